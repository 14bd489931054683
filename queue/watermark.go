package queue

import (
	"time"

	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// deliver records p's batch as delivered: rejected records (or, with
// deadReason, all of them) become dead letters; the delivered mark, the
// cursor and the sink's state changes are committed together. The
// partition sends again only once that commit is durable.
func (l *loop) deliver(p *partition, rejected []sinks.Rejection, deleteState [][]byte, deadReason string, now time.Time) {
	d := l.d
	batch := p.batch
	carryFirst, last := p.carryFirst, p.carryLast // 0, 0 without a carry
	if len(batch) > 0 {
		last = batch[len(batch)-1].Seq
	}
	req := &commitReq{p: p, records: len(batch) + p.carryRecs}
	l.unhold(p)
	l.sendDelivered(p)
	l.flow.delivered()
	at := time.Now()
	dead := func(r *sinks.Record, reason string) {
		req.ops.Put(d.name, deadKey(r.Seq), encodeDeadLetter(r, reason, at))
		req.deadSeqs = append(req.deadSeqs, r.Seq)
		d.opts.Metrics.DeadLetters.WithLabelValues(d.name, reason).Inc()
		l.deadReasons[reason]++
		req.dead++
	}
	if deadReason != "" {
		for i := range batch {
			dead(&batch[i], deadReason)
		}
	} else if len(rejected) > 0 {
		bySeq := make(map[uint64]*sinks.Record, len(batch))
		for i := range batch {
			bySeq[batch[i].Seq] = &batch[i]
		}
		seen := make(map[uint64]bool, len(rejected))
		for _, rj := range rejected {
			if seen[rj.Seq] {
				continue // named twice (once per part of a split message): one dead letter, counted once
			}
			seen[rj.Seq] = true
			if r, ok := bySeq[rj.Seq]; ok {
				dead(r, rj.Reason)
			} else if r, ok, gone := l.carriedRecord(p, rj.Seq, carryFirst, last); ok {
				dead(&r, rj.Reason)
			} else if gone {
				req.records-- // refused, and dropped from the WAL (counted there): not delivered
			}
		}
	}
	for _, k := range deleteState {
		req.ops.Delete(d.name, stateKey(k))
	}
	low := l.lowWatermark()
	// A mark at or below the cursor says nothing (drop_oldest may have
	// moved the cursor past a batch in flight: dropForced).
	if last > max(low, l.cursor) {
		req.ops.Put(d.name, markKey(p.key), u64(last))
		l.marks.set(p.key, last)
	} else if _, ok := l.marks.get(p.key); ok {
		req.ops.Delete(d.name, markKey(p.key))
		l.marks.del(p.key)
	}
	if low > l.cursor {
		req.ops.SetCursor(d.name, low)
		l.cursor = low
		l.passMarks(low, &req.ops)
	}
	clear(batch) // its array may hold the partition's queue too: let these bodies go
	p.shedArrays(&l.arrays)
	l.commits <- req
}

// dropForced forgets records that the WAL dropped for this sink
// (wal.when_full: drop_oldest moves a lagging cursor past them and counts
// them), so that what is counted as dropped is not delivered after all.
func (l *loop) dropForced(now time.Time) {
	pos, ok := l.d.w.Cursor(l.d.name)
	if !ok || pos <= l.cursor {
		return
	}
	l.cursor = pos
	l.readPos = max(l.readPos, pos+1)
	for _, p := range l.parts {
		l.dropPart(p, pos, now)
	}
	// Marks the cursor passed say nothing any more (no record at or below
	// it is read again): forgotten now, deleted from the WAL with the next
	// commit that moves the cursor, or at once when the commit queue has
	// room for a cursor move of its own.
	l.marks.takeUpTo(pos, func(k string) { l.staleMarks = append(l.staleMarks, k) })
	if len(l.staleMarks) > 0 && !l.idlePending && len(l.commits) < cap(l.commits) {
		req := &commitReq{} // committed as advanceIdle's cursor moves are
		l.deleteStaleMarks(&req.ops)
		l.commits <- req // the loop alone sends: there is room
		l.idlePending = true
	}
}

// deleteStaleMarks adds to ops the deletion of the marks dropForced
// forgot, but for those of partitions that have a mark again (a delivery
// since, whose commit stores it).
func (l *loop) deleteStaleMarks(ops *wal.Batch) {
	for _, k := range l.staleMarks {
		if _, ok := l.marks.get(k); !ok {
			ops.Delete(l.d.name, markKey(k))
		}
	}
	clear(l.staleMarks)
	l.staleMarks = l.staleMarks[:0]
}

// dropPart forgets p's records up to pos, which the WAL dropped. A batch
// or carry in flight is the exception: it finishes, and what it leaves is
// looked at again when it fails or is carried. A carry that holds dropped
// records is given up, and the partition's records after them are read
// again.
func (l *loop) dropPart(p *partition, pos uint64, now time.Time) {
	if p.carry != nil && p.carryFirst <= pos && !p.busy() {
		l.release(p, pos+1, now)
		return
	}
	if n := len(p.batch); n > 0 && !p.busy() && p.batch[0].Seq <= pos {
		p.batch = dropUpTo(p.batch, pos)
		if len(p.batch) == 0 {
			l.batchDropped(p)
		}
		mem := 0
		for i := range p.batch {
			mem += recordMem(&p.batch[i])
		}
		p.batchMem = mem
		l.touch(p)
	}
	if n := len(p.queue); n > 0 && p.queue[0].Seq <= pos {
		p.queue = dropUpTo(p.queue, pos)
		p.sizes = p.sizes[n-len(p.queue):]
		p.taken(n - len(p.queue))
		size, mem := 0, 0
		for i := range p.queue {
			size += int(p.sizes[i])
			mem += recordMem(&p.queue[i])
		}
		p.size, p.mem = size, mem
		if len(p.queue) > 0 {
			p.resetSpan()
		}
		l.touch(p)
	}
	if p.spillFrom != 0 && p.spillFrom <= pos {
		p.spillFrom = pos + 1
	}
	p.shedArrays(&l.arrays)
}

func dropUpTo(recs []sinks.Record, pos uint64) []sinks.Record {
	i := 0
	for i < len(recs) && recs[i].Seq <= pos {
		i++
	}
	clear(recs[:i]) // the array may live on with the rest: let these bodies go
	return recs[i:]
}

// lowWatermark is the highest sequence number such that every record up
// to it is delivered, dead-lettered, or not for this sink.
func (l *loop) lowWatermark() uint64 {
	low := l.readPos
	if s := l.lowestPending(); s != 0 && s < low {
		low = s
	}
	return low - 1
}

// advanceIdle moves the cursor past records that needed no delivery (not
// for this sink, or delivered before a restart) when no delivery will carry
// it along: a sink that matches nothing must not pin the WAL.
func (l *loop) advanceIdle() {
	low := l.lowWatermark()
	if low <= l.cursor || l.idlePending {
		return
	}
	if len(l.commits) == cap(l.commits) {
		return // deliveries are queued for commit: they carry the cursor
	}
	req := &commitReq{}
	req.ops.SetCursor(l.d.name, low)
	l.passMarks(low, &req.ops)
	l.commits <- req // the loop alone sends: there is room
	l.idlePending = true
	l.cursor = low
}
