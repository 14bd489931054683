// Package reuse keeps buffers for reuse in two tiers: a few kept for good,
// which garbage collections leave alone, and more in a sync.Pool, which
// each collection empties.
//
// A sync.Pool alone loses what it holds at every other collection. The
// forwarder runs near its memory limit (README.md, Memory), where the heap
// is collected every few megabytes allocated: buffers of a mebibyte or more
// that a pool gave back were made (and cleared) again over and over. The
// few kept for good are what a busy sink uses all the time; the pool takes
// what a burst adds, and lets it go once the burst is over.
package reuse

import "sync"

// Buffers keeps values of type T for reuse: at most Keep for good, the
// rest in a sync.Pool. The zero value keeps none for good. Safe for
// concurrent use.
type Buffers[T any] struct {
	Keep int // how many are kept for good
	// KeepIf, when set, says which values may be kept for good (a large
	// buffer, say, only pooled); nil: any.
	KeepIf func(T) bool

	mu   sync.Mutex
	kept []T
	pool sync.Pool
}

// Get returns a value kept or pooled, or false when there is none.
func (b *Buffers[T]) Get() (T, bool) {
	b.mu.Lock()
	if n := len(b.kept); n > 0 {
		v := b.kept[n-1]
		var zero T
		b.kept[n-1] = zero
		b.kept = b.kept[:n-1]
		b.mu.Unlock()
		return v, true
	}
	b.mu.Unlock()
	if v, ok := b.pool.Get().(T); ok {
		return v, true
	}
	var zero T
	return zero, false
}

// Put keeps v for a later Get.
func (b *Buffers[T]) Put(v T) {
	if b.KeepIf != nil && !b.KeepIf(v) {
		b.pool.Put(v)
		return
	}
	b.mu.Lock()
	if len(b.kept) < b.Keep {
		b.kept = append(b.kept, v)
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	b.pool.Put(v)
}
