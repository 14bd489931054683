package queue

import (
	"context"
	"encoding/binary"

	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// Keys of a sink's state bucket in the WAL. The drainer and the sink share
// the bucket, apart by prefix:
//
//	m/<partition>   uint64: the partition delivered every record up to this
//	fingerprint     how the sink partitioned records when the marks were written
//	d/<uint64 seq>  a dead letter, JSON (see DeadLetter)
//	s/<sink key>    the sink's own state (sinks.State)
const (
	keyFingerprint = "fingerprint"
	prefixMark     = "m/"
	prefixDead     = "d/"
	prefixState    = "s/"
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
}

var _ sinks.State = (*sinkState)(nil)

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

func (s *sinkState) ReadRange(first, last uint64) ([]sinks.Record, error) {
	recs, err := s.w.ReadRange(first, last)
	if err != nil {
		return nil, err
	}
	kept := recs[:0]
	for _, r := range recs {
		if s.match == nil || s.match(r.Tag) {
			kept = append(kept, r)
		}
	}
	return toSinkRecords(kept), nil
}

func (s *sinkState) Delivered(ctx context.Context, partition string, last uint64, deleteKeys [][]byte) error {
	var b wal.Batch
	b.Put(s.name, markKey(partition), u64(last))
	for _, k := range deleteKeys {
		b.Delete(s.name, stateKey(k))
	}
	return s.w.Commit(ctx, &b)
}

func toSinkRecords(recs []wal.Record) []sinks.Record {
	out := make([]sinks.Record, len(recs))
	for i, r := range recs {
		out[i] = sinks.Record{Seq: r.Seq, Time: r.Time, Tag: r.Tag, Body: r.Body}
	}
	return out
}
