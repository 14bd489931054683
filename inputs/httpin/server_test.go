package httpin

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/inputs"
	"github.com/logfwd/forwarder/wal"
)

// gatedWAL holds every append until the test opens the gate.
type gatedWAL struct {
	*wal.WAL
	entered chan struct{} // an append arrived
	gate    chan struct{} // closed: appends go through
}

func newGated(w *wal.WAL) *gatedWAL {
	return &gatedWAL{WAL: w, entered: make(chan struct{}, 16), gate: make(chan struct{})}
}

func (g *gatedWAL) Append(ctx context.Context, recs []wal.Record, opts wal.AppendOptions) (wal.Result, error) {
	g.entered <- struct{}{}
	select {
	case <-g.gate:
	case <-ctx.Done():
		return wal.Result{}, ctx.Err()
	}
	return g.WAL.Append(ctx, recs, opts)
}

// TestAckAfterDurable: no answer leaves while the append is pending, and
// when the 200 arrives, the records are committed (SyncAlways: fsynced).
func TestAckAfterDurable(t *testing.T) {
	var g *gatedWAL
	e := newEnv(t, withWAL(wal.Options{Sync: wal.SyncAlways}), withAppender(func(w *wal.WAL) inputs.Appender {
		g = newGated(w)
		return g
	}))
	answered := make(chan response, 1)
	go func() {
		answered <- e.post("/v1/logs/app", []byte("{\"a\":1}\n{\"a\":2}\n"))
	}()
	<-g.entered
	select {
	case r := <-answered:
		t.Fatalf("answered %d %s while the append was pending", r.status, r.body)
	case <-time.After(200 * time.Millisecond):
	}
	close(g.gate)
	r := <-answered
	// Committed state, read the moment the answer arrived.
	next := e.w.Stats().NextSeq
	if r.status != 200 || r.body != `{"stored":2}` {
		t.Fatalf("answer %d %s", r.status, r.body)
	}
	if next != 3 {
		t.Fatalf("NextSeq %d when the 200 arrived, want 3: acknowledged before the commit", next)
	}
}

// TestAckSurvivesReopen: what was acknowledged is found after the WAL is
// closed and opened again, and every answer arrives after its commit.
func TestAckSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	w, err := wal.Open(dir, wal.Options{Sync: wal.SyncAlways})
	if err != nil {
		t.Fatal(err)
	}
	m := inputs.NewMetrics(nil)
	s := New(config.HTTP{Listen: "127.0.0.1:0", MaxBodyBytes: config.MiB, TimeField: "time"}, &inputs.Pipeline{WAL: w, Metrics: m}, nil)
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	tr := &http.Transport{}
	client := &http.Client{Transport: tr}

	var mu sync.Mutex
	acked := 0
	sent := map[string]bool{} // bodies acknowledged
	var wg sync.WaitGroup
	for c := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				body := fmt.Sprintf("{\"c\":%d,\"i\":%d}\n{\"c\":%d,\"i\":%d,\"n\":2}\n", c, i, c, i)
				resp, err := client.Post("http://"+s.Addr().String()+"/v1/logs/app", "application/x-ndjson", strings.NewReader(body))
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
				mu.Lock()
				if resp.StatusCode == 200 {
					acked += 2
					for line := range strings.Lines(body) {
						sent[strings.TrimSpace(line)] = true
					}
				}
				committed := w.Stats().NextSeq - 1
				if committed < uint64(acked) {
					t.Errorf("%d records acknowledged, %d committed", acked, committed)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	cancel()
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	tr.CloseIdleConnections()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	w, err = wal.Open(dir, wal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	recs, err := w.Read(1, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != acked || acked != 80 {
		t.Fatalf("%d records after reopening, %d acknowledged, want 80", len(recs), acked)
	}
	// Bodies are parsed into reused buffers: each stored one must be
	// exactly one that was sent, once.
	for _, r := range recs {
		if !sent[string(r.Body)] {
			t.Fatalf("record %d: %s was not sent, or is stored twice", r.Seq, r.Body)
		}
		delete(sent, string(r.Body))
	}
}

func TestTLS(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t, t.TempDir())
	e := newEnv(t, withCertPool(pool), withConfig(func(c *config.HTTP) {
		c.TLS = config.HTTPTLS{CertFile: certFile, KeyFile: keyFile}
		c.Token = "tok"
	}))
	if !strings.HasPrefix(e.url, "https://") {
		t.Fatalf("url %s", e.url)
	}
	req, _ := http.NewRequest(http.MethodPost, e.url+"/v1/logs/secure", strings.NewReader(`{"over":"tls"}`))
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := e.client.Do(req)
	if err != nil {
		t.Fatalf("https: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if resp.TLS == nil || resp.ProtoMajor != 2 {
		t.Errorf("proto %s, TLS %v: want HTTP/2 over TLS", resp.Proto, resp.TLS != nil)
	}
	if b := e.bodies(); len(b) != 1 || b[0] != `{"over":"tls"}` {
		t.Fatalf("WAL holds %q", b)
	}

	// A plain-HTTP client gets no 2xx from the TLS port.
	plain := &http.Client{Transport: &http.Transport{}}
	defer plain.CloseIdleConnections()
	resp, err = plain.Post("http://"+e.s.Addr().String()+"/v1/logs/secure", "application/json", strings.NewReader(`{"a":1}`))
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Errorf("plain HTTP to the TLS port: %d", resp.StatusCode)
		}
	}
	// A client that does not trust the certificate is refused.
	untrusting := &http.Client{Transport: &http.Transport{}}
	defer untrusting.CloseIdleConnections()
	if resp, err := untrusting.Post(e.url+"/v1/logs/secure", "application/json", strings.NewReader(`{"a":1}`)); err == nil {
		resp.Body.Close()
		t.Errorf("untrusted certificate accepted")
	}
	if n := len(e.records()); n != 1 {
		t.Errorf("WAL holds %d records, want 1", n)
	}
	// Both failed handshakes are counted, as the forward input counts its
	// own; a connection closed before its handshake began (a TCP probe) is
	// not.
	probe, err := net.Dial("tcp", e.s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	probe.Close()
	time.Sleep(50 * time.Millisecond)
	if n := testutil.ToFloat64(e.m.Rejected.WithLabelValues(input, reasonTLSHandshake)); n != 2 {
		t.Errorf("%v TLS handshakes counted as refused, want 2 (plain HTTP, an untrusted certificate)", n)
	}
}

func TestStartErrors(t *testing.T) {
	e := newEnv(t)
	addr := e.s.Addr().String()
	pipe := &inputs.Pipeline{WAL: e.w}

	s := New(config.HTTP{Listen: addr}, pipe, nil)
	err := s.Start()
	if want := "listen on " + addr + ": address already in use"; err == nil || err.Error() != want {
		t.Errorf("start on a taken address: %v, want %q", err, want)
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("error %v is not EADDRINUSE", err)
	}
	if err := s.Serve(context.Background()); err == nil {
		t.Errorf("Serve without a listener returned nil")
	}

	s = New(config.HTTP{Listen: "127.0.0.1:0", TLS: config.HTTPTLS{CertFile: "/nonexistent/tls.crt", KeyFile: "/nonexistent/tls.key"}}, pipe, nil)
	if err := s.Start(); err == nil || !strings.Contains(err.Error(), "TLS for 127.0.0.1:0: load certificate") || !strings.Contains(err.Error(), "/nonexistent/tls.crt") {
		t.Errorf("start with a missing certificate: %v", err)
	}
	if s.Addr() != nil {
		t.Errorf("Addr %v after a failed Start", s.Addr())
	}

	s = New(config.HTTP{Listen: "127.0.0.1:http-no-such-port"}, pipe, nil)
	if err := s.Start(); err == nil || !strings.HasPrefix(err.Error(), "listen on 127.0.0.1:http-no-such-port: ") {
		t.Errorf("start on a bad address: %v", err)
	}
}

// TestShutdownFinishesInFlight: a request in flight when Serve's context
// ends is answered 200 once its append completes, and Serve returns nil.
func TestShutdownFinishesInFlight(t *testing.T) {
	var g *gatedWAL
	e := newEnv(t, withAppender(func(w *wal.WAL) inputs.Appender { g = newGated(w); return g }))
	answered := make(chan response, 1)
	go func() { answered <- e.post("/v1/logs/app", []byte(`{"a":1}`)) }()
	<-g.entered
	stopped := make(chan struct{})
	go func() { e.shutdown(); close(stopped) }()
	time.Sleep(100 * time.Millisecond)
	select {
	case <-stopped:
		t.Fatal("Serve returned with a request in flight")
	default:
	}
	close(g.gate)
	if r := <-answered; r.status != 200 {
		t.Fatalf("in-flight request answered %d %s", r.status, r.body)
	}
	<-stopped
	if n := len(e.records()); n != 1 {
		t.Fatalf("WAL holds %d records, want 1", n)
	}
}

// TestShutdownBounded: a request stuck in its append past the grace is
// cancelled, not acknowledged, and Serve returns.
func TestShutdownBounded(t *testing.T) {
	var g *gatedWAL
	e := newEnv(t, withShutdownTimeout(200*time.Millisecond), withStoreTimeout(time.Minute),
		withAppender(func(w *wal.WAL) inputs.Appender { g = newGated(w); return g }))
	answered := make(chan error, 1)
	go func() {
		resp, err := e.client.Post(e.url+"/v1/logs/app", "application/json", strings.NewReader(`{"a":1}`))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				err = errors.New("acknowledged")
			} else {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
		}
		answered <- err
	}()
	<-g.entered
	start := time.Now()
	e.shutdown()
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Serve took %v to return", d)
	}
	if err := <-answered; err == nil || err.Error() == "acknowledged" {
		t.Fatalf("stuck request: %v, want no acknowledgement", err)
	}
	if n := len(e.records()); n != 0 {
		t.Fatalf("WAL holds %d records", n)
	}
}

// TestShutdownCutsABodyShort: a body still arriving when the stop's grace
// ends is cut off as the service stops: counted as shutting_down, not as
// the client's read_error.
func TestShutdownCutsABodyShort(t *testing.T) {
	e := newEnv(t, withShutdownTimeout(200*time.Millisecond))
	c, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := fmt.Fprintf(c, "POST /v1/logs/app HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"a\":"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the handler reads the body
	e.shutdown()
	if n, r := e.rejected(reasonShutdown), e.rejected(reasonReadError); n != 1 || r != 0 {
		t.Fatalf("rejected: shutting_down %v, read_error %v; want 1 and 0", n, r)
	}
}

// A client that breaks its own connection mid-body during the stop's
// grace (its connection is not closed by the stop) is a read_error, not
// shutting_down.
func TestClientErrorDuringTheGrace(t *testing.T) {
	e := newEnv(t, withShutdownTimeout(5*time.Second))
	c, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Fprintf(c, "POST /v1/logs/app HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"a\":"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	e.stop() // the stop begins; its grace is 5 s
	time.Sleep(100 * time.Millisecond)
	c.Close() // the client's own fault, well within the grace
	e.shutdown()
	if e.rejected(reasonReadError) != 1 || e.rejected(reasonShutdown) != 0 {
		t.Errorf("client broke its connection during the grace: counted shutting_down %v, read_error %v", e.rejected(reasonShutdown), e.rejected(reasonReadError))
	}
}

// A body over the memory budget, arriving during the stop, is still a 413
// over_memory_budget (a retry cannot succeed), not 503 shutting_down.
func TestOverBudgetDuringTheStop(t *testing.T) {
	e := newEnv(t, withShutdownTimeout(5*time.Second), withConfig(func(c *config.HTTP) { c.MaxBodyBytes = 16 * config.MiB }), withBudget(4<<20))
	body := bytes.Repeat([]byte(`{"log":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}`+"\n"), 50_000)
	c, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/logs/app HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
	if _, err := c.Write(body[:1000]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	e.stop()
	time.Sleep(100 * time.Millisecond)
	go func() { _, _ = c.Write(body[1000:]) }()
	if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	e.shutdown()
	if resp.StatusCode != http.StatusRequestEntityTooLarge || e.rejected(reasonOverBudget) != 1 || e.rejected(reasonShutdown) != 0 {
		t.Errorf("a body over the budget during the stop: %d; over_memory_budget %v, shutting_down %v; want 413, 1, 0", resp.StatusCode, e.rejected(reasonOverBudget), e.rejected(reasonShutdown))
	}
}

// TestMemoryWaitCutByStop: a request waiting for room in the memory budget
// when the stop's grace ends is cut by the stop: shutting_down, not the
// client's canceled.
func TestMemoryWaitCutByStop(t *testing.T) {
	e := newEnv(t, withShutdownTimeout(300*time.Millisecond), withBudget(128<<10), withMemoryWait(10*time.Second))
	addr := strings.TrimPrefix(e.url, "http://")
	send := func(length, sent int) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := fmt.Fprintf(c, "POST /v1/logs/app HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", length, bytes.Repeat([]byte(" "), sent)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	send(900<<10, 50<<10) // holds most of the budget, its body stalled
	send(60<<10, 40<<10)  // waits for room
	e.shutdown()
	if c, n := e.rejected(reasonCanceled), e.rejected(reasonShutdown); c != 0 || n == 0 {
		t.Errorf("a request waiting for memory when the stop's grace ended: canceled %v, shutting_down %v; want 0 and more", c, n)
	}
}

// logRecorder keeps every log record's level and attributes.
type logRecorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r.Clone())
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

// attrOf is the value of r's attribute key, "" without one.
func attrOf(r slog.Record, key string) string {
	v := ""
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value.String()
			return false
		}
		return true
	})
	return v
}

// A refused request's log line carries what the client says of itself,
// its User-Agent and X-Forwarded-For (behind a load balancer the remote
// address is the balancer's), cut to a bound.
func TestRefusalLogsTheClient(t *testing.T) {
	rec := &logRecorder{}
	e := newEnv(t, withLogger(slog.New(rec)))
	long := strings.Repeat("x", 300)
	e.post("/v1/logs/app", []byte(`{"a":`), "User-Agent", "fluent-bit/4.0", "X-Forwarded-For", "10.1.2.3, "+long)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var ua, xff string
	for _, r := range rec.recs {
		if r.Message == "http request refused" {
			ua, xff = attrOf(r, "user_agent"), attrOf(r, "forwarded_for")
		}
	}
	if ua != "fluent-bit/4.0" || !strings.HasPrefix(xff, "10.1.2.3, xxx") || len(xff) != maxLoggedHeader+3 {
		t.Errorf("user_agent %q, forwarded_for %q (%d bytes); want the client's, cut to %d bytes and \"...\"", ua, xff, len(xff), maxLoggedHeader)
	}
	// Cut before a character that would not fit whole, not within it.
	for _, v := range []string{strings.Repeat("é", 150), "a" + strings.Repeat("€", 100)} {
		if c := clipHeader(v); !utf8.ValidString(c) || strings.ContainsRune(c, utf8.RuneError) || len(c) > maxLoggedHeader+3 {
			t.Errorf("clipHeader of %d bytes: %q (%d bytes)", len(v), c, len(c))
		}
	}
}

// TestBadInputQuiet: a client's bad requests are logged with its address
// and the reason, the first of each reason in a minute as a warning and
// the others at debug level only, and the server keeps serving.
func TestBadInputQuiet(t *testing.T) {
	rec := &logRecorder{}
	e := newEnv(t, withLogger(slog.New(rec)), withConfig(func(c *config.HTTP) { c.Token = "t"; c.MaxBodyBytes = 4096 }))
	auth := []string{"Authorization", "Bearer t"}
	e.post("/v1/logs/app", []byte(`{"a":1}`))
	e.post("/v1/logs/app", []byte(`{"a":`), auth...)
	e.post("/v1/logs/app", []byte(`{"b":`), auth...) // the same reason again
	e.post("/v1/logs/app", bytes.Repeat([]byte("x"), 5000), auth...)
	e.post("/v1/logs/app", []byte(`{"a":1}`), append(auth, "Content-Encoding", "br")...)
	e.do(http.MethodDelete, "/v1/logs/app", nil)

	if r := e.post("/v1/logs/app", []byte(`{"still":"serving"}`), auth...); r.status != 200 {
		t.Fatalf("after bad requests: %d %s", r.status, r.body)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	reasons := map[string]bool{}
	warned := map[string]int{}
	for _, r := range rec.recs {
		if r.Message == "listening" && r.Level == slog.LevelInfo {
			continue // the start's one line
		}
		if r.Level > slog.LevelDebug && (r.Level != slog.LevelWarn || r.Message != "http request refused") {
			t.Errorf("logged at %s: %s", r.Level, r.Message)
		}
		remote, reason := attrOf(r, "remote"), attrOf(r, "reason")
		if remote == "" || reason == "" {
			t.Errorf("log %q without remote address or reason", r.Message)
		}
		reasons[reason] = true
		if r.Level == slog.LevelWarn {
			warned[reason]++
		}
	}
	for _, want := range []string{"unauthorized", "malformed", "too_large", "unsupported_encoding", "bad_method"} {
		if !reasons[want] || warned[want] != 1 {
			t.Errorf("%s: logged %v, %d warnings; want one warning (have %v)", want, reasons[want], warned[want], warned)
		}
	}
}

// TestGarbageNeverCrashes throws random bodies, encodings and paths at a
// server and checks each gets an answer and the server still stores.
func TestGarbageNeverCrashes(t *testing.T) {
	e := newEnv(t, withConfig(func(c *config.HTTP) { c.MaxBodyBytes = 8 << 10 }))
	r := rand.New(rand.NewSource(1))
	pieces := []string{"{", "}", "[", "]", `"`, `\`, ":", ",", "\n", " ", "1", "-", "e", ".", "true", "null", `"time"`, "\xff", "\u00e9", `\u12`, "0x", "9999999999999999999999"}
	for i := range 300 {
		var b strings.Builder
		for range r.Intn(40) {
			b.WriteString(pieces[r.Intn(len(pieces))])
		}
		body := []byte(b.String())
		headers := []string{"Idempotency-Key", fmt.Sprint("k", i%7)}
		if i%5 == 0 {
			body = gzipped(string(body))
			headers = append(headers, "Content-Encoding", "gzip")
		}
		if i%11 == 0 {
			body = body[:len(body)/2]
		}
		got := e.post("/v1/logs/app", body, headers...)
		// 422: one of the seven keys again, with another body.
		if got.status != 200 && got.status != 400 && got.status != 422 {
			t.Fatalf("body %q: %d %s", body, got.status, got.body)
		}
	}
	if r := e.post("/v1/logs/app", []byte(`{"ok":true}`)); r.status != 200 {
		t.Fatalf("after garbage: %d %s", r.status, r.body)
	}
	if c := testutil.ToFloat64(e.m.Connections.WithLabelValues(input)); c < 1 {
		t.Errorf("connections gauge %v with a connection open", c)
	}
}

// countingReader counts the bytes read from it.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// TestHTTP2BuffersLittle: over HTTP/2 (TLS), a request whose handler waits
// for room in the memory budget is sent no further than the small flow
// control window: what net/http buffers for it outside the budget is tens
// of KiB, not the default window's megabyte.
func TestHTTP2BuffersLittle(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t, t.TempDir())
	e := newEnv(t, withCertPool(pool), withBudget(1<<20), withMemoryWait(30*time.Second), withConfig(func(c *config.HTTP) {
		c.TLS = config.HTTPTLS{CertFile: certFile, KeyFile: keyFile}
		c.MaxBodyBytes = 16 * config.MiB
	}))
	client := func() *http.Client {
		return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
	}
	// Bodies that never end take the budget.
	var stalls []*io.PipeWriter
	var wg sync.WaitGroup
	defer wg.Wait()
	defer func() {
		for _, w := range stalls {
			w.CloseWithError(errors.New("done"))
		}
	}()
	send := func(c *http.Client, body io.Reader) {
		req, _ := http.NewRequest(http.MethodPost, e.url+"/v1/logs/h2", body)
		wg.Go(func() {
			if resp, err := c.Do(req); err == nil {
				resp.Body.Close()
			}
		})
	}
	for range 12 {
		pr, pw := io.Pipe()
		stalls = append(stalls, pw)
		send(client(), pr)
		go pw.Write(bytes.Repeat([]byte("{}\n"), 40_000))
	}
	deadline := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(e.m.MemoryWaits.WithLabelValues(input)) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if testutil.ToFloat64(e.m.MemoryWaits.WithLabelValues(input)) == 0 {
		t.Fatalf("the budget is not full: %v held", testutil.ToFloat64(e.m.MemoryHeld.WithLabelValues(input)))
	}
	// A request that waits for room: how much of its body the client could
	// send beyond what its handler read (and holds of the budget).
	heldBefore := testutil.ToFloat64(e.m.MemoryHeld.WithLabelValues(input))
	pr, pw := io.Pipe()
	stalls = append(stalls, pw)
	go pw.Write(bytes.Repeat([]byte("{}\n"), 1<<20))
	cr := &countingReader{r: pr}
	c := client()
	send(c, cr)
	time.Sleep(2 * time.Second)
	resp, err := c.Get(e.url + "/") // the same connection: HTTP/2?
	if err != nil || resp.ProtoMajor != 2 {
		t.Fatalf("not HTTP/2: %v %v", resp, err)
	}
	resp.Body.Close()
	read := int64(testutil.ToFloat64(e.m.MemoryHeld.WithLabelValues(input)) - heldBefore)
	if n := cr.n.Load() - max(read, 0); n > 128<<10 {
		t.Errorf("the client sent %d KiB of a body beyond the %d KiB its handler read: buffered outside the budget", n>>10, read>>10)
	}
}

// A refusal of a client's token or certificate has its series (at 0) from
// the start: an alert's increase() sees the first refusal after a restart.
func TestUnauthorizedSeriesFromTheStart(t *testing.T) {
	e := newEnv(t)
	if n := testutil.CollectAndCount(e.m.Rejected, "forwarder_input_rejected_total"); n != 2 || e.rejected(reasonUnauth) != 0 || e.rejected(reasonTLSHandshake) != 0 {
		t.Fatalf("%d series of forwarder_input_rejected_total at the start, want unauthorized's and tls_handshake's", n)
	}
}

// TestHTTP2StreamsPerConnection: the server tells HTTP/2 clients (its
// SETTINGS frame) that a connection may have h2Streams requests at once,
// not Go's default of 250, each of which would hold a goroutine and its
// headers outside the memory budget.
func TestHTTP2StreamsPerConnection(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t, t.TempDir())
	e := newEnv(t, withCertPool(pool), withConfig(func(c *config.HTTP) {
		c.TLS = config.HTTPTLS{CertFile: certFile, KeyFile: keyFile}
	}))
	c, err := tls.Dial("tcp", e.s.Addr().String(), &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if p := c.ConnectionState().NegotiatedProtocol; p != "h2" {
		t.Fatalf("negotiated %q, not h2", p)
	}
	// The client's preface and an empty SETTINGS frame.
	if _, err := io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var head [9]byte
	for {
		if _, err := io.ReadFull(c, head[:]); err != nil {
			t.Fatalf("no SETTINGS frame from the server: %v", err)
		}
		n := int(head[0])<<16 | int(head[1])<<8 | int(head[2])
		payload := make([]byte, n)
		if _, err := io.ReadFull(c, payload); err != nil {
			t.Fatal(err)
		}
		if head[3] != 0x4 || head[4]&0x1 != 0 { // not SETTINGS, or its ACK
			continue
		}
		for i := 0; i+6 <= len(payload); i += 6 {
			id := int(payload[i])<<8 | int(payload[i+1])
			v := int(payload[i+2])<<24 | int(payload[i+3])<<16 | int(payload[i+4])<<8 | int(payload[i+5])
			if id == 0x3 { // SETTINGS_MAX_CONCURRENT_STREAMS
				if v != h2Streams {
					t.Fatalf("the server allows %d requests at once on a connection, want %d", v, h2Streams)
				}
				return
			}
		}
		t.Fatal("the server's SETTINGS do not limit the requests at once on a connection")
	}
}

// TestClientThatDoesNotReadIsClosed: a client that pipelines requests and
// never reads the answers has its connection closed after WriteTimeout,
// not held for good (an authenticated connection is never evicted).
func TestClientThatDoesNotReadIsClosed(t *testing.T) {
	// The server's own: longer than the longest a request may take
	// before its answer (its body's read and its waits), so that only a
	// client that does not read meets it.
	if d := newEnv(t).s.srv.WriteTimeout; d <= bodyMax+2*memoryWait+storeTimeout {
		t.Fatalf("WriteTimeout %v: a request reading its body for %v and waiting %v for memory and %v for the WAL could not be answered", d, bodyMax, 2*memoryWait, storeTimeout)
	}
	// The server's socket buffers a few answers only, so that its writes
	// block soon, however slowly it answers (a loaded machine, -race).
	e := newEnv(t, withWriteTimeout(time.Second), withListener(func(ln net.Listener) net.Listener { return smallSendBuffer{ln} }))
	c, err := net.Dial("tcp", e.s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.(*net.TCPConn).SetReadBuffer(4096)
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		body := "{\"a\":1}\n"
		fmt.Fprintf(c, "POST /v1/logs/t HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		req := []byte(strings.Repeat("GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", 1000))
		for range 200 {
			c.SetWriteDeadline(time.Now().Add(3 * time.Second))
			if _, err := c.Write(req); err != nil {
				return
			}
		}
	}()
	conns := func() float64 { return testutil.ToFloat64(e.m.Connections.WithLabelValues(input)) }
	deadline := time.Now().Add(3 * time.Second)
	for conns() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if conns() == 0 {
		t.Fatal("the connection was never counted")
	}
	deadline = time.Now().Add(20 * time.Second)
	for conns() > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := conns(); n > 0 {
		t.Fatalf("a client that reads no answer still holds %v connection(s) after 20 s (WriteTimeout 1 s)", n)
	}
	c.Close()
	<-wrote
}

// TestUncleanPathIsNotFound: a path that is not clean ("//", "." or "..")
// is answered 404 with a JSON error and counted, not redirected by
// ServeMux with an empty 307.
func TestUncleanPathIsNotFound(t *testing.T) {
	e := newEnv(t)
	for _, p := range []string{"/v1/logs/./x", "/v1//logs/x", "/v1/logs/..", "/v1/logs/a/../b"} {
		c, err := net.Dial("tcp", e.s.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}", p)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		b, _ := io.ReadAll(resp.Body)
		c.Close()
		if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(b), `"error"`) {
			t.Errorf("%s: %d %q, want 404 with a JSON error", p, resp.StatusCode, b)
		}
	}
	if n := e.rejected(reasonNotFound); n != 4 {
		t.Errorf("not_found counted %v times, want 4", n)
	}
	if st := e.w.Stats(); st.NextSeq != 1 {
		t.Errorf("records stored: next seq %d", st.NextSeq)
	}
}

// smallSendBuffer gives each accepted connection a send buffer of 4 KiB.
type smallSendBuffer struct{ net.Listener }

func (l smallSendBuffer) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetWriteBuffer(4 << 10)
	}
	return c, err
}

// TestH2CIsRefusedAsSuch: HTTP/2 with prior knowledge on the port without
// TLS is answered 505 and counted as unsupported_protocol, not as a path
// not found.
func TestH2CIsRefusedAsSuch(t *testing.T) {
	e := newEnv(t)
	c, err := net.Dial("tcp", e.s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, _ := io.ReadAll(c)
	if !strings.HasPrefix(string(b), "HTTP/1.1 505 ") || !strings.Contains(string(b), "HTTP/2 without TLS") {
		t.Errorf("answer %q", b)
	}
	if n := testutil.ToFloat64(e.m.Rejected.WithLabelValues(input, reasonProtocol)); n != 1 {
		t.Errorf("%v counted as unsupported_protocol", n)
	}
}
