package queue

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/logfwd/forwarder/internal/syncbuf"
	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		crashChild(dir)
		return
	}
	goleak.VerifyTestMain(m)
}

func openWAL(t testing.TB, opts wal.Options) *wal.WAL {
	t.Helper()
	w, err := wal.Open(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// appendN appends n records with tags from tag(i) and bodies naming i,
// padded with random letters (which compress about as well as logs do).
func appendN(t testing.TB, w *wal.WAL, n int, tag func(i int) string, bodySize int) uint64 {
	t.Helper()
	var last uint64
	rng := rand.New(rand.NewPCG(uint64(n), uint64(bodySize)))
	pad := make([]byte, max(0, bodySize-20))
	for start := 0; start < n; start += 100 {
		var recs []wal.Record
		for i := start; i < min(n, start+100); i++ {
			// Letters a to p, four random bits each, sixteen to a draw
			// (a draw per byte was most of the time of tests under -race).
			for j := 0; j < len(pad); j += 16 {
				v := rng.Uint64()
				for k := j; k < min(j+16, len(pad)); k++ {
					pad[k] = byte('a' + v&15)
					v >>= 4
				}
			}
			body := fmt.Sprintf(`{"i":%d,"pad":"%s"}`, i, pad)
			recs = append(recs, wal.Record{Time: time.Now().UnixNano(), Tag: tag(i), Body: []byte(body)})
		}
		res, err := w.Append(context.Background(), recs, wal.AppendOptions{})
		if err != nil {
			t.Fatal(err)
		}
		last = res.Last
	}
	return last
}

type running struct {
	d      *Drainer
	cancel context.CancelFunc
	done   chan error
}

func start(w *wal.WAL, name string, s sinks.Sink, opts Options) *running {
	opts.checkInvariants = true // every test checks the loop's invariants at every step
	return startUnchecked(w, name, s, opts)
}

// startUnchecked is start without the invariant checks, for benchmarks.
func startUnchecked(w *wal.WAL, name string, s sinks.Sink, opts Options) *running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{d: New(w, name, s, opts), cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- r.d.Run(ctx) }()
	return r
}

func (r *running) stop(t testing.TB) {
	t.Helper()
	r.cancel()
	if err := <-r.done; err != nil {
		t.Fatalf("drainer %s: %v", r.d.Name(), err)
	}
}

func waitCursor(t testing.TB, w *wal.WAL, name string, want uint64, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if pos, _ := w.Cursor(name); pos >= want {
			return
		}
		if time.Now().After(deadline) {
			pos, _ := w.Cursor(name)
			t.Fatalf("cursor %s at %d after %v, want %d", name, pos, timeout, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestDeliversEverythingInOrder(t *testing.T) {
	w := openWAL(t, wal.Options{})
	defer w.Close()
	last := appendN(t, w, 5000, tagsOf(20), 50)
	s := newTestSink(sinks.Limits{MaxRecords: 50, MaxBytes: 1 << 20, MaxAge: 20 * time.Millisecond, Concurrency: 4})
	r := start(w, "s", s, Options{Match: func(tag string) bool { return tag != "p19" }})
	waitCursor(t, w, "s", last, 20*time.Second)
	more := appendN(t, w, 1000, tagsOf(20), 50) // records arriving while it runs
	waitCursor(t, w, "s", more, 20*time.Second)
	r.stop(t)
	s.check(t)
	got, _, _ := s.snapshot()
	for seq := uint64(1); seq <= more; seq++ {
		want := 1
		if (seq-1)%20 == 19 || (seq > last && (seq-last-1)%20 == 19) {
			want = 0 // p19 does not match this sink
		}
		if got[seq] != want {
			t.Fatalf("record %d delivered %d times, want %d", seq, got[seq], want)
		}
	}
	if st := r.d.Status(); st.Delivered != uint64(len(got)) || st.State != "stopped" {
		t.Fatalf("status %+v, %d delivered", st, len(got))
	}
}

func TestErrorClasses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		tags := []string{"retry", "throttle", "reject", "partial", "fine"}
		last := appendN(t, w, 400, func(i int) string { return tags[i%len(tags)] }, 30)
		s := newTestSink(sinks.Limits{MaxRecords: 20, MaxBytes: 1 << 20, MaxAge: time.Second, Concurrency: 3})
		var mu sync.Mutex
		calls := map[string]int{}
		s.setFail(func(b *sinks.Batch) error {
			mu.Lock()
			defer mu.Unlock()
			calls[b.Partition]++
			switch b.Partition {
			case "retry":
				if calls["retry"] <= 3 {
					return sinks.NewRetryable("http_503", fmt.Errorf("service unavailable"))
				}
			case "throttle":
				if calls["throttle"] == 1 {
					return sinks.NewThrottled("ThrottlingException", 10*time.Second, fmt.Errorf("rate exceeded"))
				}
			case "reject":
				return sinks.NewRecordPermanent("InvalidParameterException", fmt.Errorf("bad event"))
			case "partial":
				var rj []sinks.Rejection
				for _, r := range b.Records {
					if r.Seq%2 == 0 {
						// Twice, as a sink may name a record once for each part of it.
						rj = append(rj, sinks.Rejection{Seq: r.Seq, Reason: "too_old"}, sinks.Rejection{Seq: r.Seq, Reason: "too_old"})
					}
				}
				return partial(rj)
			}
			return nil
		})
		m := NewMetrics(nil)
		r := start(w, "s", s, Options{Metrics: m})
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		if pos, _ := w.Cursor("s"); pos != last {
			t.Fatalf("cursor %d, want %d", pos, last)
		}
		r.stop(t)
		s.check(t)
		got, _, _ := s.snapshot()
		dead := map[uint64]string{}
		if err := DeadLetters(w, "s", func(d DeadLetter) error {
			dead[d.Seq] = d.Reason
			if !bytes.Contains(d.Body, []byte(`"i":`)) || d.Tag == "" {
				t.Errorf("dead letter %d lacks its record: %+v", d.Seq, d)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		for seq := uint64(1); seq <= last; seq++ {
			tag := tags[(seq-1)%5]
			switch {
			case tag == "reject":
				if dead[seq] != "InvalidParameterException" || got[seq] != 0 {
					t.Fatalf("record %d of %s: dead %q, delivered %d", seq, tag, dead[seq], got[seq])
				}
			case tag == "partial" && seq%2 == 0:
				if dead[seq] != "too_old" || got[seq] != 0 {
					t.Fatalf("rejected record %d: dead %q, delivered %d", seq, dead[seq], got[seq])
				}
			default:
				if got[seq] != 1 || dead[seq] != "" {
					t.Fatalf("record %d of %s: delivered %d times, dead %q", seq, tag, got[seq], dead[seq])
				}
			}
		}
		if n := testutil.ToFloat64(m.Retries.WithLabelValues("s", "retryable", "http_503")); n != 3 {
			t.Fatalf("%v retries counted, want 3", n)
		}
		if n := testutil.ToFloat64(m.Retries.WithLabelValues("s", "throttled", "ThrottlingException")); n != 1 {
			t.Fatalf("%v throttles counted, want 1", n)
		}
		if n := testutil.ToFloat64(m.DeadLetters.WithLabelValues("s", "InvalidParameterException")); n != 80 {
			t.Fatalf("%v dead letters counted, want 80", n)
		}
		if n := testutil.ToFloat64(m.DeadStored.WithLabelValues("s")); n != float64(len(dead)) {
			t.Fatalf("forwarder_sink_dead_letters_stored %v, want the %d the WAL keeps", n, len(dead))
		}
		// After a restart the gauge says what the WAL keeps, before any send.
		m2 := NewMetrics(nil)
		r = start(w, "s", s, Options{Metrics: m2})
		time.Sleep(time.Second)
		synctest.Wait()
		if n := testutil.ToFloat64(m2.DeadStored.WithLabelValues("s")); n != float64(len(dead)) {
			t.Fatalf("after a restart forwarder_sink_dead_letters_stored %v, want %d", n, len(dead))
		}
		r.stop(t)
	})
}

func TestThrottleHoldsEveryPartition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		s := newTestSink(sinks.Limits{MaxRecords: 10, MaxBytes: 1 << 20, MaxAge: time.Second, Concurrency: 8})
		var mu sync.Mutex
		var times []time.Time
		throttled := false
		s.setFail(func(b *sinks.Batch) error {
			mu.Lock()
			defer mu.Unlock()
			times = append(times, time.Now())
			if !throttled {
				throttled = true
				return sinks.NewThrottled("ThrottlingException", 20*time.Second, nil)
			}
			return nil
		})
		appendN(t, w, 10, func(int) string { return "a" }, 10)
		r := start(w, "s", s, Options{})
		time.Sleep(5 * time.Second) // a's batch is throttled at about 1s
		synctest.Wait()
		at := time.Now()
		last := appendN(t, w, 100, tagsOf(10), 10) // other partitions, during the wait
		time.Sleep(time.Minute)
		synctest.Wait()
		if pos, _ := w.Cursor("s"); pos != last {
			t.Fatalf("cursor %d, want %d", pos, last)
		}
		r.stop(t)
		mu.Lock()
		defer mu.Unlock()
		for _, ts := range times[1:] {
			if ts.Before(at.Add(15 * time.Second)) {
				t.Fatalf("a send %v after the throttle, inside the 20s wait", ts.Sub(at))
			}
		}
	})
}

func TestStuckPartitionDoesNotStopOthers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		s := newTestSink(sinks.Limits{MaxRecords: 20, MaxBytes: 1 << 20, MaxAge: time.Second, Concurrency: 2})
		s.setFail(func(b *sinks.Batch) error {
			if b.Partition == "p00" {
				return sinks.NewRetryable("http_500", fmt.Errorf("internal error"))
			}
			return nil
		})
		// Small memory: the stuck partition's records must be spilled for
		// the others to keep being read.
		r := start(w, "s", s, Options{MaxBufferedBytes: 64 << 10, ReadBatch: 200})
		var last uint64
		for i := 0; i < 10; i++ {
			last = appendN(t, w, 500, tagsOf(5), 1000)
			time.Sleep(time.Minute)
		}
		synctest.Wait()
		got, _, _ := s.snapshot()
		for seq := uint64(1); seq <= last; seq++ {
			stuck := (seq-1)%5 == 0
			if !stuck && got[seq] != 1 {
				t.Fatalf("record %d of a healthy partition delivered %d times", seq, got[seq])
			}
			if stuck && got[seq] != 0 {
				t.Fatalf("record %d of the stuck partition delivered", seq)
			}
		}
		if pos, _ := w.Cursor("s"); pos != 0 {
			t.Fatalf("cursor %d passed the stuck partition's first record 1", pos)
		}
		if st := w.Stats(); st.FirstSeq != 1 {
			t.Fatalf("retention deleted up to %d, records the stuck partition needs", st.FirstSeq-1)
		}
		if b := r.d.Status().Buffered; b > 256<<10 {
			t.Fatalf("%d bytes buffered, bound 64 KiB", b)
		}
		// Unstuck: everything goes, in order, once.
		s.heal(t, w, last, 10*time.Minute)
		r.stop(t)
		s.check(t)
		s.deliveredOnce(t, last)
	})
}

func TestSinkPermanentPausesWithOneLine(t *testing.T) {
	for name, whenFull := range map[string]wal.FullPolicy{"block": wal.Block, "drop_oldest": wal.DropOldest} {
		t.Run(name, func(t *testing.T) { sinkPermanentPausesWithOneLine(t, whenFull) })
	}
}

func sinkPermanentPausesWithOneLine(t *testing.T, whenFull wal.FullPolicy) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{WhenFull: whenFull})
		defer w.Close()
		var logs syncbuf.Buffer
		log := slog.New(slog.NewTextHandler(&logs, nil))
		s := newTestSink(sinks.Limits{MaxRecords: 10, MaxBytes: 1 << 20, MaxAge: time.Second, Concurrency: 4})
		s.setFail(func(b *sinks.Batch) error {
			return sinks.NewSinkPermanent("AccessDeniedException", fmt.Errorf("not authorized to perform logs:PutLogEvents"))
		})
		last := appendN(t, w, 200, tagsOf(10), 10)
		r := start(w, "s", s, Options{Logger: log})
		time.Sleep(3*time.Minute + time.Second)
		synctest.Wait()
		if st := r.d.Status(); st.State != "paused" || !strings.Contains(st.LastError, "AccessDenied") {
			t.Fatalf("status while denied: %+v", st)
		}
		_, _, sends := s.snapshot()
		// The first batches of up to Concurrency partitions fail together;
		// then one probe at a time, at 1, 3, 7, 15 and 31 s, then every 30s
		// (61 ... 181 s): 10 in 3 minutes.
		if sends < 4+9 || sends > 4+11 {
			t.Fatalf("%d sends in 3 minutes while paused, want 4 and then 10 probes (1s, doubling to every 30s)", sends)
		}
		if n := strings.Count(logs.String(), "sink paused"); n != 1 || !strings.Contains(logs.String(), "level=ERROR") {
			t.Fatalf("%d 'sink paused' lines:\n%s", n, logs.String())
		}
		// What becomes of the records, as the WAL is configured.
		var pause string
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, "sink paused") {
				pause = l
			}
		}
		if says := strings.Contains(pause, "nothing is dropped"); says != (whenFull == wal.Block) || whenFull == wal.DropOldest && !strings.Contains(pause, "drop_oldest") {
			t.Fatalf("when_full %v: the pause line: %s", whenFull, pause)
		}
		n := 0
		DeadLetters(w, "s", func(DeadLetter) error { n++; return nil })
		if n != 0 {
			t.Fatalf("%d records dead-lettered for a sink-permanent error", n)
		}
		s.heal(t, w, last, 2*time.Minute)
		r.stop(t)
		if !strings.Contains(logs.String(), "sink recovered") {
			t.Fatalf("no recovery line:\n%s", logs.String())
		}
	})
}

// TestStalledSinkDoesNotSlowOtherOrAppends runs two sinks on one WAL: one
// stalls for minutes, the other and the appends go on at full pace.
func TestStalledSinkDoesNotSlowOtherOrAppends(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a stalled sink beside a running one for seconds; make test runs it")
	}
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		fast := newTestSink(sinks.Limits{MaxRecords: 100, MaxBytes: 1 << 20, MaxAge: time.Second, Concurrency: 4})
		slow := newTestSink(sinks.Limits{MaxRecords: 100, MaxBytes: 1 << 20, MaxAge: time.Second, Concurrency: 4})
		slow.delay = 10 * time.Minute // every send hangs for ten minutes
		rf := start(w, "fast", fast, Options{})
		rs := start(w, "slow", slow, Options{ShutdownTimeout: time.Second})
		var last uint64
		startT := time.Now()
		for i := 0; i < 60; i++ { // a minute, a batch a second
			last = appendN(t, w, 100, tagsOf(8), 100)
			time.Sleep(time.Second)
		}
		if took := time.Since(startT); took > 61*time.Second {
			t.Fatalf("appends took %v for 60 seconds of records", took)
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if pos, _ := w.Cursor("fast"); pos != last {
			t.Fatalf("fast sink at %d, want %d", pos, last)
		}
		if pos, _ := w.Cursor("slow"); pos != 0 {
			t.Fatalf("stalled sink's cursor moved to %d", pos)
		}
		if st := w.Stats(); st.FirstSeq != 1 {
			t.Fatalf("retention deleted records the stalled sink needs (first live %d)", st.FirstSeq)
		}
		rf.stop(t)
		rs.stop(t)
		fast.check(t)
	})
}

// TestDropOldestDropsExactlyWhatItCounts fills a small WAL while one sink is
// paused: what that sink never receives is exactly what the WAL counted,
// also when the sink carries records (a carry holding dropped ones is
// given up and the rest read again).
func TestDropOldestDropsExactlyWhatItCounts(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: fills a WAL with drop_oldest; make test runs it")
	}
	for _, carry := range []int{0, 1 << 20} {
		t.Run(fmt.Sprintf("carry %d", carry), func(t *testing.T) { dropOldest(t, carry) })
	}
}

func dropOldest(t *testing.T, carry int) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{MaxBytes: 256 << 10, WhenFull: wal.DropOldest})
		defer w.Close()
		fast := newTestSink(sinks.Limits{MaxRecords: 100, MaxBytes: 1 << 20, MaxAge: time.Second, Concurrency: 4})
		paused := newTestSink(sinks.Limits{MaxRecords: 100, MaxBytes: 1 << 20, MaxAge: time.Second, Concurrency: 4})
		paused.carryBytes = carry
		if carry > 0 {
			paused.lim.MaxAge = time.Minute // batches are cut full and carried for a while
		}
		paused.setFail(func(*sinks.Batch) error { return sinks.NewSinkPermanent("AccessDenied", nil) })
		rf := start(w, "fast", fast, Options{})
		rp := start(w, "paused", paused, Options{})
		var last uint64
		for i := 0; i < 60; i++ {
			last = appendN(t, w, 200, tagsOf(4), 200)
			time.Sleep(time.Second)
		}
		dropped := w.Stats().Dropped["paused"]
		if dropped == 0 {
			t.Fatal("nothing was dropped: the test did not fill the WAL")
		}
		paused.setFail(nil)
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		if pos, _ := w.Cursor("paused"); pos != last {
			t.Fatalf("paused sink at %d after recovery, want %d", pos, last)
		}
		rf.stop(t)
		rp.stop(t)
		got, _, _ := paused.snapshot()
		missing := uint64(0)
		for seq := uint64(1); seq <= last; seq++ {
			if got[seq] > 1 {
				t.Fatalf("record %d delivered %d times", seq, got[seq])
			}
			if got[seq] == 0 {
				missing++
			}
		}
		if final := w.Stats().Dropped["paused"]; missing != final {
			t.Fatalf("%d records never reached the sink, the WAL counted %d dropped", missing, final)
		}
		if fg, _, _ := fast.snapshot(); uint64(len(fg)) != last || w.Stats().Dropped["fast"] != 0 {
			t.Fatalf("the sink that kept up received %d of %d (dropped %d)", len(fg), last, w.Stats().Dropped["fast"])
		}
		if carry > 0 && paused.carried == 0 {
			t.Fatal("the paused sink carried nothing")
		}
		paused.check(t)
	})
}

// TestMaxOpenCutsOldestEarly: with more partitions waiting than the sink
// allows open, the ones that waited longest are sent before their age.
func TestMaxOpenCutsOldestEarly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		s := newTestSink(sinks.Limits{MaxRecords: 1000, MaxBytes: 1 << 20, MaxAge: time.Hour, Concurrency: 2, MaxOpen: 3})
		m := NewMetrics(nil)
		r := start(w, "s", s, Options{Metrics: m})
		last := appendN(t, w, 10, tagsOf(10), 10) // ten partitions, one record each
		time.Sleep(time.Minute)
		synctest.Wait()
		got, _, _ := s.snapshot()
		if len(got) < 7 {
			t.Fatalf("%d of 10 partitions sent within a minute, want all but the 3 allowed open", len(got))
		}
		if n := testutil.ToFloat64(m.EarlyCuts.WithLabelValues("s")); n < 7 {
			t.Fatalf("%v early cuts counted", n)
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		if pos, _ := w.Cursor("s"); pos != last {
			t.Fatalf("cursor %d, want %d", pos, last)
		}
		r.stop(t)
	})
}

// TestRetriesAreSummedUpNotShouted: failed sends that are retried do not
// log a line each; one summary per interval counts them, at info level
// once everything is delivered.
func TestRetriesAreSummedUpNotShouted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		var logs syncbuf.Buffer
		var mu sync.Mutex
		log := slog.New(slog.NewTextHandler(&logs, nil))
		s := newTestSink(sinks.Limits{MaxRecords: 10, MaxBytes: 1 << 20, MaxAge: time.Second, Concurrency: 2})
		fails := 0
		s.setFail(func(b *sinks.Batch) error {
			mu.Lock()
			defer mu.Unlock()
			if fails < 5 {
				fails++
				return sinks.NewRetryable("http_503", fmt.Errorf("unavailable"))
			}
			return nil
		})
		last := appendN(t, w, 30, tagsOf(3), 10)
		r := start(w, "s", s, Options{Logger: log, SummaryInterval: 20 * time.Second})
		time.Sleep(time.Minute)
		synctest.Wait()
		if pos, _ := w.Cursor("s"); pos != last {
			t.Fatalf("cursor %d", pos)
		}
		r.stop(t)
		out := logs.String()
		if n := strings.Count(out, "sends failed and were retried; every partition has delivered since"); n != 1 || !strings.Contains(out, "retryable/http_503=5") ||
			!strings.Contains(out, `last_error="http_503 (retryable): unavailable"`) {
			t.Fatalf("want one summary counting 5 failures, with the last error:\n%s", out)
		}
		if strings.Contains(out, "level=WARN") || strings.Contains(out, "level=ERROR") {
			t.Fatalf("retries that succeeded were logged as warnings or errors:\n%s", out)
		}
	})
}

// Delivered marks belong to the partitioning that wrote them: after the
// sink's partitioning changes, a record is not skipped because another
// partition of the same name had delivered up to it before.
func TestMarksDroppedWhenPartitioningChanges(t *testing.T) {
	w := openWAL(t, wal.Options{})
	defer w.Close()
	ctx := context.Background()
	// A mark from before: partition "p00" delivered up to record 50.
	if _, err := w.RegisterCursor(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	last := appendN(t, w, 60, tagsOf(1), 10) // all p00, records 1-60
	var b wal.Batch
	b.Put("s", markKey("p00"), u64(50))
	b.Put("s", []byte(keyFingerprint), []byte("old-templates"))
	if err := w.Commit(ctx, &b); err != nil {
		t.Fatal(err)
	}
	s := newTestSink(sinks.Limits{MaxRecords: 100, MaxBytes: 1 << 20, MaxAge: time.Millisecond, Concurrency: 1})
	r := start(w, "s", s, Options{Fingerprint: "new-templates"})
	waitCursor(t, w, "s", last, 10*time.Second)
	r.stop(t)
	if got, _, _ := s.snapshot(); len(got) != 60 {
		t.Fatalf("%d of 60 records delivered: stale marks skipped records", len(got))
	}
	// Same fingerprint: marks are honoured (nothing is sent twice).
	more := appendN(t, w, 10, tagsOf(1), 10)
	r = start(w, "s", s, Options{Fingerprint: "new-templates"})
	waitCursor(t, w, "s", more, 10*time.Second)
	r.stop(t)
	got, _, _ := s.snapshot()
	for seq, n := range got {
		if n != 1 {
			t.Fatalf("record %d delivered %d times", seq, n)
		}
	}
}

// A sink whose globs match none of the records still moves its cursor, so
// it does not keep them in the WAL forever.
func TestCursorPassesRecordsForOtherSinks(t *testing.T) {
	w := openWAL(t, wal.Options{})
	defer w.Close()
	last := appendN(t, w, 500, tagsOf(5), 10)
	s := newTestSink(sinks.Limits{MaxRecords: 100, MaxBytes: 1 << 20, MaxAge: time.Millisecond, Concurrency: 2})
	r := start(w, "s", s, Options{Match: func(string) bool { return false }})
	waitCursor(t, w, "s", last, 10*time.Second)
	r.stop(t)
	if st := w.Stats(); st.Records != 0 {
		t.Fatalf("%d records kept for a sink that wants none of them", st.Records)
	}
}

// With memory smaller than a batch, partitions are sent early rather than
// waiting for an age that memory never lets them reach. What is left when
// the records stop coming is less than half the memory: that part waits
// for its age (an hour here), as the limits say.
func TestMemoryFullCutsLargestEarly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		const limit = 64 << 10
		s := newTestSink(sinks.Limits{MaxRecords: 100000, MaxBytes: 64 << 20, MaxAge: time.Hour, Concurrency: 2})
		r := start(w, "s", s, Options{MaxBufferedBytes: limit})
		last := appendN(t, w, 3000, tagsOf(3), 200) // about 800 KiB: twelve times the memory
		time.Sleep(time.Minute)
		synctest.Wait()
		st := r.d.Status()
		if st.Buffered >= limit/2 {
			t.Fatalf("%d bytes still held after a minute, limit %d: the drainer waited for the age", st.Buffered, limit)
		}
		got, _, _ := s.snapshot()
		if n := len(got); n < int(last)-limit/2/200 {
			t.Fatalf("%d of %d records delivered after a minute: the drainer waited for the age", n, last)
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		if pos, _ := w.Cursor("s"); pos != last {
			t.Fatalf("cursor %d of %d after the age", pos, last)
		}
		r.stop(t)
		s.check(t)
	})
}

// recoveringSink's Recover is refused until allowed, as S3 is while the
// credentials are wrong.
type recoveringSink struct {
	*testSink
	mu      sync.Mutex
	allowed bool
	calls   int
	err     error // what Recover returns until allowed; nil: AccessDenied
}

func (s *recoveringSink) Recover(ctx context.Context, st sinks.State) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if !s.allowed {
		if s.err != nil {
			return s.err
		}
		return sinks.NewSinkPermanent("AccessDenied", fmt.Errorf("access denied"))
	}
	return nil
}

// A state commit of Recover that finds the WAL's disk full (an S3 upload
// a crash interrupted, finished at start) is retried as the loop's commits
// are, with a warning, until there is room: the drainer does not end, and
// with it the service.
func TestRecoverDiskFullWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		last := appendN(t, w, 20, tagsOf(2), 10)
		s := &recoveringSink{testSink: newTestSink(sinks.Limits{MaxRecords: 100, MaxBytes: 1 << 20, MaxAge: time.Second, Concurrency: 2}),
			err: fmt.Errorf("record delivery of %q: %w", "k", fmt.Errorf("%w: write wal.db: no space left on device", wal.ErrNoSpace))}
		var logs syncbuf.Buffer
		r := start(w, "s", s, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		time.Sleep(time.Minute)
		synctest.Wait()
		if st := r.d.Status(); st.State != StateRecovering || !strings.Contains(st.LastError, "no space") {
			t.Fatalf("status while the disk is full: %+v", st)
		}
		if !strings.Contains(logs.String(), "the WAL's disk is full; retrying") {
			t.Fatalf("no warning:\n%s", logs.String())
		}
		s.mu.Lock()
		calls := s.calls
		s.allowed = true
		s.mu.Unlock()
		if calls < 3 || calls > 8 {
			t.Fatalf("%d Recover calls in a minute, want one every 1 s to 30 s", calls)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if pos, _ := w.Cursor("s"); pos != last {
			t.Fatalf("cursor %d after room was found, want %d", pos, last)
		}
		r.stop(t)
	})
}

// A sink that cannot finish its interrupted work at start is paused, and
// says so in its status and metrics, until the destination lets it.
func TestRecoverRefusedPausesSink(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		last := appendN(t, w, 20, tagsOf(2), 10)
		s := &recoveringSink{testSink: newTestSink(sinks.Limits{MaxRecords: 100, MaxBytes: 1 << 20, MaxAge: time.Second, Concurrency: 2})}
		m := NewMetrics(nil)
		r := start(w, "s", s, Options{Metrics: m})
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		st := r.d.Status()
		if st.State != "paused" || st.LagRecords != last || !strings.Contains(st.LastError, "AccessDenied") {
			t.Fatalf("status while recovery is refused: %+v", st)
		}
		if testutil.ToFloat64(m.Paused.WithLabelValues("s")) != 1 {
			t.Fatal("paused gauge not set")
		}
		s.mu.Lock()
		calls := s.calls
		s.allowed = true
		s.mu.Unlock()
		// At 0, 1, 3, 7, 15 and 31 s, then every 30s (61, 91, 121).
		if calls < 8 || calls > 9 {
			t.Fatalf("%d Recover calls in 2 minutes, want 8 or 9 (after 1s, doubling to every 30s)", calls)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if pos, _ := w.Cursor("s"); pos != last {
			t.Fatalf("cursor %d after recovery, want %d", pos, last)
		}
		if testutil.ToFloat64(m.Paused.WithLabelValues("s")) != 0 {
			t.Fatal("paused gauge still set")
		}
		r.stop(t)
	})
}

// While a sink finishes its interrupted work (the destination refusing
// it, then down), its lag metrics go on following the WAL, and the pause
// ends when the refusal does, though the work still fails otherwise.
func TestRecoveringKeepsItsMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		appendN(t, w, 20, tagsOf(2), 10)
		s := &recoveringSink{testSink: newTestSink(sinks.Limits{MaxRecords: 100, MaxBytes: 1 << 20, MaxAge: time.Second, Concurrency: 2})}
		m := NewMetrics(nil)
		r := start(w, "s", s, Options{Metrics: m, RetryMin: time.Second, RetryMax: 5 * time.Second})
		time.Sleep(time.Minute)
		last := appendN(t, w, 30, tagsOf(2), 10)
		time.Sleep(time.Minute)
		synctest.Wait()
		st := r.d.Status()
		lag, lagSec := testutil.ToFloat64(m.LagRecords.WithLabelValues("s")), testutil.ToFloat64(m.LagSeconds.WithLabelValues("s"))
		if st.State != StatePaused || st.LagRecords != last || lag != float64(last) || lagSec < 110 || st.LagSeconds != lagSec {
			t.Fatalf("status %+v, lag %v records and %v s; want paused, %d records, 2 minutes", st, lag, lagSec, last)
		}
		s.mu.Lock()
		s.err = sinks.NewRetryable("network", fmt.Errorf("dial tcp: connection refused"))
		s.mu.Unlock()
		time.Sleep(time.Minute)
		synctest.Wait()
		if st := r.d.Status(); st.State != StateRecovering || !strings.Contains(st.LastError, "connection refused") {
			t.Fatalf("status %+v, want recovering", st)
		}
		if testutil.ToFloat64(m.Paused.WithLabelValues("s")) != 0 {
			t.Fatal("paused gauge still set while the destination no longer refuses")
		}
		s.mu.Lock()
		s.allowed = true
		s.mu.Unlock()
		time.Sleep(time.Minute)
		synctest.Wait()
		if pos, _ := w.Cursor("s"); pos != last {
			t.Fatalf("cursor %d after recovery, want %d", pos, last)
		}
		r.stop(t)
	})
}

// Failures of Recover that are retried (the destination unreachable at
// start) are warned of at the first and then once a SummaryInterval, not
// at debug level only: the loop's summary of failures does not run yet.
func TestRecoverRetriesAreWarned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		appendN(t, w, 20, tagsOf(2), 10)
		s := &recoveringSink{testSink: newTestSink(sinks.Limits{MaxRecords: 100, MaxBytes: 1 << 20, MaxAge: time.Second, Concurrency: 2}),
			err: sinks.NewRetryable("network", fmt.Errorf("dial tcp: connection refused"))}
		var logs syncbuf.Buffer
		r := start(w, "s", s, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil)), RetryMin: time.Second, RetryMax: 5 * time.Second})
		time.Sleep(150 * time.Second) // about 30 tries
		synctest.Wait()
		s.mu.Lock()
		calls := s.calls
		s.allowed = true
		s.mu.Unlock()
		if n := strings.Count(logs.String(), `level=WARN msg="finishing interrupted work failed; retrying (the sink delivers nothing new until it is done)"`); n != 3 || calls < 20 {
			t.Errorf("%d warnings in 150 s of %d failures, want 3 (at the first, then once a minute):\n%s", n, calls, logs.String())
		}
		r.stop(t)
	})
}

// A stop's Drain does not wait for a sink paused while finishing its
// interrupted work: it answers ErrNotDrained at once, as for a sink paused
// in its loop, and the drainer goes on probing.
func TestDrainAnswersPausedRecovery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		appendN(t, w, 20, tagsOf(2), 10)
		s := &recoveringSink{testSink: newTestSink(sinks.Limits{MaxRecords: 100, MaxBytes: 1 << 20, MaxAge: time.Second, Concurrency: 2})}
		m := NewMetrics(nil)
		r := start(w, "s", s, Options{Metrics: m})
		time.Sleep(500 * time.Millisecond) // before the first probe, at 1s
		synctest.Wait()
		if st := r.d.Status(); st.State != StatePaused {
			t.Fatalf("status %+v, want paused", st)
		}
		// A refusal is a failure that is retried, counted as such.
		if got := testutil.ToFloat64(m.Retries.WithLabelValues("s", "sink_permanent", "AccessDenied")); got != 1 {
			t.Errorf("forwarder_sink_retries_total{class=sink_permanent} = %v after one refused Recover", got)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		began := time.Now()
		err := r.d.Drain(ctx)
		if !errors.Is(err, ErrNotDrained) || time.Since(began) > time.Second {
			t.Fatalf("Drain after %s: %v, want ErrNotDrained at once", time.Since(began), err)
		}
		// Once the destination lets it, the sink delivers, and a second
		// Drain is answered as the first was (the loop does not block).
		s.mu.Lock()
		s.allowed = true
		s.mu.Unlock()
		time.Sleep(time.Minute)
		synctest.Wait()
		ctx2, cancel2 := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel2()
		if err := r.d.Drain(ctx2); !errors.Is(err, ErrNotDrained) {
			t.Fatalf("second Drain: %v", err)
		}
		r.stop(t)
	})
}

// heldSink holds every batch until released and keeps count of the body
// bytes of the batches it holds, as a slow destination holds requests.
type heldSink struct {
	*testSink
	release chan struct{}
	mu      sync.Mutex
	held    int
	maxHeld int
}

func (s *heldSink) Send(ctx context.Context, b *sinks.Batch) (sinks.Outcome, error) {
	n := 0
	for _, r := range b.Records {
		n += len(r.Body)
	}
	s.mu.Lock()
	s.held += n
	s.maxHeld = max(s.maxHeld, s.held)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.held -= n
		s.mu.Unlock()
	}()
	select {
	case <-s.release:
	case <-ctx.Done():
		return sinks.Outcome{}, sinks.NewRetryable("cancelled", ctx.Err())
	}
	return s.testSink.Send(ctx, b)
}

// Records in batches being sent count against MaxBufferedBytes like
// queued ones: a slow destination with many partitions in flight does not
// make the drainer read and hold more.
func TestMemoryBoundCountsBatchesInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		const limit = 128 << 10
		s := &heldSink{testSink: newTestSink(sinks.Limits{MaxRecords: 1000, MaxBytes: 64 << 10, MaxAge: time.Second, Concurrency: 4}), release: make(chan struct{})}
		r := start(w, "s", s, Options{MaxBufferedBytes: limit, ReadBatch: 200})
		last := appendN(t, w, 8000, tagsOf(4), 250) // about 2 MiB in 4 partitions
		time.Sleep(time.Minute)
		synctest.Wait()
		s.mu.Lock()
		held := s.held
		s.mu.Unlock()
		if held == 0 {
			t.Fatal("no batch reached the sink")
		}
		st := r.d.Status()
		if st.Buffered > limit+64<<10 {
			t.Fatalf("%d bytes held by the drainer, limit %d", st.Buffered, limit)
		}
		if held > st.Buffered {
			t.Fatalf("the sink holds %d bytes of records, the drainer counts %d", held, st.Buffered)
		}
		close(s.release)
		time.Sleep(time.Minute)
		synctest.Wait()
		if pos, _ := w.Cursor("s"); pos != last {
			t.Fatalf("cursor %d, want %d", pos, last)
		}
		s.mu.Lock()
		maxHeld := s.maxHeld
		s.mu.Unlock()
		if maxHeld > limit {
			t.Fatalf("at most %d bytes of records were being sent at once, limit %d", maxHeld, limit)
		}
		r.stop(t)
		s.check(t)
	})
}

// At a stop, in-flight sends get ShutdownTimeout, but no longer than until
// a second before StopBy: what stopped before the drainer took part of the
// service's stop, and the drainer's own wait must not make it outlast it.
func TestStopByBoundsSends(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		s := &heldSink{testSink: newTestSink(sinks.Limits{MaxRecords: 10, MaxBytes: 64 << 10, MaxAge: time.Second, Concurrency: 1}), release: make(chan struct{})}
		var by time.Time
		r := start(w, "s", s, Options{ShutdownTimeout: 20 * time.Second, StopBy: func() time.Time { return by }})
		appendN(t, w, 10, tagsOf(1), 100)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		s.mu.Lock()
		held := s.held
		s.mu.Unlock()
		if held == 0 {
			t.Fatal("no send in flight")
		}
		by = time.Now().Add(10 * time.Second)
		began := time.Now()
		r.stop(t)
		if took := time.Since(began); took != 9*time.Second {
			t.Errorf("the stop took %v with a send in flight, want 9s (a second before StopBy, not ShutdownTimeout's 20s)", took)
		}
		// With less time left, a fifth of it is kept.
		r = start(w, "s", s, Options{ShutdownTimeout: 20 * time.Second, StopBy: func() time.Time { return by }})
		appendN(t, w, 10, tagsOf(1), 100)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		by = time.Now().Add(2 * time.Second)
		began = time.Now()
		r.stop(t)
		if took := time.Since(began); took != 1600*time.Millisecond {
			t.Errorf("the stop took %v with a send in flight and 2s left, want 1.6s", took)
		}
	})
}

// While every send slot is taken and more partitions are due, the loop
// waits for a send to end, not for a timer a millisecond away: a slow
// destination with a backlog does not make it spin.
func TestFullSlotsDoNotSpin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		s := &heldSink{testSink: newTestSink(sinks.Limits{MaxRecords: 10, MaxBytes: 64 << 10, MaxAge: time.Second, Concurrency: 1}), release: make(chan struct{})}
		r := start(w, "s", s, Options{})
		last := appendN(t, w, 100, tagsOf(8), 100) // 8 partitions, each with a full batch due
		time.Sleep(5 * time.Second)
		synctest.Wait()
		before := r.d.steps.Load()
		time.Sleep(time.Minute) // one send held all along
		synctest.Wait()
		if n := r.d.steps.Load() - before; n > 120 {
			t.Errorf("%d steps of the loop in a minute with every slot taken, want about one a second", n)
		}
		close(s.release)
		time.Sleep(time.Minute)
		synctest.Wait()
		if pos, _ := w.Cursor("s"); pos != last {
			t.Fatalf("cursor %d, want %d", pos, last)
		}
		r.stop(t)
		s.check(t)
	})
}

// A destination that fails every send (down, or unreachable) is probed one
// batch at a time with a sink-wide backoff, not by every partition on its
// own schedule, each building its request again; once it answers, every
// partition is delivered, once.
func TestDestinationDownIsProbedOneBatchAtATime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		s := newTestSink(sinks.Limits{MaxRecords: 100, MaxBytes: 1 << 20, MaxAge: 100 * time.Millisecond, Concurrency: 16})
		s.setFail(func(b *sinks.Batch) error { return sinks.NewRetryable("dial", fmt.Errorf("connection refused")) })
		r := start(w, "s", s, Options{RetryMin: 200 * time.Millisecond, RetryMax: 30 * time.Second})
		last := appendN(t, w, 2000, tagsOf(20), 100)
		time.Sleep(5 * time.Minute)
		synctest.Wait()
		_, _, sends := s.snapshot()
		// Per partition, backoffs from 200 ms to 30 s make about 15 sends in 5 minutes:
		// 300 for 20 partitions. One probe at a time makes about 15 plus the first round.
		if sends > 60 {
			t.Fatalf("%d sends to a destination that is down in 5 minutes", sends)
		}
		if st := r.d.Status(); st.State != "retrying" || st.Concurrency != 1 {
			t.Fatalf("status %+v, want state retrying at concurrency 1", st)
		}
		s.heal(t, w, last, time.Minute)
		if st := r.d.Status(); st.State != "running" || st.Concurrency != 16 {
			t.Fatalf("status %+v after recovery, want running at concurrency 16", st)
		}
		r.stop(t)
		s.check(t)
	})
}

// While every send fails, memory stays within MaxBufferedBytes, one read of
// the WAL and the batches waiting for a retry (one a partition, cut from no
// more than MaxBufferedBytes of queued records), however much arrives; then
// everything is delivered, once.
func TestMemoryBoundWhileDestinationDown(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a destination down under load, measuring memory; make test runs it")
	}
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		const limit, readBatch = 4 << 20, 1000
		s := newTestSink(sinks.Limits{MaxRecords: 10000, MaxBytes: 1 << 20, MaxAge: 5 * time.Second, MaxSpan: 24 * time.Hour, Concurrency: 64})
		s.setFail(func(b *sinks.Batch) error { return sinks.NewRetryable("dial", fmt.Errorf("connection refused")) })
		r := start(w, "s", s, Options{MaxBufferedBytes: limit, ReadBatch: readBatch})
		var last uint64
		for range 20 { // 100,000 records of about 250 bytes: six times the memory
			last = appendN(t, w, 5000, tagsOf(39), 250)
			time.Sleep(time.Second)
			synctest.Wait()
			if b := r.d.Status().Buffered; b > 2*limit+readBatch*(250+128+8) {
				t.Fatalf("%d bytes held, limit %d, its batches waiting and one read of %d records", b, limit, readBatch)
			}
		}
		s.heal(t, w, last, 5*time.Minute)
		r.stop(t)
		s.check(t)
		s.deliveredOnce(t, last)
	})
}

// TestBodiesOutliveReads: the reader decodes into buffers it reuses once a
// read is ingested, so what batches hold must be ingest's copies: with
// many small reads and a slow sink, every body sent is the one written.
func TestBodiesOutliveReads(t *testing.T) {
	w := openWAL(t, wal.Options{})
	defer w.Close()
	s := newTestSink(sinks.Limits{MaxRecords: 500, MaxBytes: 1 << 20, MaxAge: 20 * time.Millisecond, Concurrency: 4})
	s.bodies = true
	s.delay = 5 * time.Millisecond
	const n = 20000
	last := appendN(t, w, n, tagsOf(7), 120)
	r := start(w, "s", s, Options{ReadBatch: 100})
	waitCursor(t, w, "s", last, time.Minute)
	r.stop(t)
	s.check(t)
	if got, _, _ := s.snapshot(); len(got) != n {
		t.Fatalf("%d records delivered, want %d", len(got), n)
	}
}

// TestRunStoppedBeforeStart: a drainer whose context ends before it has
// registered its cursor stops without an error, as one stopped later does.
func TestRunStoppedBeforeStart(t *testing.T) {
	w := openWAL(t, wal.Options{})
	defer w.Close()
	appendN(t, w, 100, tagsOf(2), 50)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	// Registering the cursor races the ended context (either may win):
	// many runs meet both.
	for i := range 50 {
		s := newTestSink(sinks.Limits{MaxRecords: 50, MaxBytes: 1 << 20, MaxAge: 20 * time.Millisecond, Concurrency: 1})
		if err := New(w, "s", s, Options{checkInvariants: true}).Run(ctx); err != nil {
			t.Fatalf("run %d: Run with its context ended: %v", i, err)
		}
	}
}

// A send the stop cancels (its time ran out) leaves the status's last
// error as the destination last said it, not "context canceled", and is
// no failure of the destination's: not counted in retries_total nor in the
// summary of failed sends.
func TestStopKeepsTheLastError(t *testing.T) {
	w := openWAL(t, wal.Options{})
	defer w.Close()
	s := newTestSink(sinks.Limits{MaxRecords: 10, MaxBytes: 1 << 20, MaxAge: time.Millisecond, Concurrency: 1})
	var fails atomic.Int32
	s.setFail(func(*sinks.Batch) error {
		if fails.Add(1) == 1 {
			return sinks.NewRetryable("http_503", errors.New("the destination said 503"))
		}
		return nil
	})
	var logs syncbuf.Buffer
	m := NewMetrics(nil)
	r := start(w, "s", s, Options{RetryMin: time.Millisecond, RetryMax: time.Millisecond, ShutdownTimeout: 50 * time.Millisecond,
		Metrics: m, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	appendN(t, w, 1, tagsOf(1), 10)
	for deadline := time.Now().Add(5 * time.Second); fails.Load() < 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no send")
		}
	}
	s.mu.Lock()
	s.delay = time.Hour // the next sends hang until canceled
	s.mu.Unlock()
	appendN(t, w, 1, tagsOf(1), 10)
	for deadline := time.Now().Add(5 * time.Second); r.d.Status().InFlight == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no send in flight")
		}
	}
	r.stop(t)
	if st := r.d.Status(); !strings.Contains(st.LastError, "503") {
		t.Errorf("last error %q after a stop that canceled a send, want the destination's 503", st.LastError)
	}
	if n := testutil.CollectAndCount(m.Retries); n != 1 || testutil.ToFloat64(m.Retries.WithLabelValues("s", "retryable", "http_503")) != 1 {
		t.Errorf("retries_total has %d series (want the 503's alone, 1):\n%s", n, logs.String())
	}
	if strings.Contains(logs.String(), "unclassified") || !strings.Contains(logs.String(), "cancelling in-flight sends") {
		t.Errorf("the canceled send counted as a failure, or no line of the cancel:\n%s", logs.String())
	}
}
