package s3sink

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"io"
	"sync"
	"sync/atomic"

	"github.com/klauspost/compress/flate"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/internal/reuse"
	"github.com/logfwd/forwarder/sinks"
)

// chunkSize is how many bytes of lines the encoder gathers before it hands
// them to the compressor. The compressor's input is cut at the first line
// end at or after each chunkSize bytes: a function of the records alone, so
// the output does not depend on how the lines happened to be written.
const chunkSize = 256 << 10

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// encoding is everything that shapes an object's bytes besides its records.
// An intent records it, so that a restart with another configuration still
// rebuilds the same bytes.
type encoding struct {
	Compression string `json:"compression"` // gzip, zstd or none
	Level       int    `json:"level"`
	TimeKey     string `json:"time_key"`
	TagKey      string `json:"tag_key"`
	// OneStream: a gzip object is one gzip stream (one header, the members
	// as raw deflate each ended by a sync flush, one trailer), not gzip
	// members one after the other, which some readers stop after the first
	// of. Intents made before it have false, and rebuild their objects so.
	OneStream bool `json:"one_stream,omitempty"`
}

// object is a built object: its bytes and what an intent records of them.
// An object finished from a staged file has no body here: its bytes are
// the file's, then tail (see Sink.finish). One finished from members held
// in memory has its bytes as those members, in parts.
type object struct {
	body       []byte
	parts      [][]byte // the members of an object held in memory, when body is nil
	tail       []byte   // a staged object's last member, held in memory
	size       int64    // bytes of the object
	sha256     string   // hex, of the object's bytes
	lines      int64    // uncompressed bytes (the lines, newlines included)
	linesCRC32 uint32   // CRC-32C of the lines
}

// encoder builds objects of one encoding. Safe for concurrent use.
type encoder struct {
	enc   encoding
	liner *liner
	gz    sync.Pool // *gzip.Writer
	fl    sync.Pool // *flate.Writer, for one-stream gzip objects
	zs    sync.Pool // *zstd.Encoder
	bufs  sync.Pool // *[]byte of chunkSize+
	// outs: compressed members' buffers (see compressScratch), two kept
	// for good (see package reuse).
	outs reuse.Buffers[*bytes.Buffer]
}

// maxKeptMember is the largest buffer of a compressed member kept for
// good: a member of maxMemberBytes compressed at least twofold.
const maxKeptMember = maxMemberBytes / 2

func newEncoder(enc encoding) (*encoder, error) {
	switch enc.Compression {
	case config.CompressionGzip:
		if enc.Level < gzip.BestSpeed || enc.Level > gzip.BestCompression {
			return nil, fmt.Errorf("gzip compression_level %d is not 1 to 9", enc.Level)
		}
	case config.CompressionZstd:
		if enc.Level < int(zstd.SpeedFastest) || enc.Level > int(zstd.SpeedBestCompression) {
			return nil, fmt.Errorf("zstd compression_level %d is not 1 to 4", enc.Level)
		}
	case config.CompressionNone:
	default:
		return nil, fmt.Errorf("compression %q is not gzip, zstd or none", enc.Compression)
	}
	e := &encoder{enc: enc, liner: newLiner(enc.TimeKey, enc.TagKey)}
	// Two are kept for good, each of at most maxKeptMember: a buffer of a
	// final batch's member (up to the sink's share) is only pooled.
	e.outs.Keep = 2
	e.outs.KeepIf = func(b *bytes.Buffer) bool { return b.Cap() <= maxKeptMember }
	return e, nil
}

// contentEncoding is the object's Content-Encoding, "" for none.
func (e *encoder) contentEncoding() string {
	if e.enc.Compression == config.CompressionNone {
		return ""
	}
	return e.enc.Compression
}

// size is what r adds to an object before compression: its line and newline.
func (e *encoder) size(r *sinks.Record) int { return e.liner.lineLen(r) + 1 }

// member is one compressed piece of an object's lines: a zstd frame, the
// lines themselves, a gzip member, or, in a gzip object written as one
// stream (encoding.OneStream), raw deflate ended by a sync flush, the
// first one after the gzip header: an object is its members one after the
// other (and, in one stream, the trailer: encoder.trailer).
type member struct {
	body    []byte
	records int
	lines   int64  // uncompressed bytes
	crc     uint32 // CRC-32C of the object's lines up to the end of this member
	gzcrc   uint32 // CRC-32 (gzip's) of them, for a one-stream gzip object's trailer
	// scratch, when set, is the encoder's buffer that body lies in: body
	// is valid until release or own.
	scratch *bytes.Buffer
	enc     *encoder
}

// own makes m's body its own: an exact copy of the scratch bytes, which go
// back to the encoder.
func (m *member) own() {
	if m.scratch == nil {
		return
	}
	// Room for a one-stream gzip object's trailer, which the last member
	// is finished with (Sink.finishing) without copying it again.
	m.body = append(make([]byte, 0, len(m.body)+trailerLen), m.body...)
	m.release()
}

// release hands m's scratch buffer back to the encoder; m.body must not be
// used after it unless it was owned.
func (m *member) release() {
	if m.scratch == nil {
		return
	}
	m.scratch.Reset()
	m.enc.outs.Put(m.scratch)
	m.scratch, m.enc = nil, nil
}

// chain is what an object's members before one hand it: the CRC-32C and
// gzip's CRC-32 of the lines so far, and whether there were any (the
// first member of a one-stream gzip object begins with the header). The
// zero chain is a first member's.
type chain struct {
	crc, gzcrc uint32
	after      bool
}

// next is the chain after m.
func (m *member) next() chain { return chain{crc: m.crc, gzcrc: m.gzcrc, after: true} }

// oneStream reports whether the encoder writes gzip objects as one stream.
func (e *encoder) oneStream() bool {
	return e.enc.OneStream && e.enc.Compression == config.CompressionGzip
}

// gzipHeader is the header of a one-stream gzip object: no name, no time,
// no extra flags (XFL 0, where Go's gzip writes a level's), OS unknown.
var gzipHeader = []byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff}

// trailerLen is the length of a one-stream gzip object's trailer.
const trailerLen = 10

// trailer is what ends an object after its members: for a one-stream gzip
// object, an empty final deflate block and the gzip trailer (the CRC-32
// and the length of all the lines, gzcrc and lines); nil otherwise.
func (e *encoder) trailer(gzcrc uint32, lines int64) []byte {
	if !e.oneStream() {
		return nil
	}
	t := []byte{0x03, 0x00} // a final block, fixed codes, holding only the end
	t = binary.LittleEndian.AppendUint32(t, gzcrc)
	return binary.LittleEndian.AppendUint32(t, uint32(lines))
}

// build encodes recs as one object of one member. The bytes are a pure
// function of the records and the encoding.
func (e *encoder) build(recs []sinks.Record) (*object, error) {
	m, err := e.compress(recs, chain{})
	if err != nil {
		return nil, err
	}
	return e.join([]member{m}), nil
}

// buildSplit encodes recs as an object of members of counts[i] records
// each (one member when counts is empty): what an intent of an object
// built member by member (see openObject) is rebuilt from.
func (e *encoder) buildSplit(recs []sinks.Record, counts []int) (*object, error) {
	if len(counts) == 0 {
		return e.build(recs)
	}
	ms := make([]member, 0, len(counts))
	var ch chain
	for _, n := range counts {
		if n <= 0 || n > len(recs) {
			return nil, fmt.Errorf("member of %d records where %d are left", n, len(recs))
		}
		m, err := e.compress(recs[:n], ch)
		if err != nil {
			return nil, err
		}
		ms, ch, recs = append(ms, m), m.next(), recs[n:]
	}
	if len(recs) > 0 {
		return nil, fmt.Errorf("%d records left after the members", len(recs))
	}
	return e.join(ms), nil
}

// join makes an object of members, and its trailer.
func (e *encoder) join(ms []member) *object {
	o := &object{}
	for _, m := range ms {
		o.lines += m.lines
		o.linesCRC32 = m.crc
	}
	trailer := e.trailer(ms[len(ms)-1].gzcrc, o.lines)
	if len(ms) == 1 && trailer == nil {
		o.body = ms[0].body
	} else {
		n := len(trailer)
		for _, m := range ms {
			n += len(m.body)
		}
		o.body = make([]byte, 0, n)
		for _, m := range ms {
			o.body = append(o.body, m.body...)
		}
		o.body = append(o.body, trailer...)
	}
	o.size = int64(len(o.body))
	sum := sha256.Sum256(o.body)
	o.sha256 = hex.EncodeToString(sum[:])
	return o
}

// compress encodes recs as one member: a JSON line per record, compressed.
// ch is what the object's members before it hand it. The member owns its
// body.
func (e *encoder) compress(recs []sinks.Record, ch chain) (member, error) {
	m, err := e.compressScratch(recs, ch)
	m.own()
	return m, err
}

// compressScratch is compress into one of the encoder's buffers, reused
// from member to member: the member's body is valid until its release or
// own (a staged member is written to its file and dropped, and needs no
// copy of its own).
func (e *encoder) compressScratch(recs []sinks.Record, ch chain) (member, error) {
	crc, gzcrc := ch.crc, ch.gzcrc
	out, _ := e.outs.Get()
	if out == nil {
		out = new(bytes.Buffer)
	}
	// Room for the whole member at once: growing a buffer of megabytes by
	// doubling copies and clears it over and over.
	est := 0
	for i := range recs {
		est += len(recs[i].Body) + 64
	}
	if e.enc.Compression != config.CompressionNone {
		est = est/3 + 4096
	}
	out.Grow(est)
	ok := false
	defer func() {
		if !ok {
			out.Reset()
			e.outs.Put(out)
		}
	}()
	var w io.Writer = out
	var finish func() error
	switch {
	case e.oneStream():
		if !ch.after {
			out.Write(gzipHeader)
		}
		fw, _ := e.fl.Get().(*flate.Writer)
		if fw == nil {
			var err error
			if fw, err = flate.NewWriter(out, e.enc.Level); err != nil {
				return member{}, err
			}
		} else {
			fw.Reset(out)
		}
		// A sync flush, not a close: the stream goes on in the next member
		// (a fresh dictionary), and ends with the trailer.
		w, finish = fw, func() error { err := fw.Flush(); fw.Reset(io.Discard); e.fl.Put(fw); return err }
	case e.enc.Compression == config.CompressionGzip:
		gw, _ := e.gz.Get().(*gzip.Writer)
		if gw == nil {
			var err error
			if gw, err = gzip.NewWriterLevel(out, e.enc.Level); err != nil {
				return member{}, err
			}
		} else {
			gw.Reset(out)
		}
		// The header stays the zero one: no name, no modification time.
		w, finish = gw, func() error { err := gw.Close(); gw.Reset(io.Discard); e.gz.Put(gw); return err }
	case e.enc.Compression == config.CompressionZstd:
		zw, _ := e.zs.Get().(*zstd.Encoder)
		if zw == nil {
			var err error
			zw, err = zstd.NewWriter(out,
				zstd.WithEncoderLevel(zstd.EncoderLevel(e.enc.Level)),
				zstd.WithEncoderConcurrency(1), // one goroutine: blocks and frames do not depend on scheduling
				zstd.WithEncoderCRC(true))
			if err != nil {
				return member{}, err
			}
		} else {
			zw.Reset(out)
		}
		w, finish = zw, func() error { err := zw.Close(); zw.Reset(io.Discard); e.zs.Put(zw); return err }
	default:
		finish = func() error { return nil }
	}

	bp, _ := e.bufs.Get().(*[]byte)
	if bp == nil {
		b := make([]byte, 0, chunkSize+64<<10)
		bp = &b
	}
	buf := (*bp)[:0]
	defer func() { *bp = buf[:0]; e.bufs.Put(bp) }()
	var (
		lines int64
		err   error
	)
	oneStream := e.oneStream()
	flush := func() {
		if err == nil && len(buf) > 0 {
			crc = crc32.Update(crc, castagnoli, buf)
			if oneStream {
				gzcrc = crc32.Update(gzcrc, crc32.IEEETable, buf)
			}
			lines += int64(len(buf))
			_, err = w.Write(buf)
		}
		buf = buf[:0]
	}
	var ts timestamps
	for i := range recs {
		if i%touchAhead == 0 {
			touchBodies(recs[i:min(i+touchAhead, len(recs))])
		}
		buf = e.liner.appendLine(buf, &recs[i], &ts)
		buf = append(buf, '\n')
		if len(buf) >= chunkSize {
			flush()
		}
	}
	flush()
	if ferr := finish(); err == nil {
		err = ferr
	}
	if err != nil {
		return member{}, fmt.Errorf("compress object: %w", err)
	}
	ok = true
	return member{body: out.Bytes(), records: len(recs), lines: lines, crc: crc, gzcrc: gzcrc, scratch: out, enc: e}, nil
}

// touchAhead is how many records touchBodies brings into the cache at once.
const touchAhead = 16

// touched keeps touchBodies's loads from being optimised away.
var touched atomic.Uint32

// touchBodies loads one byte of every cache line of the records' bodies.
// A batch's records were read from the WAL among those of other partitions,
// so their bodies lie apart in memory and each line of each body would be
// a separate cache miss when the line is built; loads that depend on
// nothing overlap those misses instead of taking them one after the other.
func touchBodies(recs []sinks.Record) {
	var x byte
	for i := range recs {
		b := recs[i].Body
		for j := 0; j < len(b); j += 64 {
			x ^= b[j]
		}
	}
	if x == 0xff {
		touched.Add(1)
	}
}
