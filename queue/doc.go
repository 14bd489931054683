// Package queue drains the WAL into one sink: one Drainer per sink, each
// with its own cursor, so that one sink's outage never holds back another.
//
// # The pipeline
//
//	           head reader (ingest.go)       catch-up reader (catchup.go)
//	wal ──► from readPos, waits for appends   from the oldest spilled record
//	           │ route by Match and Partition    │ only to partitions catching up
//	           ▼                                 ▼
//	   partition: queue ──cut (batch.go)──► batch ──Send──► sink
//	     │   ▲ spill (spill.go): memory       │ ▲              │ Outcome.Carry (carry.go):
//	     │   │ short while it waits out       │ └── retry,     │ taken in, not delivered
//	     │   │ a retry: read again later      │     throttle,  ▼
//	     │   └────────────────────────────────┘     pause      carry (until a final batch)
//	     ▼                                        (flow.go)
//	   deliver (watermark.go): dead letters, delivered mark, cursor = low
//	   watermark, the sink's state deletes ──► committer (commit.go) ──► wal
//
// With sinks.Limits.MaxPartitions and a sink that is a sinks.Overflower,
// routing asks the guard (guard.go, overflow.go) whether a record's
// partition is admitted; records beyond the bound go to the sink's
// overflow partition, the same before and after a restart.
//
// The loop (loop.go) is one goroutine that owns every field of the loop
// type; the readers, the sends and the committer talk to it through
// channels. Drain (drain.go) makes it deliver everything now; Status
// (status.go) is what /status shows.
//
// # Invariants
//
// loop.check verifies these after every step of the loop in the tests:
//
//   - The memory account (mem, memory.go) sums over the partitions their
//     queues' (mem), batches' (batchMem) and carries' (carryMem) memory, and
//     that of the batches waiting to be sent again with their carries.
//   - A partition's mem, size and arrivals agree with its queue record by
//     record; its carry, batch and queue hold records in sequence order,
//     each after the one before.
//   - open counts the partitions that queue or carry records (counted);
//     closing those of them with a final batch due (finalize) or in flight.
//   - inflight counts the partitions that are busy: a batch sending, or
//     its delivery committing. At most one batch per partition is in flight.
//   - cursor <= the low watermark (every record up to it is delivered,
//     dead-lettered or not for this sink) < readPos; every delivered mark
//     is past the cursor. The one exception is wal.when_full: drop_oldest,
//     which moves the cursor past records a send in flight holds.
//   - Every partition in the due heap is filed under its key at its index.
//   - A partition's queue ends where its array (qbuf) ends; the array holds
//     no record but the queue's and its batch's, and the one the queue
//     left while the batch was in it (prev) none but the batch's. The
//     arrays kept for queues that grow (arrays.go) hold no record.
//   - The heaps kept as partitions change (index.go: the largest queue and
//     carry, the oldest open partition, the waiting ones by due time), the
//     delivered marks' heap (marks.go) and the pending heap (pending.go)
//     hold what a scan of the partitions finds, and in heap order.
//
// # Partition phases
//
// A partition's phase (partition.phase, phase.go) is where its batch is.
// Every change is a named transition; loop.check verifies that the phase
// agrees with the batch, the carry and the due heap:
//
//	            startSend               sendDelivered
//	gathering ─────────────► sending ──────────────► committing
//	 ▲  ▲  ▲   sendCarried   │  ▲  │                     │
//	 │  │  └─────────────────┘  │  │ sendFailed          │
//	 │  │             startSend │  ▼                     │
//	 │  └───── batchDropped ──── waiting                 │
//	 └──────────────── deliveryCommitted ────────────────┘
//
// The phases:
//
//   - gathering: no batch. Records may be queued and a carry held; the
//     partition is due when its queue makes a batch, its carry is due, or
//     memory or MaxOpen want it cut (finalize).
//   - sending: a batch, or the carry alone (a flush: the batch is empty),
//     is with the sink. sendCarried: the sink took it in without delivering
//     it (Outcome.Carry), or refused a carried delivery (uncarry).
//   - waiting: the send failed; the batch waits out a retry, a throttle or
//     a pause, and is sent again as it is. batchDropped: the WAL dropped its
//     records (drop_oldest) or they are to be read again (release).
//   - committing: delivered or dead-lettered; the partition sends again once
//     the commit is durable.
//
// sending and committing are in flight (busy, counted in inflight). Which
// reader hands the partition its records (partition.reading) is
// independent of the phase: the head reader (spillFrom is 0); none while it
// is spilled (a waiting partition whose queue was let go while memory ran
// short; see spill.go), the head reader passing its records by from
// spillFrom; the catch-up reader once it may send again (catchup.go), which
// may be while it is sending. The flags beside the phase are independent of
// it too: final (the batch, sent or waiting, or the delivery committing, is
// final), finalize (the next batch is to be final), noCarry (every batch is
// final) and counted (counted in open).
//
// # State keys
//
// A sink's state bucket in the WAL (wal.Batch.Put with the sink's name)
// holds:
//
//	fingerprint       how the sink partitions records (Options.Fingerprint)
//	partitioning      the same, described (sinks.Repartitioner.Partitioning)
//	m/<partition>     delivered mark: the partition delivered up to this
//	                  sequence number (8 bytes, big-endian), ahead of the cursor
//	o/<partition>     a delivered mark of an earlier configuration (its
//	o<n>/<partition>  partitioning or match changed since), kept until the
//	                  cursor passes it: generation 0, or n (repartition.go)
//	old_partitioning  the description of that generation's partitioning
//	old_partitioning/<n>
//	old_match         the match when that generation's marks were written
//	old_match/<n>
//	match             the sink's match (Options.MatchGlobs), sorted, as JSON
//	d/<seq>           a dead letter: the record and why, as JSON (DeadLetter)
//	s/<key>           the sink's own state (sinks.State), e.g. S3 intents
//	a/<partition>     with max_partitions (guard.go): the intervals of
//	                  sequence numbers whose records of the partition go to
//	                  it, 16 bytes each (first, end; end 0: open), big-endian
//	max_partitions    the bound and the first sequence number it applies
//	                  to, 16 bytes each, oldest first
//
// The cursor itself is the WAL's (wal.Batch.SetCursor), committed in the
// same transaction as the marks and state changes of a delivery.
package queue
