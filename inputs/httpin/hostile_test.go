package httpin

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/internal/heaptest"
	"github.com/logfwd/forwarder/internal/syncbuf"
)

// The bounds of the probes, with the runtime's memory limit at the default
// memory_limit, 128 MiB, as run sets it:
//   - Hold: what the server may hold (the live heap once the probe has
//     taken what it will, above the heap before it): the inputs' budget at
//     the default memory_limit and its reserve for small requests (48 and
//     3 MiB: bodies, decompressed, and the records parsed from them), and
//     8 MiB for the rest: connection state, net/http's buffers, the WAL;
//   - Heap: what the whole heap, garbage included, may reach meanwhile:
//     the memory limit, and a quarter for the collector to catch up (it
//     reached 137 MiB once, without -race).
var bounds = heaptest.Bounds{
	Limit: 128 << 20,
	Hold:  51<<20 + 8<<20,
	Heap:  128<<20 + 32<<20,
	Gauge: 51 << 20, // the budget and its reserve
}

// hostileRequest is what a hostile client sends: headers and a body, all of
// it (whole) or all but its last byte, the connection then kept open.
type hostileRequest struct {
	name    string
	conns   int
	headers string // beside Host and Content-Length
	length  int    // the Content-Length sent; 0: the body's
	body    func(testing.TB) []byte
	whole   bool
	status  int    // with whole: the answer
	reason  string // with whole and a status other than 200: counted for each
}

// The hostile clients of the HTTP input. None of them may take the server's
// memory beyond its budget, stop a well-behaved client from being answered
// 200 meanwhile, or get anything stored.
func TestHostileClients(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: hostile clients, some of them slow on purpose; make test runs it")
	}
	probes := []hostileRequest{
		{name: "unfinished 15 MB bodies", conns: 40, body: func(testing.TB) []byte { return bytes.Repeat([]byte("{}\n"), 5_000_000) }},
		{name: "Content-Length of 16 MiB and 5 bytes sent", conns: 40, length: 16 << 20, body: func(testing.TB) []byte { return []byte(`{"a":`) }, whole: true},
		{name: "gzip bomb of 5.5M tiny records", conns: 1, headers: "Content-Encoding: gzip\r\n", body: gzipBomb, whole: true, status: 413, reason: "too_many_records"},
		{name: "100,001 records", conns: 4, body: func(testing.TB) []byte { return bytes.Repeat([]byte("{}\n"), 100_001) }, whole: true, status: 413, reason: "too_many_records"},
		{name: "gzip bomb of 16M blank lines", conns: 1, headers: "Content-Encoding: gzip\r\n", body: blankLines, whole: true, status: 400, reason: "malformed"},
	}
	for _, p := range probes {
		t.Run(p.name, func(t *testing.T) {
			e := newEnv(t, withConfig(func(c *config.HTTP) { c.MaxBodyBytes = 16 * config.MiB }), withMemoryWait(time.Second))
			body := p.body(t)
			length := p.length
			if length == 0 {
				length = len(body)
			}
			if !p.whole {
				body = body[:len(body)-1]
			}
			req := append([]byte(fmt.Sprintf("POST /v1/logs/hostile HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n", length, p.headers)), body...)
			var wg sync.WaitGroup
			var hostile []net.Conn
			statuses := make(chan int, p.conns)
			heaptest.Probe(t, bounds, p.conns, func() {
				for range p.conns {
					c := dialRaw(t, e)
					hostile = append(hostile, c)
					wg.Go(func() {
						c.SetDeadline(time.Now().Add(30 * time.Second))
						if _, err := c.Write(req); err != nil || length > len(body) && p.whole {
							return // refused while sending, or a body that never ends
						}
						if p.whole {
							if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
								statuses <- resp.StatusCode
								resp.Body.Close()
							}
						}
					})
				}
			}, func() {
				// A well-behaved client is answered meanwhile.
				if r := e.post("/v1/logs/good", []byte(`{"good":1}`)); r.status != 200 {
					t.Fatalf("a well-behaved client: %d %s", r.status, r.body)
				}
			}, func() float64 { return testutil.ToFloat64(e.m.MemoryHeld.WithLabelValues(input)) })

			if p.whole && p.status != 0 {
				for range p.conns {
					select {
					case got := <-statuses:
						if got != p.status {
							t.Errorf("answered %d, want %d", got, p.status)
						}
					case <-time.After(30 * time.Second):
						t.Fatal("a hostile request was not answered")
					}
				}
				if p.reason != "" {
					if n := e.rejected(p.reason); n != float64(p.conns) {
						t.Errorf("rejected{%s} = %v, want %d", p.reason, n, p.conns)
					}
				}
			}
			for _, c := range hostile {
				c.Close()
			}
			wg.Wait()
			// The server is up, and nothing of the hostile requests was stored.
			if r := e.post("/v1/logs/good", []byte(`{"good":2}`)); r.status != 200 {
				t.Fatalf("after the probe: %d %s", r.status, r.body)
			}
			if got := strings.Join(e.bodies(), " "); got != `{"good":1} {"good":2}` {
				t.Fatalf("stored %.200s, want the well-behaved client's 2 records", got)
			}
			runtime.KeepAlive(req) // in the heap before the probe, and to its end
		})
	}
}

var (
	bombOnce sync.Once
	bomb     []byte
)

// gzipBomb is 16 KB of gzip holding 5.5M lines of {}: 16.5 MB, within
// max_body_bytes once decompressed.
func gzipBomb(t testing.TB) []byte {
	bombOnce.Do(func() { bomb = gzipRepeat([]byte("{}\n"), 5_500_000, nil, nil) })
	if len(bomb) > 24_000 {
		t.Fatalf("the gzip bomb takes %d bytes", len(bomb))
	}
	return bomb
}

// blankLines is a gzip body of a record, 16M blank lines and a line that is
// not JSON: one record in 16M lines, and refused.
func blankLines(testing.TB) []byte {
	return gzipRepeat([]byte("\n"), 16_000_000, []byte("{}"), []byte("x"))
}

// gzipRepeat is gzip of first, n times b, then last: members of 100,000
// times b (one compressed, repeated), and one for the rest.
func gzipRepeat(b []byte, n int, first, last []byte) []byte {
	member := func(p []byte) []byte {
		var z bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&z, gzip.BestCompression)
		zw.Write(p)
		zw.Close()
		return z.Bytes()
	}
	out := member(first)
	out = append(out, bytes.Repeat(member(bytes.Repeat(b, 100_000)), n/100_000)...)
	return append(out, member(append(bytes.Repeat(b, n%100_000), last...))...)
}

// The largest request the default limits allow, 16 MB of 100,000 records,
// fits the default budget: it is stored, not refused as over the budget.
func TestLargestRequestFits(t *testing.T) {
	var logs syncbuf.Buffer
	e := newEnv(t, withLogger(slog.New(slog.NewTextHandler(&logs, nil))), withConfig(func(c *config.HTTP) { c.MaxBodyBytes = 16 * config.MiB }))
	line := []byte(`{"log":"` + strings.Repeat("x", 150) + "\"}\n")
	body := bytes.Repeat(line, 100_000)
	if len(body) > 16<<20 || len(body) < 16_000_000 {
		t.Fatalf("the body takes %d bytes", len(body))
	}
	if r := e.post("/v1/logs/app", body); r.status != 200 || r.body != `{"stored":100000}` {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if strings.Contains(logs.String(), "a request of max_body_bytes needs more memory") {
		t.Errorf("warned that the default limits do not fit the default budget:\n%s", logs.String())
	}
}

// A request larger than the budget can ever hold for one is answered 413
// at once, saying so; other clients go on.
func TestRequestOverBudget(t *testing.T) {
	var logs syncbuf.Buffer
	e := newEnv(t, withLogger(slog.New(slog.NewTextHandler(&logs, nil))), withConfig(func(c *config.HTTP) { c.MaxBodyBytes = 16 * config.MiB }), withBudget(4<<20))
	start := time.Now()
	r := e.post("/v1/logs/app", bytes.Repeat([]byte(`{"log":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}`+"\n"), 50_000)) // 2.5 MB
	if r.status != 413 || !strings.Contains(r.body, "needs more memory than the forwarder gives one request") || time.Since(start) > 5*time.Second {
		t.Fatalf("%d %s after %v, want 413 at once", r.status, r.body, time.Since(start))
	}
	if n := e.rejected("over_memory_budget"); n != 1 {
		t.Fatalf("rejected{over_memory_budget} = %v", n)
	}
	if r := e.post("/v1/logs/app", []byte(`{"a":1}`)); r.status != 200 {
		t.Fatalf("then: %d %s", r.status, r.body)
	}
	if n := len(e.records()); n != 1 {
		t.Fatalf("%d records stored, want 1", n)
	}
	if !strings.Contains(logs.String(), "a request of max_body_bytes needs more memory than the inputs' budget gives one request") {
		t.Fatalf("no warning at start that max_body_bytes does not fit the budget:\n%s", logs.String())
	}
}

// TestLargestRequestSaidAtStart: with a budget too small for a request of
// max_body_bytes, the start says so and names the largest request that
// fits, which is stored.
func TestLargestRequestSaidAtStart(t *testing.T) {
	var logs syncbuf.Buffer
	e := newEnv(t, withLogger(slog.New(slog.NewTextHandler(&logs, nil))), withConfig(func(c *config.HTTP) { c.MaxBodyBytes = 16 * config.MiB }), withBudget(8<<20))
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(logs.String(), "msg=listening") && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	m := regexp.MustCompile(`level=WARN msg="a request of max_body_bytes needs more memory than the inputs' budget gives one request.* largest_request=([0-9]+)(B|KiB|MiB)\b`).FindStringSubmatch(logs.String())
	if m == nil {
		t.Fatalf("no warning at start that max_body_bytes does not fit the budget:\n%s", logs.String())
	}
	largest, _ := strconv.Atoi(m[1])
	largest *= map[string]int{"B": 1, "KiB": 1 << 10, "MiB": 1 << 20}[m[2]]
	if largest < 512<<10 {
		t.Fatalf("largest_request %d bytes with a budget of 8 MiB", largest)
	}
	line := []byte(`{"log":"` + strings.Repeat("x", 150) + "\"}\n")
	body := bytes.Repeat(line, largest/len(line))
	if r := e.post("/v1/logs/app", body); r.status != 200 {
		t.Fatalf("a request of the largest_request said (%d bytes): %d %s", len(body), r.status, r.body)
	}
}

// While the budget is held by others, a request that needs more than what
// is left waits for room for a while, then is answered 503 with
// Retry-After; small requests are served from the reserve kept for them;
// once room is back, the large request is stored.
func TestBudgetFullAnswers503(t *testing.T) {
	e := newEnv(t, withConfig(func(c *config.HTTP) { c.MaxBodyBytes = 16 * config.MiB }), withBudget(8<<20),
		withMemoryWait(200*time.Millisecond))
	// A body of 3.5 MB that never ends holds 4 MiB of the budget.
	c := dialRaw(t, e)
	fmt.Fprintf(c, "POST /v1/logs/hostile HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", 4_000_000)
	c.Write(bytes.Repeat([]byte("{}\n"), 3_500_000/3))
	deadline := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(e.m.MemoryHeld.WithLabelValues(input)) < 4<<20 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	// 1.8 MB: its body, its compacted copy and its records take more than
	// the 4 MiB left.
	large := bytes.Repeat([]byte(`{"log":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}`+"\n"), 36_000)
	r := e.post("/v1/logs/app", large)
	if r.status != 503 || r.header.Get("Retry-After") != "1" || !strings.Contains(r.body, "retry later") {
		t.Fatalf("a large request while the budget is held: %d %q %s", r.status, r.header.Get("Retry-After"), r.body)
	}
	if n := e.rejected("memory_full"); n != 1 {
		t.Fatalf("rejected{memory_full} = %v", n)
	}
	if n := testutil.ToFloat64(e.m.MemoryWaits.WithLabelValues(input)); n < 1 {
		t.Fatalf("forwarder_input_memory_waits_total = %v", n)
	}
	if r := e.post("/v1/logs/app", []byte(`{"small":1}`)); r.status != 200 {
		t.Fatalf("a small request meanwhile: %d %s", r.status, r.body)
	}
	c.Close()
	deadline = time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(e.m.MemoryHeld.WithLabelValues(input)) != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if r := e.post("/v1/logs/app", large); r.status != 200 {
		t.Fatalf("the large request again, with room: %d %s", r.status, r.body)
	}
	if n := len(e.records()); n != 36_001 {
		t.Fatalf("%d records stored, want 36,001", n)
	}
}
