package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/klauspost/compress/s2"
)

// Record is one log record as stored in the WAL.
type Record struct {
	Seq  uint64 // dense and monotonic, assigned by Append; ignored on input
	Time int64  // event time, nanoseconds since the Unix epoch (UTC)
	Tag  string // routing tag
	Body []byte // one compact JSON object
}

// Entry value layout (all integers big-endian), see doc.go:
//
//	[0]      format version (1)
//	[1]      codec: 0 none, 1 s2 block
//	[2:6]    record count
//	[6:10]   uncompressed payload length
//	[10:14]  CRC32C of payload || key || value[0:10]
//	[14:]    payload, compressed with the codec
const (
	entryVersion   = 1
	codecNone      = 0
	codecS2        = 1
	entryHeaderLen = 14

	// maxEntryRaw is where Append starts a new entry. s2 compresses blocks
	// of this size about 1.6 times faster than multi-megabyte ones (smaller
	// hash tables stay in cache) for a few percent less compression, and a
	// re-read of a small range decodes little. Each entry costs one key.
	maxEntryRaw = 56 << 10
	// maxEntryCap bounds the records of an entry Append writes: it counts
	// at least 2*binary.MaxVarintLen64 bytes for each towards maxEntryRaw.
	maxEntryCap = maxEntryRaw/(2*binary.MaxVarintLen64) + 1
	// maxRawLen bounds what a damaged header can make a reader allocate.
	maxRawLen = 1 << 30
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// entry is a batch of records encoded and compressed by the appending
// goroutine, so the writer only adds the key and finishes the checksum.
type entry struct {
	count int
	value []byte  // header (checksum unset) + stored payload
	crc   uint32  // CRC32C of the stored payload
	raw   *[]byte // the records uncompressed, kept for recent; nil: not kept
}

var rawPool = sync.Pool{New: func() any { b := make([]byte, 0, maxEntryRaw+64<<10); return &b }}

// encodeEntries turns records into entries of about maxEntryRaw
// uncompressed bytes each. A large append's entries are compressed in
// parallel, on as many cores as there are. Entries keep their
// uncompressed records for keep's recent entries while it has room
// (keep nil: none).
func encodeEntries(recs []Record, keep *recent) []entry {
	// Cut points first, from sizes alone.
	var cuts []int // end index (exclusive) of each entry's records
	size := 0
	for i := range recs {
		size += len(recs[i].Body) + len(recs[i].Tag) + 2*binary.MaxVarintLen64
		if size >= maxEntryRaw || i == len(recs)-1 {
			cuts = append(cuts, i+1)
			size = 0
		}
	}
	out := make([]entry, len(cuts))
	encode := func(j int) {
		start := 0
		if j > 0 {
			start = cuts[j-1]
		}
		bp := rawPool.Get().(*[]byte)
		raw := (*bp)[:0]
		for i := start; i < cuts[j]; i++ {
			raw = appendRecord(raw, &recs[i])
		}
		out[j] = sealEntry(raw, cuts[j]-start)
		out[j].raw = keep.keep(raw)
		if cap(raw) <= 1<<20 { // not the buffer of a rare huge record
			*bp = raw
			rawPool.Put(bp)
		}
	}
	workers := min(len(cuts), runtime.GOMAXPROCS(0))
	if workers <= 1 {
		for j := range cuts {
			encode(j)
		}
		return out
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := int(next.Add(1) - 1); j < len(cuts); j = int(next.Add(1) - 1) {
				encode(j)
			}
		}()
	}
	wg.Wait()
	return out
}

func appendRecord(b []byte, r *Record) []byte {
	b = binary.AppendVarint(b, r.Time)
	b = binary.AppendUvarint(b, uint64(len(r.Tag)))
	b = append(b, r.Tag...)
	b = binary.AppendUvarint(b, uint64(len(r.Body)))
	return append(b, r.Body...)
}

func sealEntry(raw []byte, count int) entry {
	// Compress into a pooled scratch buffer sized for the worst case, then keep an exact
	// copy: the value lives until its transaction commits, and is a quarter of the
	// worst case or less for log records.
	sp := sealPool.Get().(*[]byte)
	scratch := slices.Grow((*sp)[:0], s2.MaxEncodedLen(len(raw)))[:s2.MaxEncodedLen(len(raw))]
	codec := byte(codecS2)
	payload := s2.Encode(scratch, raw)
	if len(payload) >= len(raw) {
		codec, payload = codecNone, raw
	}
	value := make([]byte, entryHeaderLen+len(payload))
	copy(value[entryHeaderLen:], payload)
	if cap(scratch) <= 1<<20 { // not the buffer of a rare huge record
		*sp = scratch[:0]
		sealPool.Put(sp)
	}
	value[0] = entryVersion
	value[1] = codec
	binary.BigEndian.PutUint32(value[2:6], uint32(count))
	binary.BigEndian.PutUint32(value[6:10], uint32(len(raw)))
	return entry{count: count, value: value, crc: crc32.Checksum(value[entryHeaderLen:], castagnoli)}
}

// sealPool holds sealEntry's compression buffers.
var sealPool = sync.Pool{New: func() any { return new([]byte) }}

// finish completes the checksum now that the entry's key is known.
func (e *entry) finish(first uint64) []byte {
	binary.BigEndian.PutUint32(e.value[10:14], entryCRC(e.crc, first, e.value))
	return e.value
}

func entryCRC(payloadCRC uint32, first uint64, value []byte) uint32 {
	var trailer [8 + 10]byte
	binary.BigEndian.PutUint64(trailer[:8], first)
	copy(trailer[8:], value[:10])
	return crc32.Update(payloadCRC, castagnoli, trailer[:])
}

func seqKey(seq uint64) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], seq)
	return k[:]
}

// entryCount reads the record count from a value's header without checking
// it; callers that act on data use decodeEntry.
func entryCount(value []byte) (int, bool) {
	if len(value) < entryHeaderLen || value[0] != entryVersion {
		return 0, false
	}
	c := int(binary.BigEndian.Uint32(value[2:6]))
	return c, c > 0
}

var (
	errShortEntry  = errors.New("entry shorter than its header")
	errEntryFormat = errors.New("unknown entry version or codec")
	errChecksum    = errors.New("checksum mismatch")
	errFraming     = errors.New("records do not match the entry header")
)

// decodeEntry verifies and decodes the entry stored at key first. value may
// point into the memory map: every returned record is backed by memory of
// its own (new, or the scratch of d, a ReadBuffer's), never by the map.
func decodeEntry(first uint64, value []byte, dst []Record, d *decoder) ([]Record, error) {
	n0 := len(dst)
	out, err := decodeInto(first, value, dst, d)
	if err != nil {
		return dst[:n0], err
	}
	return out, nil
}

// decoder is what the entries of one read share: the tags decoded so far,
// and memory for their records' bytes (a ReadBuffer's); nil shares
// neither.
type decoder struct {
	tags    tagTable
	scratch []byte // the records' bytes go at its end while it has room
	used    int    // bytes alloc handed out
}

// alloc returns n bytes for an entry's records. It is called once the
// entry's checksum matched, so n is the entry's true size.
func (d *decoder) alloc(n int) []byte {
	if d == nil {
		return make([]byte, n)
	}
	d.used += n
	if cap(d.scratch)-len(d.scratch) < n {
		return make([]byte, n)
	}
	i := len(d.scratch)
	d.scratch = d.scratch[:i+n]
	return d.scratch[i : i+n : i+n]
}

func decodeInto(first uint64, value []byte, dst []Record, d *decoder) ([]Record, error) {
	if len(value) < entryHeaderLen {
		return dst, errShortEntry
	}
	if value[0] != entryVersion || value[1] > codecS2 {
		return dst, fmt.Errorf("%w: version %d, codec %d", errEntryFormat, value[0], value[1])
	}
	count := int(binary.BigEndian.Uint32(value[2:6]))
	rawLen := int(binary.BigEndian.Uint32(value[6:10]))
	payload := value[entryHeaderLen:]
	want := binary.BigEndian.Uint32(value[10:14])
	if got := entryCRC(crc32.Checksum(payload, castagnoli), first, value); got != want {
		return dst, fmt.Errorf("%w: stored %08x, computed %08x", errChecksum, want, got)
	}
	if count <= 0 || rawLen > maxRawLen || count > rawLen {
		return dst, fmt.Errorf("%w: count %d, length %d", errFraming, count, rawLen)
	}
	var raw []byte
	if value[1] == codecS2 {
		if n, err := s2.DecodedLen(payload); err != nil || n != rawLen {
			return dst, fmt.Errorf("%w: decoded length %d, header says %d", errFraming, n, rawLen)
		}
		var err error
		if raw, err = s2.Decode(d.alloc(rawLen), payload); err != nil {
			return dst, fmt.Errorf("decompress entry: %w", err)
		}
	} else {
		if len(payload) != rawLen {
			return dst, fmt.Errorf("%w: payload length %d, header says %d", errFraming, len(payload), rawLen)
		}
		raw = d.alloc(rawLen)
		copy(raw, payload)
	}
	return parseEntry(first, raw, count, dst, d)
}

// parseEntry appends the count records of an entry's uncompressed bytes
// raw, stored at key first, to dst; the records point into raw.
func parseEntry(first uint64, raw []byte, count int, dst []Record, d *decoder) ([]Record, error) {
	dst = slices.Grow(dst, count)
	seq := first
	tag := ""
	var tags tagTable
	if d != nil {
		tags = d.tags
	}
	for len(raw) > 0 {
		// Parsed in place: a record is not copied on its way to dst.
		dst = append(dst, Record{Seq: seq})
		r := &dst[len(dst)-1]
		var ok bool
		if raw, ok = parseRecord(raw, tag, tags, r); !ok {
			return dst[:len(dst)-1], fmt.Errorf("%w: record %d is truncated", errFraming, seq)
		}
		tag = r.Tag
		seq++
	}
	if int(seq-first) != count {
		return dst, fmt.Errorf("%w: %d records, header says %d", errFraming, seq-first, count)
	}
	return dst, nil
}

// maxSharedTags bounds a tagTable: a read of records with ever new tags
// does not build a map of them all.
const maxSharedTags = 4096

// tagTable holds the tags a read has decoded, so that records of the same
// tag share one string; nil shares only consecutive tags.
type tagTable map[string]string

// parseRecord parses the record at the start of b into r, all but its
// Seq, and returns the bytes after it. Its tag is prevTag when the bytes
// are the same (the records of an entry mostly share a tag), or else the
// one in tags: they share one string instead of allocating one each.
func parseRecord(b []byte, prevTag string, tags tagTable, r *Record) ([]byte, bool) {
	t, n := varint(b)
	if n <= 0 {
		return nil, false
	}
	r.Time, b = t, b[n:]
	tl, n := uvarint(b)
	if n <= 0 || tl > uint64(len(b)-n) {
		return nil, false
	}
	if t := b[n : n+int(tl)]; string(t) == prevTag {
		r.Tag = prevTag
	} else if s, ok := tags[string(t)]; ok {
		r.Tag = s
	} else {
		r.Tag = string(t)
		if tags != nil && len(tags) < maxSharedTags {
			tags[r.Tag] = r.Tag
		}
	}
	b = b[n+int(tl):]
	bl, n := uvarint(b)
	if n <= 0 || bl > uint64(len(b)-n) {
		return nil, false
	}
	r.Body, b = b[n:n+int(bl):n+int(bl)], b[n+int(bl):]
	return b, true
}
