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

// memAccount is the memory of every record the partitions hold, summed as
// each partition changes (loop.touch) rather than by a scan of them all.
// Each partition's share, as last added, is kept with the partition: set
// replaces it, so that the sums are right however often it is called.
type memAccount struct {
	queued  int // in queues
	batched int // in batches, being sent or waiting to be sent again
	carried int // in the sink's carries (sinks.Carry.Mem)
	// waiting is the memory of batches waiting to be sent again (not in
	// flight), with the carries they are to deliver: a part of batched
	// and carried.
	waiting int
}

// memShare is one partition's part of a memAccount.
type memShare struct {
	queued, batched, carried, waiting int
}

// set replaces the share s, which is in the account, with n.
func (a *memAccount) set(s *memShare, n memShare) {
	a.queued += n.queued - s.queued
	a.batched += n.batched - s.batched
	a.carried += n.carried - s.carried
	a.waiting += n.waiting - s.waiting
	*s = n
}

// buffered is the memory of every record held: queued, batched, carried.
func (a *memAccount) buffered() int { return a.queued + a.batched + a.carried }
