package wal

import (
	"slices"
	"sort"
	"sync"
	"unsafe"
)

// DefaultReadCacheBytes bounds the memory of a WAL's entryCache when
// Options.ReadCacheBytes is 0.
const DefaultReadCacheBytes = 8 << 20

// entryCache holds the records of the entries reads decoded last, for the
// other readers of the same entries: every sink's drainer reads every
// record, the drainers read the same entries close together in time, and
// decoding them (s2, then parsing the records) is most of what a read
// costs.
//
// An entry is cached only after its checksum matched, and a read uses it
// only for a stored value of the same key and header (which holds the
// checksum) whose checksum matches again: a read checks every entry it
// returns records of, cached or not, as doc.go promises. Entries are never
// rewritten under their key (sequence numbers are not reused), so a value
// that passes is the one the cached records were decoded from.
//
// A read copies a cached entry's bytes into its own buffer, under the
// lock, so records returned are the caller's (valid until the buffer is
// read into again, as before), and the cache holds no more than
// its bound however long callers keep what they read; the memory of
// an entry it evicts holds the next one it caches, so that caching does
// not allocate. It keeps the entries of the highest sequence numbers: the
// drainers follow the appends, and one far behind the other does not evict
// what the one in front will read next.
type entryCache struct {
	mu      sync.Mutex
	max     int
	size    int
	entries []*cachedEntry // by first, ascending
	free    []*cachedEntry // evicted: memory for the next put
}

// cachedEntry is an entry's decoded records.
type cachedEntry struct {
	first  uint64
	header [entryHeaderLen]byte
	raw    []byte // the decoded payload
	recs   []cachedRecord
}

// size is what e counts towards the cache's bound.
func (e *cachedEntry) size() int {
	return cap(e.raw) + cap(e.recs)*int(unsafe.Sizeof(cachedRecord{})) + int(unsafe.Sizeof(*e))
}

// cachedRecord is a record of a cachedEntry, its body at raw[off:off+n].
type cachedRecord struct {
	time int64
	tag  string
	off  uint32
	n    uint32
}

// maxFreeEntries bounds the evicted entries kept for their memory.
const maxFreeEntries = 2

// find returns the index of the cached entry of key first, or -1.
func (c *entryCache) find(first uint64) int {
	i := sort.Search(len(c.entries), func(i int) bool { return c.entries[i].first >= first })
	if i < len(c.entries) && c.entries[i].first == first {
		return i
	}
	return -1
}

// appendTo appends the records of the entry of key first to dst, their
// bytes copied into d's memory, if it is cached with header header.
func (c *entryCache) appendTo(first uint64, header []byte, dst []Record, d *decoder) ([]Record, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := c.find(first)
	if i < 0 || string(c.entries[i].header[:]) != string(header) {
		return dst, false
	}
	e := c.entries[i]
	raw := d.alloc(len(e.raw))
	copy(raw, e.raw)
	dst = slices.Grow(dst, len(e.recs))
	seq := e.first
	for i := range e.recs {
		cr := &e.recs[i]
		end := cr.off + cr.n
		dst = append(dst, Record{Seq: seq, Time: cr.time, Tag: cr.tag, Body: raw[cr.off:end:end]})
		seq++
	}
	return dst, true
}

// put caches what decodeRaw returned for the value at key first: recs,
// whose bodies point into raw. It evicts the entries of the lowest keys to
// make room, and caches nothing when first would be the lowest key or the
// entry would take more than an eighth of the bound.
func (c *entryCache) put(first uint64, value, raw []byte, recs []Record) {
	if len(raw)+len(recs)*int(unsafe.Sizeof(cachedRecord{})) > c.max/8 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	i := sort.Search(len(c.entries), func(i int) bool { return c.entries[i].first >= first })
	if i < len(c.entries) && c.entries[i].first == first {
		return // another read cached it
	}
	if i == 0 && len(c.entries) > 0 && c.size+len(raw) > c.max {
		return // it would be the first to go
	}
	var e *cachedEntry
	if n := len(c.free); n > 0 {
		e, c.free[n-1] = c.free[n-1], nil
		c.free = c.free[:n-1]
	} else {
		e = new(cachedEntry)
	}
	e.first = first
	copy(e.header[:], value)
	e.raw = append(e.raw[:0], raw...)
	e.recs = slices.Grow(e.recs[:0], len(recs))[:len(recs)]
	base := uintptr(unsafe.Pointer(unsafe.SliceData(raw)))
	for j := range recs {
		r := &recs[j]
		off := 0
		if len(r.Body) > 0 {
			off = int(uintptr(unsafe.Pointer(unsafe.SliceData(r.Body))) - base)
			if off < 0 || off+len(r.Body) > len(raw) {
				c.release(e)
				return // not a body of raw: not cached
			}
		}
		e.recs[j] = cachedRecord{time: r.Time, tag: r.Tag, off: uint32(off), n: uint32(len(r.Body))}
	}
	for c.size+e.size() > c.max && i > 0 {
		c.size -= c.entries[0].size()
		c.release(c.entries[0])
		c.entries[0] = nil
		c.entries = c.entries[1:]
		i--
	}
	if c.size+e.size() > c.max {
		c.release(e)
		return
	}
	c.entries = slices.Insert(c.entries, i, e)
	c.size += e.size()
}

// release keeps an entry no longer cached for its memory, up to
// maxFreeEntries of them.
func (c *entryCache) release(e *cachedEntry) {
	if len(c.free) < maxFreeEntries {
		clear(e.recs) // its tags
		c.free = append(c.free, e)
	}
}

// decode is decodeEntry for a read (d is not nil) through the cache: the
// records of a cached entry whose stored value checks, or else decoded and
// cached. A nil cache decodes.
func (c *entryCache) decode(first uint64, value []byte, dst []Record, d *decoder) ([]Record, error) {
	if c == nil {
		return decodeEntry(first, value, dst, d)
	}
	count, rawLen, payload, err := checkEntry(first, value)
	if err != nil {
		return dst, err
	}
	if out, ok := c.appendTo(first, value[:entryHeaderLen], dst, d); ok {
		return out, nil
	}
	n0 := len(dst)
	out, raw, err := decodeChecked(first, value[1], count, rawLen, payload, dst, d)
	if err != nil {
		return dst[:n0], err
	}
	c.put(first, value, raw, out[n0:])
	return out, nil
}

// shareReads turns the cache on while st has cursors of more than one sink
// (each reads every entry), and off, emptied, otherwise.
func (w *WAL) shareReads(st state) {
	if shared := len(st.cursors) > 1 && w.cache.max > 0; w.shared.Swap(shared) && !shared {
		w.cache.clear()
	}
}

// clear empties the cache.
func (c *entryCache) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries, c.free, c.size = nil, nil, 0
}

// readCache is the cache reads use now, or nil.
func (w *WAL) readCache() *entryCache {
	if w.shared.Load() {
		return &w.cache
	}
	return nil
}
