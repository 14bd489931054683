package s3sink

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/queue"
	"github.com/logfwd/forwarder/wal"
)

// TestKeyChangeAfterAnUndrainedStop: objects of one tag are delivered
// ahead of the cursor, which an open object of another tag holds back; the
// service stops without draining (a crash, a stop cut short) and starts
// with another key template. What the first run delivered is not sent
// again under the new keys: the marks of the earlier partitioning are read
// through its own key template.
func TestKeyChangeAfterAnUndrainedStop(t *testing.T) {
	for _, c := range []struct {
		name      string
		key, key2 string
		// interrupted: an upload of fast fails when the service stops,
		// leaving its intent: the next start finishes it under its old key.
		interrupted bool
	}{
		{"prefix changed", "a/${tag}/${seq}", "b/${tag}/${seq}", false},
		{"prefix changed, an upload interrupted", "a/${tag}/${seq}", "b/${tag}/${seq}", true},
		// The new key of slow-1 is the old key of fast's records, which
		// delivered past it: a mark of the earlier partitioning must not
		// be taken for today's.
		{"tags swapped", "${tag}/${seq}", "${record.other}/${seq}", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv, url := startEmu(t)
			w := openWAL(t, t.TempDir())
			cfg := testConfig(url)
			cfg.Key, cfg.MaxObjectBytes, cfg.MaxObjectAge = c.key, 2*config.KiB, config.Duration(time.Hour)

			var want []string
			at := time.Now()
			var recs []wal.Record
			add := func(tag, other, id string) {
				want = append(want, id)
				recs = append(recs, recOther(tag, other, id, at))
			}
			// slow's records stay in an open object, the first holding the
			// cursor at 0. Under the second template the other slow record
			// is in fast's old key, which delivered past it.
			add("slow", "none", "slow-0")
			for i := range 200 {
				if i == 100 {
					add("slow", "fast", "slow-1")
				}
				add("fast", "slow", fmt.Sprintf("fast-%d", i))
			}
			last := appendRecs(t, w, recs).Last

			opts := drainerOptions()
			opts.Logger = testLogger(t)
			opts.Metrics = queue.NewMetrics(prometheus.NewRegistry())
			s := newTestSink(t, cfg)
			opts.Fingerprint = s.Fingerprint()
			stop := runDrainer(t, w, "archive", s, opts)
			delivered := opts.Metrics.Delivered.WithLabelValues("archive")
			waitFor(t, "objects of fast delivered", func() bool { return testutil.ToFloat64(delivered) >= 150 })
			if c.interrupted {
				srv.SetFailures(1)
				var more []wal.Record
				for i := range 60 {
					id := fmt.Sprintf("fast-more-%d", i)
					want = append(want, id)
					more = append(more, recOther("fast", "slow", id, at))
				}
				last = appendRecs(t, w, more).Last
				waitFor(t, "a failed upload", func() bool {
					return testutil.ToFloat64(opts.Metrics.Retries.WithLabelValues("archive", "throttled", "SlowDown")) > 0
				})
			}
			stop() // not drained: slow-0 and the last fast records are in open objects
			srv.SetFailures(0)
			if pos, _ := w.Cursor("archive"); pos != 0 {
				t.Fatalf("cursor at %d, want 0 (held by the open object of slow)", pos)
			}
			first := testutil.ToFloat64(delivered)

			cfg.Key, cfg.MaxObjectAge = c.key2, config.Duration(50*time.Millisecond)
			opts.Metrics = queue.NewMetrics(prometheus.NewRegistry())
			s2 := newTestSink(t, cfg)
			opts.Fingerprint = s2.Fingerprint()
			runDrainer(t, w, "archive", s2, opts)
			waitCursor(t, w, "archive", last, 20*time.Second)
			checkOnce(t, readObjects(t, newReader(t, url), ""), want)
			// (With an upload finished at the start, its records are skipped
			// too: checkOnce is what counts there.)
			if got := testutil.ToFloat64(opts.Metrics.Skipped.WithLabelValues("archive")); !c.interrupted && got != first {
				t.Errorf("skipped %v records delivered before the restart, want %v", got, first)
			}
		})
	}
}

// TestMatchWidenedAfterAnUndrainedStop: a key without ${tag} puts two
// tags in one partition, of which the sink's match took one; its objects
// are delivered ahead of the cursor (held by another partition's open
// object), the service stops without draining and starts with a match
// that takes both tags. The records of the tag taken now are sent, not
// skipped under the mark of what the partition delivered for the other.
func TestMatchWidenedAfterAnUndrainedStop(t *testing.T) {
	_, url := startEmu(t)
	w := openWAL(t, t.TempDir())
	cfg := testConfig(url)
	cfg.Key, cfg.MaxObjectBytes, cfg.MaxObjectAge = "${record.other}/${seq}", 2*config.KiB, config.Duration(time.Hour)
	want, last := appendShared(t, w)

	opts := drainerOptions()
	opts.Logger = testLogger(t)
	opts.Metrics = queue.NewMetrics(prometheus.NewRegistry())
	opts.MatchGlobs = []string{"slow", "taken"}
	s := newTestSink(t, cfg)
	opts.Fingerprint = s.Fingerprint()
	stop := runDrainer(t, w, "archive", s, opts)
	delivered := opts.Metrics.Delivered.WithLabelValues("archive")
	waitFor(t, "objects of taken delivered", func() bool { return testutil.ToFloat64(delivered) >= 150 })
	stop()
	if pos, _ := w.Cursor("archive"); pos != 0 {
		t.Fatalf("cursor at %d, want 0 (held by the open object of slow)", pos)
	}
	first := testutil.ToFloat64(delivered)

	cfg.MaxObjectAge = config.Duration(50 * time.Millisecond)
	opts.Metrics = queue.NewMetrics(prometheus.NewRegistry())
	opts.MatchGlobs, opts.Match = []string{"**"}, nil
	runDrainer(t, w, "archive", newTestSink(t, cfg), opts)
	waitCursor(t, w, "archive", last, 20*time.Second)
	checkOnce(t, readObjects(t, newReader(t, url), ""), want)
	if got := testutil.ToFloat64(opts.Metrics.Skipped.WithLabelValues("archive")); got != first {
		t.Errorf("skipped %v records delivered before the restart, want %v", got, first)
	}
}

// appendShared appends a record of tag slow (other "open": with a key of
// ${record.other} its open object holds the cursor at 0), then 200 each of
// tags taken and later, interleaved, whose other is "shared". It returns
// their ids and the last sequence number.
func appendShared(t *testing.T, w *wal.WAL) ([]string, uint64) {
	t.Helper()
	at := time.Now()
	var want []string
	var recs []wal.Record
	add := func(tag, other, id string) {
		want = append(want, id)
		recs = append(recs, recOther(tag, other, id, at))
	}
	add("slow", "open", "slow-0")
	for i := range 200 {
		add("taken", "shared", fmt.Sprintf("taken-%d", i))
		add("later", "shared", fmt.Sprintf("later-%d", i))
	}
	return want, appendRecs(t, w, recs).Last
}

// recOther is rec (a body of 40 bytes) with an "other" field, for key
// templates that render it.
func recOther(tag, other, id string, at time.Time) wal.Record {
	r := rec(tag, id, at, 40)
	r.Body = fmt.Appendf(r.Body[:len(r.Body)-1], `,"other":%q}`, other)
	return r
}

// TestInterruptedUploadAfterAChange: in the first run after a change of
// match or key, a partition's batch leaves out the records partitions of
// the earlier configuration delivered (a batch with gaps); its upload is
// interrupted (S3 refusing it when the run stops). At the next start,
// Recover reads the batch back leaving out the same records, and finishes
// it: before, it read them too, found more records than the intent held,
// and failed the start, at every start.
func TestInterruptedUploadAfterAChange(t *testing.T) {
	for _, c := range []struct {
		name   string
		key1   string
		match1 []string
	}{
		{name: "match widened", key1: "${record.other}/${seq}", match1: []string{"slow", "taken"}},
		{name: "key changed", key1: "${tag}/${seq}", match1: []string{"**"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			key2, match2 := "${record.other}/${seq}", []string{"**"}
			srv, url := startEmu(t)
			w := openWAL(t, t.TempDir())
			want, last := appendShared(t, w)

			run := func(key string, match []string, age time.Duration) (queue.Options, func()) {
				cfg := testConfig(url)
				cfg.Key, cfg.MaxObjectBytes, cfg.MaxObjectAge = key, 2*config.KiB, config.Duration(age)
				opts := drainerOptions()
				opts.Logger = testLogger(t)
				opts.Metrics = queue.NewMetrics(prometheus.NewRegistry())
				opts.MatchGlobs = match
				s := newTestSink(t, cfg)
				opts.Fingerprint = s.Fingerprint()
				return opts, runDrainer(t, w, "archive", s, opts)
			}
			// Run 1: objects of taken delivered ahead of the cursor.
			opts, stop := run(c.key1, c.match1, time.Hour)
			delivered := opts.Metrics.Delivered.WithLabelValues("archive")
			waitFor(t, "objects of taken delivered", func() bool { return testutil.ToFloat64(delivered) >= 150 })
			stop()
			// Run 2, changed: S3 refuses the uploads, which are left to
			// the next start.
			srv.SetFailures(1)
			opts, stop = run(key2, match2, 50*time.Millisecond)
			waitFor(t, "a refused upload", func() bool {
				return testutil.ToFloat64(opts.Metrics.Retries.WithLabelValues("archive", "throttled", "SlowDown")) > 0
			})
			stop()
			srv.SetFailures(0)
			// Run 3, as run 2.
			run(key2, match2, 50*time.Millisecond)
			waitCursor(t, w, "archive", last, 20*time.Second)
			checkOnce(t, readObjects(t, newReader(t, url), ""), want)
		})
	}
}
