package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/logfwd/forwarder/internal/syncbuf"
	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// A send that was in flight when another partition paused the sink, and
// that succeeds afterwards, delivers its batch and leaves the pause alone:
// it was no probe, and says nothing of what paused the sink. Otherwise the
// sink would resume, meet the refusal again and log a second error line.
func TestPauseOutlastsASendBegunBefore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		var logs syncbuf.Buffer
		log := slog.New(slog.NewTextHandler(&logs, nil))
		m := NewMetrics(nil)
		s := newTestSink(sinks.Limits{MaxRecords: 10, MaxBytes: 1 << 20, MaxAge: time.Second, Concurrency: 4})
		s.setFail(func(b *sinks.Batch) error {
			if b.Partition == "p01" {
				time.Sleep(5 * time.Second) // in flight when p00 pauses the sink
				return nil
			}
			return sinks.NewSinkPermanent("AccessDenied", errors.New("denied for p00"))
		})
		last := appendN(t, w, 20, tagsOf(2), 10)
		r := start(w, "s", s, Options{Logger: log, Metrics: m})
		time.Sleep(20 * time.Second) // before the first probe (30s)
		synctest.Wait()
		got, _, _ := s.snapshot()
		if len(got) != 10 {
			t.Errorf("%d records delivered, want p01's 10", len(got))
		}
		if testutil.ToFloat64(m.Paused.WithLabelValues("s")) != 1 {
			t.Error("the sink is not paused any more")
		}
		if n := strings.Count(logs.String(), "sink paused"); n != 1 || strings.Contains(logs.String(), "sink recovered") {
			t.Errorf("%d 'sink paused' lines, want one and no recovery:\n%s", n, logs.String())
		}
		// A probe that succeeds lifts it.
		s.heal(t, w, last, 2*time.Minute)
		if testutil.ToFloat64(m.Paused.WithLabelValues("s")) != 0 {
			t.Error("still paused after a probe got through")
		}
		r.stop(t)
		s.check(t)
		s.deliveredOnce(t, last)
	})
}

// A paused sink's failed probes are sends that are retried: each is
// counted in forwarder_sink_retries_total under sink_permanent, as the
// summary line counts it, so that the counter and the log agree.
func TestPausedSendsAreCountedAsRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		m := NewMetrics(nil)
		s := newTestSink(sinks.Limits{MaxRecords: 10, MaxBytes: 1 << 20, MaxAge: time.Second, Concurrency: 1})
		var calls atomic.Int64
		s.setFail(func(b *sinks.Batch) error {
			calls.Add(1)
			return sinks.NewSinkPermanent("AccessDenied", errors.New("denied"))
		})
		last := appendN(t, w, 10, tagsOf(1), 10)
		r := start(w, "s", s, Options{Logger: slog.New(slog.DiscardHandler), Metrics: m})
		time.Sleep(100 * time.Second) // the first send and eight probes (1s, doubling to every 30s)
		synctest.Wait()
		n := calls.Load()
		if n < 3 {
			t.Fatalf("%d sends in 100s of a pause, want at least 3", n)
		}
		if got := testutil.ToFloat64(m.Retries.WithLabelValues("s", "sink_permanent", "AccessDenied")); got != float64(n) {
			t.Errorf("forwarder_sink_retries_total{class=sink_permanent} = %v after %d refused sends", got, n)
		}
		s.heal(t, w, last, time.Minute)
		r.stop(t)
		s.deliveredOnce(t, last)
	})
}

// A WAL full under max_bytes (when_full: block) whose cursor furthest
// behind is a sink's that holds its records in batches waiting for their
// age: the sink finishes its oldest batches at once, so that appends go on
// within seconds rather than at the batches' age (an hour here).
func TestFullWALCutsTheHoldingSink(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{MaxBytes: 64 << 10, WhenFull: wal.Block})
		defer w.Close()
		var logs syncbuf.Buffer
		m := NewMetrics(nil)
		s := newTestSink(sinks.Limits{MaxRecords: 1 << 20, MaxBytes: 64 << 20, MaxAge: time.Hour, Concurrency: 2})
		r := start(w, "s", s, Options{Metrics: m, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		began := time.Now()
		last := appendN(t, w, 4000, tagsOf(8), 200) // about 4 times max_bytes
		// The sink looks at the WAL at least every second (its status
		// tick): each time the WAL fills, appends may wait that long.
		if took := time.Since(began); took > time.Minute {
			t.Fatalf("4,000 records into a 64 KiB WAL took %v: the sink held its batches for their age", took)
		}
		if n := testutil.ToFloat64(m.EarlyCuts.WithLabelValues("s")); n == 0 {
			t.Error("no early cut counted")
		}
		if !strings.Contains(logs.String(), "the WAL is full and this sink's cursor is the furthest behind") {
			t.Errorf("no line says why batches were cut early:\n%s", logs.String())
		}
		s.heal(t, w, last, 2*time.Hour)
		r.stop(t)
		s.deliveredOnce(t, last)
	})
}

// Some partitions refused sink-permanently (an S3 key another writer holds,
// a CloudWatch group the role may not write), the others accepted: each
// healthy probe lifts the pause and the refused partition's send pauses the
// sink again. The waits between go on growing across those pauses, so the
// refused partition costs a request every 30 s at most, not every second.
func TestPartialRefusalDoesNotFlap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		var logs syncbuf.Buffer
		s := newTestSink(sinks.Limits{MaxRecords: 100, MaxBytes: 1 << 20, MaxAge: time.Second, Concurrency: 4})
		var refusals atomic.Int32
		s.setFail(func(b *sinks.Batch) error {
			if b.Partition == "p00" {
				refusals.Add(1)
				return sinks.NewSinkPermanent("PreconditionFailed", errors.New("another writer's object"))
			}
			return nil
		})
		r := start(w, "s", s, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		for range 240 { // 2 minutes
			appendN(t, w, 8, tagsOf(4), 50)
			time.Sleep(500 * time.Millisecond)
		}
		synctest.Wait()
		r.stop(t)
		// At 0, then 1, 2, 4, 8, 16 s and every 30 s after: about 9.
		if n, p := refusals.Load(), strings.Count(logs.String(), "sink paused"); n > 12 || p > 12 {
			t.Errorf("in 2 minutes: %d refused sends, %d 'sink paused' lines; want at most 12 of each", n, p)
		}
	})
}

// A send the stop cancels after the WAL dropped its records (drop_oldest)
// leaves its partition as a failed send does: what the cursor passed is
// dropped from it (the invariants are checked at every step).
func TestCanceledSendAfterDrop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{MaxBytes: 64 << 10, WhenFull: wal.DropOldest})
		defer w.Close()
		s := newTestSink(sinks.Limits{MaxRecords: 100, MaxBytes: 1 << 20, MaxAge: time.Second, Concurrency: 1})
		s.delay = time.Hour // sends hang until the stop cancels them
		r := start(w, "s", s, Options{ShutdownTimeout: 50 * time.Millisecond})
		appendN(t, w, 100, tagsOf(1), 200)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if r.d.Status().InFlight == 0 {
			t.Fatal("no send in flight")
		}
		appendN(t, w, 2000, func(int) string { return "b" }, 200)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if w.Stats().Dropped["s"] == 0 {
			t.Fatal("nothing dropped")
		}
		r.stop(t)
	})
}

// The WAL is full while another sink, paused, has its cursor level with
// this one's: no delivery of this sink frees room until the paused one
// moves, so it does not finish its objects early for nothing, whichever
// name sorts first.
func TestLevelCursorDoesNotCut(t *testing.T) {
	for _, other := range []string{"other", "zother"} {
		t.Run(other, func(t *testing.T) { levelCursorDoesNotCut(t, other) })
	}
}

func levelCursorDoesNotCut(t *testing.T, other string) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{MaxBytes: 64 << 10, WhenFull: wal.Block})
		defer w.Close()
		m := NewMetrics(nil)
		s := newTestSink(sinks.Limits{MaxRecords: 1 << 20, MaxBytes: 64 << 20, MaxAge: time.Hour, Concurrency: 2})
		s.carryBytes = 1 << 20
		o := newTestSink(sinks.Limits{MaxRecords: 100, MaxBytes: 1 << 20, MaxAge: time.Second, Concurrency: 2})
		o.setFail(func(*sinks.Batch) error { return sinks.NewSinkPermanent("AccessDenied", errors.New("denied")) })
		rs := start(w, "s", s, Options{Metrics: m})
		ro := start(w, other, o, Options{Logger: slog.New(slog.DiscardHandler)})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		for i := 0; ctx.Err() == nil; i++ {
			recs := []wal.Record{{Time: time.Now().UnixNano(), Tag: fmt.Sprintf("p%02d", i%8), Body: fmt.Appendf(nil, `{"i":%d,"pad":"%0200d"}`, i, i)}}
			if _, err := w.Append(ctx, recs, wal.AppendOptions{}); err != nil {
				break
			}
		}
		cancel()
		synctest.Wait()
		if n := testutil.ToFloat64(m.EarlyCuts.WithLabelValues("s")); n != 0 {
			t.Errorf("%v early cuts while a paused sink's cursor, level with this one's, holds the WAL", n)
		}
		rs.stop(t)
		ro.stop(t)
	})
}
