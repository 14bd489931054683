package queue

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// Keys of a sink's state bucket in the WAL (doc.go, State keys).
const (
	keyFingerprint     = "fingerprint"
	keyPartitioning    = "partitioning"
	keyOldPartitioning = "old_partitioning"
	keyMatch           = "match"
	keyOldMatch        = "old_match"
	prefixMark         = "m/"
	prefixOldMark      = "o/"
	prefixDead         = "d/"
	prefixState        = "s/"
)

func markKey(partition string) []byte { return []byte(prefixMark + partition) }

func deadKey(seq uint64) []byte {
	k := make([]byte, len(prefixDead)+8)
	copy(k, prefixDead)
	binary.BigEndian.PutUint64(k[len(prefixDead):], seq)
	return k
}

func stateKey(k []byte) []byte { return append([]byte(prefixState), k...) }

func u64(v uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, v)
	return b
}

// sinkState is the sinks.State a sink gets: its keys, under prefixState,
// in its sink's bucket of the WAL.
type sinkState struct {
	w     *wal.WAL
	name  string
	match func(tag string) bool // nil: every tag
	// guard routes records beyond max_partitions (guard.go); nil: no
	// bound. The loop changes it; Admitted reads it from the sink's
	// Recover and sends (guard.mu).
	guard *guard
	// partitioning is the description of how the records before this
	// start were routed (Partitioning), until the drainer stores the
	// sink's own after Recover.
	partitioning []byte
	// old are the marks of earlier configurations: ReadRange leaves out
	// the records they delivered, as the loop's batches did. Nil: none.
	old *oldMarks
	// replaceDamaged stands in for wal.ReplaceDamaged in tests; nil: the
	// WAL's.
	replaceDamaged func(ctx context.Context, first uint64) (uint64, error)
}

func (s *sinkState) replace(ctx context.Context, first uint64) (uint64, error) {
	if s.replaceDamaged != nil {
		return s.replaceDamaged(ctx, first)
	}
	return s.w.ReplaceDamaged(ctx, first)
}

var _ sinks.State = (*sinkState)(nil)

func (s *sinkState) Partitioning() []byte { return s.partitioning }

func (s *sinkState) Get(key []byte) ([]byte, error) { return s.w.State(s.name, stateKey(key)) }

// Scan copies the pairs out before calling fn, so that fn may read or
// write the WAL (ReadRange, Delivered): inside a read transaction that
// could wait on a writer that waits on it.
func (s *sinkState) Scan(prefix []byte, fn func(key, value []byte) error) error {
	var kvs [][2][]byte
	if err := s.w.ScanState(s.name, stateKey(prefix), func(k, v []byte) error {
		kvs = append(kvs, [2][]byte{append([]byte(nil), k[len(prefixState):]...), append([]byte(nil), v...)})
		return nil
	}); err != nil {
		return err
	}
	for _, kv := range kvs {
		if err := fn(kv[0], kv[1]); err != nil {
			return err
		}
	}
	return nil
}

func (s *sinkState) Put(ctx context.Context, key, value []byte) error {
	var b wal.Batch
	b.Put(s.name, stateKey(key), value)
	return s.w.Commit(ctx, &b)
}

func (s *sinkState) Delete(ctx context.Context, key []byte) error {
	var b wal.Batch
	b.Delete(s.name, stateKey(key))
	return s.w.Commit(ctx, &b)
}

// ReadRange decodes at most rangeReadRecords records and about
// rangeReadBytes of bodies at a time.
const (
	rangeReadRecords = 10_000
	rangeReadBytes   = 4 << 20
)

func (s *sinkState) ReadRange(first, last uint64, keep func(*sinks.Record) bool) ([]sinks.Record, error) {
	return s.readRange(first, last, s.match, keep)
}

func (s *sinkState) ReadRangeAll(first, last uint64, keep func(*sinks.Record) bool) ([]sinks.Record, error) {
	return s.readRange(first, last, nil, keep)
}

// readRange is ReadRange with the records of tags match (nil: every tag) takes.
func (s *sinkState) readRange(first, last uint64, match func(string) bool, keep func(*sinks.Record) bool) ([]sinks.Record, error) {
	var (
		out  []sinks.Record
		kept []int // records of the piece that are kept
	)
	buf := rangeBuffers.Get().(*wal.ReadBuffer)
	defer rangeBuffers.Put(buf)
	var (
		repaired uint64
		noSpace  error // the replacement of a damaged entry found the disk full
	)
	replace := func(ctx context.Context, seq uint64) (uint64, error) {
		last, err := s.replace(ctx, seq)
		if errors.Is(err, wal.ErrNoSpace) {
			noSpace = err
		}
		return last, err
	}
	for next := first; next <= last; {
		recs, err := s.w.ReadInto(next, rangeReadRecords, rangeReadBytes, buf)
		if err != nil && repairWith(context.Background(), replace, err, &repaired, 0) {
			continue
		}
		if err != nil && noSpace != nil {
			// Returned as a full disk, which the drainer waits out (the
			// sink tries again, and the replacement with it), rather than
			// as damage, which stops the sink.
			return nil, fmt.Errorf("%w; replacing the damaged entry: %w", err, noSpace)
		}
		if err != nil {
			return nil, err
		}
		if len(recs) == 0 {
			break
		}
		kept = kept[:0]
		need := 0
		for i := range recs {
			r := &recs[i]
			if r.Seq > last {
				next = last + 1
				break
			}
			next = r.Seq + 1
			if r.Tag == wal.DamagedTag || match != nil && !match(r.Tag) {
				continue
			}
			rec := sinks.Record{Seq: r.Seq, Time: r.Time, Tag: r.Tag, Body: r.Body}
			if s.old != nil && s.old.deliveredLocked(&rec) {
				continue // delivered before the configuration changed
			}
			if keep == nil || keep(&rec) {
				kept = append(kept, i)
				need += len(r.Body)
			}
		}
		// The bodies kept go into one buffer of their own: the read buffer
		// is read into again.
		arena := make([]byte, 0, need)
		for _, i := range kept {
			r := &recs[i]
			start := len(arena)
			arena = append(arena, r.Body...)
			out = append(out, sinks.Record{Seq: r.Seq, Time: r.Time, Tag: r.Tag, Body: arena[start:len(arena):len(arena)]})
		}
	}
	return out, nil
}

func (s *sinkState) Admitted(family string, seq uint64) bool {
	return s.guard == nil || s.guard.admitted(family, seq)
}

func (s *sinkState) Delivered(ctx context.Context, partition string, last uint64, deleteKeys [][]byte) error {
	var b wal.Batch
	b.Put(s.name, markKey(partition), u64(last))
	for _, k := range deleteKeys {
		b.Delete(s.name, stateKey(k))
	}
	return s.w.Commit(ctx, &b)
}
