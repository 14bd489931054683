// Package heaptest measures the heap of a test's own process, for tests
// that bound what a server in the same process holds.
package heaptest

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"testing"
	"time"
)

// Live is the heap in use right after two garbage collections: what is
// still referenced. Garbage is gone after the first, and buffers cached in
// a sync.Pool that nothing took back after the second (a pool keeps what
// is put in it for one collection). Objects allocated while a collection
// runs count as live until the next one: measure it when the server is
// quiet, not while it churns through buffers.
func Live() int64 {
	runtime.GC()
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}

// Heap is the heap's objects now, garbage not yet collected included: what
// the process's heap takes, which the runtime's memory limit bounds.
func Heap() int64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}

// Limit sets the runtime's soft memory limit, as memory_limit does for the
// service, until the returned function puts back the one before.
func Limit(n int64) (restore func()) {
	old := debug.SetMemoryLimit(n)
	return func() { debug.SetMemoryLimit(old) }
}

// Watcher samples Heap until Stop.
type Watcher struct {
	mu     sync.Mutex
	peak   int64
	stop   chan struct{}
	once   sync.Once
	done   chan struct{}
	period time.Duration
}

// Watch samples Heap every period.
func Watch(period time.Duration) *Watcher {
	w := &Watcher{stop: make(chan struct{}), done: make(chan struct{}), period: period}
	go w.run()
	return w
}

func (w *Watcher) run() {
	defer close(w.done)
	t := time.NewTicker(w.period)
	defer t.Stop()
	for {
		n := Heap()
		w.mu.Lock()
		if n > w.peak {
			w.peak = n
		}
		w.mu.Unlock()
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
	}
}

// Peak is the most seen so far.
func (w *Watcher) Peak() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.peak
}

// Steady returns Live once two measures every period differ by less than
// 1 MiB, or the last after max: the server holds what it will.
func Steady(period, max time.Duration) int64 {
	end := time.Now().Add(max)
	last := Live()
	for time.Now().Before(end) {
		time.Sleep(period)
		n := Live()
		if d := n - last; d < 1<<20 && d > -1<<20 {
			return n
		}
		last = n
	}
	return last
}

// Stop ends the sampling and returns the peak.
func (w *Watcher) Stop() int64 {
	w.once.Do(func() { close(w.stop) })
	<-w.done
	return w.Peak()
}

// Bounds are what a server may take while hostile clients press on it,
// with the runtime's memory limit at Limit.
type Bounds struct {
	Limit int64 // the runtime's memory limit during the probe: memory_limit, as run sets it
	// Hold is what the server may hold: the live heap once the hostile
	// clients have got what they will, above the heap before they started.
	Hold int64
	// Heap is what the whole heap, garbage included, may reach meanwhile.
	Heap int64
	// Gauge is what the server's own account of its memory may show.
	Gauge float64
}

// Probe runs hostile, which starts conns hostile clients and returns while
// they go on; waits until the heap is steady (the server has taken what it
// will of them); runs good, a well-behaved client's exchange, which must
// succeed meanwhile; then checks the heap against b and gauge (the
// server's own account of its memory, read once good is done) against
// b.Gauge.
func Probe(t testing.TB, b Bounds, conns int, hostile, good func(), gauge func() float64) {
	t.Helper()
	defer Limit(b.Limit)()
	base := Live()
	watch := Watch(2 * time.Millisecond)
	defer watch.Stop()
	hostile()
	steady := Steady(200*time.Millisecond, 8*time.Second)
	start := time.Now()
	good()
	t.Logf("a well-behaved client served in %v", time.Since(start).Round(time.Millisecond))
	peak := watch.Stop()
	held := gauge()
	t.Logf("the server holds %.1f MiB (by its own account: %.1f MiB); the heap peaked at %.1f MiB, %.1f MiB of it the test's own",
		float64(steady-base)/(1<<20), held/(1<<20), float64(peak)/(1<<20), float64(base)/(1<<20))
	if steady-base > b.Hold {
		t.Errorf("under %d hostile connections the server holds %d bytes of heap, more than %d", conns, steady-base, b.Hold)
	}
	if peak > b.Heap {
		t.Errorf("under %d hostile connections the heap reached %d bytes, more than %d", conns, peak, b.Heap)
	}
	if held > b.Gauge {
		t.Errorf("under %d hostile connections the server accounts for %v bytes, more than %v", conns, held, b.Gauge)
	}
}
