package queue

import (
	"context"
	"time"
)

// Spilling and catching up.
//
// A partition that cannot send (its batch waits out a retry) while memory
// runs short is spilled: its queued records are let go and the head reader
// passes its records by from then on (partition.spillFrom). Once it can
// send again it joins the catch-up: one reader, started at the lowest
// spillFrom of the partitions it serves, reads the WAL again for all of
// them at once, at the speed of the sink, as a restarted process would,
// until it reaches the head reader's position; from there on the head
// reader serves them again. After an outage every partition of a sink is
// spilled: a second pass over the WAL, not one pass per partition, brings
// them back, and each partition's batches fill as fast as records are read
// instead of waiting out Limits.MaxAge piece by piece.
//
// While no connection to the destination can be made and partitions were
// spilled (flow.unreachable), the head reader waits: it would read records
// only to pass most of them by. The catch-up reader does not wait, so a
// spilled partition that may send gets its records; the first send that
// ends otherwise than in a failed dial ends the wait, and the head reader
// goes on from where it stopped.

// join lets the catch-up reader serve spilled partition p, which can send
// again: from p.spillFrom on, p takes the records it reads. A reader
// already past that point starts again there; the partitions it serves
// skip what they have.
func (l *loop) join(p *partition) {
	if p.spillFrom >= l.readPos {
		p.spillFrom, p.reading = 0, readHead // nothing of it was passed by
		return
	}
	p.reading = readCatchingUp
	l.joined[p] = struct{}{}
	if l.stopBack == nil || p.spillFrom < l.backPos {
		l.startCatchUp(p.spillFrom)
	}
}

// unjoin takes p out of the catch-up: it is spilled again or given up.
func (l *loop) unjoin(p *partition) {
	if p.reading != readCatchingUp {
		return
	}
	p.reading = readSpilled
	delete(l.joined, p)
	if len(l.joined) == 0 {
		l.stopCatchUp()
	}
}

// holdHead: the destination cannot be reached (flow.unreachable) and a send
// whose answer ends the wait is in flight or to come: a batch waits to be
// sent again, or the catch-up reader serves partitions. With nothing to
// send (the WAL dropped what the spilled partitions held, say), the head
// reader reads on, or the wait could never end.
func (l *loop) holdHead() bool {
	return l.unreachable() && (l.inflight > 0 || l.mem.waiting > 0 || len(l.joined) > 0)
}

func (l *loop) startCatchUp(from uint64) {
	l.stopCatchUp()
	ctx, cancel := context.WithCancel(context.Background())
	l.stopBack, l.backPos = cancel, from
	l.backGen++
	gen := l.backGen
	l.wg.Add(1)
	go func() { defer l.wg.Done(); l.read(ctx, from, l.backIn, gen) }()
}

func (l *loop) stopCatchUp() {
	if l.stopBack == nil {
		return
	}
	l.stopBack()
	l.stopBack, l.backPos = nil, 0
	l.backGen++ // a read it has made is dropped
}

// caughtUp follows a read of the catch-up reader: the partitions it serves
// have every record before backPos. When it reached the head reader's
// position (done), they are served by the head reader again.
func (l *loop) caughtUp(done bool, now time.Time) {
	if !done && l.backPos < l.readPos {
		for p := range l.joined {
			p.spillFrom = max(p.spillFrom, l.backPos)
		}
		return
	}
	l.stopCatchUp()
	for p := range l.joined {
		delete(l.joined, p)
		p.reading, p.spillFrom = readHead, 0
		switch {
		case p.empty():
			l.forget(p)
		case p.phase == phaseGathering:
			l.scheduleQueue(p, now)
		}
	}
}
