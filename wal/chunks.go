package wal

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Chunk ids make a client's re-send harmless. bucketChunks maps an id to
// [8 unix nanos][8 first seq][8 last seq][digest, 0 to 32 bytes];
// bucketChunkTimes indexes the same ids by [8 unix nanos][id] so expiry
// reads them oldest first. Values written before digests were stored are
// the first 24 bytes alone, which is a value without a digest.

// chunkHead is the length of a chunk value without its digest.
const chunkHead = 24

// storedChunk is what the WAL knows of a chunk id: where its records are,
// and the digest of the request it was stored for (nil: none).
type storedChunk struct {
	Result
	digest []byte
}

// answer is the answer to r, which has a chunk id already stored as c: a
// duplicate, acknowledged as the first copy was, or, when both carry a
// digest and they differ, ErrChunkConflict.
func (c storedChunk) answer(r *appendReq) appendResult {
	if len(c.digest) > 0 && len(r.digest) > 0 && !bytes.Equal(c.digest, r.digest) {
		return appendResult{err: fmt.Errorf("%w: %q, within the dedup window", ErrChunkConflict, r.chunk)}
	}
	res := c.Result
	res.Duplicate = true
	return appendResult{Result: res}
}

func lookupChunk(b *bolt.Bucket, id string, now time.Time, window time.Duration) (storedChunk, bool) {
	v := b.Get([]byte(id))
	if len(v) < chunkHead {
		return storedChunk{}, false
	}
	at := int64(binary.BigEndian.Uint64(v[0:8]))
	if now.UnixNano()-at > int64(window) {
		return storedChunk{}, false
	}
	return storedChunk{
		Result: Result{First: binary.BigEndian.Uint64(v[8:16]), Last: binary.BigEndian.Uint64(v[16:24])},
		digest: bytes.Clone(v[chunkHead:]), // v is valid only in the transaction
	}, true
}

func storeChunk(tx *bolt.Tx, id string, digest []byte, now time.Time, res Result) error {
	v := make([]byte, chunkHead, chunkHead+len(digest))
	binary.BigEndian.PutUint64(v[0:8], uint64(now.UnixNano()))
	binary.BigEndian.PutUint64(v[8:16], res.First)
	binary.BigEndian.PutUint64(v[16:24], res.Last)
	v = append(v, digest...)
	if err := tx.Bucket(bucketChunks).Put([]byte(id), v); err != nil {
		return err
	}
	return tx.Bucket(bucketChunkTimes).Put(append(v[0:8:8], id...), nil)
}

// expireChunks forgets ids older than the dedup window, a bounded number per
// transaction.
func (wr *writer) expireChunks(tx *bolt.Tx) error {
	cutoff := uint64(time.Now().Add(-wr.w.opts.DedupWindow).UnixNano())
	times, chunks := tx.Bucket(bucketChunkTimes), tx.Bucket(bucketChunks)
	var keys [][]byte
	c := times.Cursor()
	for k, _ := c.First(); k != nil && len(k) >= 8 && binary.BigEndian.Uint64(k[:8]) < cutoff; k, _ = c.Next() {
		if len(keys) == wr.deleteLimit {
			wr.moreWork = true
			break
		}
		keys = append(keys, append([]byte(nil), k...))
	}
	if len(keys) > 0 {
		wr.dirty = true
		wr.txDeleted += len(keys)
	}
	for _, k := range keys {
		id := k[8:]
		// The id may have been stored again since; only forget this one.
		if v := chunks.Get(id); len(v) >= chunkHead && string(v[0:8]) == string(k[0:8]) {
			if err := chunks.Delete(id); err != nil {
				return err
			}
		}
		if err := times.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// forgetChunks deletes the ids whose records are among first to last
// (ReplaceDamaged lost them): a client that sends one again within the
// dedup window has it stored, not acknowledged as a duplicate of what is
// lost.
func forgetChunks(tx *bolt.Tx, first, last uint64) error {
	chunks, times := tx.Bucket(bucketChunks), tx.Bucket(bucketChunkTimes)
	var ids, timeKeys [][]byte
	if err := chunks.ForEach(func(k, v []byte) error {
		if len(v) >= chunkHead && binary.BigEndian.Uint64(v[8:16]) <= last && binary.BigEndian.Uint64(v[16:24]) >= first {
			ids = append(ids, bytes.Clone(k))
			timeKeys = append(timeKeys, append(bytes.Clone(v[0:8]), k...))
		}
		return nil
	}); err != nil {
		return err
	}
	for i := range ids {
		if err := chunks.Delete(ids[i]); err != nil {
			return err
		}
		if err := times.Delete(timeKeys[i]); err != nil {
			return err
		}
	}
	return nil
}
