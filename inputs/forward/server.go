package forward

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/inputs"
)

// maxHandshakeBytes bounds a handshake message (PING): a real one is well
// under 1 KiB, and a connection not yet authenticated must not make the
// server buffer a message of max_message_bytes.
const maxHandshakeBytes = 64 << 10

// Timeouts of a connection. Variables so that tests can shorten them.
var (
	messageTimeout = time.Minute      // from a message's first byte to its last
	writeTimeout   = 30 * time.Second // for an ack or a handshake reply
	drainTimeout   = 5 * time.Second  // at shutdown, for connections that are still reading
	storeTimeout   = 5 * time.Second  // after drainTimeout, for what they have read to be stored and acknowledged
	closeLinger    = 500 * time.Millisecond
)

// Server is the forward input: a TCP (or TLS) listener speaking the Fluent
// forward protocol.
type Server struct {
	cfg      config.Forward
	p        *inputs.Pipeline
	log      *slog.Logger
	hostname string
	tls      *tls.Config

	ln    net.Listener
	slots *inputs.Slots // max_connections; connections in the handshake give way

	// tune, when set, adjusts each accepted connection (tests shrink its
	// buffers to play a slow network).
	tune func(net.Conn)
	// listen binds the address (a variable so that tests can put faults
	// under the listener).
	listen func(network, address string) (net.Listener, error)

	rejects inputs.RateLog

	// stopWithin, when set, is the whole service's time to stop
	// (shutdown_timeout): the stop's reading and storing each get at most
	// a sixth of it (StopWithin).
	stopWithin time.Duration

	mu    sync.Mutex
	conns map[*conn]struct{}
	wg    sync.WaitGroup
}

// New returns a forward input for cfg that stores into p.
func New(cfg config.Forward, p *inputs.Pipeline, log *slog.Logger) *Server {
	host := cfg.SelfHostname
	if host == "" {
		host, _ = os.Hostname()
	}
	if cfg.MaxConnections <= 0 {
		cfg.MaxConnections = 1024
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = 16 << 20
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = config.Duration(10 * time.Second)
	}
	if cfg.MaxRecordsPerMessage <= 0 {
		cfg.MaxRecordsPerMessage = defaultMaxRecords
	}
	if p.Budget == nil {
		q := *p
		q.Budget = inputs.NewBudget(inputs.DefaultBudget, p.Metrics)
		p = &q
	}
	if p.Metrics != nil {
		// The refusals of a client's credentials have series from the
		// start, so that an alert's increase() sees the first of them.
		for _, r := range []string{"handshake", "handshake_timeout", "tls_handshake"} {
			p.Metrics.Rejected.WithLabelValues("forward", r)
		}
	}
	return &Server{cfg: cfg, p: p, log: log.With("input", "forward"), hostname: host,
		slots: inputs.NewSlots(cfg.MaxConnections), conns: map[*conn]struct{}{}, listen: net.Listen}
}

// StopWithin tells the server the whole service's time to stop
// (shutdown_timeout): reading what clients sent and storing it each take
// at most a sixth of it (5 s each by default), so that the sinks' drain
// and sends keep most of it.
func (s *Server) StopWithin(d time.Duration) { s.stopWithin = d }

// stopTimes are how long the stop reads and then stores.
func (s *Server) stopTimes() (read, store time.Duration) {
	read, store = drainTimeout, storeTimeout
	if s.stopWithin > 0 {
		read, store = min(read, s.stopWithin/6), min(store, s.stopWithin/6)
	}
	return read, store
}

// Start binds the listener.
func (s *Server) Start() error {
	if s.cfg.TLS.Enabled() {
		cfg, err := serverTLS(s.cfg.TLS)
		if err != nil {
			return err
		}
		s.tls = cfg
	}
	ln, err := s.listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("forward input: listen on %s: %w", s.cfg.Listen, err)
	}
	// Accept errors that pass by themselves (no file descriptor left, a
	// connection aborted) are waited out and counted, never fatal.
	s.ln = inputs.RetryAccept(ln, "forward", s.p.Metrics, s.log)
	return nil
}

func serverTLS(c config.TLS) (*tls.Config, error) {
	cfg, err := c.ServerConfig()
	if err != nil {
		return nil, fmt.Errorf("forward input: %w", err)
	}
	return cfg, nil
}

// Addr is the listener's address, once started.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Serve accepts connections until ctx ends. Then it stops accepting, reads
// what connections' clients had already sent (shutdownLinger), lets
// connections that are in a message finish, store and ack it (for up to a
// few seconds), and returns.
func (s *Server) Serve(ctx context.Context) error {
	s.log.Info("listening", "address", s.ln.Addr().String(), "tls", s.tls != nil, "handshake", s.cfg.SharedKey != "")
	if need := messageMemory(int64(s.cfg.MaxMessageBytes), int64(s.cfg.MaxRecordsPerMessage)); need > s.p.Budget.Limit() {
		largest := max((s.p.Budget.Limit()-bufSlack-int64(s.cfg.MaxRecordsPerMessage)*inputs.RecordSize)/2, 0)
		s.log.Warn("a message of max_message_bytes needs more memory than the inputs' budget gives one message: messages larger than about largest_message may be refused (over_memory_budget); raise memory_limit or lower max_message_bytes",
			"max_message_bytes", s.cfg.MaxMessageBytes, "memory_needed", config.Size(need), "budget", config.Size(s.p.Budget.Limit()),
			"largest_message", config.Size(largest))
	}
	storeCtx, cancelStores := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelStores()
	go func() {
		<-ctx.Done()
		s.ln.Close()
		s.mu.Lock()
		for c := range s.conns {
			c.stopReading()
		}
		s.mu.Unlock()
	}()
	var acceptErr error
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			if ctx.Err() == nil {
				acceptErr = fmt.Errorf("forward input: accept: %w", err)
			}
			break
		}
		// With every slot taken, the oldest connection still in its
		// handshake gives way (it is closed, and counted when its goroutine
		// sees it); with none in its handshake, the new one is refused.
		slot, _ := s.slots.Take(func() { nc.Close() })
		if slot == nil {
			// Said once a minute (then at debug), before it is counted:
			// each client node holds connections to every replica, so
			// this is a fleet outgrowing max_connections.
			args := []any{"remote", nc.RemoteAddr().String(), "max_connections", s.cfg.MaxConnections}
			const msg = "connection refused: max_connections reached; raise it if these are real clients (each client node keeps connections to every replica)"
			if n, ok := s.rejects.Allow("too_many_connections", time.Now()); ok {
				s.log.Warn(msg, append(args, "same_reason_not_logged_in_last_minute", n)...)
			} else {
				s.log.Debug(msg, args...)
			}
			s.p.Metrics.Rejected.WithLabelValues("forward", "too_many_connections").Inc()
			nc.Close()
			continue
		}
		c := s.newConn(nc, slot)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer slot.Release()
			c.serve(ctx, storeCtx)
		}()
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	readFor, storeFor := s.stopTimes()
	select {
	case <-done:
	case <-time.After(readFor):
		// Clients that kept sending: no connection reads another message
		// (one still arriving is not stored, not acknowledged: its client
		// sends it again). What was read is stored and acknowledged; a
		// store cancelled here could land in the WAL without its ack, and a
		// client failing over would send it to another replica: a
		// duplicate downstream.
		s.mu.Lock()
		for c := range s.conns {
			c.endReads()
		}
		s.mu.Unlock()
		select {
		case <-done:
		case <-time.After(storeFor):
			cancelStores()
			s.mu.Lock()
			for c := range s.conns {
				c.nc.Close()
			}
			s.mu.Unlock()
			// A store already in a transaction answers with its commit,
			// which a stalled disk may hold: the stop does not wait for it
			// past another storeFor.
			select {
			case <-done:
			case <-time.After(storeFor):
				s.log.Warn("stopping: stores in a commit that has not returned are left behind; their clients were disconnected without an ack and send them again (a commit that lands after all stores them twice)",
					"waited", 2*storeFor)
			}
		}
	}
	return acceptErr
}

func (s *Server) track(c *conn, open bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if open {
		s.conns[c] = struct{}{}
	} else {
		delete(s.conns, c)
	}
	s.p.Metrics.Connections.WithLabelValues("forward").Set(float64(len(s.conns)))
}

var errClosing = errors.New("server closing")

// messageMemory is about what a message of n bytes and at most records
// records takes of the budget while it is decoded: its bytes, its records'
// JSON (reserved at the message's size, grown if it is more) and the
// records, 56 bytes each.
func messageMemory(n, records int64) int64 {
	return n + bufSlack + n + min(records, n/3)*inputs.RecordSize
}
