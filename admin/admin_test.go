package admin

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/logfwd/forwarder/internal/syncbuf"
	"github.com/logfwd/forwarder/queue"
	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// deniedSink refuses everything as a destination without access does.
type deniedSink struct{}

func (deniedSink) Limits() sinks.Limits {
	return sinks.Limits{MaxRecords: 10, MaxBytes: 1 << 20, MaxAge: time.Millisecond, Concurrency: 1}
}
func (deniedSink) Partition(*sinks.Record) string { return "p" }
func (deniedSink) Size(r *sinks.Record) int       { return len(r.Body) }
func (deniedSink) Send(context.Context, *sinks.Batch) (sinks.Outcome, error) {
	return sinks.Outcome{}, sinks.NewSinkPermanent("AccessDenied", nil)
}

func get(t *testing.T, base, path string) (int, string) {
	t.Helper()
	res, err := http.Get(base + path)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func TestEndpoints(t *testing.T) {
	w, err := wal.Open(t.TempDir(), wal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w.RegisterCursor(ctx, "removed-sink") // a cursor no sink owns
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewWALCollector(w, 1<<30).Configured("cw"))
	d := queue.New(w, "cw", deniedSink{}, queue.Options{Metrics: queue.NewMetrics(reg)})
	listening := true
	s := New("127.0.0.1:0", Sources{WAL: w, MaxBytes: 1 << 30, Drainers: []*queue.Drainer{d}, Listening: func() bool { return listening },
		Gatherer: reg, Version: "v-test"}, slog.New(slog.DiscardHandler))
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	base := "http://" + s.Addr().String()

	if code, body := get(t, base, "/readyz"); code != 200 {
		t.Fatalf("/readyz before anything: %d %s", code, body)
	}
	if _, err := w.Append(ctx, []wal.Record{{Tag: "t", Body: []byte(`{"password":"hunter2"}`)}}, wal.AppendOptions{}); err != nil {
		t.Fatal(err)
	}
	drained := make(chan error, 1)
	go func() { drained <- d.Run(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for d.Status().State != "paused" && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	// Readiness is "this replica can accept records": the WAL keeps them
	// while a sink is paused, and replicas share their configuration, so
	// one sink's mistake must not take every replica out of its Service.
	code, body := get(t, base, "/readyz")
	if code != http.StatusOK || !strings.Contains(body, "sink cw: paused") {
		t.Fatalf("/readyz with a paused sink: %d %s, want 200 naming the paused sink", code, body)
	}
	if code, _ := get(t, base, "/healthz"); code != 200 {
		t.Fatalf("/healthz: %d (a paused sink is not a dead process)", code)
	}
	listening = false
	if _, body := get(t, base, "/readyz"); !strings.Contains(body, "inputs: not listening") {
		t.Fatalf("/readyz without inputs: %s", body)
	}
	_, body = get(t, base, "/status")
	var st Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	if st.Version != "v-test" || st.WAL.Records != 1 || st.WAL.NextSeq != 2 || len(st.Sinks) != 1 || st.Sinks[0].State != "paused" ||
		len(st.Orphaned) != 1 || st.Orphaned[0].Name != "removed-sink" || st.Orphaned[0].LagRecords != 1 {
		t.Fatalf("/status: %s", body)
	}
	if strings.Contains(body, "hunter2") {
		t.Fatal("/status shows record content")
	}
	_, metrics := get(t, base, "/metrics")
	if strings.Contains(metrics, `forwarder_wal_unconfigured_cursor_lag_records{cursor="cw"}`) {
		t.Error("a configured sink's cursor is exported as unconfigured")
	}
	for _, want := range []string{"forwarder_wal_records 1", "forwarder_wal_max_bytes 1.073741824e+09", `forwarder_sink_paused{sink="cw"} 1`,
		// Counters that alerts take the increase of are there at 0 before their first count.
		`forwarder_wal_dropped_records_total{sink="cw"} 0`, `forwarder_wal_dropped_records_total{sink="removed-sink"} 0`,
		`forwarder_sink_dead_letters_stored{sink="cw"} 0`, `forwarder_sink_dead_letters_evicted_total{sink="cw"} 0`,
		"forwarder_wal_commit_seconds_total ", "forwarder_wal_commit_pending_seconds 0",
		`forwarder_wal_unconfigured_cursor_lag_records{cursor="removed-sink"} 1`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// The sink read the record a moment after its append: from memory.
	if !regexp.MustCompile(`(?m)^forwarder_wal_reads_total\{from="memory"\} [1-9]`).MatchString(metrics) {
		t.Errorf("/metrics: the WAL's reads: %s", regexp.MustCompile(`(?m)^forwarder_wal_reads.*$`).FindAllString(metrics, -1))
	}
	if code, _ := get(t, base, "/nope"); code != 404 {
		t.Errorf("/nope: %d", code)
	}
	cancel()
	<-drained
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestPprof: Go's profiles are served under /debug/pprof/ only when asked
// for.
func TestPprof(t *testing.T) {
	w, err := wal.Open(t.TempDir(), wal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for _, on := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		s := New("127.0.0.1:0", Sources{WAL: w, MaxBytes: 1 << 30, Listening: func() bool { return true },
			Gatherer: prometheus.NewRegistry(), Version: "v-test", Pprof: on}, slog.New(slog.DiscardHandler))
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- s.Serve(ctx) }()
		base := "http://" + s.Addr().String()
		for path, want := range map[string]string{
			"/debug/pprof/":                  "goroutine",
			"/debug/pprof/heap?debug=1":      "heap profile",
			"/debug/pprof/goroutine?debug=1": "goroutine profile",
			"/debug/pprof/profile?seconds=1": "", // a CPU profile, gzipped protobuf
			"/debug/pprof/cmdline":           "admin.test",
		} {
			code, body := get(t, base, path)
			switch {
			case !on && code != http.StatusNotFound:
				t.Errorf("pprof off: %s answered %d, want 404", path, code)
			case on && (code != http.StatusOK || !strings.Contains(body, want) || len(body) == 0):
				t.Errorf("pprof on: %s answered %d with %.80q, want 200 with %q", path, code, body, want)
			}
		}
		if code, _ := get(t, base, "/healthz"); code != http.StatusOK {
			t.Errorf("pprof %v: /healthz answered %d", on, code)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// TestDiskFullEndpoints: with appends held for room on the disk (here a
// floor above any disk), /readyz names the disk, /status and /metrics show
// it, and /healthz stays 200: a full disk is not a failed WAL.
func TestDiskFullEndpoints(t *testing.T) {
	w, err := wal.Open(t.TempDir(), wal.Options{MinFreeBytes: 1 << 60})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewWALCollector(w, 1<<30))
	s := New("127.0.0.1:0", Sources{WAL: w, MaxBytes: 1 << 30, Gatherer: reg}, slog.New(slog.DiscardHandler))
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	base := "http://" + s.Addr().String()

	actx, acancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = w.Append(actx, []wal.Record{{Tag: "t", Body: []byte(`{}`)}}, wal.AppendOptions{})
	acancel()
	if err == nil || !w.DiskFull() {
		t.Fatalf("append under the floor: %v, DiskFull() %v", err, w.DiskFull())
	}
	if code, body := get(t, base, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "disk nearly full") || strings.Contains(body, "null") {
		t.Errorf("/readyz with the disk full: %d %s", code, body)
	}
	if code, body := get(t, base, "/healthz"); code != 200 {
		t.Errorf("/healthz with the disk full: %d %s", code, body)
	}
	_, body := get(t, base, "/status")
	var st Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	if !st.WAL.DiskFull || !st.WAL.Full || st.WAL.MinFreeBytes != 1<<60 || st.WAL.DiskFreeBytes <= 0 {
		t.Errorf("/status with the disk full: %s", body)
	}
	_, metrics := get(t, base, "/metrics")
	for _, want := range []string{"forwarder_wal_disk_full 1", "forwarder_wal_full 1", "forwarder_wal_min_free_bytes 1.152921504606847e+18"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A connection idle after its request is closed after idleTimeout (here
// 200 ms): idle connections do not pile up.
func TestIdleConnectionsClosed(t *testing.T) {
	old := idleTimeout
	idleTimeout = 200 * time.Millisecond
	t.Cleanup(func() { idleTimeout = old })
	s := serveBare(t, slog.New(slog.DiscardHandler))
	c, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	began := time.Now()
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("the idle connection: %v, want it closed", err)
	}
	if d := time.Since(began); d > 3*time.Second {
		t.Errorf("closed after %v", d)
	}
}

// TestConnectionsCapped: a client holding maxConns connections open
// without requests cannot keep a probe out: the probe's connection takes
// the place of the oldest, which is closed, with a warning, so that a
// client holding many cannot take the process's file descriptors either.
func TestConnectionsCapped(t *testing.T) {
	old := maxConns
	maxConns = 4
	t.Cleanup(func() { maxConns = old })
	var logs syncbuf.Buffer
	s := serveBare(t, slog.New(slog.NewTextHandler(&logs, nil)))
	get := func() error {
		c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 2 * time.Second}
		resp, err := c.Get("http://" + s.Addr().String() + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	var held []net.Conn
	for i := range maxConns {
		c, err := net.Dial("tcp", s.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if i == 1 {
			io.WriteString(c, "GET /healthz HTTP/1.1\r\n") // a head begun, not finished
		}
		held = append(held, c)
		time.Sleep(20 * time.Millisecond) // accepted in this order
	}
	cl := s.ln.(*capListener)
	open := func() int {
		cl.mu.Lock()
		defer cl.mu.Unlock()
		return len(cl.conns)
	}
	for i := range 2 {
		if err := get(); err != nil {
			t.Fatalf("probe %d with %d connections held: %v", i, maxConns, err)
		}
		// The server closes the probe's connection after its answer, which
		// the client may read first: a connection dialled before that
		// would take the place of another held one.
		for deadline := time.Now().Add(2 * time.Second); open() >= maxConns; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the probe's connection still counted 2s after its answer")
			}
		}
		// The oldest held, closed for the probe.
		held[i].SetReadDeadline(time.Now().Add(2 * time.Second))
		if n, err := held[i].Read(make([]byte, 1)); err != io.EOF {
			t.Errorf("held connection %d: read %d, %v; want it closed", i, n, err)
		}
		// The client fills the place again.
		c, err := net.Dial("tcp", s.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
		time.Sleep(20 * time.Millisecond)
	}
	for _, c := range held[2:] {
		c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("a newer held connection: %v, want it open", err)
		}
	}
	if !strings.Contains(logs.String(), "closed the oldest connection without a request under way to make room for a new one") {
		t.Errorf("no warning:\n%s", logs.String())
	}
}

// TestConnectionsCappedAllBusy: with every connection serving a request, a
// new one is closed as it is accepted, and one is accepted again once a
// slot is free.
func TestConnectionsCappedAllBusy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var logs syncbuf.Buffer
	l := newCapListener(ln, 2, slog.New(slog.NewTextHandler(&logs, nil)))
	defer l.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	var clients []net.Conn
	dial := func() net.Conn {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
		return c
	}
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	var busy []net.Conn
	for range 2 {
		dial()
		c := <-accepted
		l.connState(c, http.StateActive)
		busy = append(busy, c)
	}
	extra := dial()
	extra.SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, err := extra.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("a connection beyond 2 busy ones: read %d, %v; want it closed", n, err)
	}
	if !strings.Contains(logs.String(), "every open one is serving a request") {
		t.Errorf("no warning:\n%s", logs.String())
	}
	l.connState(busy[0], http.StateIdle) // its request answered: it may give way
	dial()
	select {
	case <-accepted:
	case <-time.After(2 * time.Second):
		t.Fatal("no connection accepted in the place of an idle one")
	}
	busy[1].Close()
	dial()
	select {
	case <-accepted:
	case <-time.After(2 * time.Second):
		t.Fatal("no connection accepted once one closed")
	}
}

// serveBare serves an admin server over an empty WAL, logging to log,
// until the test ends.
func serveBare(t *testing.T, log *slog.Logger) *Server {
	t.Helper()
	w, err := wal.Open(t.TempDir(), wal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := New("127.0.0.1:0", Sources{WAL: w, Gatherer: prometheus.NewRegistry()}, log)
	if err := s.Start(); err != nil {
		w.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	t.Cleanup(func() { cancel(); <-done; w.Close() })
	return s
}
