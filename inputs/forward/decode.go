package forward

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"time"

	"github.com/tinylib/msgp/msgp"

	"github.com/logfwd/forwarder/inputs"
	"github.com/logfwd/forwarder/wal"
)

// message is one decoded forward message.
type message struct {
	tag     string
	records []wal.Record
	chunk   string // option.chunk: the client wants {"ack": chunk} once stored
	invalid int    // records whose invalid UTF-8 was replaced
	buf     []byte // the records' bodies, back to bufPool by release
}

// maxPooled bounds the buffers kept for reuse: a rare huge message does not stay in memory.
const maxPooled = 8 << 20

// bufPool and recordsPool hold the buffers of messages already stored, for the next
// message of any connection: a message's JSON and its records are otherwise the largest
// allocations per message.
var (
	bufPool     sync.Pool // *[]byte
	recordsPool sync.Pool // *[]wal.Record
)

// release gives m's buffers back for reuse. Call it once m's records are stored (the WAL
// keeps no reference to them) or dropped, and use m no more.
func (m *message) release() {
	if cap(m.buf) <= maxPooled {
		b := m.buf[:0]
		bufPool.Put(&b)
	}
	if cap(m.records) <= maxPooled/64 {
		r := m.records[:0]
		clear(r[:cap(r)])
		recordsPool.Put(&r)
	}
	m.buf, m.records = nil, nil
}

// pooledBuf returns an empty buffer of at least n bytes.
func pooledBuf(n int) []byte {
	if p, ok := bufPool.Get().(*[]byte); ok && cap(*p) >= n {
		return (*p)[:0]
	}
	return make([]byte, 0, n)
}

// pooledRecords returns n zero records.
func pooledRecords(n int) []wal.Record {
	if p, ok := recordsPool.Get().(*[]wal.Record); ok && cap(*p) >= n {
		return (*p)[:n]
	}
	return make([]wal.Record, n)
}

// badMessage is a message that breaks the protocol. The connection that
// sent it is closed; nothing of the message is stored.
type badMessage struct {
	reason string // short, a metric label
	offset int    // byte of the message where it went wrong, -1 if not known
	err    error
}

func (e *badMessage) Error() string {
	if e.offset >= 0 {
		return fmt.Sprintf("%v (at byte %d of the message)", e.err, e.offset)
	}
	return e.err.Error()
}

func bad(reason string, full, rest []byte, format string, args ...any) *badMessage {
	off := -1
	if rest != nil {
		off = len(full) - len(rest)
	}
	return &badMessage{reason: reason, offset: off, err: fmt.Errorf(format, args...)}
}

// decoder decodes messages; one per connection, reused.
type decoder struct {
	tc          transcoder
	maxUnpacked int // bound on a CompressedPackedForward payload once decompressed
	now         func() time.Time
	buf         []byte  // JSON of the message's records, then split into bodies
	bodies      []int   // kept between messages: end offsets of the bodies in buf
	times       []int64 // kept between messages: the records' times
	invalid     int     // records of the current message with invalid UTF-8 replaced
}

// decode decodes one message: Message, Forward, PackedForward or
// CompressedPackedForward (DESIGN.md; NOTES.md has the shapes).
func (d *decoder) decode(full []byte) (*message, error) {
	b := full
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return nil, bad("malformed", full, b, "message is not an array: %v", err)
	}
	if n < 2 || n > 4 {
		return nil, bad("malformed", full, b, "message is an array of %d elements, want 2 to 4", n)
	}
	if msgp.NextType(b) != msgp.StrType {
		return nil, bad("malformed", full, b, "tag is not a string")
	}
	tagB, b, err := msgp.ReadStringZC(b)
	if err != nil {
		return nil, bad("malformed", full, b, "read tag: %v", err)
	}
	m := &message{tag: string(tagB)}
	if msg := inputs.CheckTag(m.tag); msg != "" {
		return nil, bad("bad_tag", full, b, "%s", msg)
	}
	// Record JSON is usually a little larger than its msgpack.
	d.buf, d.invalid = pooledBuf(len(full)+len(full)/2+64), 0
	bodies := d.bodies[:0] // end offsets of each record's JSON in d.buf
	times := d.times[:0]
	defer func() {
		if cap(bodies) <= 1<<16 { // an idle connection keeps at most 1.5 MB of them
			d.bodies, d.times = bodies[:0], times[:0]
		} else {
			d.bodies, d.times = nil, nil
		}
	}()

	switch msgp.NextType(b) {
	case msgp.ArrayType: // Forward: [tag, [[time, record], ...], option?]
		var count uint32
		if count, b, err = msgp.ReadArrayHeaderBytes(b); err != nil {
			return nil, bad("malformed", full, b, "read entries: %v", err)
		}
		for i := uint32(0); i < count; i++ {
			var t int64
			if t, b, err = d.entry(b, &bodies); err != nil {
				return nil, bad("malformed", full, b, "entry %d: %v", i, err)
			}
			times = append(times, t)
		}
	case msgp.BinType, msgp.StrType: // PackedForward, maybe compressed
		var packed []byte
		if msgp.NextType(b) == msgp.BinType {
			packed, b, err = msgp.ReadBytesZC(b)
		} else {
			packed, b, err = msgp.ReadStringZC(b)
		}
		if err != nil {
			return nil, bad("malformed", full, b, "read packed entries: %v", err)
		}
		opt, err := d.peekCompressed(b, n)
		if err != nil {
			return nil, bad("malformed", full, b, "%v", err)
		}
		if opt == "gzip" {
			if packed, err = d.gunzip(packed); err != nil {
				return nil, bad("bad_gzip", full, nil, "compressed entries: %v", err)
			}
		} else if opt != "" {
			return nil, bad("malformed", full, b, "unsupported compression %q", opt)
		}
		for i := 0; len(packed) > 0; i++ {
			var t int64
			if t, packed, err = d.entry(packed, &bodies); err != nil {
				return nil, bad("malformed", full, nil, "packed entry %d: %v", i, err)
			}
			times = append(times, t)
		}
	default: // Message: [tag, time, record, option?]
		if n < 3 {
			return nil, bad("malformed", full, b, "message mode needs time and record")
		}
		var t int64
		if t, b, err = d.time(b); err != nil {
			return nil, bad("malformed", full, b, "%v", err)
		}
		if b, err = d.body(b, &bodies); err != nil {
			return nil, bad("malformed", full, b, "record: %v", err)
		}
		times = append(times, t)
		n-- // the record took the slot an option would otherwise be counted in
	}
	if n >= 3 {
		if m.chunk, b, err = d.options(b); err != nil {
			return nil, bad("malformed", full, b, "option: %v", err)
		}
		if len(m.chunk) > inputs.MaxClientChunkID {
			return nil, bad("malformed", full, nil, "chunk id of %d bytes, at most %d", len(m.chunk), inputs.MaxClientChunkID)
		}
	}
	if len(b) != 0 {
		return nil, bad("malformed", full, b, "%d bytes after the message", len(b))
	}
	m.records, m.buf = pooledRecords(len(bodies)), d.buf
	start := 0
	for i, end := range bodies {
		m.records[i] = wal.Record{Time: times[i], Tag: m.tag, Body: d.buf[start:end:end]}
		start = end
	}
	d.buf = nil // the bodies now belong to the records
	m.invalid, d.invalid = d.invalid, 0
	return m, nil
}

// entry decodes [time, record].
func (d *decoder) entry(b []byte, bodies *[]int) (int64, []byte, error) {
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return 0, b, fmt.Errorf("not an array: %w", err)
	}
	if n != 2 {
		return 0, b, fmt.Errorf("an array of %d elements, want [time, record]", n)
	}
	t, b, err := d.time(b)
	if err != nil {
		return 0, b, err
	}
	b, err = d.body(b, bodies)
	return t, b, err
}

func (d *decoder) body(b []byte, bodies *[]int) ([]byte, error) {
	var err error
	d.buf, b, err = d.tc.record(d.buf, b)
	if err != nil {
		return b, err
	}
	if d.tc.invalidUTF8 {
		d.invalid++
	}
	*bodies = append(*bodies, len(d.buf))
	return b, nil
}

// time reads an event time: EventTime (ext 0), integer or float seconds.
// Zero means "now", as Fluentd reads it.
func (d *decoder) time(b []byte) (int64, []byte, error) {
	var t int64
	switch msgp.NextType(b) {
	case msgp.IntType:
		s, rest, err := msgp.ReadInt64Bytes(b)
		if err != nil {
			return 0, b, fmt.Errorf("time: %w", err)
		}
		// Nanoseconds must fit in an int64: the years 1677 to 2262.
		if s > math.MaxInt64/int64(time.Second) || s < math.MinInt64/int64(time.Second) {
			return 0, b, fmt.Errorf("time: integer %d out of range", s)
		}
		t, b = s*1e9, rest
	case msgp.UintType:
		s, rest, err := msgp.ReadUint64Bytes(b)
		if err != nil || s > math.MaxInt64/uint64(time.Second) {
			return 0, b, fmt.Errorf("time: integer %d out of range", s)
		}
		t, b = int64(s)*1e9, rest
	case msgp.Float32Type, msgp.Float64Type:
		f, rest, err := msgp.ReadFloat64Bytes(b)
		if err != nil || math.IsNaN(f) || math.Abs(f) > math.MaxInt64/1e9 {
			return 0, b, fmt.Errorf("time: float %v out of range", f)
		}
		t, b = int64(f*1e9), rest
	case msgp.ExtensionType:
		typ, data, rest, err := readExt(b)
		if err != nil {
			return 0, b, fmt.Errorf("time: %w", err)
		}
		ts, ok := extTime(typ, data)
		if !ok || typ != 0 {
			return 0, b, fmt.Errorf("time: extension type %d of %d bytes is not an EventTime", typ, len(data))
		}
		t, b = ts.UnixNano(), rest
	default:
		return 0, b, fmt.Errorf("time is a %s, want an EventTime or a number", msgp.NextType(b))
	}
	if t == 0 {
		t = d.now().UnixNano()
	}
	return t, b, nil
}

// peekCompressed returns option.compressed without consuming the option.
func (d *decoder) peekCompressed(b []byte, n uint32) (string, error) {
	if n < 3 {
		return "", nil
	}
	var compressed string
	err := eachOption(b, func(k string, v []byte) ([]byte, error) {
		if k != "compressed" {
			return msgp.Skip(v)
		}
		s, rest, err := msgp.ReadStringBytes(v)
		if err != nil {
			return v, fmt.Errorf("option compressed: %w", err)
		}
		compressed = s
		return rest, nil
	})
	return compressed, err
}

// options reads the option map and returns its chunk id.
func (d *decoder) options(b []byte) (string, []byte, error) {
	if msgp.NextType(b) == msgp.NilType {
		rest, err := msgp.ReadNilBytes(b)
		return "", rest, err
	}
	var chunk string
	err := eachOption(b, func(k string, v []byte) ([]byte, error) {
		if k != "chunk" {
			return msgp.Skip(v) // size, compressed, fluent_signal: nothing to do
		}
		var c, rest []byte
		var err error
		switch msgp.NextType(v) {
		case msgp.StrType:
			c, rest, err = msgp.ReadStringZC(v)
		case msgp.BinType:
			c, rest, err = msgp.ReadBytesZC(v)
		default:
			return v, fmt.Errorf("chunk is a %s, want a string", msgp.NextType(v))
		}
		chunk = string(c)
		return rest, err
	})
	if err != nil {
		return "", b, err
	}
	end, err := msgp.Skip(b)
	return chunk, end, err
}

// eachOption calls fn with each key of the option map at b and the bytes
// of its value; fn returns what follows the value.
func eachOption(b []byte, fn func(k string, v []byte) ([]byte, error)) error {
	if msgp.NextType(b) != msgp.MapType {
		return fmt.Errorf("option is a %s, want a map", msgp.NextType(b))
	}
	n, b, err := msgp.ReadMapHeaderBytes(b)
	if err != nil {
		return err
	}
	for i := uint32(0); i < n; i++ {
		k, rest, err := msgp.ReadStringZC(b)
		if err != nil {
			return fmt.Errorf("option key: %w", err)
		}
		if b, err = fn(string(k), rest); err != nil {
			return err
		}
	}
	return nil
}

var errTooBig = errors.New("too large once decompressed")

// gunzip decompresses a CompressedPackedForward payload: one or more gzip
// members, at most maxUnpacked bytes in all.
func (d *decoder) gunzip(p []byte) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(p))
	if err != nil {
		return nil, err
	}
	defer zr.Close()
	out, err := io.ReadAll(io.LimitReader(zr, int64(d.maxUnpacked)+1))
	if err != nil {
		return nil, err
	}
	if len(out) > d.maxUnpacked {
		return nil, fmt.Errorf("%w (limit %d bytes)", errTooBig, d.maxUnpacked)
	}
	return out, nil
}
