package httpin

import (
	"log/slog"
	"net"
	"sync"

	"github.com/logfwd/forwarder/inputs"
)

// limitListener holds the HTTP input to max_connections open connections:
// a connection accepted beyond them is closed at once and counted
// (forwarder_input_rejected_total{reason="too_many_connections"}), as the
// forward input does. Its client sees the connection closed before any
// answer, and may try again.
type limitListener struct {
	net.Listener
	slots   chan struct{} // one per open connection
	metrics *inputs.Metrics
	log     *slog.Logger
}

func newLimitListener(ln net.Listener, max int, m *inputs.Metrics, log *slog.Logger) *limitListener {
	return &limitListener{Listener: ln, slots: make(chan struct{}, max), metrics: m, log: log}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &limitedConn{Conn: c, release: func() { <-l.slots }}, nil
		default:
			l.metrics.Rejected.WithLabelValues(input, "too_many_connections").Inc()
			l.log.Debug("connection refused: max_connections reached", "remote", c.RemoteAddr().String(), "max_connections", cap(l.slots))
			c.Close()
		}
	}
}

// limitedConn gives its slot back when it is first closed.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
