package httpin

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"
	"sync"
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

// limitedConn gives its slot back when it is first closed.
type limitedConn struct {
	net.Conn
	once sync.Once
	slot *inputs.Slot
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
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if lc, ok := c.(*limitedConn); ok {
		return context.WithValue(ctx, slotKey{}, lc.slot)
	}
	return ctx
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
