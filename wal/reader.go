package wal

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"

	bolt "go.etcd.io/bbolt"
)

// Read returns committed records with sequence numbers from `from` on, at
// most maxRecords of them (0: no limit) and stopping after the entry that
// reaches maxBytes of bodies (0: no limit). Records before the oldest live
// one are gone (retention, drop_oldest): reading starts at the oldest live
// one. An empty result means nothing at or after from is committed yet.
// A damaged entry stops the read with a *CorruptionError.
func (w *WAL) Read(from uint64, maxRecords, maxBytes int) ([]Record, error) {
	return w.read(from, maxRecords, maxBytes, nil)
}

// ReadInto is Read decoding into buf's memory (nil: new memory). The
// records, their bodies included, are valid until buf is read into again.
func (w *WAL) ReadInto(from uint64, maxRecords, maxBytes int, buf *ReadBuffer) ([]Record, error) {
	return w.read(from, maxRecords, maxBytes, buf)
}

// A ReadBuffer kept while a reader waits for appends holds at most about
// this many bytes of records and records (see NextInto). A buffer is made
// with room for at least minBufferBytes and minBufferRecords, and grows by
// doubling: the reads of a reader that keeps up with appends vary in size
// with what they find, and a buffer cut to each would be made again for
// the next larger one.
const (
	maxWaitingBuffer  = 2 << 20
	maxWaitingRecords = 16 << 10
	minBufferBytes    = 1 << 20
	minBufferRecords  = 4 << 10
)

// A ReadBuffer is memory that reads decode into again and again (see
// Reader.NextInto and ReadInto): the records of one read and their bytes.
type ReadBuffer struct {
	recs []Record
	raw  []byte
}

// Cap returns how many records and bytes of records b has room for.
func (b *ReadBuffer) Cap() (records, bytes int) { return cap(b.recs), cap(b.raw) }

// Trim lets go of b's memory if it is more than a reader waiting for
// appends keeps (maxWaitingBuffer bytes, maxWaitingRecords records): for a
// buffer kept once its reader has caught up with the appends.
func (b *ReadBuffer) Trim() {
	if cap(b.raw) > maxWaitingBuffer || cap(b.recs) > maxWaitingRecords {
		*b = ReadBuffer{}
	}
}

// read is Read, into buf's memory when buf is not nil.
func (w *WAL) read(from uint64, maxRecords, maxBytes int, buf *ReadBuffer) ([]Record, error) {
	newDecoder := func() *decoder {
		d := &decoder{tags: tagTable{}}
		if buf != nil {
			d.scratch = buf.raw[:0]
		}
		return d
	}
	d := newDecoder()
	out, ok := w.recent.read(from, maxRecords, maxBytes, buf, d)
	var err error
	if !ok {
		d = newDecoder()
		out, err = w.readFile(from, maxRecords, maxBytes, buf, d)
		if len(out) > 0 {
			w.recent.fileReads.Add(1)
		}
	}
	if maxRecords > 0 && len(out) > maxRecords {
		out = out[:maxRecords]
	}
	if buf != nil {
		if cap(out) > cap(buf.recs) {
			buf.recs = out[:0]
		}
		// The next read gets room for as many bytes as this one decoded
		// (entries that passed their checksums: a damaged header does not
		// size it). Reads are alike in a backlog; a buffer much larger than
		// this read needed goes, so that one burst is not held for good.
		// A read that decoded more than the buffer holds (the bodies of
		// a read reach maxBytes, and their records take more) makes one
		// with an eighth more than it decoded: reads of a backlog decode
		// about as much as each other, not exactly.
		buf.raw = d.scratch[:0]
		switch used := d.used; {
		case cap(buf.raw) < used:
			buf.raw = make([]byte, 0, max(used+used/8, min(max(2*cap(buf.raw), minBufferBytes), readRawBound(maxBytes))))
		case used > 0 && cap(buf.raw) > 4*used && cap(buf.raw) > maxWaitingBuffer:
			buf.raw = make([]byte, 0, max(used, minBufferBytes))
		}
	}
	return out, err
}

// sizeRead returns the slice a read of about n records and raw bytes of
// records appends its records to, and gives d room for raw bytes: one
// allocation instead of a slice grown entry by entry, and memory for the
// whole read at once instead of for each entry now and for the next read
// after (buf nil: new memory).
func sizeRead(buf *ReadBuffer, d *decoder, n, raw, maxBytes int) []Record {
	var out []Record
	switch {
	case buf == nil:
		out = make([]Record, 0, n)
	case cap(buf.recs) < n:
		out = make([]Record, 0, max(n, min(2*cap(buf.recs), 2*n), minBufferRecords))
	default:
		out = buf.recs[:0]
	}
	if buf != nil && cap(d.scratch) < raw {
		// The file's headers are not checked yet: a damaged one makes
		// this at most readRawBound; what does not fit is decoded into
		// memory of its own. A buffer past that bound, sized by what a
		// read decoded (read), is not made again smaller.
		if want := min(max(raw, 2*cap(d.scratch), minBufferBytes), readRawBound(maxBytes)); want > cap(d.scratch) {
			d.scratch = make([]byte, 0, want)
		}
	}
	return out
}

// readFile is read from the file, into d's memory.
func (w *WAL) readFile(from uint64, maxRecords, maxBytes int, buf *ReadBuffer, d *decoder) ([]Record, error) {
	var out []Record
	err := w.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketEntries).Cursor()
		k, v := seekEntry(tx, c, from)
		if k != nil && maxRecords > 0 {
			n, raw := readCap(tx.Bucket(bucketEntries).Cursor(), k, from, maxRecords, maxBytes)
			out = sizeRead(buf, d, n, raw, maxBytes)
		}
		size := 0
		for ; k != nil; k, v = c.Next() {
			first := binary.BigEndian.Uint64(k)
			n0 := len(out)
			var err error
			if out, err = decodeEntry(first, v, out, d); err != nil {
				return w.corruptionAt(tx, c, first, v, err)
			}
			// Drop what precedes from in the first entry.
			if skip := int(from) - int(first); skip > 0 && n0 == 0 {
				out = append(out[:0], out[min(skip, len(out)):]...)
			}
			for _, r := range out[n0:] {
				size += len(r.Body)
			}
			if (maxRecords > 0 && len(out) >= maxRecords) || (maxBytes > 0 && size >= maxBytes) {
				break
			}
		}
		return nil
	})
	return out, err
}

// readCap is about how many records Read returns from seq from on, and
// the uncompressed bytes of the entries it decodes for them, where
// the entry at key k holds from: it counts the records of the entries from
// k on in their headers (which Read checks when it decodes each entry) and
// stops where Read does, after the entry that reaches maxRecords or maxBytes.
// Against maxBytes it counts the records' uncompressed length, which exceeds
// their bodies', so it counts one entry more there. An entry counts at most
// maxEntryCap records, so that a damaged header cannot make Read allocate
// much.
func readCap(c *bolt.Cursor, k []byte, from uint64, maxRecords, maxBytes int) (records, raw int) {
	n, more := 0, false
	for k, v := c.Seek(k); k != nil; k, v = c.Next() {
		count, ok := entryCount(v)
		if !ok {
			break
		}
		if first := binary.BigEndian.Uint64(k); first < from {
			count -= int(min(from-first, uint64(count)))
		}
		n += min(count, maxEntryCap)
		raw += int(binary.BigEndian.Uint32(v[6:10]))
		if more || n >= maxRecords {
			break
		}
		more = maxBytes > 0 && raw >= maxBytes
	}
	return min(n, maxRecords+maxEntryCap), raw
}

// readRawBound is the most a read of at most maxBytes (0: no limit)
// sizes its buffer to from entry headers before it checks them: what
// such a read decodes, an entry past maxBytes included.
func readRawBound(maxBytes int) int {
	return max(maxBytes, maxWaitingBuffer) + 2*maxEntryRaw
}

// ReadRange returns the records from first to last inclusive that are
// still stored, all at once: for ranges known to be small. A range that
// may be large is read a piece at a time with ReadInto (as the drainer's
// state store does for a sink rebuilding a batch after a restart).
func (w *WAL) ReadRange(first, last uint64) ([]Record, error) {
	if last < first {
		return nil, nil
	}
	var out []Record
	err := w.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketEntries).Cursor()
		for k, v := seekEntry(tx, c, first); k != nil && binary.BigEndian.Uint64(k) <= last; k, v = c.Next() {
			key := binary.BigEndian.Uint64(k)
			recs, err := decodeEntry(key, v, nil, nil)
			if err != nil {
				return w.corruptionAt(tx, c, key, v, err)
			}
			for _, r := range recs {
				if r.Seq >= first && r.Seq <= last {
					out = append(out, r)
				}
			}
		}
		return nil
	})
	return out, err
}

// seekEntry positions c on the entry holding seq, or on the first entry
// after it. Keys are dense: with an entry after seq, the one before holds
// it, and the last entry holds every record before next_seq, whatever its
// header says (a damaged count must not make a read skip its records:
// decoding it reports the damage).
func seekEntry(tx *bolt.Tx, c *bolt.Cursor, seq uint64) ([]byte, []byte) {
	k, v := c.Seek(seqKey(seq))
	if k != nil && binary.BigEndian.Uint64(k) == seq {
		return k, v
	}
	var pk, pv []byte
	if k == nil {
		pk, pv = c.Last()
	} else {
		pk, pv = c.Prev()
	}
	if pk != nil {
		next := tx.Bucket(bucketMeta).Get(keyNextSeq)
		if k != nil || len(next) == 8 && seq < binary.BigEndian.Uint64(next) {
			return pk, pv
		}
	}
	return c.Seek(seqKey(seq))
}

// corruptionAt is corruption for the entry c is on, its last record
// found from where the next entry begins (or the next sequence number),
// not from its header, which may be what is damaged. It moves c.
func (w *WAL) corruptionAt(tx *bolt.Tx, c *bolt.Cursor, first uint64, v []byte, err error) error {
	ce := w.corruption(first, v, err).(*CorruptionError)
	if nk, _ := c.Next(); nk != nil {
		ce.LastSeq = binary.BigEndian.Uint64(nk) - 1
	} else if next := tx.Bucket(bucketMeta).Get(keyNextSeq); len(next) == 8 {
		ce.LastSeq = binary.BigEndian.Uint64(next) - 1
	}
	return ce
}

func (w *WAL) corruption(first uint64, v []byte, err error) error {
	ce := &CorruptionError{Path: w.path, FirstSeq: first, Offset: -1, Err: err}
	if n, ok := entryCount(v); ok {
		ce.LastSeq = first + uint64(n) - 1
	}
	return ce
}

// Wait blocks until a record with sequence number seq or later is
// committed, ctx ends, or the WAL closes. It never polls: the writer wakes
// it after each commit that adds records.
func (w *WAL) Wait(ctx context.Context, seq uint64) error {
	for {
		w.mu.Lock()
		ready := w.st.nextSeq > seq
		ch := w.notify
		w.mu.Unlock()
		if ready {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-w.done:
			return w.closedErr()
		}
	}
}

// Reader reads forward from a position, waiting for appends when it has
// read everything. A Reader is for one goroutine.
type Reader struct {
	w    *WAL
	next uint64
}

// NewReader returns a Reader whose first record has seq >= from.
func (w *WAL) NewReader(from uint64) *Reader { return &Reader{w: w, next: from} }

// Next returns the next records, at most maxRecords (0: no limit) and
// about maxBytes of bodies (0: no limit), waiting until at least one is
// committed.
func (r *Reader) Next(ctx context.Context, maxRecords, maxBytes int) ([]Record, error) {
	return r.NextInto(ctx, maxRecords, maxBytes, nil)
}

// NextInto is Next decoding into buf's memory (nil: new memory). The
// records, their bodies included, are valid until buf is read into again:
// a caller that keeps records past that copies them.
func (r *Reader) NextInto(ctx context.Context, maxRecords, maxBytes int, buf *ReadBuffer) ([]Record, error) {
	for {
		recs, err := r.ReadInto(maxRecords, maxBytes, buf)
		if err != nil || len(recs) > 0 {
			return recs, err
		}
		if buf != nil {
			// Caught up: the reads to come are of what is appended from
			// now on; a buffer sized for a backlog is not kept while
			// waiting. One the size of such reads is: a reader that keeps
			// up with appends would otherwise decode every read into new
			// memory.
			buf.Trim()
		}
		if err := r.w.Wait(ctx, r.next); err != nil {
			return nil, err
		}
	}
}

// ReadInto is NextInto without the wait: it returns no records when the
// reader has read every committed one.
func (r *Reader) ReadInto(maxRecords, maxBytes int, buf *ReadBuffer) ([]Record, error) {
	recs, err := r.w.read(r.next, maxRecords, maxBytes, buf)
	if err != nil {
		return nil, err
	}
	if len(recs) > 0 {
		r.next = recs[len(recs)-1].Seq + 1
	} else {
		// Nothing from r.next on: what it did not read may have been
		// deleted (drop_oldest, or retention passing a reader no cursor
		// holds back), which leaves a position Wait finds committed.
		r.w.mu.Lock()
		r.next = max(r.next, r.w.st.firstSeq)
		r.w.mu.Unlock()
	}
	return recs, nil
}

// Wait blocks until a record the reader has not read is committed, ctx
// ends, or the WAL closes.
func (r *Reader) Wait(ctx context.Context) error { return r.w.Wait(ctx, r.next) }

// Position is the sequence number the next record returned will have at least.
func (r *Reader) Position() uint64 { return r.next }

// Stats describe the WAL as last committed.
type Stats struct {
	Path      string            `json:"path"`
	FirstSeq  uint64            `json:"first_seq"`  // oldest live record (== NextSeq when empty)
	NextSeq   uint64            `json:"next_seq"`   // sequence number of the next append
	Records   uint64            `json:"records"`    // live records
	Bytes     int64             `json:"live_bytes"` // live entry bytes, what max_bytes bounds
	FileBytes int64             `json:"file_bytes"` // size of the file (high-water: bbolt never shrinks it)
	Cursors   map[string]uint64 `json:"cursors"`
	Dropped   map[string]uint64 `json:"dropped"` // records each cursor lost to drop_oldest
	Commits   uint64            `json:"commits"` // transactions committed since Open
	// CommitSeconds is the time those commits took, writes and fsyncs.
	CommitSeconds float64 `json:"commit_seconds"`
	// DiskFreeBytes is the free space of the file system holding the file
	// (what an unprivileged process may take; -1 when it cannot tell), and
	// FileFreeBytes the pages free inside the file. Appends wait while
	// neither has MinFreeBytes to spare (see DiskFull).
	DiskFreeBytes int64 `json:"disk_free_bytes"`
	FileFreeBytes int64 `json:"file_free_bytes"`
	// MemoryReads and FileReads count the reads since Open that returned
	// records: from the entries committed last, kept uncompressed in
	// memory, or from the file.
	MemoryReads uint64 `json:"memory_reads"`
	FileReads   uint64 `json:"file_reads"`
	// DamagedRecords counts the records of damaged entries replaced by
	// placeholders since Open (ReplaceDamaged): records lost (not those
	// of an entry written again from memory).
	DamagedRecords uint64 `json:"damaged_records"`
}

// Stats returns the committed state; it does not touch the disk but for the file size.
func (w *WAL) Stats() Stats {
	st := w.snapshot()
	s := Stats{Path: w.path, FirstSeq: st.firstSeq, NextSeq: st.nextSeq, Records: st.nextSeq - st.firstSeq,
		Bytes: st.liveBytes, Cursors: st.cursors, Dropped: st.dropped, Commits: w.commits.Load(), CommitSeconds: float64(w.commitNanos.Load()) / 1e9, DamagedRecords: w.damaged.Load(),
		MemoryReads: w.recent.memoryReads.Load(), FileReads: w.recent.fileReads.Load()}
	_ = w.view(func(tx *bolt.Tx) error {
		s.FileBytes = tx.Size()
		return nil
	})
	disk, file, ok := w.space()
	if !ok {
		disk = -1
	}
	s.DiskFreeBytes, s.FileFreeBytes = disk, file
	return s
}

// Cursor returns cursor name's committed position.
func (w *WAL) Cursor(name string) (uint64, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	pos, ok := w.st.cursors[name]
	return pos, ok
}

// State returns a copy of key in sink's state bucket, or nil.
func (w *WAL) State(sink string, key []byte) ([]byte, error) {
	var out []byte
	err := w.view(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketState).Bucket([]byte(sink)); b != nil {
			if v := b.Get(key); v != nil {
				out = append([]byte{}, v...)
			}
		}
		return nil
	})
	return out, err
}

// ScanState calls fn for each key of sink's state bucket that starts with
// prefix, in key order, inside one read transaction. k and v are valid only
// during the call, and fn must not call the WAL: a read or write from
// inside can deadlock with the writer growing the file.
func (w *WAL) ScanState(sink string, prefix []byte, fn func(k, v []byte) error) error {
	return w.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketState).Bucket([]byte(sink))
		if b == nil {
			return nil
		}
		c := b.Cursor()
		for k, v := c.Seek(prefix); k != nil && len(k) >= len(prefix) && string(k[:len(prefix)]) == string(prefix); k, v = c.Next() {
			if err := fn(k, v); err != nil {
				return err
			}
		}
		return nil
	})
}

// VerifyReport is what Verify found.
type VerifyReport struct {
	Entries  int
	Records  uint64
	Problems []error // each a *CorruptionError or a bbolt consistency error
}

// Verify reads every entry and checks its checksum and framing, and that
// sequence numbers are dense. On a WAL opened read-only it also runs bbolt's
// page consistency check, which is not safe while a writer commits.
func (w *WAL) Verify() VerifyReport {
	var rep VerifyReport
	damaged, fileErr := checkFile(w.path)
	if fileErr != nil {
		rep.Problems = append(rep.Problems, fileErr)
	} else if damaged != nil {
		rep.Problems = append(rep.Problems, damaged)
	}
	// bbolt's check runs in a goroutine of its own, where a damaged page's
	// panic cannot be caught: the freelist is checked (checkFile) and every
	// page walked here first, and the check runs only on a file whose
	// pages all read.
	walked := w.walkPages()
	if walked != nil {
		rep.Problems = append(rep.Problems, walked)
	}
	err := w.view(func(tx *bolt.Tx) error {
		if w.opts.ReadOnly && walked == nil && fileErr == nil {
			for err := range tx.Check() {
				rep.Problems = append(rep.Problems, fmt.Errorf("bbolt consistency check of %s: %w", w.path, err))
			}
		}
		c := tx.Bucket(bucketEntries).Cursor()
		var expect uint64
		for k, v := c.First(); k != nil; k, v = c.Next() {
			first := binary.BigEndian.Uint64(k)
			rep.Entries++
			if expect != 0 && first != expect {
				rep.Problems = append(rep.Problems, &CorruptionError{Path: w.path, FirstSeq: first, Offset: -1,
					Err: fmt.Errorf("gap: expected an entry starting at record %d", expect)})
			}
			recs, err := decodeEntry(first, v, nil, nil)
			if err != nil {
				rep.Problems = append(rep.Problems, w.corruption(first, v, err))
				n, ok := entryCount(v)
				if !ok {
					expect = 0
					continue
				}
				expect = first + uint64(n)
				continue
			}
			rep.Records += uint64(len(recs))
			expect = first + uint64(len(recs))
		}
		return nil
	})
	if err != nil {
		rep.Problems = append(rep.Problems, err)
	}
	return rep
}

// walkPages reads every key of every bucket, which reads every page of the
// file's trees, and returns the *CorruptionError of the first page bbolt
// cannot read, naming the bucket it belongs to, or nil.
func (w *WAL) walkPages() error {
	where := ""
	err := w.view(func(tx *bolt.Tx) error {
		var walk func(path string, b *bolt.Bucket)
		walk = func(path string, b *bolt.Bucket) {
			where = path
			c := b.Cursor()
			for k, v := c.First(); k != nil; k, v = c.Next() {
				if v == nil {
					if child := b.Bucket(k); child != nil {
						walk(path+"/"+string(k), child)
						where = path
					}
				}
			}
		}
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			walk(string(name), b)
			return nil
		})
	})
	if ce, ok := err.(*CorruptionError); ok && where != "" {
		ce.Err = fmt.Errorf("in %s: %w", bucketMeaning(where), ce.Err)
	}
	return err
}

// bucketMeaning says what the bucket at path (its names from the root,
// "/" between them) holds.
func bucketMeaning(path string) string {
	top, sub, _ := strings.Cut(path, "/")
	switch top {
	case string(bucketEntries):
		return "the records (bucket entries)"
	case string(bucketState):
		if sub != "" {
			return fmt.Sprintf("sink %q's state: intents, delivered marks, dead letters (bucket %s)", sub, path)
		}
		return "the sinks' state (bucket state)"
	case string(bucketCursors):
		return "the sinks' cursors (bucket cursors)"
	case string(bucketChunks), string(bucketChunkTimes):
		return "the chunk ids that dedup retries (bucket " + path + ")"
	}
	return "bucket " + path
}
