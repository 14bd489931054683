package httpin

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/internal/nettest"
	"github.com/logfwd/forwarder/internal/syncbuf"
)

// Accept errors that pass by themselves (no file descriptor left, no
// buffer space, a connection aborted) are waited out and counted: the
// server goes on serving.
func TestAcceptErrorsAreRetried(t *testing.T) {
	errs := []error{nettest.AcceptError(syscall.EMFILE), nettest.AcceptError(syscall.ENFILE), nettest.AcceptError(syscall.ENOBUFS), nettest.AcceptError(syscall.ECONNABORTED)}
	e := newEnv(t, withListener(func(ln net.Listener) net.Listener { return &nettest.FaultListener{Listener: ln, Errs: errs} }))
	if r := e.post("/v1/logs/app", []byte(`{"a":1}`)); r.status != 200 {
		t.Fatalf("status %d %s", r.status, r.body)
	}
	if n := testutil.ToFloat64(e.m.AcceptErrors.WithLabelValues(input)); n != 4 {
		t.Fatalf("accept errors counted %v, want 4", n)
	}
	e.shutdown() // and Serve returned nil
}

// dialRaw opens a TCP connection to the server, closed at the test's end.
func dialRaw(t *testing.T, e *env) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", e.s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// keepAlive sends one request with a token on c, on a connection kept
// open, and reads its answer.
func keepAlive(t *testing.T, c net.Conn, token string) int {
	t.Helper()
	body := `{"a":1}`
	fmt.Fprintf(c, "POST /v1/logs/app HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s", token, len(body), body)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("answer: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// expectClosedAtOnce checks that the server closes c without an answer.
func expectClosedAtOnce(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if b, err := io.ReadAll(c); err != nil && !strings.Contains(err.Error(), "reset") || len(b) > 0 {
		t.Fatalf("the connection was not closed at once: %q, %v", b, err)
	}
}

// Connections beyond max_connections are closed at once and counted when
// every open one has sent an authenticated request; once one closes, a new
// one is served.
func TestMaxConnections(t *testing.T) {
	var logs syncbuf.Buffer
	e := newEnv(t, withLogger(slog.New(slog.NewTextHandler(&logs, nil))), withConfig(func(c *config.HTTP) { c.MaxConnections = 2; c.Token = "tok" }))
	open := func() float64 { return testutil.ToFloat64(e.m.Connections.WithLabelValues(input)) }
	waitOpen := func(n float64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for open() != n {
			if time.Now().After(deadline) {
				t.Fatalf("%v connections open, want %v", open(), n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	a, b := dialRaw(t, e), dialRaw(t, e)
	for _, c := range []net.Conn{a, b} {
		if status := keepAlive(t, c, "tok"); status != 200 {
			t.Fatalf("status %d", status)
		}
	}
	waitOpen(2)
	expectClosedAtOnce(t, dialRaw(t, e))
	if n := e.rejected("too_many_connections"); n != 1 {
		t.Fatalf("rejected{too_many_connections} = %v, want 1", n)
	}
	if !strings.Contains(logs.String(), `level=WARN msg="connection refused: max_connections reached"`) {
		t.Errorf("a connection refused at max_connections is not a warning; the log:\n%s", logs.String())
	}
	a.Close()
	waitOpen(1)
	if r := e.post("/v1/logs/app", []byte(`{"a":1}`), "Authorization", "Bearer tok"); r.status != 200 {
		t.Fatalf("after a connection closed: status %d %s", r.status, r.body)
	}
	if n := e.rejected("too_many_connections"); n != 1 || e.rejected("evicted") != 0 {
		t.Fatalf("rejected{too_many_connections} = %v, {evicted} = %v after a slot was free, want 1 and 0", n, e.rejected("evicted"))
	}
}

// Connections that have sent no authenticated request do not lock others
// out: with max_connections taken, a new connection takes the slot of the
// oldest of them, which is closed and counted. A request without the token
// is answered 401 and its connection closed.
func TestUnauthenticatedConnectionsGiveWay(t *testing.T) {
	var logs syncbuf.Buffer
	e := newEnv(t, withLogger(slog.New(slog.NewTextHandler(&logs, nil))), withConfig(func(c *config.HTTP) { c.MaxConnections = 3; c.Token = "tok" }))
	var idle []net.Conn
	for range 3 {
		idle = append(idle, dialRaw(t, e))
	}
	idle[2].Write([]byte("POST /v1/logs/app HTTP/1.1\r\n")) // half a request
	deadline := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(e.m.Connections.WithLabelValues(input)) != 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	// Three clients with the token are served, each on a connection it keeps.
	for i := range 3 {
		c := dialRaw(t, e)
		if status := keepAlive(t, c, "tok"); status != 200 {
			t.Fatalf("client %d: status %d", i, status)
		}
	}
	for _, c := range idle {
		expectClosedAtOnce(t, c)
	}
	if n := e.rejected("evicted"); n != 3 {
		t.Fatalf("rejected{evicted} = %v, want 3", n)
	}
	// The first of the minute is a warning, the others are not.
	if n := strings.Count(logs.String(), `level=WARN msg="closed a connection that has sent no authenticated request`); n != 1 {
		t.Errorf("%d warnings of evictions, want 1; the log:\n%s", n, logs.String())
	}
	// A wrong token is answered, and the connection closed.
	e2 := newEnv(t, withConfig(func(c *config.HTTP) { c.Token = "tok" }))
	c := dialRaw(t, e2)
	if status := keepAlive(t, c, "wrong"); status != 401 {
		t.Fatalf("wrong token: status %d", status)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatalf("the connection of a 401 stayed open (read %d bytes)", n)
	}
}

// A client that does not send its request's headers within
// read_header_timeout is disconnected, and its slot freed.
func TestReadHeaderTimeout(t *testing.T) {
	e := newEnv(t, withConfig(func(c *config.HTTP) {
		c.MaxConnections = 1
		c.ReadHeaderTimeout = config.Duration(200 * time.Millisecond)
	}))
	c, err := net.Dial("tcp", e.s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("POST /v1/logs/app HTTP/1.1\r\nHost: x\r\n")) // and then nothing
	start := time.Now()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	io.ReadAll(c)
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("closed after %v", d)
	}
	deadline := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(e.m.Connections.WithLabelValues(input)) != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if r := e.post("/v1/logs/app", []byte(`{"a":1}`)); r.status != 200 {
		t.Fatalf("status %d %s", r.status, r.body)
	}
	if n := testutil.ToFloat64(e.m.Rejected.WithLabelValues(input, reasonHeaderTimeout)); n != 1 {
		t.Errorf("%v connections counted as header_timeout, want 1", n)
	}
}

// TestSlowBodyIsATimeout: a body that stops arriving (here for more than
// a second) or does not arrive whole in time (here 2 s) is answered 503,
// which clients send again (not 408, which some drop; not 400); one that keeps
// arriving on a slow link gets in, past the request's read timeout.
func TestSlowBodyIsATimeout(t *testing.T) {
	body := []byte(`{"a":1}` + "\n" + `{"b":2}` + "\n" + `{"c":3}` + "\n")
	for _, c := range []struct {
		name    string
		pauses  []time.Duration // before each of the body's bytes after the first 5
		minRate float64         // bytes a second the body must keep to
		status  int
	}{
		{"stops", []time.Duration{1500 * time.Millisecond}, 5, http.StatusServiceUnavailable},
		{"slow link", slices.Repeat([]time.Duration{100 * time.Millisecond}, 16), 5, http.StatusOK},
		{"too slow in all", slices.Repeat([]time.Duration{150 * time.Millisecond}, 18), 5, http.StatusServiceUnavailable},
		// The same link, below the rate a body must keep: the request's
		// read timeout stands.
		{"trickle", slices.Repeat([]time.Duration{100 * time.Millisecond}, 16), 50, http.StatusServiceUnavailable},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, withReadTimeout(time.Second), withBodyTimes(time.Second, 2*time.Second, c.minRate))
			conn := dialRaw(t, e)
			fmt.Fprintf(conn, "POST /v1/logs/slow HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", len(body))
			conn.Write(body[:5])
			rest := body[5:]
			for i, d := range c.pauses {
				time.Sleep(d)
				n := len(rest) / (len(c.pauses) - i)
				conn.Write(rest[:n])
				rest = rest[n:]
			}
			conn.Write(rest)
			conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatalf("read response: %v", err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			stored := 3
			if c.status == http.StatusServiceUnavailable {
				stored = 0
				if e.rejected("read_timeout") != 1 || !strings.Contains(string(b), fmt.Sprintf("did not arrive whole in time (1s without %.0f bytes a second, or not whole within 2s)", c.minRate)) {
					t.Errorf("answer %s, read_timeout counted %v; want it once", b, e.rejected("read_timeout"))
				}
			}
			if resp.StatusCode != c.status || len(e.records()) != stored {
				t.Errorf("answer %d %s, %d records stored; want %d and %d", resp.StatusCode, b, len(e.records()), c.status, stored)
			}
		})
	}
}

// slowHandler takes pause to log a message that begins with prefix.
type slowHandler struct {
	slog.Handler
	prefix string
	pause  time.Duration
}

func (h slowHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return slowHandler{h.Handler.WithAttrs(as), h.prefix, h.pause}
}

func (h slowHandler) WithGroup(g string) slog.Handler {
	return slowHandler{h.Handler.WithGroup(g), h.prefix, h.pause}
}

func (h slowHandler) Handle(ctx context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, h.prefix) {
		time.Sleep(h.pause)
	}
	return h.Handler.Handle(ctx, r)
}

// TestEvictedBeforeItsHandlerStoresNothing: a connection evicted between
// its request's arrival and its handler marking it authenticated is
// dropped without an answer (a 200 would say stored), and its records are
// not stored either, or the client, sending them again, would have them
// stored twice.
func TestEvictedBeforeItsHandlerStoresNothing(t *testing.T) {
	arrived, evicted := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	first.Store(true)
	authHook = func() {
		if first.CompareAndSwap(true, false) {
			close(arrived)
			<-evicted
		}
	}
	t.Cleanup(func() { authHook = nil }) // after the server's end: cleanups run last first
	// The eviction's log line takes a while: the evicted connection is
	// closed only after it, and its handler goes on meanwhile.
	slow := slog.New(slowHandler{slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelDebug}), "closed a connection", 300 * time.Millisecond})
	e := newEnv(t, withLogger(slow), withConfig(func(c *config.HTTP) { c.MaxConnections = 1 }))
	c := dialRaw(t, e)
	body := `{"a":1}`
	fmt.Fprintf(c, "POST /v1/logs/app HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	<-arrived
	newer := dialRaw(t, e) // takes the slot of the one not yet authenticated
	deadline := time.Now().Add(5 * time.Second)
	for e.rejected("evicted") != 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	close(evicted)
	expectClosedAtOnce(t, c)
	if status := keepAlive(t, newer, ""); status != 200 {
		t.Fatalf("the newer connection: status %d", status)
	}
	if n := len(e.records()); n != 1 {
		t.Errorf("%d records stored, want the newer connection's alone", n)
	}
}

// TestRefusedHeadsAreCounted: a request head net/http refuses itself,
// before the handler (400, 431, 501), is counted as bad_request_head and
// said, also on a connection that served requests before it; a head not
// whole within read_header_timeout is header_timeout; a client that goes
// away in the middle of its head, and good requests, are neither.
func TestRefusedHeadsAreCounted(t *testing.T) {
	big := strings.Repeat("x", 20<<10)
	for _, c := range []struct {
		name, head string
		good       bool // a good request first, on the same connection
		status     int  // the answer; 0: none (the client closes first, or the head times out)
		closeFirst bool // the client closes its side after the head
		reason     string
		why        string
	}{
		{name: "malformed", head: "GARBAGE\r\n\r\n", status: 400, reason: reasonBadHead, why: "a malformed request line or header"},
		{name: "after a good request", head: "POST /v1/logs/app HTTP/1.1\r\nHost: x\r\nBad Header: 1\r\n\r\n", good: true, status: 400, reason: reasonBadHead, why: "a malformed request line or header"},
		{name: "headers too large", head: "POST /v1/logs/app HTTP/1.1\r\nHost: x\r\nX-Big: " + big + "\r\n\r\n", status: 431, reason: reasonBadHead, why: "headers over 16 KiB"},
		{name: "transfer encoding", head: "POST /v1/logs/app HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", status: 501, reason: reasonBadHead, why: "a Transfer-Encoding other than chunked"},
		{name: "unfinished", head: "POST /v1/logs/app HTTP/1.1\r\nHost: x\r\n", reason: reasonHeaderTimeout, why: "no whole request head within read_header_timeout"},
		{name: "unfinished after a good request", head: "POST /v1/logs/app HTTP/1.1\r\nHost: x\r\n", good: true, reason: reasonHeaderTimeout, why: "no whole request head within read_header_timeout"},
		{name: "client gone", head: "POST /v1/logs/app HTTP/1.1\r\nHost: x\r\n", closeFirst: true},
		{name: "good only", good: true, closeFirst: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var logs syncbuf.Buffer
			e := newEnv(t, withLogger(slog.New(slog.NewTextHandler(&logs, nil))), withConfig(func(h *config.HTTP) {
				h.ReadHeaderTimeout = config.Duration(300 * time.Millisecond)
			}))
			conn := dialRaw(t, e)
			if c.good {
				if status := keepAlive(t, conn, ""); status != 200 {
					t.Fatalf("good request: %d", status)
				}
			}
			io.WriteString(conn, c.head)
			if c.closeFirst {
				conn.Close()
			} else {
				conn.SetReadDeadline(time.Now().Add(5 * time.Second))
				b, _ := io.ReadAll(conn)
				if got := string(b); c.status != 0 && !strings.HasPrefix(got, fmt.Sprintf("HTTP/1.1 %d ", c.status)) || c.status == 0 && got != "" {
					t.Fatalf("answer %q, want status %d", got, c.status)
				}
			}
			// The count follows the warning; the connection's close, both.
			deadline := time.Now().Add(5 * time.Second)
			for (testutil.ToFloat64(e.m.Connections.WithLabelValues(input)) != 0 || c.reason != "" && e.rejected(c.reason) == 0) && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			time.Sleep(20 * time.Millisecond) // for a count that should not come
			for _, r := range []string{reasonBadHead, reasonHeaderTimeout} {
				want := 0.0
				if r == c.reason {
					want = 1
				}
				if n := e.rejected(r); n != want {
					t.Errorf("%s counted %v times, want %v", r, n, want)
				}
			}
			if c.why != "" && !strings.Contains(logs.String(), c.why) {
				t.Errorf("log does not say %q:\n%s", c.why, logs.String())
			}
			if c.reason == reasonBadHead && !strings.Contains(logs.String(), fmt.Sprintf("status=%d", c.status)) {
				t.Errorf("log does not name status %d:\n%s", c.status, logs.String())
			}
		})
	}
}

// A request the handler refuses and whose connection it closes (a wrong
// token) is counted once, as the handler's refusal: neither a head refused
// nor one not whole in time.
func TestHandlerRefusalIsNoRefusedHead(t *testing.T) {
	e := newEnv(t, withConfig(func(h *config.HTTP) {
		h.Token = "tok"
		h.ReadHeaderTimeout = config.Duration(300 * time.Millisecond)
	}))
	for i := 0; i < 3; i++ {
		conn := dialRaw(t, e)
		if status := keepAlive(t, conn, "wrong"); status != 401 {
			t.Fatalf("wrong token: %d", status)
		}
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		io.ReadAll(conn) // until the server closes it
	}
	deadline := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(e.m.Connections.WithLabelValues(input)) != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	if a, b, u := e.rejected(reasonBadHead), e.rejected(reasonHeaderTimeout), e.rejected(reasonUnauth); a != 0 || b != 0 || u != 3 {
		t.Errorf("counted bad_request_head %v, header_timeout %v, unauthorized %v; want 0, 0, 3", a, b, u)
	}
}

// Over TLS the status of net/http's refusal is not seen, but the refusal
// is counted.
func TestRefusedHeadOverTLS(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t, t.TempDir())
	var logs syncbuf.Buffer
	e := newEnv(t, withCertPool(pool), withLogger(slog.New(slog.NewTextHandler(&logs, nil))), withConfig(func(c *config.HTTP) {
		c.TLS = config.HTTPTLS{CertFile: certFile, KeyFile: keyFile}
	}))
	conn, err := tls.Dial("tcp", e.s.Addr().String(), &tls.Config{RootCAs: pool, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "GARBAGE\r\n\r\n")
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, _ := io.ReadAll(conn)
	if !strings.HasPrefix(string(b), "HTTP/1.1 400 ") {
		t.Fatalf("answer %q", b)
	}
	deadline := time.Now().Add(5 * time.Second)
	for e.rejected(reasonBadHead) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := e.rejected(reasonBadHead); n != 1 {
		t.Errorf("bad_request_head counted %v times, want 1", n)
	}
	if !strings.Contains(logs.String(), "over TLS the status is not known") {
		t.Errorf("log:\n%s", logs.String())
	}
}
