package inputs

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/logfwd/forwarder/wal"
)

func grow(t *testing.T, h *Hold, n int64) {
	t.Helper()
	if err := h.Grow(context.Background(), n); err != nil {
		t.Fatalf("Grow(%d): %v", n, err)
	}
}

// A hold takes what fits, at most the whole budget alone; a sixteenth more
// is kept for holds of at most SmallHold.
func TestBudgetShares(t *testing.T) {
	m := NewMetrics(nil)
	b := NewBudget(8<<20, m)
	if b.Limit() != 8<<20 || b.Total() != 8<<20+512<<10 || testutil.ToFloat64(m.MemoryLimit) != 8<<20+512<<10 {
		t.Fatalf("limit %d, total %d, limit gauge %v", b.Limit(), b.Total(), testutil.ToFloat64(m.MemoryLimit))
	}
	big := b.Hold("forward")
	if err := big.Grow(context.Background(), 8<<20+1); !errors.Is(err, ErrOverBudget) {
		t.Fatalf("a hold over the budget: %v, want ErrOverBudget", err)
	}
	grow(t, big, 8<<20)
	// Large holds wait now, small ones do not.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	other := b.Hold("http")
	if err := other.Grow(ctx, SmallHold+1); !errors.Is(err, ErrNoRoom) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a large hold beyond the budget: %v, want ErrNoRoom after the deadline", err)
	}
	for range 8 {
		grow(t, b.Hold("http"), SmallHold)
	}
	if b.Used() != b.Total() {
		t.Fatalf("used %d, want all %d", b.Used(), b.Total())
	}
	if got := testutil.ToFloat64(m.MemoryHeld.WithLabelValues("forward")) + testutil.ToFloat64(m.MemoryHeld.WithLabelValues("http")); got != float64(b.Total()) {
		t.Fatalf("forwarder_input_memory_bytes adds up to %v", got)
	}
	if n := testutil.ToFloat64(m.MemoryWaits.WithLabelValues("http")); n != 1 {
		t.Fatalf("waits %v, want 1", n)
	}
	big.ReleaseAll()
	if got := testutil.ToFloat64(m.MemoryHeld.WithLabelValues("forward")); got != 0 || b.Used() != 512<<10 {
		t.Fatalf("after release: forward gauge %v, used %d", got, b.Used())
	}
}

// A hold that waits goes on as soon as another gives room back.
func TestBudgetWaitsForRoom(t *testing.T) {
	b := NewBudget(8<<20, nil)
	first := b.Hold("forward")
	grow(t, first, 7<<20)
	done := make(chan error, 1)
	second := b.Hold("forward")
	grow(t, second, SmallHold)
	go func() { done <- second.Grow(context.Background(), 2<<20) }()
	select {
	case err := <-done:
		t.Fatalf("Grow returned %v with no room", err)
	case <-time.After(50 * time.Millisecond):
	}
	first.Release(1 << 20) // 8 MiB and 64 KiB would be held: not yet
	select {
	case err := <-done:
		t.Fatalf("Grow returned %v with too little room", err)
	case <-time.After(50 * time.Millisecond):
	}
	first.Release(1 << 20)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no room after a release")
	}
	if second.Held() != 2<<20+SmallHold || b.Used() != 7<<20+SmallHold {
		t.Fatalf("second holds %d, used %d", second.Held(), b.Used())
	}
}

// Holds that each hold part of the budget and wait for more would wait
// forever: the one holding the least gives up at once, and the one
// holding the most, closest to whole, goes on.
func TestBudgetBreaksDeadlock(t *testing.T) {
	b := NewBudget(8<<20, nil)
	a, c := b.Hold("forward"), b.Hold("forward")
	grow(t, a, 3<<20)
	grow(t, c, 4<<20)
	errA := make(chan error, 1)
	go func() { errA <- a.Grow(context.Background(), 2<<20) }()
	time.Sleep(20 * time.Millisecond) // a waits: c does not wait yet, and may give back
	select {
	case err := <-errA:
		t.Fatalf("a gave up while c could still give room back: %v", err)
	default:
	}
	errC := make(chan error, 1)
	start := time.Now()
	go func() { errC <- c.Grow(context.Background(), 2<<20) }()
	if err := <-errA; !errors.Is(err, ErrNoRoom) || time.Since(start) > time.Second {
		t.Fatalf("a, holding the least: %v after %v, want ErrNoRoom at once", err, time.Since(start))
	}
	a.ReleaseAll() // what its caller does
	if err := <-errC; err != nil {
		t.Fatalf("c, holding the most, after a gave up: %v", err)
	}
}

// Giving back more than a hold holds gives back what it holds, and an
// empty hold giving back changes nothing.
func TestBudgetReleaseMore(t *testing.T) {
	b := NewBudget(8<<20, nil)
	a, c := b.Hold("forward"), b.Hold("forward")
	grow(t, a, 1<<20)
	a.Release(2 << 20)
	c.Release(1 << 20)
	if a.Held() != 0 || b.Used() != 0 || b.holders != 0 {
		t.Fatalf("held %d, used %d, holders %d", a.Held(), b.Used(), b.holders)
	}
	grow(t, c, 1<<20)
	if b.holders != 1 {
		t.Fatalf("holders %d, want 1", b.holders)
	}
}

// A nil hold (no budget) never waits and holds nothing.
func TestNilHold(t *testing.T) {
	var b *Budget
	h := b.Hold("forward")
	if err := h.Grow(context.Background(), 1<<40); err != nil || h.Held() != 0 {
		t.Fatalf("nil hold: %v, %d", err, h.Held())
	}
	h.ReleaseAll()
}

func TestRecordSize(t *testing.T) {
	if n := unsafe.Sizeof(wal.Record{}); n != RecordSize {
		t.Fatalf("a wal.Record takes %d bytes, RecordSize says %d", n, RecordSize)
	}
}

// Buffers and record slices come back at the capacity asked for.
func TestPools(t *testing.T) {
	for _, n := range []int{1, 4096, 4097, 100 << 10, 1 << 20, 1<<20 + 1, 20 << 20} {
		c := BufClass(n)
		if c < n || c > max(2*n, 4096) && n <= 1<<20 {
			t.Errorf("BufClass(%d) = %d", n, c)
		}
		b := GetBuf(c)
		if cap(b) != c || len(b) != 0 {
			t.Errorf("GetBuf(%d): len %d cap %d", c, len(b), cap(b))
		}
		PutBuf(append(b, 1))
		if b := GetBuf(c); cap(b) != c || len(b) != 0 {
			t.Errorf("GetBuf(%d) again: len %d cap %d", c, len(b), cap(b))
		}
	}
	if b := GetBuf(5000); cap(b) != 5000 {
		t.Errorf("GetBuf(5000) has capacity %d", cap(b))
	}
	r := append(GetRecords(RecordsClass(10)), wal.Record{Body: []byte("x")})
	PutRecords(r)
	if r := GetRecords(RecordsClass(10)); cap(r) != 64 || len(r[:1][0].Body) != 0 {
		t.Errorf("GetRecords: cap %d, first body %q", cap(r), r[:1][0].Body)
	}
}

// AppendValidUTF8 and ValidUTF8Len agree with bytes.ToValidUTF8.
func TestAppendValidUTF8(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "é", "€", "\U0001F600", "\xff", "\xe2\x82", "\xed\xa0\x80", "\xc0\xaf", "\xf4\x90\x80\x80"}
	for range 5000 {
		var src []byte
		for range rng.IntN(12) {
			src = append(src, alphabet[rng.IntN(len(alphabet))]...)
		}
		want := bytes.ToValidUTF8(src, []byte("\uFFFD"))
		got := AppendValidUTF8([]byte("prefix"), src)
		if string(got) != "prefix"+string(want) || ValidUTF8Len(src) != len(want) {
			t.Fatalf("%q: got %q (len %d), want %q", src, got[6:], ValidUTF8Len(src), want)
		}
	}
}

// A broken deadlock is for the waiter holding the most: what the victims
// free is kept for it, not taken by others that keep growing (and, given
// up, start over), which starved it until its wait ended.
func TestBudgetDeadlockFavorsTheLargest(t *testing.T) {
	b := NewBudget(48<<20, nil)
	big := b.Hold("forward")
	grow(t, big, 40<<20)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var kills, wholes atomic.Int64
	for range 4 {
		wg.Add(1)
		go func() { // grows 1 MiB at a time to 10 MiB, starting over when refused
			defer wg.Done()
			for ctx.Err() == nil {
				h := b.Hold("forward")
				whole := true
				for range 10 {
					if err := h.Grow(ctx, 1<<20); err != nil {
						whole = false
						break
					}
					time.Sleep(100 * time.Microsecond)
				}
				if whole {
					wholes.Add(1)
				} else {
					kills.Add(1)
				}
				h.ReleaseAll()
			}
		}()
	}
	time.Sleep(10 * time.Millisecond) // the growers hold the rest
	bctx, bcancel := context.WithTimeout(context.Background(), 2*time.Second)
	start := time.Now()
	err := big.Grow(bctx, 8<<20)
	took := time.Since(start)
	bcancel()
	big.ReleaseAll() // its message is whole: stored, given back
	time.Sleep(100 * time.Millisecond)
	cancel()
	wg.Wait()
	if err != nil {
		t.Fatalf("the largest holder: %v after %v (growers refused %d times, whole %d); want its room", err, took, kills.Load(), wholes.Load())
	}
	if wholes.Load() == 0 {
		t.Errorf("no grower got whole (%d refusals)", kills.Load())
	}
}
