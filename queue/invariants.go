package queue

import (
	"fmt"
	"math/bits"
	"slices"

	"github.com/logfwd/forwarder/sinks"
)

// check verifies the rules that tie the loop's fields together, listed in
// doc.go, and returns the first one broken. The tests run it after every
// step of the loop (Options.checkInvariants); the service never does: it
// walks every partition, and at every 16th step every record held.
func (l *loop) check() error {
	var sum memAccount
	var open, closing, inflight int
	l.checks++
	if l.d != nil { // some tests check loops of their own making
		l.d.steps.Store(int64(l.checks))
	}
	records := l.checks%16 == 1
	if records {
		if err := l.arrays.check(); err != nil {
			return err
		}
		if err := l.checkArrayOwners(); err != nil {
			return err
		}
	}
	for key, p := range l.parts {
		if p.key != key {
			return fmt.Errorf("partition %q is filed under %q", p.key, key)
		}
		if err := p.checkRecords(records); err != nil {
			return fmt.Errorf("partition %q: %w", key, err)
		}
		switch {
		case len(p.batch) > 0 && len(p.queue) > 0 && p.batch[len(p.batch)-1].Seq >= p.queue[0].Seq:
			return fmt.Errorf("partition %q: batch up to %d, queue from %d", key, p.batch[len(p.batch)-1].Seq, p.queue[0].Seq)
		case p.carry == nil && (p.carryMem != 0 || p.carryRecs != 0 || p.carryFirst != 0):
			return fmt.Errorf("partition %q: no carry, but %d bytes, %d records from %d carried", key, p.carryMem, p.carryRecs, p.carryFirst)
		case p.carry != nil && (p.carryFirst == 0 || p.carryLast < p.carryFirst || p.carryMem != p.carry.Mem()):
			return fmt.Errorf("partition %q: carry of records %d to %d, %d bytes (Mem %d)", key, p.carryFirst, p.carryLast, p.carryMem, p.carry.Mem())
		case p.carry != nil && len(p.batch) > 0 && p.batch[0].Seq <= p.carryLast:
			return fmt.Errorf("partition %q: batch from %d after a carry up to %d", key, p.batch[0].Seq, p.carryLast)
		case p.counted != (len(p.queue) > 0 || p.carry != nil):
			return fmt.Errorf("partition %q: counted open %v with %d queued and carry %v", key, p.counted, len(p.queue), p.carry != nil)
		case p.heapIdx >= 0 && (p.heapIdx >= len(l.due) || l.due[p.heapIdx] != p):
			return fmt.Errorf("partition %q: heap index %d is not its place", key, p.heapIdx)
		case p.spillFrom != 0 && p.spillFrom <= l.cursor && !p.busy():
			return fmt.Errorf("partition %q: reads again from %d, at or below the cursor %d", key, p.spillFrom, l.cursor)
		}
		if err := l.checkAdmitted(p); err != nil {
			return fmt.Errorf("partition %q: %w", key, err)
		}
		if err := p.checkPhase(l); err != nil {
			return fmt.Errorf("partition %q: %w", key, err)
		}
		if fp := p.firstPending(); fp != 0 && fp <= l.cursor && !p.busy() {
			return fmt.Errorf("partition %q: pending from %d, at or below the cursor %d", key, fp, l.cursor)
		}
		sum.queued += p.mem
		sum.batched += p.batchMem
		sum.carried += p.carryMem
		if p.phase == phaseWaiting {
			sum.waiting += p.batchMem + p.carryMem
		}
		if p.counted {
			open++
		}
		if c := p.counted && (p.finalize || p.busy() && p.final); c != p.closing {
			return fmt.Errorf("partition %q: closing %v, filed as closing %v (%v, final %v, finalize %v)", key, c, p.closing, p.phase, p.final, p.finalize)
		} else if c {
			closing++
		}
		if p.busy() {
			inflight++
		}
	}
	switch {
	case l.badMove != "":
		return fmt.Errorf("a phase change the diagram does not have: %s", l.badMove)
	case sum != l.mem:
		return fmt.Errorf("memory account %+v, the partitions hold %+v", l.mem, sum)
	case open != l.open:
		return fmt.Errorf("open %d, %d partitions are counted", l.open, open)
	case closing != l.closing:
		return fmt.Errorf("closing %d, %d open partitions have a final batch due or in flight", l.closing, closing)
	case inflight != l.inflight:
		return fmt.Errorf("inflight %d, %d partitions are busy", l.inflight, inflight)
	case l.readPos <= l.cursor:
		return fmt.Errorf("reading from %d, at or below the cursor %d", l.readPos, l.cursor)
	}
	// The cursor is at or below the low watermark: no record it passed is
	// pending. The exception is when_full: drop_oldest, which moves the
	// cursor past records a batch or carry in flight holds (it finishes,
	// and what it leaves is looked at when it ends).
	low := l.readPos
	for _, p := range l.parts {
		if fp := p.firstPending(); fp != 0 && fp < low && !(p.busy() && fp <= l.cursor) {
			low = fp
		}
	}
	if low-1 < l.cursor {
		return fmt.Errorf("cursor %d is past the low watermark %d", l.cursor, low-1)
	}
	// The pending heap finds what a scan finds.
	scan := l.readPos
	for _, p := range l.parts {
		if fp := p.firstPending(); fp != 0 && fp < scan {
			scan = fp
		}
	}
	if got := l.lowWatermark(); got != scan-1 {
		return fmt.Errorf("low watermark %d from the pending heap, %d from a scan", got, scan-1)
	}
	if err := l.checkHeaps(); err != nil {
		return err
	}
	for i, p := range l.due {
		if p.heapIdx != i || l.parts[p.key] != p {
			return fmt.Errorf("due heap: %q at %d with index %d, filed %v", p.key, i, p.heapIdx, l.parts[p.key] == p)
		}
	}
	if err := l.marks.check(); err != nil {
		return err
	}
	for k, m := range l.marks.m {
		if m <= l.cursor {
			return fmt.Errorf("delivered mark of %q at %d, not past the cursor %d", k, m, l.cursor)
		}
	}
	return nil
}

// checkRecords verifies that p's counts agree with the records it holds:
// their order, sizes and memory (all of them when records is set; else
// only what costs nothing).
func (p *partition) checkRecords(records bool) error {
	if len(p.sizes) != len(p.queue) {
		return fmt.Errorf("%d sizes for %d queued records", len(p.sizes), len(p.queue))
	}
	if !records {
		return nil
	}
	size, mem, arrived := 0, 0, 0
	for i := range p.queue {
		size += int(p.sizes[i])
		mem += recordMem(&p.queue[i])
		if i > 0 && p.queue[i].Seq <= p.queue[i-1].Seq {
			return fmt.Errorf("queued records out of order: %d after %d", p.queue[i].Seq, p.queue[i-1].Seq)
		}
	}
	for _, a := range p.arrivals {
		arrived += a.n
	}
	if err := p.checkArray(); err != nil {
		return err
	}
	bmem := 0
	for i := range p.batch {
		bmem += recordMem(&p.batch[i])
		if i > 0 && p.batch[i].Seq <= p.batch[i-1].Seq {
			return fmt.Errorf("batch out of order: %d after %d", p.batch[i].Seq, p.batch[i-1].Seq)
		}
	}
	switch {
	case size != p.size:
		return fmt.Errorf("size %d, its queued records' sizes add up to %d", p.size, size)
	case mem != p.mem:
		return fmt.Errorf("queue memory %d, its records take %d", p.mem, mem)
	case arrived != len(p.queue):
		return fmt.Errorf("arrivals of %d records for %d queued", arrived, len(p.queue))
	case bmem != p.batchMem:
		return fmt.Errorf("batch memory %d, its records take %d", p.batchMem, bmem)
	}
	return nil
}

// checkPhase verifies that p's phase and reader agree with its fields
// (doc.go, Partition phases).
func (p *partition) checkPhase(l *loop) error {
	_, joined := l.joined[p]
	switch {
	case p.phase > phaseCommitting:
		return fmt.Errorf("no such phase: %v", p.phase)
	case (p.phase == phaseGathering || p.phase == phaseCommitting) && (len(p.batch) > 0 || p.batchMem != 0):
		return fmt.Errorf("%v with a batch of %d records, %d bytes", p.phase, len(p.batch), p.batchMem)
	case p.hasBatch() && len(p.batch) == 0 && p.carry == nil:
		return fmt.Errorf("%v with neither a batch nor a carry", p.phase)
	case p.busy() && p.heapIdx >= 0:
		return fmt.Errorf("%v, and due at %v", p.phase, p.dueAt)
	case p.reading > readCatchingUp:
		return fmt.Errorf("no such reader: %v", p.reading)
	case (p.reading == readHead) != (p.spillFrom == 0):
		return fmt.Errorf("read by the %v reader with spillFrom %d", p.reading, p.spillFrom)
	case (p.reading == readCatchingUp) != joined:
		return fmt.Errorf("read by the %v reader, joined to the catch-up %v", p.reading, joined)
	}
	return nil
}

// checkHeaps verifies each partHeap (index.go) against a scan of the
// partitions: its order, the places its partitions keep, that it holds the
// partitions it should under their keys, and so that its top is what a
// scan finds.
func (l *loop) checkHeaps() error {
	heaps := []struct {
		name string
		h    *partHeap
		key  func(p *partition) (int64, bool)
	}{
		{"largest queue", &l.largestQueue, func(p *partition) (int64, bool) {
			return int64(p.mem), p.phase == phaseGathering && p.mem > 0
		}},
		{"largest carry", &l.largestCarry, func(p *partition) (int64, bool) {
			return int64(p.carryMem), p.phase == phaseGathering && p.carryMem > 0
		}},
		{"oldest", &l.oldest, func(p *partition) (int64, bool) {
			return l.since(p.objectSince()), p.phase == phaseGathering && p.counted && !p.finalize
		}},
		{"stuck", &l.stuck, func(p *partition) (int64, bool) {
			return l.since(p.dueAt), p.phase == phaseWaiting && len(p.queue) > 0
		}},
	}
	for _, c := range heaps {
		h := c.h
		for i, e := range h.es {
			if int(e.p.slots[h.slot]) != i+1 {
				return fmt.Errorf("%s heap: %q at %d, its slot says %d", c.name, e.p.key, i, e.p.slots[h.slot]-1)
			}
			if i > 0 && h.before(i, (i-1)/2) {
				return fmt.Errorf("%s heap: %q (%d) at %d comes before its parent (%d)", c.name, e.p.key, e.key, i, h.es[(i-1)/2].key)
			}
			if l.parts[e.p.key] != e.p {
				return fmt.Errorf("%s heap: %q is not a partition of the loop", c.name, e.p.key)
			}
		}
	}
	// One pass over the partitions for all of them: a map's iteration is
	// what a check costs most.
	var n [slots]int
	var best [slots]int64
	for _, p := range l.parts {
		for i, c := range heaps {
			h := c.h
			key, in := c.key(p)
			slot := int(p.slots[h.slot]) - 1
			switch {
			case in && (slot < 0 || h.es[slot].key != key):
				return fmt.Errorf("%s heap: %q belongs under %d, filed at %d", c.name, p.key, key, slot)
			case !in && slot >= 0:
				return fmt.Errorf("%s heap: %q does not belong in it, filed at %d", c.name, p.key, slot)
			case !in:
				continue
			}
			if n[i] == 0 || h.max && key > best[i] || !h.max && key < best[i] {
				best[i] = key
			}
			n[i]++
		}
	}
	for i, c := range heaps {
		if n[i] != len(c.h.es) {
			return fmt.Errorf("%s heap holds %d partitions, %d belong in it", c.name, len(c.h.es), n[i])
		}
		if _, top := c.h.top(); n[i] > 0 && top != best[i] {
			return fmt.Errorf("%s heap: %d on top, a scan finds %d", c.name, top, best[i])
		}
	}
	return nil
}

// checkAdmitted: a partition the guard admitted (guard.go) holds the
// interval of its family the guard has, counted in loop.families; an open
// one is its family's last. A family the guard let go has no partition.
func (l *loop) checkAdmitted(p *partition) error {
	if p.fam == "" {
		return nil
	}
	if l.guard == nil {
		return fmt.Errorf("family %q without a guard", p.fam)
	}
	if l.families[p.fam] <= 0 {
		return fmt.Errorf("family %q counts %d partitions", p.fam, l.families[p.fam])
	}
	if p.adm.to != 0 && p.adm.to <= l.cursor+1 {
		return nil // its records are delivered: the guard may have forgotten the interval
	}
	a := l.guard.keys[p.fam]
	if a == nil {
		return fmt.Errorf("family %q is not in the guard", p.fam)
	}
	last := a.ivs[len(a.ivs)-1]
	switch {
	case p.adm.to == 0 && last != p.adm:
		return fmt.Errorf("admitted from %d, but family %q's last interval is %d to %d", p.adm.from, p.fam, last.from, last.to)
	case p.adm.to != 0 && !slices.Contains(a.ivs, p.adm):
		return fmt.Errorf("admitted %d to %d, not an interval of family %q", p.adm.from, p.adm.to, p.fam)
	}
	return nil
}

// checkArray verifies that p's queue ends where its array qbuf ends, and
// that the array holds nothing besides the queue and the batch's records
// before it, so that reserve may move the queue back to its start.
func (p *partition) checkArray() error {
	if len(p.queue) == 0 && len(p.batch) == 0 && (p.qbuf != nil || p.prev.recs != nil) && !p.busy() {
		return fmt.Errorf("no record queued or in a batch, but arrays of %d and %d places held (shedArrays)", cap(p.qbuf), cap(p.prev.recs))
	}
	if p.prev.recs != nil {
		if cap(p.prev.sizes) != cap(p.prev.recs) {
			return fmt.Errorf("arrays left of %d records and %d sizes", cap(p.prev.recs), cap(p.prev.sizes))
		}
		batch := p.batch
		if !p.batchInPrev() {
			batch = nil
		}
		if err := checkCleared(p.prev.recs[:cap(p.prev.recs)], batch); err != nil {
			return fmt.Errorf("the array left: %w", err)
		}
	}
	if p.qbuf == nil {
		return nil
	}
	if cap(p.sbuf) != cap(p.qbuf) || cap(p.sizes) != cap(p.queue) {
		return fmt.Errorf("arrays of %d records and %d sizes, queue of %d records and %d sizes", cap(p.qbuf), cap(p.sbuf), cap(p.queue), cap(p.sizes))
	}
	if cap(p.queue) == 0 {
		return checkCleared(p.qbuf, p.batch)
	}
	start := cap(p.qbuf) - cap(p.queue)
	if start < 0 || &p.qbuf[start:][0] != &p.queue[:1][0] {
		return fmt.Errorf("the queue does not end where its array does")
	}
	if err := checkCleared(p.qbuf[:start], p.batch); err != nil {
		return err
	}
	return checkCleared(p.qbuf[start+len(p.queue):], nil)
}

// checkCleared verifies that recs hold no record but those of batch.
func checkCleared(recs, batch []sinks.Record) error {
	for i := range recs {
		r := &recs[i]
		switch {
		case len(batch) > 0 && r.Seq >= batch[0].Seq && r.Seq <= batch[len(batch)-1].Seq:
		case r.Seq != 0 || r.Time != 0 || r.Tag != "" || r.Body != nil:
			return fmt.Errorf("the queue's array holds record %d outside the queue and the batch", r.Seq)
		}
	}
	return nil
}

// check verifies that the arrays kept for queues hold no record,
// and their count.
func (a *queueArrays) check() error {
	slots := 0
	for c, free := range a.free {
		for _, q := range free {
			if bits.Len(uint(cap(q.recs)))-1 != c || cap(q.sizes) != cap(q.recs) {
				return fmt.Errorf("arrays of %d records and %d sizes kept as %d", cap(q.recs), cap(q.sizes), 1<<c)
			}
			if err := checkCleared(q.recs[:cap(q.recs)], nil); err != nil {
				return fmt.Errorf("an array kept for queues: %w", err)
			}
			slots += cap(q.recs)
		}
	}
	if slots != a.slots || slots > a.max {
		return fmt.Errorf("arrays of %d places kept, counted %d, at most %d", slots, a.slots, a.max)
	}
	return nil
}

// checkArrayOwners verifies that no queue array is held twice: by two
// partitions, by a partition as its queue's and as the one it left, or by
// a partition and the arrays kept for reuse.
func (l *loop) checkArrayOwners() error {
	owners := map[*sinks.Record]string{}
	own := func(a queueArray, who string) error {
		if cap(a.recs) == 0 {
			return nil
		}
		base := &a.recs[:1][0]
		if other, ok := owners[base]; ok {
			return fmt.Errorf("a queue array is held by %s and by %s", other, who)
		}
		owners[base] = who
		return nil
	}
	for key, p := range l.parts {
		if err := own(queueArray{p.qbuf, p.sbuf}, fmt.Sprintf("partition %q", key)); err != nil {
			return err
		}
		if err := own(p.prev, fmt.Sprintf("partition %q (the array it left)", key)); err != nil {
			return err
		}
	}
	for _, free := range l.arrays.free {
		for _, q := range free {
			if err := own(q, "the arrays kept for reuse"); err != nil {
				return err
			}
		}
	}
	return nil
}
