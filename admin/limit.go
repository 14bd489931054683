package admin

import (
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/logfwd/forwarder/inputs"
)

// maxConns bounds the admin server's open connections: probes and
// scrapers need a few, and a client opening many more (anyone who can
// reach the port) must not take the file descriptors the inputs and the
// WAL need.
var maxConns = 128

// capListener keeps at most its capacity of connections open. A new one
// beyond it takes the place of the oldest connection that has no request
// under way (one idle, or still sending its request's head), which is
// closed: a client holding many connections open cannot keep the
// kubelet's probes out. Only when every connection is serving a request
// is the new one closed as it is accepted. Either is warned once a minute.
type capListener struct {
	net.Listener
	max   int
	log   *slog.Logger
	warns inputs.RateLog

	mu    sync.Mutex
	conns []*capConn // open, oldest first
}

func newCapListener(ln net.Listener, n int, log *slog.Logger) *capListener {
	return &capListener{Listener: ln, max: n, log: log}
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		cc := &capConn{Conn: c, l: l}
		l.mu.Lock()
		var evict *capConn
		if len(l.conns) >= l.max {
			for _, o := range l.conns {
				if !o.busy {
					evict = o
					break
				}
			}
			if evict == nil {
				l.mu.Unlock()
				l.warn("a connection beyond the admin server's limit was closed: every open one is serving a request; something opens many connections to it (restrict who reaches the admin port)", c)
				c.Close()
				continue
			}
			l.dropLocked(evict)
		}
		l.conns = append(l.conns, cc)
		l.mu.Unlock()
		if evict != nil {
			l.warn("admin: closed the oldest connection without a request under way to make room for a new one: something opens many connections to the admin server and keeps them (restrict who reaches the admin port)", evict)
			evict.Conn.Close()
		}
		return cc, nil
	}
}

func (l *capListener) warn(msg string, c net.Conn) {
	if n, ok := l.warns.Allow("full", time.Now()); ok {
		l.log.Warn(msg, "remote", c.RemoteAddr().String(), "max_connections", l.max, "same_reason_not_logged_in_last_minute", n)
	}
}

// dropLocked takes c out of the open connections (l.mu held).
func (l *capListener) dropLocked(c *capConn) {
	for i, o := range l.conns {
		if o == c {
			l.conns = append(l.conns[:i], l.conns[i+1:]...)
			return
		}
	}
}

// connState (http.Server.ConnState) marks a connection busy while it
// serves a request.
func (l *capListener) connState(c net.Conn, state http.ConnState) {
	cc, ok := c.(*capConn)
	if !ok {
		return
	}
	l.mu.Lock()
	cc.busy = state == http.StateActive
	l.mu.Unlock()
}

// capConn leaves its listener's open connections once, when it is closed.
type capConn struct {
	net.Conn
	l    *capListener
	once sync.Once
	busy bool // serving a request (l.mu)
}

func (c *capConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		c.l.dropLocked(c)
		c.l.mu.Unlock()
	})
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
