package queue

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// Random failures, tiny memory (spill/refill), many partitions, restarts:
// after every stop, every record at or below the cursor was delivered or
// dead-lettered, and every mark is honest. QUEUE_STRESS_ROUNDS sets the
// number of stop/starts.
func TestWatermarkUnderFailuresSpillsAndRestarts(t *testing.T) {
	w := openWAL(t, wal.Options{})
	defer w.Close()
	tag := tagsOf(30)
	s := newTestSink(sinks.Limits{MaxRecords: 40, MaxBytes: 4 << 10, MaxAge: 2 * time.Millisecond, Concurrency: 6})
	var rmu sync.Mutex
	rng := rand.New(rand.NewPCG(1, 2))
	s.setFail(func(b *sinks.Batch) error {
		rmu.Lock()
		x := rng.IntN(100)
		rmu.Unlock()
		switch {
		case x < 30:
			return sinks.NewRetryable("net", errors.New("boom"))
		case x < 33:
			return sinks.NewThrottled("thr", time.Millisecond, nil)
		case x < 35:
			return sinks.NewRecordPermanent("bad", nil)
		case x < 40:
			return partial([]sinks.Rejection{{Seq: b.Records[0].Seq, Reason: "too_old"}})
		}
		return nil
	})
	match := func(tag string) bool { return tag != "p07" }
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			appendN(t, w, 300, tag, 200)
			time.Sleep(2 * time.Millisecond)
		}
	}()
	check := func(round int) {
		got, _, _ := s.snapshot()
		dead := map[uint64]bool{}
		DeadLetters(w, "s", func(d DeadLetter) error { dead[d.Seq] = true; return nil })
		cur, _ := w.Cursor("s")
		recs, _ := w.ReadRange(1, cur)
		for _, r := range recs {
			if match(r.Tag) && got[r.Seq] == 0 && !dead[r.Seq] {
				t.Fatalf("round %d: cursor %d passed record %d (%s), neither delivered nor dead-lettered", round, cur, r.Seq, r.Tag)
			}
		}
		marks := map[string]uint64{}
		w.ScanState("s", []byte(prefixMark), func(k, v []byte) error {
			marks[string(k[len(prefixMark):])] = be64(v)
			return nil
		})
		for p, m := range marks {
			rs, _ := w.ReadRange(1, m)
			for _, r := range rs {
				if r.Tag == p && match(r.Tag) && got[r.Seq] == 0 && !dead[r.Seq] {
					t.Fatalf("round %d: mark %s=%d but record %d undelivered", round, p, m, r.Seq)
				}
			}
		}
	}
	w.RegisterCursor(context.Background(), "pin") // keep every record readable for the check
	rounds := 6                                   // make crash runs more (QUEUE_STRESS_ROUNDS)
	if v := os.Getenv("QUEUE_STRESS_ROUNDS"); v != "" {
		rounds, _ = strconv.Atoi(v)
	}
	m := NewMetrics(nil)
	for round := 0; round < rounds; round++ {
		r := start(w, "s", s, Options{MaxBufferedBytes: 16 << 10, ReadBatch: 200, RetryMin: time.Millisecond, RetryMax: 5 * time.Millisecond, Match: match, Metrics: m})
		time.Sleep(time.Duration(50+rand.IntN(150)) * time.Millisecond)
		r.stop(t)
		check(round)
	}
	close(stop)
	wg.Wait()
	s.setFail(nil)
	last := w.Stats().NextSeq - 1
	r := start(w, "s", s, Options{MaxBufferedBytes: 16 << 10, Match: match})
	waitCursor(t, w, "s", last, 60*time.Second)
	r.stop(t)
	check(99)
	s.check(t)
	spills := testutil.ToFloat64(m.Spills.WithLabelValues("s"))
	t.Logf("records %d, spills %v", last, spills)
	if spills == 0 {
		t.Fatal("no partition was spilled: the test does not reach the catch-up reader")
	}
}
