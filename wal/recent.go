package wal

import (
	"sort"
	"sync"
	"sync/atomic"
)

const (
	// recentCap bounds the buffers recent holds: about 58 whole entries of
	// log records (keptBufCap each), 11,000 records of 250 bytes, what a
	// few commits store under load. A sink that keeps up with appends reads a commit or two behind.
	recentCap = 4 << 20
	// recentMaxEntries bounds its entries (small appends make small ones).
	recentMaxEntries = 4096
	// inflightCap bounds the buffers that entries hold on their way from
	// Append to their commit; an entry made while it is taken holds none,
	// and the entries committed before it leave recent.
	inflightCap = 4 << 20
	// keptBufCap is the size of the pooled buffers entries are kept in: a
	// whole entry of log records (maxEntryRaw and its last record). A
	// smaller entry (a small append's) is kept in a buffer of its size, a
	// larger one (ending in a large record) too, up to maxKeptRaw; one
	// larger than that is not kept.
	keptBufCap   = maxEntryRaw + 16<<10
	smallKeptRaw = 8 << 10
	maxKeptRaw   = 256 << 10
)

// keptPool holds the buffers of keptBufCap that entries are kept in.
var keptPool = sync.Pool{New: func() any { b := make([]byte, 0, keptBufCap); return &b }}

// putKept returns the buffer of an entry that leaves, to keptPool if it
// came from there.
func putKept(bp *[]byte) {
	if cap(*bp) == keptBufCap {
		*bp = (*bp)[:0]
		keptPool.Put(bp)
	}
}

// recent holds the uncompressed records of the entries committed last:
// a reader that keeps up with appends (a sink's head reader) copies them
// from here instead of reading the file, checking its checksum and
// decompressing it, which every sink otherwise does for every record a
// moment after Append had them uncompressed. It holds one run of
// consecutive entries that ends at the last one committed (an entry
// committed without its buffer empties it); reads of what it does not
// hold go to the file. It gets an entry only once the entry's transaction
// committed, and lets go of the entries that retention or drop_oldest
// deleted when that deletion commits.
type recent struct {
	inflight atomic.Int64 // cap of the buffers entries hold before their commit

	mu    sync.RWMutex
	ents  []recentEntry // from head on, oldest first
	head  int
	bytes int // cap of the buffers held

	memoryReads, fileReads atomic.Uint64
}

type recentEntry struct {
	first uint64
	count int
	raw   *[]byte // a copy of the records (keep); to keptPool when it leaves
}

func (e *recentEntry) end() uint64 { return e.first + uint64(e.count) }

// keep returns a copy of raw, the uncompressed records of an entry being
// made, for the entry to hold until its commit, and counts it; nil when
// there is no room for it.
func (r *recent) keep(raw []byte) *[]byte {
	if r == nil || len(raw) > maxKeptRaw {
		return nil
	}
	size := len(raw)
	if size > smallKeptRaw && size <= keptBufCap {
		size = keptBufCap
	}
	if r.inflight.Add(int64(size)) > inflightCap {
		r.inflight.Add(-int64(size))
		return nil
	}
	var bp *[]byte
	if size == keptBufCap {
		bp = keptPool.Get().(*[]byte)
	} else {
		b := make([]byte, 0, size)
		bp = &b
	}
	*bp = append((*bp)[:0], raw...)
	return bp
}

// release returns the buffer of an entry that will not reach recent.
func (r *recent) release(raw *[]byte) {
	r.inflight.Add(-int64(cap(*raw)))
	putKept(raw)
}

// releaseAll releases the buffers the entries of req still hold: the
// writer did not store them.
func (r *recent) releaseAll(req *appendReq) {
	for i := range req.entries {
		if e := &req.entries[i]; e.raw != nil {
			r.release(e.raw)
			e.raw = nil
		}
	}
}

// committed takes the entries a transaction stored, in order (fresh: the
// transaction stored an entry without its buffer before them, or dropped
// some, so that they do not follow what recent holds), and lets go of
// the entries before firstSeq, the oldest live record.
func (r *recent) committed(ents []recentEntry, fresh bool, firstSeq uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := len(r.ents); fresh || len(ents) > 0 && n > r.head && r.ents[n-1].end() != ents[0].first {
		r.evict(n - r.head)
	}
	for _, e := range ents {
		r.inflight.Add(-int64(cap(*e.raw)))
		r.bytes += cap(*e.raw)
		r.ents = append(r.ents, e)
	}
	drop := 0
	for i := r.head; i < len(r.ents) && (r.bytes > recentCap || len(r.ents)-i > recentMaxEntries || r.ents[i].end() <= firstSeq); i++ {
		r.bytes -= cap(*r.ents[i].raw)
		drop++
	}
	r.evict(drop)
}

// evict lets go of the n oldest entries; r.mu is held.
func (r *recent) evict(n int) {
	for i := r.head; i < r.head+n; i++ {
		if i < len(r.ents) {
			putKept(r.ents[i].raw)
			r.ents[i] = recentEntry{}
		}
	}
	r.head += n
	if r.head >= len(r.ents) {
		r.ents, r.head, r.bytes = r.ents[:0], 0, 0
	} else if r.head > len(r.ents)/2 && r.head > 64 {
		k := copy(r.ents, r.ents[r.head:])
		clear(r.ents[k:])
		r.ents, r.head = r.ents[:k], 0
	}
}

// read is WAL.read from memory: it returns ok false, having done nothing,
// when recent does not hold the record at from. The records it returns
// are copies, in d's memory.
func (r *recent) read(from uint64, maxRecords, maxBytes int, buf *ReadBuffer, d *decoder) (out []Record, ok bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	ents := r.ents[r.head:]
	if len(ents) == 0 || from < ents[0].first || from >= ents[len(ents)-1].end() {
		return nil, false
	}
	i := sort.Search(len(ents), func(i int) bool { return ents[i].end() > from })
	ents = ents[i:]
	// Room first, as the file's reads size it (readCap): the records of
	// the entries up to the one whose uncompressed bytes reach maxBytes
	// (which exceed its bodies), and one more.
	n, raw, more := 0, 0, false
	for j := range ents {
		e := &ents[j]
		n += e.count - int(from-min(from, e.first))
		raw += len(*e.raw)
		if more || maxRecords > 0 && n >= maxRecords {
			break
		}
		more = maxBytes > 0 && raw >= maxBytes
	}
	if maxRecords > 0 {
		n = min(n, maxRecords+maxEntryCap)
	}
	out = sizeRead(buf, d, n, raw, maxBytes)
	size := 0
	for j := range ents {
		e := &ents[j]
		b := d.alloc(len(*e.raw))
		copy(b, *e.raw)
		n0 := len(out)
		var err error
		if out, err = parseEntry(e.first, b, e.count, out, d); err != nil {
			// Made by this process and never on the disk: not reached.
			return nil, false
		}
		if skip := int(from) - int(e.first); skip > 0 && n0 == 0 {
			out = append(out[:0], out[min(skip, len(out)):]...)
		}
		for _, rec := range out[n0:] {
			size += len(rec.Body)
		}
		if (maxRecords > 0 && len(out) >= maxRecords) || (maxBytes > 0 && size >= maxBytes) {
			break
		}
	}
	r.memoryReads.Add(1)
	return out, true
}
