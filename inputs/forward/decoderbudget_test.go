package forward

import (
	"bytes"
	"context"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/logfwd/forwarder/inputs"
)

// While a CompressedPackedForward message in zstd waits for room in the
// budget (its next piece of decompressed entries does not fit), its
// decoder is in the middle of a frame: what it holds besides its window
// (block buffers, about 400 KiB) is held from the budget too, so that many
// such messages at once stay within it. (A gzip reader's 66 KiB are held
// too, but are lost in this measure's noise.)
func TestWaitingZstdDecodersWithinTheBudget(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	entries := append(entry(eventTime(t0), record("log", "small")),
		entry(eventTime(t0), record("log", strings.Repeat("z", 4<<20)))...)
	var zout bytes.Buffer
	zw, err := zstd.NewWriter(&zout, zstd.WithWindowSize(128<<10))
	if err != nil {
		t.Fatal(err)
	}
	zw.Write(entries) // one write: full blocks of 128 KiB
	zw.Close()
	msg := packedMode("a", zout.Bytes(), false, options("c", "compressed", "zstd"))
	const n = 32
	m := inputs.NewMetrics(prometheus.NewRegistry())
	budget := inputs.NewBudget(64<<20, m)
	blocker := budget.Hold("forward") // what a slow client holds, leaving 400 KiB a message
	if err := blocker.Grow(context.Background(), 64<<20-n*400<<10); err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	before := ms.HeapAlloc
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			h := budget.Hold("forward")
			defer h.ReleaseAll()
			d := decoder{maxUnpacked: 64 << 20, now: time.Now, hold: h, ctx: ctx}
			if m, err := d.decode(msg); err == nil {
				m.release()
			}
		})
	}
	// Each waits in the budget: for its decompressor, or for room
	// for the entry it is decompressing.
	waits := m.MemoryWaits.WithLabelValues("forward")
	for deadline := time.Now().Add(5 * time.Second); testutil.ToFloat64(waits) < n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%v waits for room within 5s, want %d", testutil.ToFloat64(waits), n)
		}
	}
	time.Sleep(500 * time.Millisecond) // and the last of them to settle in their wait
	runtime.GC()
	runtime.ReadMemStats(&ms)
	heap := int64(ms.HeapAlloc) - int64(before)
	reserved := budget.Used() - blocker.Held()
	cancel()
	wg.Wait()
	t.Logf("heap grew %d KiB, the budget holds %d KiB for the messages", heap>>10, reserved>>10)
	// Without the decoders' block buffers held, about 250 KiB a
	// message are outside; with them, the rest of what a message
	// holds outside is below 140 KiB.
	if out := heap - reserved; out > n*140<<10 {
		t.Errorf("%d KiB held outside the budget by %d waiting messages (%d KiB each)", out>>10, n, out/n>>10)
	}
}
