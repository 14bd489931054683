package queue

import "container/heap"

// pendingHeap finds the lowest first pending record of the partitions
// (partition.firstPending) without a scan of them all: the low watermark
// is asked at every delivery, and a scan costs as much as there are
// partitions (hundreds of thousands when a template names a field with a
// value per record).
//
// It holds entries (seq, partition), pushed whenever a partition's first
// pending record becomes a new value (notePending). A partition's value
// only grows while it has records pending (they are delivered in order),
// so an entry whose value is no longer its partition's is stale and lower
// than the partition's: it is dropped when it comes to the top, and the
// partition's current value pushed in its place.
type pendingHeap []pendingEntry

type pendingEntry struct {
	seq uint64
	p   *partition
}

func (h pendingHeap) Len() int           { return len(h) }
func (h pendingHeap) Less(i, j int) bool { return h[i].seq < h[j].seq }
func (h pendingHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *pendingHeap) Push(x any)        { *h = append(*h, x.(pendingEntry)) }
func (h *pendingHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = pendingEntry{}
	*h = old[:len(old)-1]
	return e
}

// notePending records p's first pending record when it changed.
func (l *loop) notePending(p *partition) {
	if fp := p.firstPending(); fp != 0 && fp != p.pendingAt {
		p.pendingAt = fp
		heap.Push(&l.pending, pendingEntry{fp, p})
		if len(l.pending) > 2*len(l.parts)+1024 {
			l.rebuildPending()
		}
	}
}

// rebuildPending drops every stale entry at once.
func (l *loop) rebuildPending() {
	l.pending = l.pending[:0]
	for _, p := range l.parts {
		p.pendingAt = p.firstPending()
		if p.pendingAt != 0 {
			l.pending = append(l.pending, pendingEntry{p.pendingAt, p})
		}
	}
	heap.Init(&l.pending)
}

// lowestPending is the lowest first pending record of any partition, or 0.
func (l *loop) lowestPending() uint64 {
	for len(l.pending) > 0 {
		e := l.pending[0]
		filed := l.parts[e.p.key] == e.p
		cur := e.p.firstPending()
		if filed && cur == e.seq {
			return e.seq
		}
		heap.Pop(&l.pending)
		if filed && e.seq == e.p.pendingAt {
			// The partition's latest entry, and its value has moved on:
			// put its value now in its place.
			e.p.pendingAt = cur
			if cur != 0 {
				heap.Push(&l.pending, pendingEntry{cur, e.p})
			}
		}
	}
	return 0
}
