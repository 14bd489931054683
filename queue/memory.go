package queue

import (
	"github.com/logfwd/forwarder/sinks"
)

// recordMem is what holding r costs: its bytes, its place in a queue and
// in a batch (a sinks.Record is 56 bytes; slices grow ahead), and the
// allocator's rounding.
func recordMem(r *sinks.Record) int {
	return len(r.Body) + len(r.Tag) + 128
}

// waitingBatches is the memory of batches waiting for a retry (not in
// flight), with the carries they are to deliver.
func (l *loop) waitingBatches() int {
	n := 0
	for _, p := range l.parts {
		if p.phase == phaseWaiting {
			n += p.batchMem + p.carryMem
		}
	}
	return n
}
