package httpin

import (
	"bytes"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/wal"
)

// containerLog is a container runtime's log line as a JSON object of
// exactly size bytes (Docker / CRI style, with Kubernetes metadata).
func containerLog(r *rand.Rand, t time.Time, size int) []byte {
	paths := []string{"/api/v1/orders", "/api/v1/items", "/healthz", "/login", "/api/v2/carts"}
	s := fmt.Sprintf(`{"time":%q,"stream":"stdout","log":"INFO handled %s %s/%d status=%d dur=%dms","kubernetes":{"namespace_name":"prod","pod_name":"web-7d9f8c6b5-%05x","container_name":"web","host":"ip-10-0-%d-%d"}`,
		t.UTC().Format(time.RFC3339Nano), []string{"GET", "POST"}[r.Intn(2)], paths[r.Intn(len(paths))], r.Intn(100000),
		200+100*r.Intn(4), r.Intn(900), r.Intn(1<<20), r.Intn(4), r.Intn(255))
	pad := size - len(s) - len(`,"trace_id":""}`)
	b := make([]byte, max(pad, 0))
	for i := range b {
		b[i] = "0123456789abcdef"[r.Intn(16)]
	}
	return []byte(s + `,"trace_id":"` + string(b) + `"}`)
}

func ndjsonBody(n, size int) []byte {
	r := rand.New(rand.NewSource(1))
	t := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	var buf bytes.Buffer
	for i := range n {
		buf.Write(containerLog(r, t.Add(time.Duration(i)*time.Millisecond), size))
		buf.WriteByte('\n')
	}
	return buf.Bytes()
}

// BenchmarkHTTPNDJSON: 8 clients POST NDJSON bodies of 1,000 records of
// 250 bytes to a server on loopback; every answer waits for a committed,
// fsynced WAL transaction (SyncAlways).
func BenchmarkHTTPNDJSON(b *testing.B) {
	const clients, records, size = 8, 1000, 250
	e := newEnv(b, withWAL(wal.Options{Sync: wal.SyncAlways}), withConfig(func(c *config.HTTP) { c.MaxBodyBytes = 16 * config.MiB }))
	body := ndjsonBody(records, size)
	url := e.url + "/v1/logs/pod.prod.web"
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	b.ResetTimer()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				resp, err := e.client.Post(url, "application/x-ndjson", bytes.NewReader(body))
				if err != nil {
					b.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Errorf("status %d", resp.StatusCode)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N*records)/b.Elapsed().Seconds(), "records/s")
	if got := e.w.Stats().NextSeq - 1; got != uint64(b.N*records) {
		b.Fatalf("WAL holds %d records, want %d", got, b.N*records)
	}
}

// BenchmarkParseBody is the parser alone on the same bodies.
func BenchmarkParseBody(b *testing.B) {
	body := ndjsonBody(1000, 250)
	now := time.Now()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := parseBody(body, "pod.prod.web", "time", now); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*1000)/b.Elapsed().Seconds(), "records/s")
}
