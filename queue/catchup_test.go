package queue

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/logfwd/forwarder/internal/racedetect"
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
	racedetect.Heavy(t) // 14 s under -race, 4.5 s without
	for _, c := range []catchUpCase{
		{"one partition", 1, false},
		{"100 partitions", 100, false},
		{"one partition carried", 1, true},
		{"100 partitions carried", 100, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			opts := Options{MaxBufferedBytes: catchUpMem, RetryMin: time.Second, RetryMax: 5 * time.Second} // waits long enough to be spilled
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

// While no connection to the destination can be made (sinks.Error.
// Unreachable) and memory has run short, the head reader waits instead of
// reading records only to pass them by: each costs a WAL read, a decode and
// a Partition call, for every record the inputs take in while the outage
// lasts. A destination that answers, even with errors, and a send that
// times out or loses its connection midway (which can be one request's
// own) do not hold it. Either way every record is delivered once when
// sends succeed again.
func TestUnreachableDestinationHoldsHeadReader(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: half a minute of appends while the sink fails; make test runs it")
	}
	refused := sinks.NewRetryable("network", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")})
	unavailable := sinks.NewRetryable("http_503", errors.New("service unavailable"))
	for _, c := range []struct {
		name  string
		err   error
		every int // with every > 0, each every-th failure is a 503 instead
		parts int
		held  bool
	}{
		{"connection refused", refused, 0, 4, true},
		{"connection refused, one partition", refused, 0, 1, true},
		{"no such host", sinks.NewRetryable("network", &net.DNSError{Err: "no such host", Name: "logs.example"}), 0, 4, true},
		{"timeout", sinks.NewRetryable("timeout", context.DeadlineExceeded), 0, 4, false},
		{"connection reset", sinks.NewRetryable("network", &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")}), 0, 4, false},
		{"503", unavailable, 0, 4, false},
		{"two refused, then a 503", refused, 3, 4, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := openWAL(t, wal.Options{})
				defer w.Close()
				s := newTestSink(sinks.Limits{MaxRecords: 100, MaxBytes: 1 << 20, MaxAge: time.Second, Concurrency: 4})
				var failures atomic.Int64 // sends may fail at once
				s.setFail(func(*sinks.Batch) error {
					if n := failures.Add(1); c.every > 0 && n%int64(c.every) == 0 {
						return unavailable
					}
					return c.err
				})
				m := NewMetrics(nil)
				r := start(w, "s", s, Options{MaxBufferedBytes: 256 << 10, RetryMin: time.Second, RetryMax: 10 * time.Second, Metrics: m})
				var last uint64
				for range 30 { // half a minute, 500 records of 200 bytes a second
					last = appendN(t, w, 500, tagsOf(c.parts), 200)
					time.Sleep(time.Second)
				}
				synctest.Wait()
				if n := testutil.ToFloat64(m.Spills.WithLabelValues("s")); n == 0 {
					t.Fatal("nothing was spilled: memory did not run short, the test tested nothing")
				}
				routed := s.partitions.Load()
				t.Logf("%d records appended, %d routed during the outage", last, routed)
				if got := r.d.Status().Unreachable; got != c.held {
					t.Errorf("/status unreachable %v during the outage, want %v", got, c.held)
				}
				if c.held && routed > int64(last)/4 {
					t.Errorf("%d records routed while the destination could not be reached, of %d appended: the head reader read on", routed, last)
				}
				if !c.held && routed < int64(last) {
					t.Errorf("%d records routed of %d appended: the head reader waited while the destination could be reached", routed, last)
				}
				s.heal(t, w, last, 2*time.Minute)
				s.deliveredOnce(t, last)
				if r.d.Status().Unreachable {
					t.Error("/status unreachable after sends succeed again")
				}
				r.stop(t)
				s.check(t)
			})
		})
	}
}

// With drop_oldest, the WAL can drop every record the spilled partitions
// held while the destination cannot be reached: then nothing is left to send
// whose answer would end the head reader's wait, and the head reader reads
// on instead of waiting for ever. Once sends succeed the cursor reaches the
// last record, and what the sink missed is what the WAL counted dropped.
func TestUnreachableDestinationWithDropOldest(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a minute of appends into a full WAL while the sink fails; make test runs it")
	}
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{MaxBytes: 256 << 10, WhenFull: wal.DropOldest})
		defer w.Close()
		s := newTestSink(sinks.Limits{MaxRecords: 100, MaxBytes: 1 << 20, MaxAge: time.Second, Concurrency: 4})
		s.setFail(func(*sinks.Batch) error {
			return sinks.NewRetryable("network", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")})
		})
		r := start(w, "s", s, Options{MaxBufferedBytes: 64 << 10, RetryMin: time.Second, RetryMax: 10 * time.Second})
		var last uint64
		for range 60 {
			last = appendN(t, w, 500, tagsOf(4), 200)
			time.Sleep(time.Second)
		}
		dropped := w.Stats().Dropped["s"]
		if dropped == 0 {
			t.Fatal("nothing was dropped: the test did not fill the WAL")
		}
		s.heal(t, w, last, 2*time.Minute)
		got, _, _ := s.snapshot()
		for seq, n := range got {
			if n != 1 {
				t.Errorf("record %d delivered %d times", seq, n)
			}
		}
		if missed := last - uint64(len(got)); missed != dropped {
			t.Errorf("the sink missed %d records, the WAL counted %d dropped", missed, dropped)
		}
		r.stop(t)
		s.check(t)
	})
}

// Throttled sends (a wait of 100 ms) under memory pressure do not spill:
// reading a partition back would read again all the WAL read meanwhile,
// for a moment's memory. The reader waits for the throttled partitions to
// send instead, and nothing is read twice.
func TestShortWaitsAreNotSpilled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		s := catchUpCase{parts: 100}.sink()
		var n atomic.Int64
		s.setFail(func(b *sinks.Batch) error {
			if n.Add(1)%10 == 0 {
				return sinks.NewThrottled("ThrottlingException", 100*time.Millisecond, errors.New("rate exceeded"))
			}
			return nil
		})
		m := NewMetrics(nil)
		last := appendN(t, w, catchUpRecords, tagsOf(100), 250)
		r := start(w, "s", s, Options{MaxBufferedBytes: catchUpMem, Metrics: m})
		drainedAfter(t, w, r, s, last, time.Hour)
		s.deliveredOnce(t, last)
		if spills, reread := testutil.ToFloat64(m.Spills.WithLabelValues("s")), testutil.ToFloat64(m.Reread.WithLabelValues("s")); spills != 0 || reread != 0 {
			t.Errorf("%v partitions spilled, %v records read again, for waits of 100 ms", spills, reread)
		}
		if n.Load() < 20 {
			t.Fatalf("%d sends: too few throttled to measure anything", n.Load())
		}
	})
}
