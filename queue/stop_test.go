package queue

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// holdOne holds the batches of partition "p00" until the send is canceled.
type holdOne struct{ *testSink }

func (s *holdOne) Send(ctx context.Context, b *sinks.Batch) (sinks.Outcome, error) {
	if b.Partition == "p00" {
		<-ctx.Done()
		return sinks.Outcome{}, sinks.NewRetryable("cancelled", ctx.Err())
	}
	return s.testSink.Send(ctx, b)
}

// While the stop waits for a send in flight, a partition that became due
// is not sent (stopping), and does not wake the loop for it (every
// millisecond until the send ends, before).
func TestStopDoesNotSpin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		s := &holdOne{newTestSink(sinks.Limits{MaxRecords: 10, MaxBytes: 64 << 10, MaxAge: time.Second, Concurrency: 4})}
		r := start(w, "s", s, Options{ShutdownTimeout: 20 * time.Second})
		appendN(t, w, 10, func(int) string { return "p00" }, 100) // a full batch: sent at once, held
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		appendN(t, w, 1, func(int) string { return "p01" }, 100) // due in a second
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		before := r.d.steps.Load()
		began := time.Now()
		r.stop(t)
		took := time.Since(began)
		n := r.d.steps.Load() - before
		t.Logf("stop took %v, %d loop steps", took, n)
		if n > 100 {
			t.Errorf("%d steps of the loop during a %v stop with one send in flight, want about one a second", n, took)
		}
	})
}

// A delivery whose commit waits for room on a full disk keeps its
// partition in flight; at ShutdownTimeout the stop gives it up, as it
// cancels sends (its records are sent again at the next start), rather
// than wait until the process's own deadline.
func TestStopGivesUpCommitsOnAFullDisk(t *testing.T) {
	w := openWAL(t, wal.Options{})
	defer w.Close()
	s := newTestSink(sinks.Limits{MaxRecords: 10, MaxBytes: 64 << 10, MaxAge: 10 * time.Millisecond, Concurrency: 2})
	full := diskFullSwitch(t)
	r := start(w, "s", s, Options{ShutdownTimeout: 500 * time.Millisecond})
	first := appendN(t, w, 10, tagsOf(1), 100)
	waitCursor(t, w, "s", first, 10*time.Second)
	full.Store(true)
	appendN(t, w, 10, tagsOf(1), 100)
	time.Sleep(300 * time.Millisecond) // delivered; its commit waits for room
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		if pos, _ := w.Cursor("s"); pos != first {
			t.Errorf("cursor at %d, want %d: the delivery given up is not recorded", pos, first)
		}
	case <-time.After(5 * time.Second):
		full.Store(false) // let it end, for goleak
		<-r.done
		t.Fatal("Run did not return within 5s of the stop (ShutdownTimeout 500ms): the stop waits for a commit on a full disk")
	}
}

// lateDeliver: p00's send ends only when cancelled, and is delivered all the same
// (its answer arrived as the stop cancelled it).
type lateDeliver struct{ *testSink }

func (s *lateDeliver) Send(ctx context.Context, b *sinks.Batch) (sinks.Outcome, error) {
	if b.Partition == "p00" {
		<-ctx.Done()
		return s.testSink.Send(context.Background(), b)
	}
	return s.testSink.Send(ctx, b)
}

// A send delivered after ShutdownTimeout's cancel, its commit on a full
// disk: tried once, and given up, not waited on.
func TestStopGivesUpALateDeliverysCommit(t *testing.T) {
	w := openWAL(t, wal.Options{})
	defer w.Close()
	s := &lateDeliver{newTestSink(sinks.Limits{MaxRecords: 10, MaxBytes: 64 << 10, MaxAge: 10 * time.Millisecond, Concurrency: 2})}
	full := diskFullSwitch(t)
	r := start(w, "s", s, Options{ShutdownTimeout: 500 * time.Millisecond})
	appendN(t, w, 10, func(int) string { return "p00" }, 100)
	time.Sleep(200 * time.Millisecond) // p00 in flight, held
	full.Store(true)
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(5 * time.Second):
		full.Store(false)
		<-r.done
		t.Fatal("Run did not return within 5s of the stop (ShutdownTimeout 500ms): a delivery that reached its commit after the hard stop waits on the full disk")
	}
}

// diskFullSwitch makes the drainers' commits fail for a full disk while
// the switch it returns is on, until the test ends.
func diskFullSwitch(t *testing.T) *atomic.Bool {
	var full atomic.Bool
	commit := walCommit
	walCommit = func(w *wal.WAL, b *wal.Batch) error {
		if full.Load() {
			return fmt.Errorf("commit: %w", wal.ErrNoSpace)
		}
		return commit(w, b)
	}
	t.Cleanup(func() { walCommit = commit })
	return &full
}
