package s3sink

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/queue"
	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// countingSink accepts everything and counts what it got: the other sink
// on the WAL, which an S3 outage must not hold up.
type countingSink struct {
	mu  sync.Mutex
	got map[uint64]int
}

func (c *countingSink) Limits() sinks.Limits {
	return sinks.Limits{MaxRecords: 100, MaxBytes: 1 << 20, MaxAge: 10 * time.Millisecond, Concurrency: 4}
}
func (c *countingSink) Partition(r *sinks.Record) string { return r.Tag }
func (c *countingSink) Size(r *sinks.Record) int         { return len(r.Body) }
func (c *countingSink) Send(_ context.Context, b *sinks.Batch) (sinks.Outcome, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range b.Records {
		c.got[r.Seq]++
	}
	return sinks.Outcome{}, nil
}

func TestOutageLosesNothing(t *testing.T) {
	srv, url := startEmu(t)
	cfg := testConfig(url)
	cfg.MaxObjectBytes = 8 * config.KiB
	cfg.Key = "o/${tag}/${seq}"
	w := openWAL(t, t.TempDir())

	other := &countingSink{got: map[uint64]int{}}
	runDrainer(t, w, "other", other, drainerOptions())
	opts := drainerOptions()
	opts.Metrics = queue.NewMetrics(prometheus.NewRegistry())
	d := queue.New(w, "archive", newTestSink(t, cfg), opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("drainer: %v", err)
		}
	}()

	var want []string
	var last uint64
	appendSome := func(phase string) {
		for i := range 10 {
			var recs []wal.Record
			for j := range 20 {
				id := fmt.Sprintf("%s-%d-%d", phase, i, j)
				want = append(want, id)
				recs = append(recs, rec(fmt.Sprintf("t%d", j%3), id, time.Now(), 50))
			}
			last = appendRecs(t, w, recs).Last
			time.Sleep(10 * time.Millisecond)
		}
	}

	for _, outage := range []struct {
		name       string
		start, end func()
		check      func()
	}{
		{"503 SlowDown", func() { srv.SetFailures(1) }, func() { srv.SetFailures(0) }, func() {
			waitFor(t, "throttled retries", func() bool {
				return testutil.ToFloat64(opts.Metrics.Retries.WithLabelValues("archive", "throttled", "SlowDown")) > 2
			})
		}},
		{"403 AccessDenied", func() { srv.SetDenyAll(true) }, func() { srv.SetDenyAll(false) }, func() {
			waitFor(t, "the sink paused", func() bool {
				st := d.Status()
				return st.State == "paused" && strings.Contains(st.LastError, "access denied to bucket logs (AccessDenied)")
			})
		}},
	} {
		outage.start()
		appendSome(outage.name)
		// The other sink drains meanwhile; S3 gets nothing.
		waitCursor(t, w, "other", last, 10*time.Second)
		if pos, _ := w.Cursor("archive"); pos >= last {
			t.Fatalf("%s: the S3 sink passed everything during the outage", outage.name)
		}
		outage.check()
		outage.end()
		waitCursor(t, w, "archive", last, 20*time.Second)
		t.Logf("%s: drainer %+v", outage.name, d.Status())
	}
	checkOnce(t, readObjects(t, newReader(t, url), "o/"), want)
	other.mu.Lock()
	defer other.mu.Unlock()
	if len(other.got) != len(want) {
		t.Errorf("other sink got %d records, want %d", len(other.got), len(want))
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 20 s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
