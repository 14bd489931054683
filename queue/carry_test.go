package queue

import (
	"bytes"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// A sink that carries what it takes in (sinks.Outcome.Carry) holds the
// cursor before the carried records until a later batch delivers them: at
// MaxAge of the oldest, or when the carry has no room for the next record.
// Batches are cut within the carry's room, and retries go with the carry
// they were first sent with.
func TestCarryHoldsTheCursorUntilDelivered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		s := newTestSink(sinks.Limits{MaxRecords: 20, MaxBytes: 1 << 20, MaxAge: time.Minute, Concurrency: 3})
		s.carryBytes = 5000
		m := NewMetrics(nil)
		r := start(w, "s", s, Options{RetryMin: time.Second, Metrics: m})
		sends := func() uint64 {
			var out dto.Metric
			m.SendDuration.WithLabelValues("s").(prometheus.Histogram).Write(&out)
			return out.GetHistogram().GetSampleCount()
		}
		first := appendN(t, w, 45, func(int) string { return "a" }, 100)
		time.Sleep(30 * time.Second)
		synctest.Wait()
		got, _, _ := s.snapshot()
		if pos, _ := w.Cursor("s"); pos != 0 || len(got) != 0 || s.carried == 0 {
			t.Fatalf("before MaxAge: cursor %d, %d delivered, %d carried; want the records carried and the cursor before them", pos, len(got), s.carried)
		}
		// A batch the sink only took into its carry was not sent to the destination.
		if n := sends(); n != 0 {
			t.Fatalf("send_duration_seconds counts %d sends while the sink only carried", n)
		}
		if st := r.d.Status(); st.Buffered == 0 {
			t.Fatalf("status %+v: the carry is not counted", st)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if pos, _ := w.Cursor("s"); pos != first {
			t.Fatalf("after MaxAge: cursor %d, want %d", pos, first)
		}
		if n := sends(); n == 0 {
			t.Fatal("send_duration_seconds counts no send after the carry was delivered")
		}
		s.deliveredOnce(t, first)

		// Many more: deliveries fill the carry's room. Every third delivery
		// fails twice first; its retries must bring the same carry.
		fails := map[uint64]int{}
		s.setFail(func(b *sinks.Batch) error {
			var k uint64
			if c, ok := b.Carry.(*testCarry); ok {
				k = c.recs[0].Seq
			} else {
				k = b.Records[0].Seq
			}
			if k%3 == 0 && fails[k] < 2 {
				fails[k]++
				return sinks.NewRetryable("http_500", fmt.Errorf("internal error"))
			}
			return nil
		})
		last := appendN(t, w, 1000, func(i int) string { return fmt.Sprintf("p%d", i%4) }, 130)
		drainedAfter(t, w, r, s, last, 5*time.Minute)
		s.deliveredOnce(t, last)
		retried := 0
		for _, n := range fails {
			retried += n
		}
		if s.flushes == 0 || retried == 0 {
			t.Fatalf("%d deliveries of a carry alone (its room too small for the next record), %d retried sends: want some of each", s.flushes, retried)
		}
		t.Logf("%d sends carried, %d final, %d of a carry alone, %d retried", s.carried, s.finals, s.flushes, retried)
	})
}

// When a delivery with a carry is refused for its content, the drainer
// reads the carried records again from the WAL and sends every batch of the
// partition final, so that the refusal dead-letters them batch by batch:
// nothing is lost and the cursor moves on.
func TestCarryRefusedIsDeadLettered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		s := newTestSink(sinks.Limits{MaxRecords: 10, MaxBytes: 1 << 20, MaxAge: time.Second, Concurrency: 2})
		s.carryBytes = 1 << 20
		finalsOfBad, carriesSeen := 0, 0
		s.setFail(func(b *sinks.Batch) error {
			if b.Partition != "bad" {
				return nil
			}
			finalsOfBad++
			if b.Carry != nil {
				carriesSeen++
			}
			return sinks.NewRecordPermanent("EntityTooLarge", fmt.Errorf("refused"))
		})
		last := appendN(t, w, 200, func(i int) string { return []string{"bad", "good"}[i%2] }, 50)
		r := start(w, "s", s, Options{})
		drainedAfter(t, w, r, s, last, time.Minute)
		got, _, _ := s.snapshot()
		dead := map[uint64]string{}
		if err := DeadLetters(w, "s", func(d DeadLetter) error { dead[d.Seq] = d.Reason; return nil }); err != nil {
			t.Fatal(err)
		}
		for seq := uint64(1); seq <= last; seq++ {
			if seq%2 == 1 && (dead[seq] != "EntityTooLarge" || got[seq] != 0) || seq%2 == 0 && (dead[seq] != "" || got[seq] != 1) {
				t.Fatalf("record %d: dead %q, delivered %d", seq, dead[seq], got[seq])
			}
		}
		if carriesSeen == 0 || finalsOfBad <= carriesSeen {
			t.Fatalf("%d refused deliveries, %d of them with a carry: want a carried one refused, then batches of their own", finalsOfBad, carriesSeen)
		}
		// Each carry given up was discarded (what it holds outside the
		// drainer, such as the S3 sink's staged file, is let go).
		s.mu.Lock()
		discards := s.discards
		s.mu.Unlock()
		if discards != carriesSeen {
			t.Fatalf("%d carries refused and given up, %d discarded", carriesSeen, discards)
		}
	})
}

// Carries count against MaxBufferedBytes: when they fill half of it, the
// largest is delivered early; with Limits.MaxOpen, the oldest open one is
// when another partition opens. A sink whose carries never fill and never
// age still delivers everything but what the bound lets it hold.
func TestCarriesWithinMemoryAndMaxOpen(t *testing.T) {
	for _, c := range []struct {
		name    string
		maxOpen int
		mem     int
	}{
		{"memory", 0, 64 << 10},
		{"max open", 3, 64 << 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := openWAL(t, wal.Options{})
				defer w.Close()
				s := newTestSink(sinks.Limits{MaxRecords: 20, MaxBytes: 1 << 20, MaxAge: time.Hour, Concurrency: 4, MaxOpen: c.maxOpen})
				s.carryBytes = 1 << 30
				r := start(w, "s", s, Options{MaxBufferedBytes: c.mem, ReadBatch: 100})
				last := appendN(t, w, 3000, func(i int) string { return fmt.Sprintf("p%d", i%10) }, 100)
				time.Sleep(time.Minute)
				synctest.Wait()
				got, _, _ := s.snapshot()
				held := map[string]int{} // undelivered records by partition
				for seq := uint64(1); seq <= last; seq++ {
					if got[seq] == 0 {
						held[fmt.Sprintf("p%d", (seq-1)%10)]++
					}
				}
				n := 0
				for _, k := range held {
					n += k
				}
				st := r.d.Status()
				// A record of 100 bytes costs 228 in a queue (recordMem) and
				// its 100 bytes in a carry.
				if c.maxOpen > 0 && len(held) > c.maxOpen || c.maxOpen == 0 && n*100 > c.mem {
					t.Fatalf("after a minute %d records of %d partitions are not delivered (status %+v): more than the bound holds", n, len(held), st)
				}
				if s.carried == 0 {
					t.Fatal("nothing was carried")
				}
				drainedAfter(t, w, r, s, last, time.Hour)
				s.deliveredOnce(t, last)
			})
		})
	}
}

// A sink may reject carried records when it delivers them: they are read
// back from the WAL and dead-lettered like the batch's own.
func TestCarryRejectionsOfCarriedRecords(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		s := newTestSink(sinks.Limits{MaxRecords: 10, MaxBytes: 1 << 20, MaxAge: time.Minute, Concurrency: 2})
		s.carryBytes = 3000
		s.setFail(func(b *sinks.Batch) error {
			var rj []sinks.Rejection
			if c, ok := b.Carry.(*testCarry); ok {
				for _, r := range c.recs {
					if r.Seq%2 == 0 {
						rj = append(rj, sinks.Rejection{Seq: r.Seq, Reason: "too_old"})
					}
				}
			}
			for _, r := range b.Records {
				if r.Seq%2 == 0 {
					rj = append(rj, sinks.Rejection{Seq: r.Seq, Reason: "too_old"})
				}
			}
			return partial(rj)
		})
		r := start(w, "s", s, Options{})
		last := appendN(t, w, 300, func(i int) string { return fmt.Sprintf("p%d", i%3) }, 100)
		drainedAfter(t, w, r, s, last, 5*time.Minute)
		got, _, _ := s.snapshot()
		dead := map[uint64]string{}
		if err := DeadLetters(w, "s", func(d DeadLetter) error {
			dead[d.Seq] = d.Reason
			if !bytes.Contains(d.Body, fmt.Appendf(nil, `"i":%d,`, d.Seq-1)) {
				t.Errorf("dead letter %d holds another record: %.40s", d.Seq, d.Body)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		for seq := uint64(1); seq <= last; seq++ {
			if seq%2 == 0 && (dead[seq] != "too_old" || got[seq] != 0) || seq%2 == 1 && (dead[seq] != "" || got[seq] != 1) {
				t.Fatalf("record %d: dead %q, delivered %d", seq, dead[seq], got[seq])
			}
		}
		if s.carried == 0 {
			t.Fatal("nothing was carried")
		}
	})
}

// MaxAge counts from when each record was read: records left in a queue
// after a full batch was cut from it wait for their own age, not for that
// of the records cut before them (a carry of the S3 sink would otherwise
// end its object as soon as it began, in a steady flow).
func TestAgeCountsFromEachRecordsRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := openWAL(t, wal.Options{})
		defer w.Close()
		s := newTestSink(sinks.Limits{MaxRecords: 10, MaxBytes: 1 << 20, MaxAge: time.Minute, Concurrency: 1})
		r := start(w, "s", s, Options{})
		appendN(t, w, 5, func(int) string { return "a" }, 50)
		time.Sleep(50 * time.Second)
		last := appendN(t, w, 10, func(int) string { return "a" }, 50)
		time.Sleep(20 * time.Second) // 70s after the first five, 20s after the others
		synctest.Wait()
		if got, _, _ := s.snapshot(); len(got) != 10 {
			t.Fatalf("%d records delivered 20s after the second read, want the full batch of 10 only", len(got))
		}
		time.Sleep(45 * time.Second)
		synctest.Wait()
		if pos, _ := w.Cursor("s"); pos != last {
			t.Fatalf("cursor %d a minute after the second read, want %d", pos, last)
		}
		r.stop(t)
		s.deliveredOnce(t, last)
	})
}

// drainedAfter waits d in the test's bubble; by then the cursor must be at
// last. It stops the drainer, checks the sink's rules and that the memory
// counted as held went back to 0.
func drainedAfter(t *testing.T, w *wal.WAL, r *running, s *testSink, last uint64, d time.Duration) {
	t.Helper()
	time.Sleep(d)
	synctest.Wait()
	if pos, _ := w.Cursor("s"); pos != last {
		t.Fatalf("cursor %d after %v, want %d; status %+v", pos, d, last, r.d.Status())
	}
	r.stop(t)
	s.check(t)
	if st := r.d.Status(); st.Buffered != 0 {
		t.Fatalf("%d bytes still counted as held once everything is delivered", st.Buffered)
	}
}

// droppedUnderACarry is what carryHeldThroughADrop leaves: the WAL, the
// sink, its metrics, the cursor right after the drop and the last record.
type droppedUnderACarry struct {
	w            *wal.WAL
	s            *testSink
	m            *Metrics
	cursor, last uint64
}

// carryHeldThroughADrop runs a sink that carries what it takes in and
// holds the final send of its first carry until drop_oldest has dropped
// records of it (a sink that keeps up makes the drops fall on this one),
// then answers that send with answer and lets the drainer run until the
// cursor reaches the last record.
func carryHeldThroughADrop(t *testing.T, answer func(c *testCarry) error) droppedUnderACarry {
	t.Helper()
	w := openWAL(t, wal.Options{MaxBytes: 256 << 10, WhenFull: wal.DropOldest})
	t.Cleanup(func() { w.Close() })
	s := newTestSink(sinks.Limits{MaxRecords: 100, MaxBytes: 1 << 20, MaxAge: 10 * time.Second, Concurrency: 2})
	s.carryBytes = 1 << 30
	gate := make(chan struct{})
	held := false
	s.setFail(func(b *sinks.Batch) error {
		if c, ok := b.Carry.(*testCarry); ok && b.Final && !held {
			held = true
			<-gate
			return answer(c)
		}
		return nil
	})
	fast := newTestSink(sinks.Limits{MaxRecords: 100, MaxBytes: 1 << 20, MaxAge: time.Second, Concurrency: 4})
	rf := start(w, "fast", fast, Options{})
	m := NewMetrics(nil)
	r := start(w, "s", s, Options{RetryMin: time.Second, Metrics: m})
	appendN(t, w, 100, func(int) string { return "a" }, 200)
	time.Sleep(15 * time.Second) // MaxAge: the final send is sent, and held
	synctest.Wait()
	if !held {
		t.Fatal("no final send of the carry")
	}
	var last uint64
	for i := 0; i < 40 && w.Stats().Dropped["s"] == 0; i++ {
		last = appendN(t, w, 200, func(int) string { return "b" }, 200)
		time.Sleep(time.Second)
	}
	cursor, _ := w.Cursor("s")
	if w.Stats().Dropped["s"] == 0 || cursor < 1 {
		t.Fatalf("nothing dropped for s (cursor %d): the test needs the carry's first records dropped", cursor)
	}
	close(gate)
	time.Sleep(2 * time.Minute)
	synctest.Wait()
	if pos, _ := w.Cursor("s"); pos != last {
		t.Errorf("cursor of s at %d, want %d", pos, last)
	}
	rf.stop(t)
	r.stop(t)
	return droppedUnderACarry{w: w, s: s, m: m, cursor: cursor, last: last}
}

// A carry given up after a send that failed while drop_oldest dropped its
// first records (the sink refused the carried batch, or could no longer
// deliver the carry: sinks.ErrCarryLost) is read again from past the
// cursor, not from its first record, which the WAL no longer holds: the
// loop's invariants hold (checked at every step) and every record after
// the drop is delivered once.
func TestCarryGivenUpAfterADrop(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
	}{
		{"carry lost", sinks.NewRetryable("staging", fmt.Errorf("rebuild: %w", sinks.ErrCarryLost))},
		{"refused", sinks.NewRecordPermanent("too_large", fmt.Errorf("refused"))},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := carryHeldThroughADrop(t, func(*testCarry) error { return c.err })
				d.s.check(t)
				got, _, _ := d.s.snapshot()
				for seq := d.cursor + 1; seq <= d.last; seq++ {
					if got[seq] != 1 {
						t.Fatalf("record %d delivered %d times, want once", seq, got[seq])
					}
				}
			})
		})
	}
}

// A carried record the sink refuses once drop_oldest has dropped it from
// the WAL cannot be dead-lettered (it is counted dropped): it is not
// counted delivered either.
func TestCarryRefusedRecordDroppedIsNotDelivered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var refused uint64
		d := carryHeldThroughADrop(t, func(c *testCarry) error {
			refused = c.recs[0].Seq
			return partial([]sinks.Rejection{{Seq: refused, Reason: "too_old"}})
		})
		got, _, _ := d.s.snapshot()
		accepted := 0
		for _, n := range got {
			accepted += n
		}
		if refused == 0 || got[refused] != 0 {
			t.Fatalf("record %d, refused, accepted %d times by the sink", refused, got[refused])
		}
		if first := d.w.Stats().FirstSeq; refused >= first {
			t.Fatalf("record %d is still in the WAL (its first is %d): the test needs it dropped", refused, first)
		}
		if delivered := int(testutil.ToFloat64(d.m.Delivered.WithLabelValues("s"))); delivered != accepted {
			t.Errorf("delivered metric %d, the sink accepted %d", delivered, accepted)
		}
		dead := 0
		if err := DeadLetters(d.w, "s", func(DeadLetter) error { dead++; return nil }); err != nil {
			t.Fatal(err)
		}
		if dead != 0 {
			t.Errorf("%d dead letters of a record the WAL dropped", dead)
		}
	})
}
