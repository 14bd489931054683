package queue

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
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
	// overflows: batches of partition "overflow" hold records of any tag
	// (see overflowSink).
	overflows bool
	// carryBytes, when not 0, makes the sink carry what it takes in
	// (sinks.Outcome.Carry) until a final batch or until it holds
	// carryBytes of bodies (its Room is what is left); a carry's Mem is
	// its bodies' bytes over carryRatio (1 when 0).
	carryBytes, carryRatio int
	carries                map[string]*testCarry // partition → the carry last handed back
	carried, finals        int                   // sends answered with a carry; final batches
	flushes                int                   // final batches of a carry alone
	discards               int                   // carries the drainer gave up (Discard)

	partitions atomic.Int64 // Partition calls: the records the drainer routed
}

// testCarry is what a carrying testSink hands back: the records it took in.
type testCarry struct {
	recs       []sinks.Record // bodies copied
	bytes, mem int
	room       int
	// The drainer discards a carry it gives up (sinks.Discarder): once,
	// never while a send of its partition is in flight.
	s         *testSink
	partition string
	discarded bool
}

func (c *testCarry) Mem() int  { return c.mem }
func (c *testCarry) Room() int { return c.room }

func (c *testCarry) Discard() {
	c.s.mu.Lock()
	c.s.discards++
	inflight := c.s.inflight[c.partition]
	twice := c.discarded
	c.discarded = true
	c.s.mu.Unlock()
	switch {
	case twice:
		c.s.setViolation("a carry of " + c.partition + " discarded twice")
	case inflight:
		c.s.setViolation("a carry of " + c.partition + " discarded while a send of its partition is in flight")
	}
}

func newTestSink(lim sinks.Limits) *testSink {
	return &testSink{lim: lim, got: map[uint64]int{}, order: map[string][]uint64{}, inflight: map[string]bool{}, carries: map[string]*testCarry{}}
}

func (s *testSink) Limits() sinks.Limits             { return s.lim }
func (s *testSink) Partition(r *sinks.Record) string { s.partitions.Add(1); return r.Tag }
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
		if r.Tag != b.Partition && !(s.overflows && b.Partition == "overflow") {
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
	recs := b.Records
	if s.carryBytes > 0 || b.Carry != nil {
		var c *testCarry
		if b.Carry != nil {
			c = b.Carry.(*testCarry)
		}
		s.mu.Lock()
		// The drainer may give a carry up (and read its records again),
		// but never sends an older one.
		if c != nil && c != s.carries[b.Partition] {
			s.violation = "a batch of " + b.Partition + " with another carry than the one handed back last"
		}
		if b.Final {
			s.finals++
			if len(b.Records) == 0 {
				s.flushes++
			}
		}
		s.mu.Unlock()
		if c == nil && len(b.Records) == 0 {
			s.setViolation("an empty batch without a carry")
		}
		if c != nil && len(b.Records) > 0 && b.Records[0].Seq <= c.recs[len(c.recs)-1].Seq {
			s.setViolation(fmt.Sprintf("batch from %d after a carry up to %d", b.Records[0].Seq, c.recs[len(c.recs)-1].Seq))
		}
		n := &testCarry{s: s, partition: b.Partition}
		if c != nil {
			n.recs, n.bytes = c.recs[:len(c.recs):len(c.recs)], c.bytes
		}
		for _, r := range b.Records {
			n.bytes += len(r.Body)
			r.Body = bytes.Clone(r.Body)
			n.recs = append(n.recs, r)
		}
		if c != nil && n.bytes > s.carryBytes && len(b.Records) > 0 {
			s.setViolation(fmt.Sprintf("a batch of %d bytes with a carry that had room for %d", n.bytes-c.bytes, c.room))
		}
		if !b.Final && n.bytes < s.carryBytes {
			n.room = s.carryBytes - n.bytes
			n.mem = n.bytes / max(s.carryRatio, 1)
			s.mu.Lock()
			s.carries[b.Partition] = n
			s.carried++
			s.mu.Unlock()
			return sinks.Outcome{Carry: n}, nil
		}
		recs = n.recs
	}
	var out sinks.Outcome
	if fail != nil {
		if err := fail(b); err != nil {
			var e *sinks.Error
			if ok := asError(err, &e); ok && e.Reason == "partial" {
				// Accept all but the rejections carried in e.Err.
				out.Rejected = e.Err.(rejections)
			} else {
				if sinks.Classify(err).Class == sinks.RecordPermanent {
					s.mu.Lock()
					delete(s.carries, b.Partition) // the drainer gives it up
					s.mu.Unlock()
				}
				return sinks.Outcome{}, err
			}
		}
	}
	rejected := map[uint64]bool{}
	for _, rj := range out.Rejected {
		rejected[rj.Seq] = true
	}
	s.mu.Lock()
	for _, r := range recs {
		if !rejected[r.Seq] {
			s.got[r.Seq]++
			s.order[b.Partition] = append(s.order[b.Partition], r.Seq)
		}
	}
	delete(s.carries, b.Partition)
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
func (s *testSink) heal(t *testing.T, w *wal.WAL, last uint64, d time.Duration) {
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
