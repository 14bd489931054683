// Package admin is the forwarder's admin HTTP server: Prometheus metrics,
// liveness and readiness, a JSON status page and, when enabled, Go's
// profiles. It only reads: the WAL's statistics and the drainers' status.
// Nothing it serves holds a secret (profiles hold code locations and sizes,
// /debug/pprof/cmdline the command line); record content only
// /dead-letters, which answers only requests from the machine itself.
package admin

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"os"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/logfwd/forwarder/queue"
	"github.com/logfwd/forwarder/wal"
)

// Sources are what the admin server reports on.
type Sources struct {
	WAL      *wal.WAL
	MaxBytes int64
	Drainers []*queue.Drainer
	// Listening reports whether the inputs accept connections.
	Listening func() bool
	Gatherer  prometheus.Gatherer
	Version   string
	// Pprof serves Go's runtime profiles under /debug/pprof/.
	Pprof bool
	// TokenFile is where Start writes the token /dead-letters asks for
	// (Authorization: Bearer): a new random one at each start, readable
	// by the service's user alone, so that only who can read its data_dir
	// reads records' content. "": no token is asked.
	TokenFile string
}

// Server serves /metrics, /healthz, /readyz, /status, /wal and /dead-letters, and with
// Sources.Pprof Go's profiles under /debug/pprof/.
type Server struct {
	listen string
	src    Sources
	log    *slog.Logger
	ln     net.Listener
	srv    *http.Server
	start  time.Time
	token  string // what /dead-letters asks for; "": nothing
}

// idleTimeout closes a connection idle between requests: scrapers and
// probes open new ones as they need, and idle ones must not pile up.
var idleTimeout = 2 * time.Minute

// New returns an admin server for listen ("127.0.0.1:9880").
func New(listen string, src Sources, log *slog.Logger) *Server {
	s := &Server{listen: listen, src: src, log: log, start: time.Now()}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(src.Gatherer, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}))
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.HandleFunc("GET /status", s.status)
	mux.HandleFunc("GET /wal", s.walStats)
	mux.HandleFunc("GET /dead-letters", s.deadLetters)
	if src.Pprof {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index) // and every named profile: heap, goroutine, allocs, ...
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	s.srv = &http.Server{Handler: noBody(mux), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: idleTimeout}
	return s
}

// noBody answers a request that announces a body (no admin route takes
// one) with 400 and closes its connection at once. Otherwise net/http
// would read the body after the answer, for the connection's next request,
// with no deadline: a client that never sends it would keep the
// connection serving a request, which the connection cap does not evict,
// and enough of them would keep the kubelet's probes out.
func noBody(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength == 0 {
			h.ServeHTTP(w, r)
			return
		}
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil { // not HTTP/1: answered, and the connection closed by net/http
			w.Header().Set("Connection", "close")
			http.Error(w, "admin routes take no request body", http.StatusBadRequest)
			return
		}
		defer conn.Close()
		const msg = "admin routes take no request body\n"
		_ = conn.SetWriteDeadline(time.Now().Add(time.Second))
		fmt.Fprintf(conn, "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", len(msg), msg)
	})
}

// Start binds the listener.
func (s *Server) Start() error {
	if s.src.TokenFile != "" {
		// The token is this run's whether or not its file could be written:
		// a start on a full disk (whose sinks must run to make room) is
		// not failed for it; /dead-letters is then refused for the run.
		s.token = newToken()
		if err := writeToken(s.src.TokenFile, s.token); err != nil {
			s.log.Warn("could not write the admin token: /dead-letters (forwarder wal dead-letters on the running service) is refused until the service starts again with room in its data_dir; the rest of the admin server is served",
				"path", s.src.TokenFile, "error", err)
		}
	}
	ln, err := net.Listen("tcp", s.listen)
	if err != nil {
		return fmt.Errorf("admin: listen on %s: %w", s.listen, err)
	}
	cl := newCapListener(ln, maxConns, s.log)
	s.srv.ConnState = cl.connState
	s.ln = cl
	return nil
}

// newToken is a random token: 64 hex digits.
func newToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// writeToken writes token to path, mode 0600, whole or not at all: a new
// file (any left over by a failed try removed first, so that its mode is
// not kept) renamed over path.
func writeToken(path, token string) error {
	tmp := path + ".new"
	_ = os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err == nil {
		_, err = f.WriteString(token + "\n")
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(tmp, path)
		}
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}

// Addr is the listener's address, once started.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Serve serves until ctx ends.
func (s *Server) Serve(ctx context.Context) error {
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		s.srv.Shutdown(sctx)
	}()
	s.log.Info("admin listening", "address", s.ln.Addr().String())
	if err := s.srv.Serve(s.ln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("admin: %w", err)
	}
	return nil
}

// healthz: the process is alive and its WAL can still promise durability.
func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	if err := s.src.WAL.Err(); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "failed", "error": err.Error()})
		return
	}
	if d := s.src.WAL.CommitPending(); d >= wal.StallAfter {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "stalled",
			"error": fmt.Sprintf("a WAL commit (its writes and fsync) has not returned for %s: the disk does not answer", d.Round(time.Second))})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz: this replica can accept records: the WAL is open, healthy and
// not full, and the inputs listen. A paused or failing sink does not make
// it fail: the WAL keeps its records, and replicas share a configuration,
// so one sink's mistake would take every replica out of its Service. Such
// sinks are named in the answer (as notes), in /status, in
// forwarder_sink_paused and in the log.
func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	var problems, notes []string
	if err := s.src.WAL.Err(); err != nil {
		problems = append(problems, "wal: "+err.Error())
	}
	switch w := s.src.WAL; {
	case w.DiskFull():
		st := w.Stats()
		problems = append(problems, fmt.Sprintf("wal: disk nearly full, or a commit refused for lack of space (%d bytes free on the file system, %d in the WAL file, wal.min_free_bytes is %d; the log says which); inputs are pushing back on clients until the sinks deliver or space is freed",
			st.DiskFreeBytes, st.FileFreeBytes, w.MinFreeBytes()))
	case w.Full():
		problems = append(problems, "wal: full (wal.max_bytes reached); inputs are pushing back on clients")
	}
	if s.src.Listening != nil && !s.src.Listening() {
		problems = append(problems, "inputs: not listening")
	}
	for _, d := range s.src.Drainers {
		st := d.Status()
		switch st.State {
		case queue.StatePaused, queue.StateFailed: // recovering is a normal start; a refused one is paused
			notes = append(notes, fmt.Sprintf("sink %s: %s: %s", st.Sink, st.State, st.LastError))
		}
	}
	if len(problems) > 0 {
		body := map[string]any{"status": "not ready", "problems": problems}
		if len(notes) > 0 {
			body["sinks"] = notes
		}
		writeJSON(w, http.StatusServiceUnavailable, body)
		return
	}
	if len(notes) > 0 {
		writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "sinks": notes})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// Status is the /status document.
type Status struct {
	Version  string         `json:"version"`
	Uptime   string         `json:"uptime"`
	WAL      WALStatus      `json:"wal"`
	Sinks    []queue.Status `json:"sinks"`
	Orphaned []Cursor       `json:"unconfigured_cursors,omitempty"`
	// Links are the admin server's other documents: the WAL's statistics and
	// each sink's dead letters.
	Links map[string]string `json:"links"`
}

// WALStatus is the WAL part of /status.
type WALStatus struct {
	Path      string `json:"path"`
	Bytes     int64  `json:"bytes"`
	MaxBytes  int64  `json:"max_bytes"`
	FileBytes int64  `json:"file_bytes"`
	Records   uint64 `json:"records"`
	FirstSeq  uint64 `json:"first_seq"`
	NextSeq   uint64 `json:"next_seq"`
	Full      bool   `json:"full"`
	// DiskFull: appends wait because the disk has less than MinFreeBytes free,
	// on the file system (DiskFreeBytes; -1: unknown) and in the file (FileFreeBytes).
	DiskFull      bool              `json:"disk_full"`
	DiskFreeBytes int64             `json:"disk_free_bytes"`
	FileFreeBytes int64             `json:"file_free_bytes"`
	MinFreeBytes  int64             `json:"min_free_bytes"`
	Dropped       map[string]uint64 `json:"dropped_records,omitempty"`
	Error         string            `json:"error,omitempty"`
}

// Cursor is a cursor of a sink that is not configured: it pins retention.
type Cursor struct {
	Name       string `json:"name"`
	Position   uint64 `json:"position"`
	LagRecords uint64 `json:"lag_records"`
}

func (s *Server) status(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.Snapshot())
}

// Snapshot builds the /status document.
func (s *Server) Snapshot() Status {
	st := s.src.WAL.Stats()
	out := Status{Version: s.src.Version, Uptime: time.Since(s.start).Round(time.Second).String(),
		WAL: WALStatus{Path: st.Path, Bytes: st.Bytes, MaxBytes: s.src.MaxBytes, FileBytes: st.FileBytes, Records: st.Records,
			FirstSeq: st.FirstSeq, NextSeq: st.NextSeq, Full: s.src.WAL.Full(), Dropped: st.Dropped,
			DiskFull: s.src.WAL.DiskFull(), DiskFreeBytes: st.DiskFreeBytes, FileFreeBytes: st.FileFreeBytes, MinFreeBytes: s.src.WAL.MinFreeBytes()}}
	if err := s.src.WAL.Err(); err != nil {
		out.WAL.Error = err.Error()
	}
	configured := map[string]bool{}
	out.Links = map[string]string{"wal": "/wal", "dead_letters": "/dead-letters"}
	for _, d := range s.src.Drainers {
		out.Sinks = append(out.Sinks, d.Status())
		configured[d.Name()] = true
		out.Links["dead_letters_of_"+d.Name()] = "/dead-letters?sink=" + url.QueryEscape(d.Name())
	}
	for name, pos := range st.Cursors {
		if !configured[name] {
			lag := uint64(0)
			if st.NextSeq-1 > pos {
				lag = st.NextSeq - 1 - pos
			}
			out.Orphaned = append(out.Orphaned, Cursor{Name: name, Position: pos, LagRecords: lag})
		}
	}
	sort.Slice(out.Orphaned, func(i, j int) bool { return out.Orphaned[i].Name < out.Orphaned[j].Name })
	return out
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}
