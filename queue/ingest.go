package queue

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// read is records a reader hands the loop, and the buffer holding them.
type read struct {
	recs []wal.Record
	buf  *wal.ReadBuffer
	gen  uint64 // the catch-up reader's generation; 0 for the head reader
}

// readBytes is about how many bytes of bodies a read of the WAL takes: it
// stops after the entry that reaches them.
const readBytes = 4 << 20

// rangeBuffers are buffers of ReadRange, for the pieces of a range. A
// pool: ranges are read after a restart and for checks, seldom.
var rangeBuffers = sync.Pool{New: func() any { return new(wal.ReadBuffer) }}

// readBuffers keeps a loop's read buffers, for its readers to decode into
// again: the head reader's two (one being decoded into, one being
// ingested) and the catch-up reader's. Kept across garbage collections, not
// in a sync.Pool: at the memory limit the heap is collected every few reads,
// and a pool emptied at each collection had readers allocate (and clear) a
// buffer of up to a few MiB a read. While a reader waits for appends, the
// loop keeps what a reader that keeps up uses (wal.ReadBuffer.Trim): the
// head reader's two buffers, trimmed.
type readBuffers struct {
	mu      sync.Mutex
	bufs    []*wal.ReadBuffer
	waiting bool // the head reader has read everything and waits for appends
}

const (
	readBufferCap        = 4
	readBufferCapWaiting = 2
)

// get returns a buffer to read into: one kept or a new one. head: for
// the head reader, which waits for appends no more.
func (b *readBuffers) get(head bool) *wal.ReadBuffer {
	b.mu.Lock()
	defer b.mu.Unlock()
	if head {
		b.waiting = false
	}
	if n := len(b.bufs); n > 0 {
		buf := b.bufs[n-1]
		b.bufs[n-1] = nil
		b.bufs = b.bufs[:n-1]
		return buf
	}
	return new(wal.ReadBuffer)
}

// put keeps buf for a reader, or drops it when enough are kept.
func (b *readBuffers) put(buf *wal.ReadBuffer) {
	b.mu.Lock()
	defer b.mu.Unlock()
	keep := readBufferCap
	if b.waiting {
		buf.Trim()
		keep = readBufferCapWaiting
	}
	if len(b.bufs) < keep {
		b.bufs = append(b.bufs, buf)
	}
}

// wait is told that the head reader waits for appends (until its next
// get): what is kept is cut to what a waiting reader keeps, and so is what
// is put back meanwhile (by ingest, or by the catch-up reader, whose reads
// do not change what the head reader does).
func (b *readBuffers) wait() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.waiting = true
	b.trim(readBufferCapWaiting)
}

// drop lets go of every buffer kept (the loop reads no more for now).
func (b *readBuffers) drop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.trim(0)
}

func (b *readBuffers) trim(keep int) {
	for i, buf := range b.bufs {
		if i < keep {
			buf.Trim()
		} else {
			b.bufs[i] = nil
		}
	}
	b.bufs = b.bufs[:min(keep, len(b.bufs))]
}

// read feeds the loop from the WAL from record from on, waiting for
// appends when caught up. It decodes into buffers ingest has given back
// (ingest copies the bodies it keeps), so that reading does not allocate
// the records again and again.
func (l *loop) read(ctx context.Context, from uint64, out chan<- read, gen uint64) {
	rd := l.d.w.NewReader(from)
	var repaired uint64
	for {
		head := gen == 0
		buf := l.bufs.get(head)
		recs, err := rd.ReadInto(l.d.opts.ReadBatch, readBytes, buf)
		if err != nil && repairWith(ctx, l.d.w.ReplaceDamaged, err, &repaired, noSpaceRepairWait) {
			l.bufs.put(buf)
			continue
		}
		if err == nil && len(recs) == 0 {
			l.bufs.put(buf)
			if head {
				l.bufs.wait()
			}
			err = rd.Wait(ctx)
			if err == nil {
				continue
			}
		}
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, wal.ErrClosed) {
				select {
				case l.readErr <- err:
				case <-ctx.Done():
				}
			}
			return
		}
		select {
		case out <- read{recs, buf, gen}:
		case <-ctx.Done():
			return
		}
	}
}

// ingest routes records to their partitions: records of the head reader
// to partitions that are not spilled, records of the catch-up reader (back)
// to the partitions it serves, up to where the head reader took over.
func (l *loop) ingest(recs []wal.Record, now time.Time, back bool) error {
	d := l.d
	// First route every record, counting the bytes each partition takes
	// from this read; then copy each partition's bodies into one buffer of
	// its own. Bodies leave the decoded entries (a record held for a slow
	// partition must not hold the memory of a whole entry), a partition's
	// records sit next to each other for its sink, and a read costs one
	// allocation per partition, not one per record. A partition's records
	// are delivered in order, so its buffer is not held much past them.
	route := l.route[:0]
	caughtUp := false
	for i := range recs {
		r := &recs[i]
		if back {
			if r.Seq >= l.readPos {
				caughtUp = true
				break
			}
			l.backPos = r.Seq + 1
		} else {
			// Never back: a read made before the WAL dropped records for
			// this sink (drop_oldest) holds records below the position
			// dropForced moved on to, and they are at or below the cursor.
			l.readPos = max(l.readPos, r.Seq+1)
		}
		if r.Seq <= l.cursor || r.Tag == wal.DamagedTag {
			continue // a damaged entry's placeholder (repairWith): passed as a tag no sink takes
		}
		if d.opts.Match != nil && !d.opts.Match(r.Tag) {
			if !back {
				l.unmatch(r.Tag)
			}
			continue
		}
		if !back {
			l.matched++
		}
		// wal.Record and sinks.Record have the same fields: the sink is
		// asked about the read's record itself, not a copy of it.
		rec := (*sinks.Record)(r)
		if l.old != nil && l.old.delivered(rec) {
			// Delivered before the partitioning changed (repartition.go).
			if !back {
				d.skipped.Inc()
				l.skippedUnlogged++
			}
			continue
		}
		key := d.sink.Partition(rec)
		p := l.parts[key]
		var (
			fam string   // when the guard admits the record: its family
			iv  interval // and the interval that admits it
		)
		if l.guard != nil && (p == nil || !p.admits(r.Seq)) {
			fam = l.overflow.Family(rec, key)
			var ok bool
			if ok, iv = l.guard.route(fam, r.Seq, now); ok {
				if p != nil {
					l.adopt(p, fam, iv)
				}
			} else {
				fam, key = "", l.overflow.Overflow(rec)
				p = l.parts[key]
				if !back {
					l.overflowed(rec)
				}
			}
		}
		// A partition that took a record of this read has none of it at
		// or below its mark: the marks stay as they are while a read is
		// ingested, and its records come in sequence order.
		if p == nil || p.take == 0 {
			if m, ok := l.marks.get(key); ok && r.Seq <= m {
				if !back {
					d.skipped.Inc()
					l.skippedUnlogged++
				}
				continue
			}
		}
		switch {
		case back:
			if p == nil || p.reading != readCatchingUp || r.Seq < p.spillFrom {
				continue
			}
			p.spillFrom = r.Seq + 1
		case p == nil:
			p = &partition{key: key, heapIdx: -1}
			l.parts[key] = p
			if fam != "" {
				l.adopt(p, fam, iv)
			}
		case p.reading != readHead:
			continue // the catch-up reader reads it again
		}
		if p.take == 0 {
			p.tookAt = int32(len(l.took))
			l.took = append(l.took, p)
		}
		p.take++
		p.need += len(r.Body)
		route = append(route, routed{p: p.tookAt, i: int32(i)})
	}
	if l.guard != nil {
		// The partitions this read admitted are stored before any of its
		// records can be sent (see guard).
		if err := d.commitGuard(l.ctx, l.guard); err != nil {
			for _, p := range l.took {
				p.need, p.take = 0, 0
			}
			clear(l.took)
			l.took = l.took[:0]
			return err
		}
	}
	for _, p := range l.took {
		if p.need > 0 {
			p.arena = make([]byte, 0, p.need)
		}
		p.reserve(p.take, &l.arrays)
	}
	for _, rt := range route {
		r, p := &recs[rt.i], l.took[rt.p]
		start := len(p.arena)
		p.arena = append(p.arena, r.Body...)
		l.enqueue(p, r, p.arena[start:len(p.arena):len(p.arena)])
	}
	// What follows from the partitions' new records is filed once per
	// partition and read, not once per record: nothing looks at it before
	// the read is ingested.
	for _, p := range l.took {
		p.arena, p.need = nil, 0 // the next read starts buffers of its own
		p.arrived(p.take, now)
		p.take = 0
		l.touch(p)
		if p.phase == phaseGathering {
			l.scheduleQueue(p, now)
		}
		l.notePending(p)
	}
	clear(l.took)
	l.took = l.took[:0]
	l.route = route[:0]
	if back {
		l.caughtUp(caughtUp, now)
	}
	return nil
}

// routed is a record of the read being ingested (its index in the read)
// and its partition (its index in loop.took). Without pointers, routing a
// record stores none that the garbage collector would be told of.
type routed struct {
	p, i int32
}

// enqueue appends r to p's queue, which has room for it (reserve), with
// its body copied to body. The record is written in its place in the
// queue, not copied there. The partition's arrivals and its place in the
// loop's structures follow once per read (ingest).
func (l *loop) enqueue(p *partition, r *wal.Record, body []byte) {
	if len(p.queue) == 0 {
		p.lo, p.hi = r.Time, r.Time
	} else {
		p.lo, p.hi = min(p.lo, r.Time), max(p.hi, r.Time)
	}
	n := len(p.queue)
	p.queue = p.queue[:n+1]
	rec := &p.queue[n]
	*rec = sinks.Record{Seq: r.Seq, Time: r.Time, Tag: r.Tag, Body: body}
	size := l.d.sink.Size(rec)
	p.sizes = append(p.sizes, int32(size))
	p.size += size
	p.mem += recordMem(rec)
}

// recount keeps p counted in l.open while it has queued or carried records.
func (l *loop) recount(p *partition) {
	open := len(p.queue) > 0 || p.carry != nil
	switch {
	case open && !p.counted:
		l.open++
	case !open && p.counted:
		l.open--
	}
	p.counted = open
}

// repairWith handles err from a read of the WAL: a damaged entry (a
// wal.CorruptionError) is replaced by placeholders, or written again from
// memory (replace: wal.ReplaceDamaged, which logs it and counts the
// records lost), and the read is to be made again (true), rather than the
// sink failing at it at every start. The same entry is replaced once per
// reader (*repaired): damage a read still meets after that is returned as
// it is. With
// noSpaceWait above 0, a replacement a full disk refuses (wal.ErrNoSpace)
// is tried again: the read is to be made again after that pause (it meets
// the damage again) until the replacement fits or ctx ends, rather than
// the sink failing, and the service stopping, on a full disk.
func repairWith(ctx context.Context, replace func(context.Context, uint64) (uint64, error), err error, repaired *uint64, noSpaceWait time.Duration) bool {
	var ce *wal.CorruptionError
	if !errors.As(err, &ce) || ce.FirstSeq == 0 || ce.FirstSeq == *repaired {
		return false
	}
	_, err = replace(ctx, ce.FirstSeq)
	if noSpaceWait > 0 && errors.Is(err, wal.ErrNoSpace) {
		t := time.NewTimer(noSpaceWait)
		defer t.Stop()
		select {
		case <-t.C:
			return true
		case <-ctx.Done():
			return false
		}
	}
	*repaired = ce.FirstSeq
	return err == nil
}

// noSpaceRepairWait is how long the head and catch-up readers wait before
// they try again a damaged entry's replacement a full disk refused.
var noSpaceRepairWait = 5 * time.Second
