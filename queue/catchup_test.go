package queue

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// catchUpCase is a sink and a backlog for the catch-up tests.
type catchUpCase struct {
	name  string
	parts int
	carry bool // the sink carries (as S3 does), with a 5-minute MaxAge
}

func (c catchUpCase) sink() *testSink {
	if !c.carry {
		// As CloudWatch: 10,000 events or 1 MiB a call, flushed after 5 s.
		return newTestSink(sinks.Limits{MaxRecords: 10000, MaxBytes: 1 << 20, MaxAge: 5 * time.Second, MaxSpan: 24 * time.Hour, Concurrency: 64})
	}
	// As S3: objects of 4 MiB built from members of 512 KiB, compressed 4:1,
	// finished after 5 minutes.
	s := newTestSink(sinks.Limits{MaxRecords: 1 << 20, MaxBytes: 512 << 10, MaxFinalBytes: 4 << 20, MaxAge: 5 * time.Minute, MaxOpen: 256, Concurrency: 16})
	s.carryBytes, s.carryRatio = 4<<20, 4
	return s
}

const (
	catchUpRecords = 40000 // of 250 bytes: 10 MB, 15 MB in memory
	catchUpMem     = 4 << 20
	catchUpWindow  = 20 * time.Second
)

// taken counts the records from 1 to last that the sink accepted at least
// once or carries now: what it has of the backlog. For a carrying sink,
// objects that are not full wait out their age (5 minutes here) whether
// the backlog was read at once or not; what it carries is what it read.
func (s *testSink) taken(last uint64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for seq := uint64(1); seq <= last; seq++ {
		if s.got[seq] > 0 {
			n++
		}
	}
	for _, c := range s.carries {
		n += len(c.recs)
	}
	return n
}

// After an outage, a backlog drains as fast as a drainer started on the
// same backlog drains it: within a retry interval and the same window,
// the sink takes at least 80% as many records. Before, each spilled partition was
// read back a little at a time and every piece waited out MaxAge: one
// batch per flush interval, one S3 object per max_object_age.
func TestCatchUpAfterOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: outages and catch-ups of both sinks, with and without carries; make test runs it")
	}
	for _, c := range []catchUpCase{
		{"one partition", 1, false},
		{"100 partitions", 100, false},
		{"one partition carried", 1, true},
		{"100 partitions carried", 100, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			opts := Options{MaxBufferedBytes: catchUpMem, RetryMin: 200 * time.Millisecond, RetryMax: 5 * time.Second}
			var fresh, caught int
			var last uint64
			synctest.Test(t, func(t *testing.T) {
				// A drainer started on the backlog.
				w := openWAL(t, wal.Options{})
				defer w.Close()
				last = appendN(t, w, catchUpRecords, tagsOf(c.parts), 250)
				s := c.sink()
				r := start(w, "s", s, opts)
				time.Sleep(catchUpWindow)
				synctest.Wait()
				fresh = s.taken(last)
				drainedAfter(t, w, r, s, last, time.Hour)
				s.deliveredOnce(t, last)
			})
			synctest.Test(t, func(t *testing.T) {
				// The same backlog piled up while the destination was down.
				w := openWAL(t, wal.Options{})
				defer w.Close()
				s := c.sink()
				s.setFail(func(b *sinks.Batch) error { return sinks.NewRetryable("dial", fmt.Errorf("connection refused")) })
				m := NewMetrics(nil)
				o := opts
				o.Metrics = m
				r := start(w, "s", s, o)
				for i := range 10 {
					appendN(t, w, catchUpRecords/10, func(j int) string { return tagsOf(c.parts)(i*catchUpRecords/10 + j) }, 250)
					time.Sleep(time.Second)
				}
				time.Sleep(time.Minute)
				synctest.Wait()
				if got, _, _ := s.snapshot(); len(got) != 0 {
					t.Fatalf("%d records delivered while every send fails", len(got))
				}
				if n := testutil.ToFloat64(m.Spills.WithLabelValues("s")); n == 0 {
					t.Fatal("nothing was spilled: the backlog fits in memory and the test measures nothing")
				}
				s.setFail(nil)
				time.Sleep(opts.RetryMax + catchUpWindow)
				synctest.Wait()
				caught = s.taken(last)
				drainedAfter(t, w, r, s, last, time.Hour)
				// One pass over the backlog brings every partition back, not
				// one pass a partition.
				if n := testutil.ToFloat64(m.Reread.WithLabelValues("s")); n == 0 || n > 2*catchUpRecords {
					t.Errorf("%v records read again for a backlog of %d, want one pass or little more", n, catchUpRecords)
				}
				s.deliveredOnce(t, last)
			})
			t.Logf("within %v the sink took %d of %d records from a fresh start, %d after the outage", catchUpWindow, fresh, catchUpRecords, caught)
			if fresh < catchUpRecords/2 {
				t.Fatalf("a fresh start took only %d of %d records in %v: the test measures nothing", fresh, catchUpRecords, catchUpWindow)
			}
			if caught*10 < fresh*8 {
				t.Fatalf("after the outage the sink took %d records in a retry interval and %v, from a fresh start %d", caught, catchUpWindow, fresh)
			}
		})
	}
}
