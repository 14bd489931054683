package queue

import "time"

// The loop asks at every step, while memory is short or too many objects
// are open, for the partition holding the most memory, the oldest open
// one, the batches waiting to be sent again and the memory held. With
// hundreds of thousands of partitions a scan of them all at every step
// costs more than the records it moves (BENCHMARKS.md), so these are kept
// as each partition changes: loop.touch files it anew in each structure,
// and loop.check compares every structure with a scan in the tests.

// Each partHeap keeps its partitions' places in the partition's slots.
const (
	slotQueue  = iota // l.largestQueue
	slotCarry         // l.largestCarry
	slotOldest        // l.oldest
	slotStuck         // l.stuck
	slots
)

// partHeap is a heap of partitions by a key filed with each entry. A
// partition's place is kept in its slots (1-based; 0: not in the heap), so
// that its key changes or it leaves in O(log n).
type partHeap struct {
	es   []partEntry
	max  bool // the largest key on top; else the smallest
	slot int  // which of a partition's slots is its place here
}

type partEntry struct {
	key int64
	p   *partition
}

func newPartHeap(slot int, max bool) partHeap { return partHeap{max: max, slot: slot} }

// initIndex makes the loop's empty heaps; their times count from epoch.
func (l *loop) initIndex(epoch time.Time) {
	l.largestQueue, l.largestCarry = newPartHeap(slotQueue, true), newPartHeap(slotCarry, true)
	l.oldest, l.stuck = newPartHeap(slotOldest, false), newPartHeap(slotStuck, true)
	l.epoch = epoch
}

func (h *partHeap) Len() int { return len(h.es) }

// top is the partition on top and its key; nil when the heap is empty.
func (h *partHeap) top() (*partition, int64) {
	if len(h.es) == 0 {
		return nil, 0
	}
	return h.es[0].p, h.es[0].key
}

// set files p under key when in is set, and takes it out when not.
func (h *partHeap) set(p *partition, key int64, in bool) {
	i := int(p.slots[h.slot]) - 1
	switch {
	case !in && i < 0:
	case !in:
		h.remove(i)
	case i < 0:
		h.es = append(h.es, partEntry{key, p})
		i = len(h.es) - 1
		p.slots[h.slot] = int32(i + 1)
		h.up(i)
	case h.es[i].key != key:
		h.es[i].key = key
		if !h.up(i) {
			h.down(i)
		}
	}
}

func (h *partHeap) remove(i int) {
	last := len(h.es) - 1
	p := h.es[i].p
	if i != last {
		h.swap(i, last)
	}
	h.es[last] = partEntry{}
	h.es = h.es[:last]
	p.slots[h.slot] = 0
	if i != last && !h.up(i) {
		h.down(i)
	}
}

func (h *partHeap) before(i, j int) bool {
	if h.max {
		return h.es[i].key > h.es[j].key
	}
	return h.es[i].key < h.es[j].key
}

func (h *partHeap) swap(i, j int) {
	h.es[i], h.es[j] = h.es[j], h.es[i]
	h.es[i].p.slots[h.slot] = int32(i + 1)
	h.es[j].p.slots[h.slot] = int32(j + 1)
}

// up moves entry i up to its place and says whether it moved.
func (h *partHeap) up(i int) bool {
	moved := false
	for i > 0 {
		parent := (i - 1) / 2
		if !h.before(i, parent) {
			break
		}
		h.swap(i, parent)
		i, moved = parent, true
	}
	return moved
}

func (h *partHeap) down(i int) {
	n := len(h.es)
	for {
		c := 2*i + 1
		if c >= n {
			return
		}
		if c+1 < n && h.before(c+1, c) {
			c++
		}
		if !h.before(c, i) {
			return
		}
		h.swap(i, c)
		i = c
	}
}

// touch files p anew in the loop's incremental structures after any of
// what they are kept by changed: its phase, its queue's, batch's or
// carry's memory, its oldest record, counted, finalize, final, or its due
// time while it waits.
func (l *loop) touch(p *partition) {
	l.recount(p)
	share := memShare{queued: p.mem, batched: p.batchMem, carried: p.carryMem}
	if p.phase == phaseWaiting {
		share.waiting = p.batchMem + p.carryMem
	}
	l.mem.set(&p.share, share)
	gathering := p.phase == phaseGathering
	l.largestQueue.set(p, int64(p.mem), gathering && p.mem > 0)
	l.largestCarry.set(p, int64(p.carryMem), gathering && p.carryMem > 0)
	l.oldest.set(p, l.since(p.objectSince()), gathering && p.counted && !p.finalize)
	if closing := p.counted && (p.finalize || p.busy() && p.final); closing != p.closing {
		p.closing = closing
		if closing {
			l.closing++
		} else {
			l.closing--
		}
	}
	l.stuck.set(p, l.since(p.dueAt), p.phase == phaseWaiting && len(p.queue) > 0)
}

// since is t as a heap key: the time since the loop began.
func (l *loop) since(t time.Time) int64 { return int64(t.Sub(l.epoch)) }

// schedule makes p due at t (see dueHeap.schedule).
func (l *loop) schedule(p *partition, t time.Time) {
	l.due.schedule(p, t)
	l.touch(p)
}

// forget drops p, which is empty, from the loop.
func (l *loop) forget(p *partition) {
	l.due.remove(p)
	delete(l.parts, p.key)
	p.releaseArrays(&l.arrays)
	if p.fam != "" {
		l.guard.seenAt(p.fam, time.Now())
		l.unadopt(p)
	}
	// Out of every structure: it holds nothing, and is not counted.
	l.largestQueue.set(p, 0, false)
	l.largestCarry.set(p, 0, false)
	l.oldest.set(p, 0, false)
	l.stuck.set(p, 0, false)
}
