package admin

import (
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/logfwd/forwarder/inputs"
)

// maxConns bounds the admin server's open connections: probes and
// scrapers need a few, and a client opening many more (anyone who can
// reach the port) must not take the file descriptors the inputs and the
// WAL need. A connection beyond it is closed at once.
var maxConns = 128

// capListener closes, as they are accepted, connections beyond its
// capacity, and warns once a minute that it does.
type capListener struct {
	net.Listener
	slots chan struct{}
	log   *slog.Logger
	warns inputs.RateLog
}

func newCapListener(ln net.Listener, n int, log *slog.Logger) *capListener {
	return &capListener{Listener: ln, slots: make(chan struct{}, n), log: log}
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &capConn{Conn: c, release: func() { <-l.slots }}, nil
		default:
			if n, ok := l.warns.Allow("full", time.Now()); ok {
				l.log.Warn("admin: a connection beyond the admin server's limit was closed: something opens many connections to it and keeps them (restrict who reaches the admin port)",
					"remote", c.RemoteAddr().String(), "max_connections", cap(l.slots), "same_reason_not_logged_in_last_minute", n)
			}
			c.Close()
		}
	}
}

// capConn gives its slot back once, when it is closed.
type capConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *capConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// CloseWrite lets net/http end an error answer with a FIN before it
// closes (its graceful close), as on the connection beneath.
func (c *capConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
