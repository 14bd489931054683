package queue

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/logfwd/forwarder/internal/syncbuf"
	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// deliveredOf counts deliveries of the records first..last.
func deliveredOf(s *testSink, first, last uint64) int {
	got, _, _ := s.snapshot()
	n := 0
	for seq := first; seq <= last; seq++ {
		n += got[seq]
	}
	return n
}

// Failing partitions do not keep a healthy partition behind them from being
// read and delivered: not when a run of one failing partition's records fills
// memory, and not when the failing partitions' batches alone fill it. Once
// they recover, everything is delivered, once.
func TestFailingPartitionsDoNotBlockOthers(t *testing.T) {
	for _, c := range []struct {
		name        string
		concurrency int
		fill        func(t *testing.T, w *wal.WAL) // appends the failing partitions' records
	}{
		{"run of one partition", 2, func(t *testing.T, w *wal.WAL) {
			appendN(t, w, 30, func(int) string { return "bad" }, 1000)
			time.Sleep(time.Minute) // several failures in a row, all of one partition
			appendN(t, w, 1000, func(int) string { return "bad" }, 1000)
		}},
		{"batches of four partitions", 4, func(t *testing.T, w *wal.WAL) {
			appendN(t, w, 120, func(i int) string { return fmt.Sprintf("bad%d", i%4) }, 1000)
			time.Sleep(time.Second)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := openWAL(t, wal.Options{})
				defer w.Close()
				s := newTestSink(sinks.Limits{MaxRecords: 20, MaxBytes: 1 << 20, MaxAge: time.Second, Concurrency: c.concurrency})
				s.setFail(func(b *sinks.Batch) error {
					if strings.HasPrefix(b.Partition, "bad") {
						return sinks.NewRetryable("http_500", fmt.Errorf("internal error"))
					}
					return nil
				})
				r := start(w, "s", s, Options{MaxBufferedBytes: 64 << 10, ReadBatch: 200})
				c.fill(t, w)
				last := appendN(t, w, 500, func(int) string { return "good" }, 1000)
				time.Sleep(30 * time.Minute)
				synctest.Wait()
				if n := deliveredOf(s, last-499, last); n != 500 {
					t.Fatalf("healthy partition: %d of 500 records delivered after 30 minutes; status %+v", n, r.d.Status())
				}
				s.heal(t, w, last, 10*time.Minute)
				r.stop(t)
				s.check(t)
			})
		})
	}
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// Spilling a stuck partition frees its memory, not just the count of it: the
// batch it keeps for the retry does not hold the queue's array or the read
// buffers it shared with the spilled records.
func TestSpillFreesMemory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		s := newTestSink(sinks.Limits{MaxRecords: 5, MaxBytes: 1 << 20, MaxAge: time.Second, Concurrency: 1})
		s.setFail(func(b *sinks.Batch) error { return sinks.NewRetryable("http_500", fmt.Errorf("internal error")) })
		appendN(t, w, 100000, func(int) string { return "bad" }, 100)
		base := heapInUse()
		m := NewMetrics(nil)
		r := start(w, "s", s, Options{MaxBufferedBytes: 8 << 20, ReadBatch: 20000, RetryMin: time.Hour, RetryMax: time.Hour, Metrics: m})
		time.Sleep(time.Minute)
		synctest.Wait()
		st := r.d.Status()
		// The one partition was released once: the records read after it
		// are not held, and are read again when it can send.
		if n := testutil.ToFloat64(m.Spills.WithLabelValues("s")); n != 1 {
			t.Errorf("forwarder_sink_spills_total is %v, want 1", n)
		}
		grown := int64(heapInUse()) - int64(base)
		if st.Buffered > 64<<10 {
			t.Fatalf("%d bytes counted after the spill", st.Buffered)
		}
		if grown > 2<<20 {
			t.Fatalf("the heap grew by %d bytes with %d counted: spilled memory is still held", grown, st.Buffered)
		}
		s.setFail(nil)
		r.stop(t)
	})
}

// panicky panics sending a batch of partition "p00" while panics is above
// zero; other partitions are delivered.
type panicky struct {
	*testSink
	panics atomic.Int32
}

func (s *panicky) Send(ctx context.Context, b *sinks.Batch) (sinks.Outcome, error) {
	if b.Partition == "p00" && s.panics.Add(-1) >= 0 {
		panic("a bug met by this batch")
	}
	return s.testSink.Send(ctx, b)
}

// A sink that panics sending one partition's batch (a bug) does not stop
// the service: the other partitions are delivered, the batch stays in the
// WAL and is sent again, counted as reason "panic", the panic logged.
func TestSendPanicIsTheBatchsFailure(t *testing.T) {
	w := openWAL(t, wal.Options{})
	defer w.Close()
	s := &panicky{testSink: newTestSink(sinks.Limits{MaxRecords: 10, MaxBytes: 64 << 10, MaxAge: 10 * time.Millisecond, Concurrency: 2})}
	s.panics.Store(3)
	var logs syncbuf.Buffer
	m := NewMetrics(prometheus.NewRegistry())
	r := start(w, "s", s, Options{Metrics: m, RetryMin: 5 * time.Millisecond, RetryMax: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	last := appendN(t, w, 40, tagsOf(4), 100)
	waitCursor(t, w, "s", last, 10*time.Second)
	r.stop(t)
	if got := testutil.ToFloat64(m.Retries.WithLabelValues("s", "retryable", "panic")); got != 3 {
		t.Errorf("%v retries for a panic, want 3", got)
	}
	if n := strings.Count(logs.String(), "level=ERROR msg=\"the sink panicked sending a batch"); n != 1 || !strings.Contains(logs.String(), "a bug met by this batch") {
		t.Errorf("%d panic lines, want one, with the panic:\n%s", n, logs.String())
	}
	s.check(t)
	s.deliveredOnce(t, last)
}
