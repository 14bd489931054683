package admin

import (
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
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
	slots   chan struct{}
	log     *slog.Logger
	closed  atomic.Int64 // connections closed for want of a slot since the last warning
	mu      sync.Mutex
	warnNow time.Time // the next warning's earliest time
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
			c.Close()
			l.refused(c.RemoteAddr())
		}
	}
}

func (l *capListener) refused(remote net.Addr) {
	n := l.closed.Add(1)
	l.mu.Lock()
	defer l.mu.Unlock()
	if now := time.Now(); !now.Before(l.warnNow) {
		l.warnNow = now.Add(time.Minute)
		l.closed.Add(-n)
		l.log.Warn("admin: a connection beyond the admin server's limit was closed: something opens many connections to it and keeps them (restrict who reaches the admin port)",
			"remote", remote.String(), "max_connections", cap(l.slots), "closed_since_last_warning", n)
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
