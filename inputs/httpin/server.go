package httpin

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	stdlog "log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/inputs"
)

// input is this input's name in the metrics.
const input = "http"

// Server limits and timeouts.
const (
	defaultMaxBody           = 16 << 20
	defaultMaxConnections    = 1024
	defaultReadHeaderTimeout = 10 * time.Second
	// readTimeout bounds a request's head and the start of its body; a
	// body that keeps arriving has its deadline moved (bodyDeadline): no
	// more than bodyIdle without a byte, whole within bodyMax of its start.
	readTimeout    = 60 * time.Second
	bodyIdle       = 60 * time.Second
	bodyMax        = 3 * time.Minute
	idleTimeout    = 120 * time.Second
	maxHeaderBytes = 16 << 10
	// writeTimeout bounds a request from its headers to the end of its
	// answer: far more than its body's read (bodyMax), its waits for
	// the memory budget and the WAL, and a commit that stalls (a disk
	// that stops for two minutes fails /healthz), so that only a client
	// that does not read its answers meets it (its connection is closed):
	// an answer cut off after the records were stored would have them
	// sent again.
	writeTimeout = 6 * time.Minute
	// h2Streams is how many requests an HTTP/2 connection may have at
	// once: each holds a goroutine and its headers outside the memory
	// budget, as an HTTP/1.1 connection holds one request's.
	h2Streams = 4

	// storeTimeout is how long a request waits for room in a full WAL
	// before the client is told 503 and to retry.
	storeTimeout = 5 * time.Second
	// memoryWait is how long a request waits for room in the inputs'
	// memory budget, in all, before the client is told 503 and to retry.
	memoryWait = 5 * time.Second
	// defaultMaxRecords is max_records_per_request when none is given.
	defaultMaxRecords = 100_000
	// shutdownTimeout bounds how long Serve waits for in-flight requests
	// once its context ends.
	shutdownTimeout = 5 * time.Second
)

// Server is the HTTP input. New makes it, Start binds its address, Serve
// answers requests until its context ends.
type Server struct {
	cfg  config.HTTP
	p    *inputs.Pipeline
	log  *slog.Logger
	auth *bearer // nil: no token configured

	storeTimeout    time.Duration
	memoryWait      time.Duration
	shutdownTimeout time.Duration
	bodyIdle        time.Duration // see bodyDeadline
	bodyMax         time.Duration
	bodyRate        float64
	// listen binds the address (a variable so that tests can put faults
	// under the listener).
	listen func(network, address string) (net.Listener, error)

	srv        *http.Server
	baseCtx    context.Context // every request's context derives from it
	cancelBase context.CancelFunc

	mu       sync.Mutex
	ln       net.Listener
	tls      *tls.Config
	stopped  bool           // Serve is returning: no new request may start
	closing  atomic.Bool    // the server is being shut down: its closes are not the clients' doing
	cutOff   atomic.Bool    // the stop's grace ended: requests under way are cut off (their connections closed)
	inflight sync.WaitGroup // requests being handled; Add under mu, before stopped

	rejects inputs.RateLog // the warnings of refused requests

	// conns holds each open connection's connInfo (connContext): one closed
	// without a request served, read_header_timeout or more after its
	// accept, sent no request head in time (connState).
	conns sync.Map

	badTimeMu      sync.Mutex
	badTimeNext    time.Time // when the next warning of bad times may be logged
	badTimeRecords int       // records with a bad time since the last warning
}

// New returns the HTTP input for cfg, storing records through p. p.Metrics
// may be nil (no metrics); log may be nil (no log).
func New(cfg config.HTTP, p *inputs.Pipeline, log *slog.Logger) *Server {
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = defaultMaxBody
	}
	if cfg.MaxConnections <= 0 {
		cfg.MaxConnections = defaultMaxConnections
	}
	if cfg.ReadHeaderTimeout <= 0 {
		cfg.ReadHeaderTimeout = config.Duration(defaultReadHeaderTimeout)
	}
	if cfg.MaxRecordsPerRequest <= 0 {
		cfg.MaxRecordsPerRequest = defaultMaxRecords
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if p.Metrics == nil {
		q := *p
		q.Metrics = inputs.NewMetrics(nil)
		p = &q
	}
	if p.Budget == nil {
		q := *p
		q.Budget = inputs.NewBudget(inputs.DefaultBudget, p.Metrics)
		p = &q
	}
	// A refusal of a client's credentials has its series from the start,
	// so that an alert's increase() sees the first.
	p.Metrics.Rejected.WithLabelValues(input, reasonUnauth)
	p.Metrics.Rejected.WithLabelValues(input, reasonTLSHandshake)
	s := &Server{
		cfg:             cfg,
		p:               p,
		log:             log,
		storeTimeout:    storeTimeout,
		memoryWait:      memoryWait,
		shutdownTimeout: shutdownTimeout,
		bodyIdle:        bodyIdle,
		bodyMax:         bodyMax,
		bodyRate:        minBodyRate,
		listen:          net.Listen,
	}
	if cfg.Token != "" {
		s.auth = newBearer(cfg.Token)
	}
	s.baseCtx, s.cancelBase = context.WithCancel(context.Background())
	s.srv = &http.Server{
		Handler:           s.tracked(s.routes()),
		ReadHeaderTimeout: time.Duration(cfg.ReadHeaderTimeout),
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		BaseContext:       func(net.Listener) context.Context { return s.baseCtx },
		ConnContext:       s.connContext,
		ConnState:         s.connState,
		// The server's own complaints are about clients: a failed TLS
		// handshake is counted and said as a refusal (serverLog), the rest
		// at debug, never a flood at warn.
		ErrorLog: stdlog.New(serverLog{s}, "", 0),
		// Over TLS clients may speak HTTP/2, whose server buffers what a
		// connection sends ahead of the handler's reads, up to its flow
		// control window, and reads each frame whole, outside the memory
		// budget: the smallest windows and frames keep that about what
		// HTTP/1.1 leaves in the socket's buffer.
		HTTP2: &http.HTTP2Config{MaxConcurrentStreams: h2Streams, MaxReceiveBufferPerConnection: h2Streams * h2Window, MaxReceiveBufferPerStream: h2Window, MaxReadFrameSize: 16 << 10},
	}
	return s
}

// requestMemory is about what a request of n bytes (decompressed) and at
// most records records takes of the memory budget while it is parsed: its
// body, the records' JSON, and the records.
func requestMemory(n, records int64) int64 {
	return n + bodySlack + n + min(records, n/3)*inputs.RecordSize
}

// bodySlack is what a body's buffer may hold beyond its bytes as it grows.
const bodySlack = 64 << 10

// h2Window is an HTTP/2 stream's flow control window (the least HTTP/2
// allows), and a quarter of its connection's: a request that waits for
// the budget holds a quarter of what its connection may send ahead.
const h2Window = 64 << 10

// StopWithin tells the server the whole service's time to stop
// (shutdown_timeout): requests in progress get at most a sixth of it (5 s
// by default) to be answered, so that the sinks keep most of it.
func (s *Server) StopWithin(d time.Duration) {
	if d > 0 {
		s.shutdownTimeout = min(s.shutdownTimeout, d/6)
	}
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/logs", s.handleLogs)
	mux.HandleFunc("/v1/logs/{tag}", s.handleLogs)
	mux.HandleFunc("/v1/logs/{$}", s.handleLogs) // no tag: 400, not 404
	mux.HandleFunc("/", s.handleNotFound)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := r.URL.EscapedPath(); r.Method != http.MethodConnect && cleanPath(p) != p {
			// ServeMux would answer 307 to the path cleaned (no body, not
			// counted): a path with "//", "." or ".." is none of ours.
			s.handleNotFound(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// cleanPath is p as ServeMux cleans it before it matches a pattern: no
// "//", "." or ".." elements, a trailing slash kept.
func cleanPath(p string) string {
	if p == "" || p[0] != '/' {
		p = "/" + p
	}
	np := path.Clean(p)
	if p[len(p)-1] == '/' && np != "/" {
		np += "/"
	}
	return np
}

// tracked counts the requests being handled, so that Serve returns only
// after the last one: none may reach the WAL once Serve has returned.
func (s *Server) tracked(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		stopped := s.stopped
		if !stopped {
			s.inflight.Add(1)
		}
		s.mu.Unlock()
		if stopped {
			s.shuttingDown(w, r)
			return
		}
		defer s.inflight.Done()
		if info, ok := r.Context().Value(connInfoKey{}).(*connInfo); ok {
			info.served.Store(true)
			if info.lc != nil {
				info.lc.handled()
			}
		}
		h.ServeHTTP(w, r)
	})
}

// Start binds the listen address, and loads the TLS certificate when one
// is configured.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln != nil {
		return errors.New("httpin: already started")
	}
	if s.cfg.TLS.Enabled() {
		cfg, err := s.cfg.TLS.ServerConfig()
		if err != nil {
			return fmt.Errorf("TLS for %s: %w", s.cfg.Listen, err)
		}
		s.tls = cfg
		s.srv.TLSConfig = s.tls
	}
	ln, err := s.listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.cfg.Listen, listenCause(err))
	}
	// Accept errors that pass by themselves are waited out here, and
	// counted, before the server sees them; connections beyond
	// max_connections are closed.
	log := s.log.With("input", input)
	s.ln = newLimitListener(inputs.RetryAccept(ln, input, s.p.Metrics, log), s.cfg.MaxConnections, s.p.Metrics, log, &s.rejects)
	return nil
}

// listenCause strips what net.Listen repeats of the address ("listen tcp
// 127.0.0.1:8080: bind: ") down to the cause.
func listenCause(err error) error {
	var op *net.OpError
	if errors.As(err, &op) {
		err = op.Err
	}
	var sys *os.SyscallError
	if errors.As(err, &sys) {
		err = sys.Err
	}
	return err
}

// Addr is the bound address; nil before Start.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

// Serve answers requests until ctx ends, then stops accepting, lets the
// requests in flight finish for up to a few seconds, cancels those that
// remain (none of them is acknowledged) and returns nil. It returns an
// error only if serving fails before ctx ends.
func (s *Server) Serve(ctx context.Context) error {
	s.mu.Lock()
	ln, tlsConfig := s.ln, s.tls
	s.mu.Unlock()
	if ln == nil {
		return errors.New("httpin: Serve called before Start")
	}
	if need := requestMemory(int64(s.cfg.MaxBodyBytes), int64(s.cfg.MaxRecordsPerRequest)); need > s.p.Budget.Limit() {
		largest := max((s.p.Budget.Limit()-bodySlack-int64(s.cfg.MaxRecordsPerRequest)*inputs.RecordSize)/2, 0)
		s.log.Warn("a request of max_body_bytes needs more memory than the inputs' budget gives one request: requests larger than about largest_request may be refused (413, over_memory_budget); raise memory_limit or lower max_body_bytes",
			"max_body_bytes", s.cfg.MaxBodyBytes, "memory_needed", config.Size(need), "budget", config.Size(s.p.Budget.Limit()),
			"largest_request", config.Size(largest))
	}
	s.log.Info("listening", "input", input, "address", ln.Addr().String(), "tls", tlsConfig != nil, "token", s.cfg.Token != "")
	errc := make(chan error, 1)
	go func() {
		if tlsConfig != nil {
			errc <- s.srv.ServeTLS(ln, "", "")
		} else {
			errc <- s.srv.Serve(ln)
		}
	}()
	select {
	case err := <-errc:
		s.closing.Store(true)
		s.cutOff.Store(true)
		s.cancelBase()
		_ = s.srv.Close()
		s.drain()
		return fmt.Errorf("serve http on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	s.closing.Store(true)
	sctx, cancel := context.WithTimeout(context.Background(), s.shutdownTimeout)
	defer cancel()
	if err := s.srv.Shutdown(sctx); err != nil {
		// Requests still waiting (for room in the WAL, or a slow client):
		// end them unacknowledged.
		s.cutOff.Store(true)
		s.cancelBase()
		_ = s.srv.Close()
	}
	s.cancelBase()
	<-errc
	s.drain()
	return nil
}

// drain lets no new request start and waits for those running, whose
// context is cancelled by now.
func (s *Server) drain() {
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	s.inflight.Wait()
}

func (s *Server) connState(c net.Conn, state http.ConnState) {
	switch state {
	case http.StateNew:
		s.p.Metrics.Connections.WithLabelValues(input).Inc()
	case http.StateActive:
		// net/http read a request head (HTTP/1.1), or an HTTP/2
		// connection's first request began; the handler marks it taken.
		if lc := limitedOf(c); lc != nil {
			lc.headOpen.Store(true)
		}
	case http.StateIdle:
		if lc := limitedOf(c); lc != nil {
			lc.idle()
		}
	case http.StateClosed, http.StateHijacked:
		s.p.Metrics.Connections.WithLabelValues(input).Dec()
		v, ok := s.conns.LoadAndDelete(c)
		if !ok || state != http.StateClosed || s.closing.Load() {
			return
		}
		info := v.(*connInfo)
		if lc := limitedOf(c); lc != nil && !isHTTP2(c) && s.headRefused(c, lc, info.served.Load()) {
			return
		}
		if !info.served.Load() {
			s.closedUnused(c, time.Since(info.opened))
		}
	}
}

// isHTTP2 reports whether c speaks HTTP/2, whose server refuses a bad
// request on its stream and says nothing of it here.
func isHTTP2(c net.Conn) bool {
	tc, ok := c.(*tls.Conn)
	return ok && tc.ConnectionState().NegotiatedProtocol == "h2"
}

// headerTimeoutSlack: a connection closed this long past
// read_header_timeout was closed for it (a busy machine's delay).
const headerTimeoutSlack = 5 * time.Second

// connInfo is what the server keeps of a connection: when it was
// accepted, and whether a request of it reached the handler.
type connInfo struct {
	opened time.Time
	served atomic.Bool
	lc     *limitedConn // under the connection (nil: none)
}

type connInfoKey struct{}

// connContext is the context of c's requests: its slot (withSlot) and its
// connInfo, which the handler marks served.
func (s *Server) connContext(ctx context.Context, c net.Conn) context.Context {
	info := &connInfo{opened: time.Now(), lc: limitedOf(c)}
	s.conns.Store(c, info)
	return context.WithValue(withSlot(ctx, c), connInfoKey{}, info)
}

// closedUnused counts and says a connection closed without a request
// served or begun, open for d: one that sent no request head within
// read_header_timeout (a client too slow, or one holding connections
// open) is a refusal, header_timeout. Sooner, the client went away (a TCP
// probe) or its TLS handshake failed (serverLog says that).
func (s *Server) closedUnused(c net.Conn, d time.Duration) {
	timeout := time.Duration(s.cfg.ReadHeaderTimeout)
	latest := timeout + headerTimeoutSlack
	if _, ok := c.(*tls.Conn); ok {
		latest += timeout // the header's time starts after the handshake, which may take as long
	}
	latest = min(latest, idleTimeout-time.Second) // an HTTP/2 connection idle since its preface closes at idleTimeout
	if s.closing.Load() || d < timeout || d > latest {
		// Sooner: see above. Much later: not the server's header timeout
		// but another close (an HTTP/2 connection idle since its preface).
		return
	}
	s.headerTimedOut(c)
}

func (s *Server) headerTimedOut(c net.Conn) {
	timeout := time.Duration(s.cfg.ReadHeaderTimeout)
	if n, ok := s.rejects.Allow(reasonHeaderTimeout, time.Now()); ok {
		s.log.Warn("http connection closed: no whole request head within read_header_timeout (a client too slow, or one holding connections open)",
			"remote", c.RemoteAddr().String(), "read_header_timeout", timeout, "same_reason_not_logged_in_last_minute", n)
	}
	// Counted once said: what reads the count finds the line written.
	s.p.Metrics.Rejected.WithLabelValues(input, reasonHeaderTimeout).Inc()
}

// headRefused counts and says a connection (HTTP/1.1) closed with a
// request head begun that never reached the handler, and reports whether
// it was one: net/http refused the head with its own plain-text answer
// (400 a malformed request line or header, 431 headers over
// maxHeaderBytes, 501 a Transfer-Encoding other than chunked, 417 an
// Expect other than 100-continue: bad_request_head), or the head was not
// whole within read_header_timeout (header_timeout). A client that went
// away in the middle of its head is not counted. served: a request of
// the connection reached the handler before.
func (s *Server) headRefused(c net.Conn, lc *limitedConn, served bool) bool {
	status := int(lc.status.Load())
	// A head begun: net/http answered one (plain HTTP), said it read one
	// (not always after another request: the bytes it waited for may have
	// been the whole head), or bytes came after a request answered.
	if status == 0 && !lc.headOpen.Load() && !(served && lc.headBytes.Load() > 0) {
		return false
	}
	switch lc.readEnd.Load() {
	case readTimedOut:
		s.headerTimedOut(c)
		return true
	case readClosed:
		// Whatever net/http answered (400 to an unexpected EOF), no one
		// read it.
		s.log.Debug("http connection closed by its client in the middle of a request head", "remote", c.RemoteAddr().String())
		return true
	}
	if status == 0 && !lc.headOpen.Load() {
		return false // bytes after a request, and no answer: not a head net/http refused
	}
	why := "a malformed request line or header (400), headers over 16 KiB (431), a Transfer-Encoding other than chunked (501) or an Expect other than 100-continue (417); over TLS the status is not known"
	switch status {
	case http.StatusBadRequest:
		why = "a malformed request line or header"
	case http.StatusRequestHeaderFieldsTooLarge:
		why = "headers over 16 KiB"
	case http.StatusNotImplemented:
		why = "a Transfer-Encoding other than chunked"
	case http.StatusExpectationFailed:
		why = "an Expect header other than 100-continue"
	case http.StatusHTTPVersionNotSupported:
		why = "an HTTP version the input does not serve"
	}
	msg, args := "http request refused before the input read it: "+why, []any{"remote", c.RemoteAddr().String(), "status", status}
	if n, ok := s.rejects.Allow(reasonBadHead, time.Now()); ok {
		s.log.Warn(msg, append(args, "same_reason_not_logged_in_last_minute", n)...)
	} else {
		s.log.Debug(msg, args...)
	}
	s.p.Metrics.Rejected.WithLabelValues(input, reasonBadHead).Inc()
	return true
}

// serverLog takes what net/http logs about clients (http.Server.ErrorLog):
// a failed TLS handshake (an untrusted or expired certificate on either
// side, plain HTTP to the TLS port) is counted as tls_handshake and said
// as a refusal; a connection closed before its handshake began (a TCP
// probe) and a handshake that timed out (closedUnused counts that) are
// not; the rest is logged at debug.
type serverLog struct{ s *Server }

func (l serverLog) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	rest, ok := strings.CutPrefix(line, "http: TLS handshake error from ")
	if !ok {
		l.s.log.Debug("http server", "said", line)
		return len(p), nil
	}
	remote, why, _ := strings.Cut(rest, ": ")
	if why == "EOF" || strings.HasSuffix(why, "connection reset by peer") || strings.HasSuffix(why, "i/o timeout") {
		l.s.log.Debug("http connection closed in its TLS handshake", "remote", remote, "error", why)
		return len(p), nil
	}
	l.s.p.Metrics.Rejected.WithLabelValues(input, reasonTLSHandshake).Inc()
	if n, ok := l.s.rejects.Allow(reasonTLSHandshake, time.Now()); ok {
		l.s.log.Warn("http connection refused: its TLS handshake failed (a certificate one side does not trust or that expired, or plain HTTP to the TLS port)",
			"remote", remote, "error", why, "same_reason_not_logged_in_last_minute", n)
	}
	return len(p), nil
}
