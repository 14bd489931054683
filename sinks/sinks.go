// Package sinks defines what the drainer (package queue) and a destination
// (sinks/cloudwatch, sinks/s3sink) agree on: the record view a sink sees, how a
// sink declares its partitions and batch rules, the small state store it
// gets, and the classes of errors a send can end in. It imports nothing of
// the project, so a sink never depends on the WAL or the drainer.
package sinks

import (
	"context"
	"time"
)

// Record is a record as a sink sees it. Body is one compact JSON object.
// A sink must not keep Body after Send returns.
type Record struct {
	Seq  uint64 // the WAL's sequence number
	Time int64  // event time, nanoseconds since the Unix epoch
	Tag  string
	Body []byte
}

// Limits are a sink's batch rules. The drainer cuts a partition's records
// into batches that keep every rule and hands each batch to Send.
type Limits struct {
	MaxRecords int           // records in one batch
	MaxBytes   int           // sum of Size over a batch
	MaxAge     time.Duration // how long a partial batch waits for more records
	MaxSpan    time.Duration // largest difference of event times in one batch; 0: none
	// Concurrency is how many partitions may have a batch in flight at
	// once. Within one partition there is never more than one.
	Concurrency int
	// MaxOpen bounds the partitions with records waiting for a batch (S3's
	// open objects): beyond it, the partition that waited longest is sent
	// early. 0: no bound.
	MaxOpen int
	// MaxPartitions bounds the partitions a sink that is an Overflower
	// has: records that would make one more go to its overflow partition
	// (max_partitions). 0: no bound.
	MaxPartitions int
	// MaxFinalBytes, for a sink that carries (see Outcome.Carry), is the
	// most a final batch without a carry may hold (S3: max_object_bytes);
	// with a carry it may hold what the carry has room for. 0: MaxBytes.
	MaxFinalBytes int
}

// Sink is a destination. Its methods must be safe for concurrent use; the
// drainer calls Send for many partitions at once but never twice at once
// for one partition.
type Sink interface {
	Limits() Limits
	// Partition names the partition of a record: a CloudWatch group and
	// stream, an S3 key prefix. Records of one partition are delivered in
	// sequence order, one batch at a time.
	Partition(r *Record) string
	// Size is what a record counts against Limits.MaxBytes.
	Size(r *Record) int
	// Send delivers one batch. A nil error means every record was accepted
	// except those listed in Outcome.Rejected, which are dead-lettered, or,
	// with Outcome.Carry, that the sink took the records in without
	// delivering them yet. An error must be an *Error (see Retryable and the
	// others) or it is treated as retryable; the whole batch is then sent
	// again later.
	Send(ctx context.Context, b *Batch) (Outcome, error)
}

// Batch is what Send delivers: records of one partition in sequence order.
type Batch struct {
	Partition string
	// Records are the batch's records. It is empty only when Carry is set
	// and Final: the carried records alone are to be delivered.
	Records []Record
	State   State // the sink's own state, kept in the WAL
	// Carry is what the previous send of the partition handed back in its
	// Outcome: records taken in before these ones and not delivered yet.
	// Delivering the batch delivers them too. Nil when there are none: the
	// drainer may also give a carry up and read its records again (when
	// the WAL dropped some of them, or a delivery was refused), so a sink
	// keeps nothing of a carry but in the carry itself.
	Carry Carry
	// Final asks the sink to deliver now whatever it would otherwise carry
	// on: the partition's oldest record has waited Limits.MaxAge, memory
	// or Limits.MaxOpen calls for it, or the partition must not carry.
	Final bool
}

// First and Last are the sequence numbers of the first and last of
// Records, which is not empty.
func (b *Batch) First() uint64 { return b.Records[0].Seq }
func (b *Batch) Last() uint64  { return b.Records[len(b.Records)-1].Seq }

// Outcome is the result of a send that did not fail as a whole.
type Outcome struct {
	// Rejected are records the destination refused for their content or
	// age; they are dead-lettered with the reason and never sent again.
	// They may be records of Batch.Carry: the drainer reads those back from
	// the WAL to dead-letter them.
	Rejected []Rejection
	// DeleteState are keys of the sink's state to delete in the same
	// transaction that records the batch as delivered (an S3 intent).
	DeleteState [][]byte
	// Carry, when not nil, means nothing was delivered: the sink took the
	// batch's records (and those of Batch.Carry) into what it hands back,
	// to be delivered with a later batch of the partition. The drainer
	// keeps it, counts its memory, and holds the cursor before its records.
	// Rejected and DeleteState must be empty then.
	Carry Carry
}

// Carry is what a sink keeps of a partition's records between sends: the
// S3 sink's object being built, its records already compressed, so that a
// partition's object can outgrow the memory its records would take.
type Carry interface {
	Mem() int // bytes it holds
	// Room is how much (in Size) the next batch may hold: the drainer cuts
	// it within Room and Limits.MaxBytes, and when the next record alone
	// does not fit, it sends the carry alone, as a final batch.
	Room() int
}

// Discarder is a Carry that holds something besides memory (the S3 sink's
// staged file). The drainer calls Discard when it gives the carry up
// without sending it (its records are read again from the WAL: the WAL
// dropped some, or the sink refused a batch it had carried), at most once,
// and never while a send of its partition is in flight.
type Discarder interface {
	Discard()
}

// Overflower is a sink whose partitions the drainer can bound
// (Limits.MaxPartitions): a record whose family would be one more than the
// bound goes to the partition Overflow names instead of its own. A sink's
// Recover routes records as the drainer did with State.Admitted.
type Overflower interface {
	// Family names what the bound counts for r, whose partition is
	// partition: the partition without its time bucket (partition itself
	// when the names use no time), so that a tag's objects of every hour
	// count once and a backlog of many hours read at once does not take
	// the room of as many tags.
	Family(r *Record, partition string) string
	// Overflow names the partition for r when its own is not admitted:
	// the sink's names rendered as for a record without fields.
	Overflow(r *Record) string
	// Explain says, from some of the records that went to the overflow
	// partition, which template and which of its placeholders rendered so
	// many partitions: for the log line that reports it.
	Explain(recs []Record) string
}

// Rejection is one record refused for good.
type Rejection struct {
	Seq    uint64
	Reason string // short, for people and for a metric label: "too_old", "too_large"
}

// State is a sink's small store inside the WAL. Put is durable when it
// returns. Keys are the sink's own; the drainer keeps its keys apart.
type State interface {
	Get(key []byte) ([]byte, error)
	Scan(prefix []byte, fn func(key, value []byte) error) error
	Put(ctx context.Context, key, value []byte) error
	Delete(ctx context.Context, key []byte) error
	// ReadRange returns the records from first to last inclusive that are
	// still in the WAL, that this sink takes (its match globs), that no
	// partition of an earlier configuration delivered (the drainer's
	// batches leave those out, see Repartitioner) and that keep accepts
	// (nil: all): a sink rebuilding a batch after a restart keeps those
	// its Partition puts in the batch's partition. The range is
	// read a piece at a time, so that only the records kept are held: a
	// batch of a quiet partition can span much of the WAL. The record keep
	// sees is valid only during the call.
	ReadRange(first, last uint64, keep func(*Record) bool) ([]Record, error)
	// ReadRangeAll is ReadRange whatever the sink's match globs: a batch
	// built under other globs (the configuration changed since) is
	// rebuilt by applying those in keep.
	ReadRangeAll(first, last uint64, keep func(*Record) bool) ([]Record, error)
	// Delivered records, durably, that partition has delivered every record
	// up to last, and deletes keys of the sink's state in the same
	// transaction. Recover uses it for work a crash left half done.
	Delivered(ctx context.Context, partition string, last uint64, deleteKeys [][]byte) error
	// Admitted reports whether the drainer routes the record seq, whose
	// family (Overflower.Family) is family, to its own partition; false: to
	// the sink's Overflow partition (Limits.MaxPartitions was reached when
	// it was read). Always true for a sink without a bound.
	Admitted(family string, seq uint64) bool
	// Partitioning is the description (Repartitioner.Partitioning) of
	// how the records before this start were routed, nil when not known.
	// In Recover it may differ from the sink's: the configuration changed
	// since, and Recover routes the records of its work as they were
	// routed then (Repartitioner.Router).
	Partitioning() []byte
}

// Repartitioner is a sink that can route records as an earlier
// configuration of it did. The drainer stores Partitioning beside the
// delivered marks; after a change of partitioning (a key or name template,
// the host name) it keeps the earlier marks and reads them through Router,
// so that records a partition delivered before the change are not sent
// again under the new names.
type Repartitioner interface {
	// Partitioning describes how the sink partitions records: what its
	// Fingerprint is made of, in a form Router reads.
	Partitioning() []byte
	// Router returns the partition a sink of partitioning desc gave a
	// record, its overflow through st.Admitted included: what Partition
	// and the drainer's bound gave it then.
	Router(desc []byte, st State) (func(*Record) string, error)
}

// Recoverer is a sink with work a crash can leave half done (an S3 upload
// whose intent is committed). The drainer calls Recover once, before it
// reads any record.
type Recoverer interface {
	Recover(ctx context.Context, st State) error
}
