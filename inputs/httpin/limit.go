package httpin

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/logfwd/forwarder/inputs"
)

// limitListener holds the HTTP input to max_connections open connections
// (inputs.Slots). A connection is in its "handshake" until a request of it
// passes authentication (any POST to /v1/logs when no token is set): until
// then it gives way to a new connection when every slot is taken, and is
// closed and counted (forwarder_input_rejected_total{reason="evicted"}).
// With every connection past that point, a new one is closed at once and
// counted (reason too_many_connections), as the forward input does; its
// client sees the connection closed before any answer, and may try again.
type limitListener struct {
	net.Listener
	slots   *inputs.Slots
	metrics *inputs.Metrics
	log     *slog.Logger
	rejects *inputs.RateLog // shared with the requests' refusals: one warning a minute per reason
	max     int
}

func newLimitListener(ln net.Listener, max int, m *inputs.Metrics, log *slog.Logger, rejects *inputs.RateLog) *limitListener {
	return &limitListener{Listener: ln, slots: inputs.NewSlots(max), metrics: m, log: log, rejects: rejects, max: max}
}

// refused counts and logs a connection closed for reason: the first of a
// minute as a warning, the others at debug level.
func (l *limitListener) refused(reason, msg, remote string) {
	args := []any{"remote", remote, "reason", reason, "max_connections", l.max}
	if n, ok := l.rejects.Allow(reason, time.Now()); ok {
		l.log.Warn(msg, append(args, "same_reason_not_logged_in_last_minute", n)...)
	} else {
		l.log.Debug(msg, args...)
	}
	// Counted once said: what reads the count finds the line written.
	l.metrics.Rejected.WithLabelValues(input, reason).Inc()
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		remote := c.RemoteAddr().String()
		slot, _ := l.slots.Take(func() {
			l.refused("evicted", "closed a connection that has sent no authenticated request, to make room for a new one: max_connections reached", remote)
			c.Close()
		})
		if slot != nil {
			return &limitedConn{Conn: c, slot: slot}, nil
		}
		l.refused("too_many_connections", "connection refused: max_connections reached", remote)
		c.Close()
	}
}

// limitedConn gives its slot back when it is first closed. It also keeps
// what the server needs to say why a request head never reached the
// handler (Server.headRefused): how its last failed read ended, and the
// status of the answer net/http wrote for it on its own.
type limitedConn struct {
	net.Conn
	once sync.Once
	slot *inputs.Slot

	// Since the connection went idle (or opened) and until a request
	// reached the handler:
	inRequest atomic.Bool  // a request reached the handler since the connection went idle
	headOpen  atomic.Bool  // net/http read a request head (http.StateActive) not yet handled
	headBytes atomic.Int64 // bytes read outside a request since the connection went idle
	readEnd   atomic.Int32 // how the last failed read ended: readTimedOut, readClosed or 0
	status    atomic.Int32 // the status of an answer written outside a request: net/http's own (plain HTTP only)
}

// idle is the start of another request head on c (http.StateIdle).
func (c *limitedConn) idle() {
	c.inRequest.Store(false)
	c.headOpen.Store(false)
	c.headBytes.Store(0)
	c.readEnd.Store(0)
	c.status.Store(0)
}

// handled marks the connection's request head as taken by the handler.
func (c *limitedConn) handled() {
	c.inRequest.Store(true)
	c.headOpen.Store(false)
	c.headBytes.Store(0)
}

// How a connection's last failed read ended.
const (
	readTimedOut = 1 + iota // its deadline passed
	readClosed              // the client closed or reset the connection
)

func (c *limitedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && !c.inRequest.Load() {
		c.headBytes.Add(int64(n))
	}
	if err != nil {
		var ne net.Error
		switch {
		case errors.As(err, &ne) && ne.Timeout():
			c.readEnd.Store(readTimedOut)
		case errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET):
			c.readEnd.Store(readClosed)
		}
	}
	return n, err
}

// Write notes the status of an answer written outside a request: net/http
// refusing a head itself ("HTTP/1.1 400 Bad Request", 431, 501, 417).
// Over TLS what passes here is ciphertext, and no status is found.
func (c *limitedConn) Write(p []byte) (int, error) {
	if !c.inRequest.Load() && len(p) >= 12 && string(p[:9]) == "HTTP/1.1 " {
		if code, err := strconv.Atoi(string(p[9:12])); err == nil {
			c.status.Store(int32(code))
		}
	}
	return c.Conn.Write(p)
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.slot.Release)
	return err
}

type slotKey struct{}

// withSlot puts the connection's slot in its requests' context
// (http.Server.ConnContext).
func withSlot(ctx context.Context, c net.Conn) context.Context {
	if lc := limitedOf(c); lc != nil {
		return context.WithValue(ctx, slotKey{}, lc.slot)
	}
	return ctx
}

// limitedOf is the limitedConn under c (nil: none).
func limitedOf(c net.Conn) *limitedConn {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	lc, _ := c.(*limitedConn)
	return lc
}

// authenticated marks r's connection as past its handshake: its slot is
// its own until it closes. It reports false when a new connection took
// the slot first (the connection is closed: no answer would reach the
// client, which sends the request again).
func authenticated(r *http.Request) bool {
	if slot, ok := r.Context().Value(slotKey{}).(*inputs.Slot); ok {
		return slot.Ready()
	}
	return true
}
