// Package heaptest measures the heap of a test's own process, for tests
// that bound what a server in the same process holds.
package heaptest

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
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
