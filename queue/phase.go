package queue

import "fmt"

// phase is where a partition's batch is; doc.go, Partition phases, draws
// the diagram. Each change is one of the named transitions below, which
// keep inflight and the loop's incremental structures (l.touch) in step.
type phase uint8

const (
	// phaseGathering: no batch. Records may be queued or carried; the
	// partition is due when its queue makes a batch (scheduleQueue).
	phaseGathering phase = iota
	// phaseSending: a batch, or the carry alone (flush), is being sent.
	phaseSending
	// phaseWaiting: the send failed; the batch waits in the due heap to be
	// sent again.
	phaseWaiting
	// phaseCommitting: the batch was delivered (or dead-lettered); the
	// delivery is being committed to the WAL.
	phaseCommitting
)

func (ph phase) String() string {
	switch ph {
	case phaseGathering:
		return "gathering"
	case phaseSending:
		return "sending"
	case phaseWaiting:
		return "waiting"
	case phaseCommitting:
		return "committing"
	}
	return fmt.Sprintf("phase(%d)", uint8(ph))
}

// reading is which reader hands a partition its records, independent of
// its phase: a partition is spilled while its batch waits, and may send
// while it catches up.
type reading uint8

const (
	readHead       reading = iota // the head reader; spillFrom is 0
	readSpilled                   // none: the head reader passes its records by from spillFrom
	readCatchingUp                // the catch-up reader, from spillFrom
)

func (r reading) String() string {
	switch r {
	case readHead:
		return "head"
	case readSpilled:
		return "spilled"
	case readCatchingUp:
		return "catching up"
	}
	return fmt.Sprintf("reading(%d)", uint8(r))
}

// phaseMoves are the transitions a phase may take.
var phaseMoves = [4][4]bool{
	phaseGathering:  {phaseSending: true},
	phaseSending:    {phaseGathering: true, phaseWaiting: true, phaseCommitting: true},
	phaseWaiting:    {phaseSending: true, phaseGathering: true},
	phaseCommitting: {phaseGathering: true},
}

// setPhase moves p to phase to. A move the diagram does not have is made
// all the same and noted for loop.check, which reports it.
func (l *loop) setPhase(p *partition, to phase) {
	from := p.phase
	if !phaseMoves[from][to] && l.badMove == "" {
		l.badMove = fmt.Sprintf("partition %q moved from %v to %v", p.key, from, to)
	}
	switch {
	case !from.inFlight() && to.inFlight():
		l.inflight++
	case from.inFlight() && !to.inFlight():
		l.inflight--
	}
	p.phase = to
	l.touch(p)
}

func (ph phase) inFlight() bool { return ph == phaseSending || ph == phaseCommitting }

// startSend: a due partition's batch (cut now, or waiting) goes to the sink.
func (l *loop) startSend(p *partition) { l.setPhase(p, phaseSending) }

// sendFailed: the batch is kept to be sent again.
func (l *loop) sendFailed(p *partition) { l.setPhase(p, phaseWaiting) }

// sendCarried: the sink took the batch in without delivering it, or it is
// given up to be read again (uncarry); either way the partition has no
// batch.
func (l *loop) sendCarried(p *partition) { l.setPhase(p, phaseGathering) }

// sendDelivered: the batch was delivered or dead-lettered; its delivery
// commits.
func (l *loop) sendDelivered(p *partition) { l.setPhase(p, phaseCommitting) }

// deliveryCommitted: the delivery is durable; the partition may send again.
func (l *loop) deliveryCommitted(p *partition) { l.setPhase(p, phaseGathering) }

// batchDropped: a waiting batch is gone: the WAL dropped its records, or
// they are to be read again.
func (l *loop) batchDropped(p *partition) {
	if p.phase == phaseWaiting {
		l.setPhase(p, phaseGathering)
	}
}
