package queue

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// testSink records what it accepts and fails on demand. Its partition is
// the record's tag.
type testSink struct {
	lim sinks.Limits

	mu        sync.Mutex
	fail      func(b *sinks.Batch) error // nil: accept
	delay     time.Duration
	got       map[uint64]int      // seq → times accepted
	order     map[string][]uint64 // partition → seqs in acceptance order
	sends     int
	inflight  map[string]bool
	maxActive int
	active    int
	violation string
	// bodies: check that each record's body is the one appendN wrote for
	// it into a fresh WAL (`{"i":seq-1,...`) when the batch is sent.
	bodies bool
}

func newTestSink(lim sinks.Limits) *testSink {
	return &testSink{lim: lim, got: map[uint64]int{}, order: map[string][]uint64{}, inflight: map[string]bool{}}
}

func (s *testSink) Limits() sinks.Limits             { return s.lim }
func (s *testSink) Partition(r *sinks.Record) string { return r.Tag }
func (s *testSink) Size(r *sinks.Record) int         { return len(r.Body) }

func (s *testSink) Send(ctx context.Context, b *sinks.Batch) (sinks.Outcome, error) {
	s.mu.Lock()
	s.sends++
	if s.inflight[b.Partition] {
		s.violation = "two batches in flight for " + b.Partition
	}
	s.inflight[b.Partition] = true
	s.active++
	s.maxActive = max(s.maxActive, s.active)
	fail, delay := s.fail, s.delay
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inflight[b.Partition] = false
		s.active--
		s.mu.Unlock()
	}()
	if len(b.Records) > s.lim.MaxRecords {
		s.setViolation(fmt.Sprintf("batch of %d records, limit %d", len(b.Records), s.lim.MaxRecords))
	}
	for _, r := range b.Records {
		if r.Tag != b.Partition {
			s.setViolation("record of " + r.Tag + " in a batch of " + b.Partition)
		}
		if s.bodies && !bytes.HasPrefix(r.Body, fmt.Appendf(nil, `{"i":%d,`, r.Seq-1)) {
			s.setViolation(fmt.Sprintf("record %d has the body %.40q", r.Seq, r.Body))
		}
	}
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return sinks.Outcome{}, sinks.NewRetryable("cancelled", ctx.Err())
		}
	}
	var out sinks.Outcome
	if fail != nil {
		if err := fail(b); err != nil {
			var e *sinks.Error
			if ok := asError(err, &e); ok && e.Reason == "partial" {
				// Accept all but the rejections carried in e.Err.
				out.Rejected = e.Err.(rejections)
			} else {
				return sinks.Outcome{}, err
			}
		}
	}
	rejected := map[uint64]bool{}
	for _, rj := range out.Rejected {
		rejected[rj.Seq] = true
	}
	s.mu.Lock()
	for _, r := range b.Records {
		if !rejected[r.Seq] {
			s.got[r.Seq]++
			s.order[b.Partition] = append(s.order[b.Partition], r.Seq)
		}
	}
	s.mu.Unlock()
	return out, nil
}

// rejections lets a scripted failure return a partial success.
type rejections []sinks.Rejection

func (r rejections) Error() string { return fmt.Sprintf("%d rejected", len(r)) }

func partial(rj []sinks.Rejection) error { return &sinks.Error{Reason: "partial", Err: rejections(rj)} }

func asError(err error, e **sinks.Error) bool {
	x, ok := err.(*sinks.Error)
	*e = x
	return ok
}

func (s *testSink) setViolation(v string) {
	s.mu.Lock()
	s.violation = v
	s.mu.Unlock()
}

func (s *testSink) setFail(f func(b *sinks.Batch) error) {
	s.mu.Lock()
	s.fail = f
	s.mu.Unlock()
}

func (s *testSink) snapshot() (got map[uint64]int, order map[string][]uint64, sends int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	got = make(map[uint64]int, len(s.got))
	for k, v := range s.got {
		got[k] = v
	}
	order = map[string][]uint64{}
	for k, v := range s.order {
		order[k] = append([]uint64(nil), v...)
	}
	return got, order, s.sends
}

func (s *testSink) check(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.violation != "" {
		t.Fatal(s.violation)
	}
	if s.maxActive > s.lim.Concurrency {
		t.Fatalf("%d partitions in flight at once, limit %d", s.maxActive, s.lim.Concurrency)
	}
	for p, seqs := range s.order {
		if !sort.SliceIsSorted(seqs, func(i, j int) bool { return seqs[i] < seqs[j] }) {
			t.Fatalf("partition %s delivered out of order", p)
		}
	}
}

// recover lets every send succeed from now on and waits d in the test's
// synctest bubble; by then cursor "s" must have passed last.
func (s *testSink) recover(t *testing.T, w *wal.WAL, last uint64, d time.Duration) {
	t.Helper()
	s.setFail(nil)
	time.Sleep(d)
	synctest.Wait()
	if pos, _ := w.Cursor("s"); pos != last {
		t.Fatalf("cursor %d %v after sends succeed again, want %d", pos, d, last)
	}
}

// deliveredOnce fails unless every record from 1 to last was accepted once.
func (s *testSink) deliveredOnce(t *testing.T, last uint64) {
	t.Helper()
	got, _, _ := s.snapshot()
	for seq := uint64(1); seq <= last; seq++ {
		if got[seq] != 1 {
			t.Fatalf("record %d delivered %d times", seq, got[seq])
		}
	}
}

func tagsOf(n int) func(i int) string {
	return func(i int) string { return fmt.Sprintf("p%02d", i%n) }
}

var _ = strings.Contains
