package queue

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// TestModelRandomFailures: a sink failing at random in every class
// (retryable, throttled, refused, paused, a carry lost, records rejected
// one by one, carried ones too), drop_oldest pressure while it is down,
// and the drainer, or the drainer and the WAL, stopped and started again
// between rounds, with the loop's invariants checked at every step.
// Afterwards every record the cursor passed was delivered once,
// dead-lettered or counted dropped, never both delivered and
// dead-lettered, and the metrics agree with the sink and the WAL.
func TestModelRandomFailures(t *testing.T) {
	for _, c := range []struct {
		seed  uint64
		carry bool
	}{{1, false}, {4, true}} {
		t.Run(fmt.Sprintf("seed %d carry %v", c.seed, c.carry), func(t *testing.T) {
			modelRandomFailures(t, c.seed, c.carry, 8, 1<<30)
		})
	}
	t.Run("dead letters bounded", func(t *testing.T) { modelRandomFailures(t, 5, false, 4, 50) })
}

func modelRandomFailures(t *testing.T, seed uint64, carry bool, rounds, maxDead int) {
	dir := t.TempDir()
	wopts := wal.Options{MaxBytes: 192 << 10, WhenFull: wal.DropOldest}
	w, err := wal.Open(dir, wopts)
	if err != nil {
		t.Fatal(err)
	}
	var wmu sync.RWMutex // appends hold it shared; a reopen holds it
	tags := map[uint64]string{}
	var tmu sync.Mutex

	s := newTestSink(sinks.Limits{MaxRecords: 30, MaxBytes: 8 << 10, MaxAge: 3 * time.Millisecond, Concurrency: 4})
	if carry {
		s.carryBytes = 12 << 10
	}
	var rmu sync.Mutex
	rng := rand.New(rand.NewPCG(seed, 7))
	rnd := func(n int) int { rmu.Lock(); defer rmu.Unlock(); return rng.IntN(n) }
	var failing sync.Map // set: a period of failures (drop_oldest pressure)
	s.setFail(func(b *sinks.Batch) error {
		x := rnd(100)
		if _, ok := failing.Load("all"); ok {
			return sinks.NewRetryable("down", errors.New("down"))
		}
		switch {
		case x < 15:
			return sinks.NewRetryable("net", errors.New("boom"))
		case x < 18:
			return sinks.NewThrottled("thr", time.Millisecond, nil)
		case x < 20:
			return sinks.NewRecordPermanent("bad", nil)
		case x < 21:
			return sinks.NewSinkPermanent("denied", nil)
		case x < 23 && b.Carry != nil:
			return sinks.NewRetryable("lost", fmt.Errorf("x: %w", sinks.ErrCarryLost))
		case x < 28:
			var seqs []uint64
			for _, r := range b.Records {
				seqs = append(seqs, r.Seq)
			}
			if b.Carry != nil {
				for _, r := range b.Carry.(*testCarry).recs {
					seqs = append(seqs, r.Seq)
				}
			}
			if len(seqs) == 0 {
				return nil
			}
			return partial([]sinks.Rejection{{Seq: seqs[rnd(len(seqs))], Reason: "too_old"}})
		}
		return nil
	})

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		arng := rand.New(rand.NewPCG(seed, 9))
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			var recs []wal.Record
			n := 1 + arng.IntN(60)
			for j := 0; j < n; j++ {
				recs = append(recs, wal.Record{Time: time.Now().UnixNano(), Tag: fmt.Sprintf("p%d", arng.IntN(7)), Body: fmt.Appendf(nil, `{"n":%d,"j":%d,"pad":"%x"}`, i, j, arng.Uint64()*arng.Uint64())})
				for k := 0; k < 10; k++ {
					recs[len(recs)-1].Body = fmt.Appendf(recs[len(recs)-1].Body, "%x", arng.Uint64())
				}
			}
			wmu.RLock()
			res, err := w.Append(context.Background(), recs, wal.AppendOptions{})
			wmu.RUnlock()
			if err != nil {
				t.Error(err)
				return
			}
			tmu.Lock()
			for k := range recs {
				tags[res.First+uint64(k)] = recs[k].Tag
			}
			tmu.Unlock()
			time.Sleep(time.Duration(arng.IntN(3)) * time.Millisecond)
		}
	}()

	m := NewMetrics(nil)
	opts := Options{MaxBufferedBytes: 24 << 10, ReadBatch: 100, RetryMin: time.Millisecond, RetryMax: 8 * time.Millisecond, PauseRetry: 20 * time.Millisecond, MaxDeadLetters: maxDead, Metrics: m}

	deadSet := func() map[uint64]bool {
		dead := map[uint64]bool{}
		wmu.RLock()
		DeadLetters(w, "s", func(d DeadLetter) error { dead[d.Seq] = true; return nil })
		wmu.RUnlock()
		return dead
	}
	check := func(round int) {
		got, _, _ := s.snapshot()
		dead := deadSet()
		wmu.RLock()
		cur, _ := w.Cursor("s")
		dropped := w.Stats().Dropped["s"]
		wmu.RUnlock()
		missing := uint64(0)
		for seq := uint64(1); seq <= cur; seq++ {
			if got[seq] == 0 && !dead[seq] {
				missing++
			}
		}
		// Dead letters evicted to keep within the bound are no longer listed.
		evicted := uint64(testutil.ToFloat64(m.Evicted.WithLabelValues("s")))
		if missing > dropped+evicted {
			t.Errorf("round %d: cursor %d passed %d records neither delivered nor dead-lettered, %d counted dropped, %d dead letters evicted", round, cur, missing, dropped, evicted)
		}
		for seq, n := range got {
			if n > 1 {
				t.Errorf("round %d: record %d delivered %d times", round, seq, n)
				break
			}
		}
		for seq := range dead {
			if got[seq] > 0 {
				t.Errorf("round %d: record %d delivered and dead-lettered", round, seq)
				break
			}
		}
	}

	for round := 0; round < rounds; round++ {
		r := start(w, "s", s, opts)
		if rnd(2) == 0 {
			failing.Store("all", true)
		}
		time.Sleep(time.Duration(200+rnd(400)) * time.Millisecond)
		failing.Delete("all")
		time.Sleep(time.Duration(rnd(100)) * time.Millisecond)
		r.stop(t)
		s.check(t)
		check(round)
		if rnd(2) == 0 {
			wmu.Lock()
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			if w, err = wal.Open(dir, wopts); err != nil {
				t.Fatal(err)
			}
			wmu.Unlock()
		}
	}
	close(stop)
	wg.Wait()
	s.setFail(nil)
	last := w.Stats().NextSeq - 1
	r := start(w, "s", s, opts)
	waitCursor(t, w, "s", last, 60*time.Second)
	r.stop(t)
	s.check(t)
	check(99)

	marks := 0
	if err := w.ScanState("s", []byte(prefixMark), func(k, v []byte) error { marks++; return nil }); err != nil {
		t.Fatal(err)
	}
	if marks != 0 {
		t.Errorf("%d delivered marks left in the WAL with the cursor at the last record", marks)
	}
	got, _, _ := s.snapshot()
	dead := deadSet()
	dropped := w.Stats().Dropped["s"]
	missing := uint64(0)
	var accepted uint64
	for seq := uint64(1); seq <= last; seq++ {
		accepted += uint64(got[seq])
		if got[seq] == 0 && !dead[seq] {
			missing++
		}
	}
	delivered := uint64(testutil.ToFloat64(m.Delivered.WithLabelValues("s")))
	deadTotal := uint64(testutil.ToFloat64(m.DeadLetters.WithLabelValues("s", "too_old")) + testutil.ToFloat64(m.DeadLetters.WithLabelValues("s", "bad")))
	t.Logf("seed %d carry %v: records %d, accepted %d, delivered metric %d, dead %d (metric %d), missing %d, dropped %d, carried %d, discards %d, spills %v",
		seed, carry, last, accepted, delivered, len(dead), deadTotal, missing, dropped, s.carried, s.discards, testutil.ToFloat64(m.Spills.WithLabelValues("s")))
	evicted := uint64(testutil.ToFloat64(m.Evicted.WithLabelValues("s")))
	if missing > dropped+evicted {
		t.Errorf("%d records never delivered nor dead-lettered, %d counted dropped, %d dead letters evicted", missing, dropped, evicted)
	}
	if delivered != accepted {
		t.Errorf("delivered metric %d, the sink accepted %d", delivered, accepted)
	}
	stored := testutil.ToFloat64(m.DeadStored.WithLabelValues("s"))
	t.Logf("evicted %d stored gauge %v stored %d", evicted, stored, len(dead))
	if int(stored) != len(dead) || len(dead) > maxDead {
		t.Errorf("dead letters stored %d, gauge %v, bound %d", len(dead), stored, maxDead)
	}
	if deadTotal != uint64(len(dead))+evicted {
		t.Errorf("dead letters metric %d, stored %d", deadTotal, len(dead))
	}
	w.Close()
}
