package queue

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

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

// Records appended while the drain runs are not waited for, and a drain
// that cannot finish (the destination is down) ends with its context.
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
