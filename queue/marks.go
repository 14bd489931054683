package queue

import (
	"container/heap"
	"fmt"
)

// markSet holds the delivered marks committed ahead of the cursor: the
// partitions that delivered past the low watermark, each up to which
// sequence number. Each time the cursor moves, the marks it reached go.
// With a partition per record's field value there are as many marks as
// partitions, and the cursor moves at most deliveries: the marks it
// reached come off a heap (lowest first) instead of from a scan of them
// all.
//
// The heap holds (seq, key) for every mark set; an entry whose mark has
// since moved on or gone is stale and dropped when it comes to the top.
// Dropping a stale entry at or below the cursor is harmless: its mark,
// if it still has that value, is at or below the cursor too.
type markSet struct {
	m map[string]uint64
	h markHeap
}

func newMarkSet() markSet { return markSet{m: map[string]uint64{}} }

// get is the mark of key.
func (s *markSet) get(key string) (uint64, bool) {
	seq, ok := s.m[key]
	return seq, ok
}

func (s *markSet) len() int { return len(s.m) }

// set marks key delivered up to seq.
func (s *markSet) set(key string, seq uint64) {
	if old, ok := s.m[key]; ok && old == seq {
		return
	}
	s.m[key] = seq
	heap.Push(&s.h, markEntry{seq, key})
	if len(s.h) > 2*len(s.m)+1024 {
		s.rebuild()
	}
}

// del forgets key's mark.
func (s *markSet) del(key string) { delete(s.m, key) }

// takeUpTo forgets every mark at or below seq and calls f with its key.
func (s *markSet) takeUpTo(seq uint64, f func(key string)) {
	for len(s.h) > 0 && s.h[0].seq <= seq {
		e := heap.Pop(&s.h).(markEntry)
		if cur, ok := s.m[e.key]; ok && cur <= seq {
			delete(s.m, e.key)
			f(e.key)
		}
	}
}

// rebuild drops every stale entry at once.
func (s *markSet) rebuild() {
	s.h = s.h[:0]
	for k, seq := range s.m {
		s.h = append(s.h, markEntry{seq, k})
	}
	heap.Init(&s.h)
}

type markEntry struct {
	seq uint64
	key string
}

type markHeap []markEntry

func (h markHeap) Len() int           { return len(h) }
func (h markHeap) Less(i, j int) bool { return h[i].seq < h[j].seq }
func (h markHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *markHeap) Push(x any)        { *h = append(*h, x.(markEntry)) }
func (h *markHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = markEntry{}
	*h = old[:len(old)-1]
	return e
}

// check verifies that every mark has its entry in the heap, and the
// heap's order: what takeUpTo relies on to find every mark it reaches.
func (s *markSet) check() error {
	filed := make(map[markEntry]bool, len(s.h))
	for i, e := range s.h {
		if i > 0 && e.seq < s.h[(i-1)/2].seq {
			return fmt.Errorf("marks heap: %d at %d under %d", e.seq, i, s.h[(i-1)/2].seq)
		}
		filed[e] = true
	}
	for k, seq := range s.m {
		if !filed[markEntry{seq, k}] {
			return fmt.Errorf("delivered mark of %q at %d is not in the heap", k, seq)
		}
	}
	return nil
}
