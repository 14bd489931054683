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
	// qbuf and sbuf are the arrays queue and sizes lie in, from their
	// start, of the same capacity (see reserve).
	qbuf []sinks.Record
	sbuf []int32
	// prev is the array the queue left while the batch was in it, up to
	// prevLast; it goes to the loop's free arrays once the batch is gone.
	prev     queueArray
	prevLast uint64
	// arrivals are when the queued records were read, in order: runs of
	// records read at the same time (one read), so that what MaxAge counts
	// from stays right when a batch is cut from the front.
	arrivals []arrival

	// adm is the guard's interval that admits the partition's records
	// (guard.go), as last asked, and fam the family it was asked for; zero:
	// none (no guard, or an overflow partition).
	adm interval
	fam string

	arena []byte // ingest: where this read's bodies of the partition are copied
	need  int    // ingest: bytes of this read's bodies
	take  int    // ingest: records of this read
	// tookAt is the partition's place in loop.took while a read that
	// gives it records is ingested.
	tookAt int32

	phase    phase          // where its batch is: see doc.go, Partition phases
	batch    []sinks.Record // being sent, or waiting to be sent again
	batchMem int            // memory held by batch
	attempts int            // failed sends of batch
	// final: the batch is sent with Batch.Final (its retries too). It
	// stays set while the delivery commits, until the next batch.
	final bool

	// carry is what the sink took in of this partition's records without
	// delivering them yet (sinks.Outcome.Carry): carryRecs records from
	// carryFirst to carryLast, the first of them read at carrySince. They
	// precede batch and queue. carryMem is carry.Mem().
	carry                 sinks.Carry
	carryFirst, carryLast uint64
	carryRecs, carryMem   int
	carrySince            time.Time
	batchSince            time.Time // when the batch's first record was read
	finalize              bool      // the next batch is final: memory or MaxOpen wants the carry delivered
	noCarry               bool      // every batch is final: a carried delivery was refused (see uncarry)
	counted               bool      // counted in loop.open: it has queued or carried records

	// spillFrom, when not 0, is the first record of this partition that is
	// not held in memory: the partition was stuck while memory ran short.
	// The head reader passes its records by; once it can send again, it
	// catches up: the catch-up reader reads them again from the WAL (see
	// catchup.go), and spillFrom follows what it hands over. reading says
	// which reader serves it.
	spillFrom uint64
	reading   reading

	dueAt   time.Time // when it may send next
	heapIdx int       // position in the due heap; -1 when not in it

	pendingAt uint64 // firstPending as last pushed to loop.pending

	// Its part in the loop's incremental structures (index.go), as last
	// filed by loop.touch.
	share   memShare     // in loop.mem
	slots   [slots]int32 // places in the loop's partHeaps
	closing bool         // counted in loop.closing
}

// admits: the record seq of p's key goes to p without asking the guard.
func (p *partition) admits(seq uint64) bool { return p.adm != (interval{}) && p.adm.holds(seq) }

type arrival struct {
	n  int
	at time.Time
}

// arrived notes n records queued at now.
func (p *partition) arrived(n int, now time.Time) {
	if k := len(p.arrivals); k > 0 && p.arrivals[k-1].at.Equal(now) {
		p.arrivals[k-1].n += n
		return
	}
	p.arrivals = append(p.arrivals, arrival{n, now})
}

// reserve makes room in p's queue and sizes for n more records. They grow
// to twice what they then hold (an array used again: up to four times,
// see arrays.go), so that a record is moved about once as its queue
// grows, and the arrays stay about within what recordMem counts for a
// record's place (2 x 60 bytes).
//
// Batches are cut from the front of the queue, in its array: when the
// queue is at most half its array, it moves back to the array's start
// instead, and an array the queue leaves is kept in free for other
// queues. The records before the queue in its array were cut into
// batches; they are cleared once their batch is delivered, carried or
// given up (deliver, takeCarry, release, detach, dropUpTo), and until
// then the batch holds them: the sink may read them while it is sent, or
// it waits to be sent again as it is. So while the batch is in the
// queue's array, the queue does not move in it, and an array the queue
// leaves waits in prev until the batch is gone.
//
// An array much larger than the queue needs (a backlog's, once drained)
// is not moved in: the queue takes one of its size, so that a partition
// does not keep the peak of its queue for good.
func (p *partition) reserve(n int, free *queueArrays) {
	if p.prev.recs != nil && !p.batchInPrev() {
		free.put(p.prev)
		p.prev = queueArray{}
	}
	k := len(p.queue) + n
	if k <= cap(p.queue) {
		return
	}
	m := len(p.queue)
	inArray := len(p.batch) > 0 && !p.batchInPrev()
	if k <= cap(p.qbuf) && 2*m <= cap(p.qbuf) && cap(p.qbuf) <= 8*k && !inArray {
		// The queue ends where qbuf ends: it was cut from the front only.
		start := cap(p.qbuf) - cap(p.queue)
		copy(p.qbuf, p.queue)
		clear(p.qbuf[m : start+m]) // no record is left twice
		p.queue = p.qbuf[:m]
		p.sizes = p.sbuf[:copy(p.sbuf, p.sizes)]
		return
	}
	a := free.get(k)
	copy(a.recs, p.queue)
	copy(a.sizes, p.sizes)
	clear(p.queue)
	if inArray {
		p.prev, p.prevLast = queueArray{p.qbuf, p.sbuf}, p.batch[len(p.batch)-1].Seq
	} else {
		free.put(queueArray{p.qbuf, p.sbuf})
	}
	p.qbuf, p.sbuf = a.recs, a.sizes
	p.queue, p.sizes = a.recs[:m], a.sizes[:m]
}

// batchInPrev: p's batch is the one that was in the array its queue left
// (prev), or what is left of it; records cut from the queue since come
// after prevLast.
func (p *partition) batchInPrev() bool {
	return p.prev.recs != nil && len(p.batch) > 0 && p.batch[0].Seq <= p.prevLast
}

// shedArrays gives p's arrays to free once its queue and batch are empty
// (their records cleared): a partition idle between reads, a tag that
// sends now and then, does not keep arrays sized for its largest read.
// With thousands of partitions that is most of them: their arrays held
// ten places per record held (README.md, Memory).
func (p *partition) shedArrays(free *queueArrays) {
	if len(p.queue) == 0 && len(p.batch) == 0 && (p.qbuf != nil || p.prev.recs != nil) {
		p.releaseArrays(free)
	}
}

// releaseArrays gives p's arrays, which hold no record, to free.
func (p *partition) releaseArrays(free *queueArrays) {
	free.put(queueArray{p.qbuf, p.sbuf})
	free.put(p.prev)
	p.queue, p.sizes, p.qbuf, p.sbuf, p.prev = nil, nil, nil, nil, queueArray{}
}

// taken notes that the first n queued records left the queue.
func (p *partition) taken(n int) {
	i := 0
	for n > 0 && i < len(p.arrivals) {
		if p.arrivals[i].n > n {
			p.arrivals[i].n -= n
			break
		}
		n -= p.arrivals[i].n
		i++
	}
	p.arrivals = p.arrivals[i:]
	if len(p.arrivals) == 0 {
		p.arrivals = nil
	}
}

// since is when the oldest queued record was read; zero when none is.
func (p *partition) since() time.Time {
	if len(p.arrivals) == 0 {
		return time.Time{}
	}
	return p.arrivals[0].at
}

// firstPending is the lowest sequence number this partition has not
// delivered, or 0 if none.
func (p *partition) firstPending() uint64 {
	switch {
	case p.carry != nil:
		return p.carryFirst
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

// empty: p holds nothing, sends nothing and waits for no reader: it may
// be forgotten.
func (p *partition) empty() bool {
	return p.phase == phaseGathering && len(p.queue) == 0 && p.carry == nil && p.reading == readHead
}

// hasBatch: a batch is being sent or waits to be sent again.
func (p *partition) hasBatch() bool { return p.phase == phaseSending || p.phase == phaseWaiting }

// busy: a batch is being sent or its delivery committed (in flight).
func (p *partition) busy() bool { return p.phase == phaseSending || p.phase == phaseCommitting }

// flush: the batch is the carry alone (batch is empty): it is sent, or
// waits to be sent again, to deliver what the sink carries.
func (p *partition) flush() bool { return p.hasBatch() && len(p.batch) == 0 }

// objectSince is when the oldest record p holds, carried or queued, was
// read: what Limits.MaxAge counts from.
func (p *partition) objectSince() time.Time {
	if p.carry != nil {
		return p.carrySince
	}
	return p.since()
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
