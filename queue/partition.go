package queue

import (
	"container/heap"
	"time"

	"github.com/logfwd/forwarder/sinks"
)

// partition is one destination stream or key prefix: records wait in
// queue, at most one batch is in flight.
type partition struct {
	key   string
	queue []sinks.Record // read, not yet in a batch, in sequence order
	sizes []int32        // Sink.Size of each record of queue
	size  int            // sum of sizes
	lo    int64          // earliest event time in queue (when not empty)
	hi    int64          // latest event time in queue
	mem   int            // memory held by queue
	since time.Time      // when the oldest queued record was read

	arena []byte // ingest: where this read's bodies of the partition are copied
	need  int    // ingest: bytes of this read's bodies still to copy

	batch    []sinks.Record // being sent, or waiting to be sent again
	batchMem int            // memory held by batch
	busy     bool           // batch is sending or its delivery committing
	attempts int            // failed sends of batch

	// spillFrom, when not 0, is the first record of this partition that is
	// not held in memory: the partition was stuck while memory ran short.
	// Records from there on are read again from the WAL (a refill).
	spillFrom uint64
	refilling bool

	dueAt   time.Time // when it may send next
	heapIdx int       // position in the due heap; -1 when not in it
}

// firstPending is the lowest sequence number this partition has not
// delivered, or 0 if none.
func (p *partition) firstPending() uint64 {
	switch {
	case len(p.batch) > 0:
		return p.batch[0].Seq
	case len(p.queue) > 0:
		return p.queue[0].Seq
	default:
		return p.spillFrom
	}
}

// resetSpan sets lo and hi from the queue, which is not empty.
func (p *partition) resetSpan() {
	p.lo, p.hi = p.queue[0].Time, p.queue[0].Time
	for i := range p.queue {
		p.lo, p.hi = min(p.lo, p.queue[i].Time), max(p.hi, p.queue[i].Time)
	}
}

func (p *partition) idle() bool {
	return len(p.batch) == 0 && len(p.queue) == 0 && p.spillFrom == 0 && !p.busy && !p.refilling
}

// dueHeap orders partitions that wait to send by the time they may.
type dueHeap []*partition

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].dueAt.Before(h[j].dueAt) }
func (h dueHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx = i
	h[j].heapIdx = j
}
func (h *dueHeap) Push(x any) {
	p := x.(*partition)
	p.heapIdx = len(*h)
	*h = append(*h, p)
}
func (h *dueHeap) Pop() any {
	old := *h
	p := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	p.heapIdx = -1
	return p
}

// schedule puts p in the heap due at t, or moves it there.
func (h *dueHeap) schedule(p *partition, t time.Time) {
	p.dueAt = t
	if p.heapIdx >= 0 {
		heap.Fix(h, p.heapIdx)
		return
	}
	heap.Push(h, p)
}

func (h *dueHeap) remove(p *partition) {
	if p.heapIdx >= 0 {
		heap.Remove(h, p.heapIdx)
	}
}
