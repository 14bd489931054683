package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/logfwd/forwarder/internal/syncbuf"
	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// Drain delivers what the age limits would hold back: partial CloudWatch
// batches and S3 objects that are not full, which would wait MaxAge (5
// minutes here) without it.
func TestDrainDeliversWhatAgeHoldsBack(t *testing.T) {
	for _, c := range []struct {
		name  string
		carry bool
	}{{"batches", false}, {"carried objects", true}} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := openWAL(t, wal.Options{})
				defer w.Close()
				lim := sinks.Limits{MaxRecords: 10000, MaxBytes: 1 << 20, MaxAge: 5 * time.Minute, Concurrency: 4}
				if c.carry {
					// Members of 2 KiB: each partition's 10 KB are carried
					// member by member, and the object waits for its age.
					lim.MaxBytes, lim.MaxFinalBytes = 2<<10, 4<<20
				}
				s := newTestSink(lim)
				if c.carry {
					s.carryBytes, s.carryRatio = 4<<20, 4
				}
				last := appendN(t, w, 3000, tagsOf(30), 100)
				r := start(w, "s", s, Options{})
				time.Sleep(10 * time.Second)
				synctest.Wait()
				if pos, _ := w.Cursor("s"); pos != 0 {
					t.Fatalf("cursor at %d before the drain: the age limit holds nothing back and the test measures nothing", pos)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				began := time.Now()
				if err := r.d.Drain(ctx); err != nil {
					t.Fatalf("drain: %v", err)
				}
				if pos, _ := w.Cursor("s"); pos != last {
					t.Fatalf("drained, and the cursor is at %d of %d", pos, last)
				}
				t.Logf("drained %d records in %v", last, time.Since(began))
				s.deliveredOnce(t, last)
				s.check(t)
				if c.carry {
					s.mu.Lock()
					finals, carried := s.finals, s.carried
					s.mu.Unlock()
					if carried == 0 {
						t.Fatal("nothing was carried: the test measures nothing")
					}
					if finals < 30 {
						t.Fatalf("%d final batches for 30 partitions' objects", finals)
					}
				}
				// A second caller is answered the same.
				if err := r.d.Drain(ctx); err != nil {
					t.Fatalf("second drain: %v", err)
				}
				r.stop(t)
			})
		})
	}
}

// A paused sink is not waited for: Drain says so at once.
// With wal.sync: interval, the records acknowledged last may not be
// committed when the drain begins: it commits them, and delivers them.
func TestDrainWithSyncInterval(t *testing.T) {
	w := openWAL(t, wal.Options{Sync: wal.SyncInterval, SyncInterval: time.Hour})
	defer w.Close()
	s := newTestSink(sinks.Limits{MaxRecords: 10000, MaxBytes: 1 << 20, MaxAge: 5 * time.Minute, Concurrency: 4})
	r := start(w, "s", s, Options{})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, ok := w.Cursor("s"); ok {
			break // the drainer registered its cursor
		}
		if time.Now().After(deadline) {
			t.Fatal("the drainer did not register its cursor within 10 s")
		}
	}
	last := appendN(t, w, 300, tagsOf(3), 100) // acknowledged; committed in an hour
	if n := w.Stats().NextSeq - 1; n == last {
		t.Fatal("the appends are committed already: the test measures nothing")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.d.Drain(ctx); err != nil {
		t.Fatalf("drain: %v", err)
	}
	if pos, _ := w.Cursor("s"); pos != last {
		t.Fatalf("drained, and the cursor is at %d of %d acknowledged", pos, last)
	}
	s.deliveredOnce(t, last)
	r.stop(t)
}

func TestDrainOfPausedSink(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		s := newTestSink(sinks.Limits{MaxRecords: 100, MaxBytes: 1 << 20, MaxAge: time.Second, Concurrency: 4})
		s.setFail(func(b *sinks.Batch) error {
			return sinks.NewSinkPermanent("AccessDenied", fmt.Errorf("access denied"))
		})
		appendN(t, w, 500, tagsOf(5), 50)
		r := start(w, "s", s, Options{})
		time.Sleep(5 * time.Second)
		synctest.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		began := time.Now()
		err := r.d.Drain(ctx)
		if !errors.Is(err, ErrNotDrained) {
			t.Fatalf("drain of a paused sink: %v, want ErrNotDrained", err)
		}
		if waited := time.Since(began); waited > time.Second {
			t.Fatalf("drain of a paused sink waited %v", waited)
		}
		r.stop(t)
		if err := r.d.Drain(ctx); !errors.Is(err, ErrNotDrained) {
			t.Fatalf("drain after Run returned: %v", err)
		}
	})
}

// A drain that cannot finish (the destination is down) ends with its
// context.
func TestDrainEndsWithItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		s := newTestSink(sinks.Limits{MaxRecords: 100, MaxBytes: 1 << 20, MaxAge: time.Second, Concurrency: 4})
		s.setFail(func(b *sinks.Batch) error { return sinks.NewRetryable("dial", fmt.Errorf("connection refused")) })
		appendN(t, w, 500, tagsOf(5), 50)
		r := start(w, "s", s, Options{})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := r.d.Drain(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("drain with the destination down: %v", err)
		}
		r.stop(t)
	})
}

// Records the destination refuses for their content are summed up as dead
// letters, at warning level, with where they are kept: never as failed
// sends that are "retried".
func TestDeadLettersAreSummedUpAsSuch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		var logs syncbuf.Buffer
		log := slog.New(slog.NewTextHandler(&logs, nil))
		s := newTestSink(sinks.Limits{MaxRecords: 10, MaxBytes: 1 << 20, MaxAge: time.Second, Concurrency: 2})
		s.setFail(func(b *sinks.Batch) error {
			switch b.Partition {
			case "p00":
				return sinks.NewRecordPermanent("key_too_long", fmt.Errorf("key of 1,100 bytes"))
			case "p01":
				var rj []sinks.Rejection
				for _, r := range b.Records {
					if r.Seq%2 == 0 {
						rj = append(rj, sinks.Rejection{Seq: r.Seq, Reason: "too_old"})
					}
				}
				return partial(rj)
			}
			return nil
		})
		last := appendN(t, w, 60, tagsOf(3), 10)
		m := NewMetrics(nil)
		r := start(w, "s", s, Options{Logger: log, SummaryInterval: 20 * time.Second, Metrics: m})
		time.Sleep(time.Minute)
		synctest.Wait()
		if pos, _ := w.Cursor("s"); pos != last {
			t.Fatalf("cursor %d", pos)
		}
		r.stop(t)
		// p01's and p02's two batches of 10 each; p00's, all dead-lettered, are not delivered.
		if n := testutil.ToFloat64(m.Batches.WithLabelValues("s")); n != 4 {
			t.Errorf("delivered_batches_total %v, want 4", n)
		}
		if n := testutil.ToFloat64(m.Delivered.WithLabelValues("s")); n != 30 {
			t.Errorf("delivered_records_total %v, want 30", n)
		}
		out := logs.String()
		if strings.Contains(out, "retried") {
			t.Errorf("dead letters were logged as retried:\n%s", out)
		}
		if n := strings.Count(out, `level=WARN msg="records dead-lettered:`); n != 1 || !strings.Contains(out, "key_too_long=20 too_old=10") ||
			!strings.Contains(out, "forwarder wal dead-letters") {
			t.Errorf("want one warning counting 20 key_too_long and 10 too_old dead letters, saying how to list them:\n%s", out)
		}
	})
}

// Dead letters and retried sends since the last summary are summed up
// when the drainer stops too: a stop within the interval leaves none
// counted but never logged.
func TestSummaryAtStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		var logs syncbuf.Buffer
		log := slog.New(slog.NewTextHandler(&logs, nil))
		s := newTestSink(sinks.Limits{MaxRecords: 10, MaxBytes: 1 << 20, MaxAge: time.Second, Concurrency: 2})
		var mu sync.Mutex
		fails := 0
		s.setFail(func(b *sinks.Batch) error {
			mu.Lock()
			defer mu.Unlock()
			if b.Partition == "p00" {
				return sinks.NewRecordPermanent("key_too_long", fmt.Errorf("key of 1,100 bytes"))
			}
			if fails < 2 {
				fails++
				return sinks.NewRetryable("http_503", fmt.Errorf("unavailable"))
			}
			return nil
		})
		last := appendN(t, w, 60, tagsOf(3), 10)
		r := start(w, "s", s, Options{Logger: log, SummaryInterval: time.Hour})
		time.Sleep(time.Minute)
		synctest.Wait()
		if pos, _ := w.Cursor("s"); pos != last {
			t.Fatalf("cursor %d", pos)
		}
		if out := logs.String(); strings.Contains(out, "dead-lettered") || strings.Contains(out, "retried") {
			t.Fatalf("summed up within the interval:\n%s", out)
		}
		r.stop(t)
		out := logs.String()
		if !strings.Contains(out, `msg="records dead-lettered:`) || !strings.Contains(out, "key_too_long=20") ||
			!strings.Contains(out, "sends failed and were retried") || !strings.Contains(out, "retryable/http_503=2") {
			t.Errorf("the stop did not sum up the dead letters and retries since the last summary:\n%s", out)
		}
	})
}

// A sink whose match refuses every tag that arrives says so, once per
// summary interval, naming some of the tags; a sink that takes some of
// them says nothing.
func TestMatchThatTakesNothingWarns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		var logs syncbuf.Buffer
		log := slog.New(slog.NewTextHandler(&logs, nil))
		pods := func(tag string) bool { return strings.HasPrefix(tag, "pod.") }
		none := newTestSink(sinks.Limits{MaxRecords: 10, MaxBytes: 1 << 20, MaxAge: time.Second, Concurrency: 2})
		some := newTestSink(sinks.Limits{MaxRecords: 10, MaxBytes: 1 << 20, MaxAge: time.Second, Concurrency: 2})
		appendN(t, w, 30, func(i int) string { return fmt.Sprintf("kube.var.log.containers.c%d", i%3) }, 10)
		r1 := start(w, "none", none, Options{Logger: log, SummaryInterval: 20 * time.Second, Match: pods})
		r2 := start(w, "some", some, Options{Logger: log.With("other", true), SummaryInterval: 20 * time.Second, Match: func(tag string) bool { return !pods(tag) }})
		time.Sleep(50 * time.Second)
		synctest.Wait()
		r1.stop(t)
		r2.stop(t)
		out := logs.String()
		want := `level=WARN msg="the sink took none of the records read: its match refused every tag; other sinks may take them, and those no sink matches are not stored; check the sink's match" sink=none interval=20s records=30 tags=kube.var.log.containers.c0,kube.var.log.containers.c1,kube.var.log.containers.c2`
		if strings.Count(out, "the sink took none") != 1 || !strings.Contains(out, want) {
			t.Errorf("want one line %q:\n%s", want, out)
		}
	})
}

// The dead letters stay within their bound when one commit brings more
// than it: the newest are kept.
func TestDeadLettersBoundInOneCommit(t *testing.T) {
	w := openWAL(t, wal.Options{})
	defer w.Close()
	last := appendN(t, w, 50, tagsOf(1), 10)
	s := newTestSink(sinks.Limits{MaxRecords: 100, MaxBytes: 1 << 20, MaxAge: 10 * time.Millisecond, Concurrency: 1})
	s.setFail(func(*sinks.Batch) error { return sinks.NewRecordPermanent("too_large", fmt.Errorf("refused")) })
	m := NewMetrics(nil)
	var logs syncbuf.Buffer
	r := start(w, "s", s, Options{Metrics: m, MaxDeadLetters: 10, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	waitCursor(t, w, "s", last, 10*time.Second)
	r.stop(t)
	// The summary at the stop says what was deleted, and the bound.
	if out := logs.String(); !strings.Contains(out, `msg="dead letters deleted: the oldest went to keep the newest 10 per sink; their records are gone"`) ||
		!strings.Contains(out, "deleted=40") || !strings.Contains(out, "(the newest 10 per sink)") {
		t.Errorf("the log does not say 40 dead letters were deleted, keeping 10:\n%s", out)
	}
	var kept []uint64
	w.ScanState("s", []byte(prefixDead), func(k, _ []byte) error {
		kept = append(kept, be64(k[len(prefixDead):]))
		return nil
	})
	if len(kept) != 10 || kept[0] != last-9 {
		t.Errorf("dead letters kept: %v, want the newest 10", kept)
	}
	if n := testutil.ToFloat64(m.DeadStored.WithLabelValues("s")); n != 10 {
		t.Errorf("stored gauge %v, want 10", n)
	}
	if n := testutil.ToFloat64(m.Evicted.WithLabelValues("s")); n != 40 {
		t.Errorf("evicted %v, want 40", n)
	}
}
