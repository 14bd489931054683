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
// The loop (loop.go) is one goroutine that owns every field of the loop
// type; the readers, the sends and the committer talk to it through
// channels. Drain (drain.go) makes it deliver everything now; Status
// (status.go) is what /status shows.
//
// # Invariants
//
// loop.check verifies these after every step of the loop in the tests:
//
//   - buffered is the memory of every record held: the sum over the
//     partitions of their queues' (mem), batches' (batchMem) and carries'
//     (carryMem) memory; batched and carried are the sums of the last two.
//   - A partition's mem, size and arrivals agree with its queue record by
//     record; its carry, batch and queue hold records in sequence order,
//     each after the one before.
//   - open counts the partitions that queue or carry records (counted).
//   - inflight counts the partitions that are busy: a batch sending, or
//     its delivery committing. At most one batch per partition is in flight.
//   - cursor <= the low watermark (every record up to it is delivered,
//     dead-lettered or not for this sink) < readPos; every delivered mark
//     is past the cursor. The one exception is wal.when_full: drop_oldest,
//     which moves the cursor past records a send in flight holds.
//   - Every partition in the due heap is filed under its key at its index.
//
// # State keys
//
// A sink's state bucket in the WAL (wal.Batch.Put with the sink's name)
// holds:
//
//	fingerprint       how the sink partitions records (Options.Fingerprint)
//	m/<partition>     delivered mark: the partition delivered up to this
//	                  sequence number (8 bytes, big-endian), ahead of the cursor
//	d/<seq>           a dead letter: the record and why, as JSON (DeadLetter)
//	s/<key>           the sink's own state (sinks.State), e.g. S3 intents
//
// The cursor itself is the WAL's (wal.Batch.SetCursor), committed in the
// same transaction as the marks and state changes of a delivery.
package queue
