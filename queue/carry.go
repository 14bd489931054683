package queue

import (
	"time"

	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// carriedRecord reads back a record of p's carry, which held the records
// from first (0: no carry) up to the batch, that the sink rejected, to
// dead-letter it: the drainer does not hold carried records. A record the
// WAL no longer has was dropped and counted already: gone reports it, so
// that it is not counted delivered either.
func (l *loop) carriedRecord(p *partition, seq, first, last uint64) (_ sinks.Record, ok, gone bool) {
	if first == 0 || seq < first || seq > last {
		l.d.log.Error("the sink rejected a record that was not in the batch", "seq", seq)
		return sinks.Record{}, false, false
	}
	recs, err := l.d.w.Read(seq, 1, 0)
	if err != nil {
		l.d.log.Warn("a rejected record could not be read from the WAL to be dead-lettered", "seq", seq, "error", err)
		return sinks.Record{}, false, false
	}
	if len(recs) == 0 || recs[0].Seq != seq || recs[0].Tag == wal.DamagedTag { // dropped, or a placeholder: lost, counted
		l.d.log.Warn("a rejected record is no longer in the WAL to be dead-lettered", "seq", seq)
		return sinks.Record{}, false, true
	}
	r := recs[0]
	rec := sinks.Record{Seq: r.Seq, Time: r.Time, Tag: r.Tag, Body: r.Body}
	if l.d.sink.Partition(&rec) != p.key {
		l.d.log.Error("the sink rejected a record of another partition", "seq", seq)
		return sinks.Record{}, false, false
	}
	return rec, true, false
}

// takeCarry records that the sink took p's batch in without delivering it
// (sinks.Outcome.Carry): the batch's memory goes, the carry's comes, and
// the cursor stays before the carried records until a later batch
// delivers them.
func (l *loop) takeCarry(p *partition, c sinks.Carry, now time.Time) {
	l.sendCarried(p)
	if p.carry == nil {
		p.carryFirst, p.carrySince = p.batch[0].Seq, p.batchSince
	}
	if n := len(p.batch); n > 0 {
		p.carryLast = p.batch[n-1].Seq
		p.carryRecs += n
	}
	clear(p.batch) // its array may hold the partition's queue too: let these bodies go
	p.batch, p.batchMem, p.attempts = nil, 0, 0
	p.shedArrays(&l.arrays)
	p.carry, p.carryMem = c, c.Mem()
	l.touch(p)
	if p.carryFirst <= l.cursor {
		l.dropPart(p, l.cursor, now) // the WAL dropped some while it was sent
		return
	}
	l.scheduleQueue(p, now)
}

// uncarry gives up what the sink carries for p, with p's batch and queue,
// when the sink refused to deliver them for their content: they are read
// again from the WAL and sent in final batches, never carried, so that the
// refusal dead-letters the records of one batch, which the drainer holds.
func (l *loop) uncarry(p *partition, now time.Time) {
	l.d.log.Warn("the sink refused a batch with records it had carried; reading them again to send them in batches of their own",
		"partition_records", p.carryRecs+len(p.batch)+len(p.queue))
	l.sendCarried(p)
	p.noCarry = true
	l.release(p, p.carryFirst, now)
}

// release forgets what p carries, its batch and its queue, and reads its
// records from `from` on again from the WAL, but none the cursor passed
// (the WAL dropped them, with drop_oldest, while a send of p was in
// flight). p is not busy.
func (l *loop) release(p *partition, from uint64, now time.Time) {
	from = max(from, l.cursor+1)
	if d, ok := p.carry.(sinks.Discarder); ok {
		d.Discard() // given up: not sent, its records read again
	}
	clear(p.batch)
	l.unhold(p)
	l.batchDropped(p)
	l.dropQueue(p)
	l.unjoin(p)
	p.spillFrom, p.reading = from, readSpilled
	l.scheduleQueue(p, now)
}

// unhold stops holding p's batch and carry: their memory leaves the loop's
// counts. The caller clears the batch's records when it is done with them.
func (l *loop) unhold(p *partition) {
	p.batch, p.batchMem, p.attempts = nil, 0, 0
	p.carry, p.carryMem, p.carryRecs, p.carryFirst, p.carryLast = nil, 0, 0, 0, 0
	l.touch(p)
}
