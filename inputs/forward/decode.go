package forward

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/tinylib/msgp/msgp"

	"github.com/logfwd/forwarder/inputs"
	"github.com/logfwd/forwarder/wal"
)

// message is one decoded forward message.
type message struct {
	tag     string
	records []wal.Record
	chunk   string   // option.chunk: the client wants {"ack": chunk} once stored
	acked   bool     // option.chunk was there (Fluentd acknowledges an empty one too)
	invalid int      // records whose invalid UTF-8 was replaced
	nils    int      // nil records, skipped
	notMaps int      // records that are not maps, skipped
	notMap  string   // the msgpack type of the first of them
	buf     []byte   // the records' bodies (the last of them, with chunks)
	chunks  [][]byte // the bodies before buf's, when buf filled (decoder.growJSON)
	times   uint64   // a hash of the records' times as the message had them (see digest)
	hold    *inputs.Hold
}

// digest names m's records for its chunk id (wal.AppendOptions.ChunkDigest):
// a client that sends the same chunk id again with other records reused
// the id. CRC-32C of the tag and the bodies, a hash of the times as sent
// (a time of 0, stored as the time of arrival, hashes as 0: a re-send is
// the same message), and the count: enough to tell messages apart by
// accident, at a few nanoseconds a record.
func (m *message) digest() []byte {
	crc := crc32.Update(0, castagnoli, []byte(m.tag))
	var body int
	for i := range m.records {
		body += len(m.records[i].Body)
	}
	inBufs := len(m.buf)
	for _, c := range m.chunks {
		inBufs += len(c)
	}
	if body == inBufs {
		for _, c := range m.chunks { // the bodies, one after another
			crc = crc32.Update(crc, castagnoli, c)
		}
		crc = crc32.Update(crc, castagnoli, m.buf)
	} else {
		for i := range m.records {
			crc = crc32.Update(crc, castagnoli, m.records[i].Body)
		}
	}
	d := binary.BigEndian.AppendUint32(make([]byte, 0, 16), crc)
	d = binary.BigEndian.AppendUint64(d, m.times)
	return binary.BigEndian.AppendUint32(d, uint32(len(m.records)))
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// release gives m's buffers back, to their pools and to the budget. Call it
// once m's records are stored (the WAL keeps no reference to them) or
// dropped, and use m no more.
func (m *message) release() {
	m.hold.Release(int64(cap(m.buf)) + int64(cap(m.records))*inputs.RecordSize)
	inputs.PutBuf(m.buf)
	inputs.PutRecords(m.records)
	for _, c := range m.chunks {
		m.hold.Release(int64(cap(c)))
		inputs.PutBuf(c)
	}
	m.buf, m.records, m.chunks = nil, nil, nil
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

// defaultMaxRecords is max_records_per_message when a decoder is given none.
const defaultMaxRecords = 100_000

// decoder decodes messages; one per connection, reused. Every buffer it
// fills (the records' JSON, the record slice, the window of decompressed
// entries) is reserved from hold before it is allocated, sized from bytes
// that have arrived, and grown as it fills: never from a count or length
// the message declares.
type decoder struct {
	tc          transcoder
	maxUnpacked int // bound on a CompressedPackedForward payload once decompressed
	maxRecords  int // max_records_per_message; 0: defaultMaxRecords
	now         func() time.Time
	hold        *inputs.Hold    // nil: no budget
	ctx         context.Context // bounds a wait for room in the budget; nil: none

	buf  []byte       // JSON of the message's records, one body after the other
	recs []wal.Record // the records decoded so far, their bodies in chunks and buf
	// chunks are earlier buffers of the message's JSON, full: the records
	// before chunkFirst have their bodies there (growJSON).
	chunks     [][]byte
	chunkFirst int    // the first record whose body is in buf
	recStart   int    // where in buf the record being transcoded begins
	invalid    int    // records of the current message with invalid UTF-8 replaced
	nils       int    // nil records of the current message, skipped
	notMaps    int    // records of the current message that are not maps, skipped
	notMap     string // the msgpack type of the first of them
	window     []byte // decompressed entries not yet decoded
	times      uint64 // a hash of the message's times as sent (0 not yet replaced by now)
	marker     bool   // the time just read was a group marker's (see markerTime)
}

// decode decodes one message: Message, Forward, PackedForward or
// CompressedPackedForward (doc.go has the shapes). On error
// it holds nothing of the message.
func (d *decoder) decode(full []byte) (*message, error) {
	m, err := d.decodeInto(full)
	if err != nil {
		d.drop()
		return nil, err
	}
	return m, nil
}

func (d *decoder) decodeInto(full []byte) (*message, error) {
	if d.tc.grow == nil {
		d.tc.grow = d.growJSON
	}
	b := full
	if len(b) > 0 && (b[0] == '[' || b[0] == '{') {
		// A positive fixint, never a message: the start of one in JSON,
		// which Fluentd's in_forward also takes (fluent-logger's
		// MarshalAsJSON). The framer took this one byte for a message.
		return nil, bad("malformed", full, nil, "the message is JSON, not msgpack: this input takes msgpack only (a client's JSON mode, as fluent-logger's MarshalAsJSON, is not supported)")
	}
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
	m := &message{tag: string(tagB), hold: d.hold}
	if msg := inputs.CheckTag(m.tag); msg != "" {
		return nil, bad("bad_tag", full, b, "%s", msg)
	}
	// Record JSON is usually a little smaller than its msgpack (the times
	// and the entries' arrays are not in it); the buffer grows if it is not.
	d.invalid, d.nils, d.notMaps, d.notMap, d.times, d.marker = 0, 0, 0, "", 0, false
	if err := d.reserveJSON(inputs.BufClass(len(full) + 64)); err != nil {
		return nil, d.budgetErr(err)
	}

	switch msgp.NextType(b) {
	case msgp.ArrayType: // Forward: [tag, [[time, record], ...], option?]
		var count uint32
		if count, b, err = msgp.ReadArrayHeaderBytes(b); err != nil {
			return nil, bad("malformed", full, b, "read entries: %v", err)
		}
		if int(count) > d.recordLimit() {
			return nil, d.tooMany()
		}
		// The message is framed whole: it holds that many values, and an
		// entry takes at least 3 bytes of it. Sizing the records from the
		// count saves growing them, which for a message of many records
		// would hold twice their slice at once.
		if err := d.growRecords(min(int(count), len(b)/3)); err != nil {
			return nil, d.budgetErr(err)
		}
		for i := uint32(0); i < count; i++ {
			if b, err = d.entry(b); err != nil {
				return nil, d.entryErr(full, b, "entry", int(i), err)
			}
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
		opt, signal, err := d.peekOptions(b, n)
		if err != nil {
			return nil, bad("malformed", full, b, "%v", err)
		}
		if signal != 0 {
			return nil, unsupportedSignal(full, b, m.tag, signal)
		}
		switch opt {
		case "gzip":
			if err := d.gzipEntries(full, packed); err != nil {
				return nil, err
			}
		case "zstd": // Fluentd's out_forward with compress zstd
			if err := d.zstdEntries(full, packed); err != nil {
				return nil, err
			}
		case "", "text": // Fluentd's out_forward says "text" when it does not compress
			for i := 0; len(packed) > 0; i++ {
				if packed, err = d.entry(packed); err != nil {
					return nil, d.entryErr(full, nil, "packed entry", i, err)
				}
			}
		default:
			return nil, bad("malformed", full, b, "unsupported compression %q", opt)
		}
	default: // Message: [tag, time, record, option?]
		if n < 3 {
			return nil, bad("malformed", full, b, "message mode needs time and record")
		}
		var t int64
		if t, b, err = d.time(b); err != nil {
			return nil, bad("malformed", full, b, "%v", err)
		}
		var skipped bool
		if b, skipped, err = d.skipRecord(b); err != nil {
			return nil, bad("malformed", full, b, "record: %v", err)
		} else if !skipped {
			if b, err = d.body(b, t); err != nil {
				return nil, d.entryErr(full, b, "record", -1, err)
			}
		}
		n-- // the record took the slot an option would otherwise be counted in
	}
	if n >= 3 {
		var signal int64
		if m.chunk, m.acked, signal, b, err = d.options(b); err != nil {
			return nil, bad("malformed", full, b, "option: %v", err)
		}
		if signal != 0 {
			return nil, unsupportedSignal(full, nil, m.tag, signal)
		}
		if len(m.chunk) > inputs.MaxClientChunkID {
			return nil, bad("malformed", full, nil, "chunk id of %d bytes, at most %d", len(m.chunk), inputs.MaxClientChunkID)
		}
	}
	if len(b) != 0 {
		return nil, bad("malformed", full, b, "%d bytes after the message", len(b))
	}
	for i := range d.recs {
		d.recs[i].Tag = m.tag
	}
	m.records, m.buf, m.chunks, m.times = d.recs, d.buf, d.chunks, d.times
	d.recs, d.buf, d.chunks, d.chunkFirst = nil, nil, nil, 0 // they belong to the message now
	m.invalid, d.invalid = d.invalid, 0
	m.nils, d.nils = d.nils, 0
	m.notMaps, m.notMap, d.notMaps, d.notMap = d.notMaps, d.notMap, 0, ""
	return m, nil
}

// drop gives back what a message that failed holds.
func (d *decoder) drop() {
	d.hold.Release(int64(cap(d.buf)) + int64(cap(d.recs))*inputs.RecordSize)
	inputs.PutBuf(d.buf)
	inputs.PutRecords(d.recs)
	for _, c := range d.chunks {
		d.hold.Release(int64(cap(c)))
		inputs.PutBuf(c)
	}
	d.buf, d.recs, d.chunks, d.chunkFirst = nil, nil, nil, 0
	d.dropWindow()
}

func (d *decoder) dropWindow() {
	d.hold.Release(int64(cap(d.window)))
	inputs.PutBuf(d.window)
	d.window = nil
}

func (d *decoder) recordLimit() int {
	if d.maxRecords > 0 {
		return d.maxRecords
	}
	return defaultMaxRecords
}

func (d *decoder) tooMany() *badMessage {
	return &badMessage{reason: reasonTooManyRecords, offset: -1,
		err: fmt.Errorf("more than %d records in one message (max_records_per_message)", d.recordLimit())}
}

// Reasons of refusals for the inputs' limits, beside those of bad input.
const (
	reasonTooManyRecords = "too_many_records"   // over max_records_per_message
	reasonOverBudget     = "over_memory_budget" // more than the inputs' memory budget holds for one message
	reasonNoRoom         = "memory_full"        // no room in the budget before the message's time was up
)

// budgetErr is a refusal for a reservation that failed.
func (d *decoder) budgetErr(err error) error {
	switch {
	case errors.Is(err, inputs.ErrOverBudget):
		return &badMessage{reason: reasonOverBudget, offset: -1, err: err}
	case errors.Is(err, context.Canceled):
		return err // the server is stopping
	default:
		return &badMessage{reason: reasonNoRoom, offset: -1, err: err}
	}
}

// entryErr names where decoding an entry (i >= 0) or the record of a
// Message failed; a refusal for the limits passes as it is.
func (d *decoder) entryErr(full, rest []byte, what string, i int, err error) error {
	var bm *badMessage
	if errors.As(err, &bm) {
		return bm
	}
	if errors.Is(err, errBudget) {
		return d.budgetErr(err)
	}
	if i < 0 {
		return bad("malformed", full, rest, "%s: %v", what, err)
	}
	return bad("malformed", full, rest, "%s %d: %v", what, i, err)
}

// reserveJSON makes d.buf an empty buffer of size bytes.
func (d *decoder) reserveJSON(size int) error {
	if err := d.hold.Grow(d.context(), int64(size)); err != nil {
		return err
	}
	d.buf = inputs.GetBuf(size)
	return nil
}

func (d *decoder) context() context.Context {
	if d.ctx == nil {
		return context.Background()
	}
	return d.ctx
}

// errBudget marks the transcoder's errors that are a failed reservation.
var errBudget = errors.New("reserve memory")

// growJSON is the transcoder's way to more room: dst (d.buf as the
// transcoder has it) is full. When whole records before the one being
// transcoded fill at least half of it, they stay where they are (dst
// becomes a chunk) and the record goes on in a new buffer, reserved first, with room for n more
// bytes and half of dst's size: the message's JSON never needs twice its
// size while it is copied, which made a message of max_message_bytes whose
// JSON outgrew its msgpack need more than the whole budget (refused for
// good). Otherwise dst is copied into a buffer a quarter larger, and the
// bodies in it move along.
func (d *decoder) growJSON(dst []byte, n int) ([]byte, error) {
	if d.recStart >= cap(dst)/2 {
		// At least half of dst is whole records: they stay in it. (Less,
		// and keeping dst would hold more than copying the few.)
		partial := dst[d.recStart:]
		size := inputs.BufClass(max(len(partial)+n, cap(dst)/2))
		if err := d.hold.Grow(d.context(), int64(size)); err != nil {
			return dst, fmt.Errorf("%w: %w", errBudget, err)
		}
		grown := append(inputs.GetBuf(size), partial...)
		d.chunks = append(d.chunks, dst[:d.recStart])
		d.tc.moved += d.recStart
		d.recStart, d.chunkFirst = 0, len(d.recs)
		d.buf = grown
		return grown, nil
	}
	size := inputs.BufClass(max(len(dst)+n, cap(dst)+cap(dst)/4))
	if err := d.hold.Grow(d.context(), int64(size)); err != nil {
		return dst, fmt.Errorf("%w: %w", errBudget, err)
	}
	grown := append(inputs.GetBuf(size), dst...)
	pos := 0
	for i := d.chunkFirst; i < len(d.recs); i++ {
		l := len(d.recs[i].Body)
		d.recs[i].Body = grown[pos : pos+l : pos+l]
		pos += l
	}
	d.hold.Release(int64(cap(dst)))
	inputs.PutBuf(dst)
	d.buf = grown
	return grown, nil
}

// addRecord appends a record to d.recs, growing it when it is full, up to
// max_records_per_message.
func (d *decoder) addRecord(t int64, body []byte) error {
	if len(d.recs) >= d.recordLimit() {
		return d.tooMany()
	}
	if len(d.recs) == cap(d.recs) {
		if err := d.growRecords(min(inputs.RecordsClass(max(2*cap(d.recs), 1)), d.recordLimit())); err != nil {
			return fmt.Errorf("%w: %w", errBudget, err)
		}
	}
	d.recs = append(d.recs, wal.Record{Time: t, Body: body})
	return nil
}

// growRecords makes d.recs a slice of capacity n, or more, reserved first.
func (d *decoder) growRecords(n int) error {
	if n <= cap(d.recs) {
		return nil
	}
	if err := d.hold.Grow(d.context(), int64(n)*inputs.RecordSize); err != nil {
		return err
	}
	grown := append(inputs.GetRecords(n), d.recs...)
	d.hold.Release(int64(cap(d.recs)) * inputs.RecordSize)
	inputs.PutRecords(d.recs)
	d.recs = grown
	return nil
}

// entry decodes [time, record].
func (d *decoder) entry(b []byte) ([]byte, error) {
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return b, fmt.Errorf("not an array: %w", err)
	}
	if n != 2 {
		return b, fmt.Errorf("an array of %d elements, want [time, record]", n)
	}
	t, b, err := d.time(b)
	if err != nil {
		return b, err
	}
	if d.marker {
		// A group marker: its attributes are skipped, as its time was.
		d.marker = false
		rest, err := msgp.Skip(b)
		if err != nil {
			return b, fmt.Errorf("group marker's attributes: %w", err)
		}
		return rest, nil
	}
	if b, skipped, err := d.skipRecord(b); err != nil || skipped {
		return b, err
	}
	return d.body(b, t)
}

// skipRecord passes over the record at b when it is nil (nothing to
// store) or not a map (a string, a number, an array: not a record the
// sinks can store), counting it, as Fluentd's in_forward skips them (with
// skip_invalid_event): the other records of the message are stored and
// it is acknowledged, rather than refused, which a client would send again
// for ever.
func (d *decoder) skipRecord(b []byte) (rest []byte, skipped bool, err error) {
	if len(b) > 0 && b[0] == 0xc0 {
		d.nils++
		return b[1:], true, nil
	}
	t := msgp.NextType(b)
	if t == msgp.MapType {
		return b, false, nil
	}
	rest, err = msgp.Skip(b)
	if err != nil {
		return b, true, err
	}
	if d.notMaps == 0 {
		d.notMap = t.String()
	}
	d.notMaps++
	return rest, true, nil
}

// markerTime reports whether the time at b, the first of a [time,
// metadata] pair, is that of one of Fluent Bit's group markers
// ([[time, metadata], attributes]): -1 seconds (a group starts) or -2 (it
// ends), which Fluent Bit writes as the unsigned seconds of an EventTime
// (or as an integer). They frame the records of a group (the OpenTelemetry
// input's resource and scope); they are not records, and are left out
// (README, the forward input).
func markerTime(b []byte) bool {
	switch msgp.NextType(b) {
	case msgp.ExtensionType:
		typ, data, _, err := readExt(b)
		if err != nil || typ != 0 || len(data) != 8 {
			return false
		}
		s := binary.BigEndian.Uint32(data)
		return s == 1<<32-1 || s == 1<<32-2
	case msgp.IntType:
		s, _, err := msgp.ReadInt64Bytes(b)
		return err == nil && (s == -1 || s == -2)
	}
	return false
}

// body transcodes the record at b and adds it, at time t.
func (d *decoder) body(b []byte, t int64) ([]byte, error) {
	d.recStart = len(d.buf) // moved by growJSON should the record move to a new buffer
	buf, b, err := d.tc.record(d.buf, b)
	d.buf = buf
	if err != nil {
		return b, err
	}
	if d.tc.invalidUTF8 {
		d.invalid++
	}
	return b, d.addRecord(t, d.buf[d.recStart:len(d.buf):len(d.buf)])
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
		// Nanoseconds must fit in an int64 once rounded to a float64.
		if ns := f * 1e9; err != nil || math.IsNaN(f) || ns >= 0x1p63 || ns < -0x1p63 {
			return 0, b, fmt.Errorf("time: float %v out of range", f)
		}
		t, b = int64(f*1e9), rest
	case msgp.ArrayType:
		// Fluent Bit's entries with metadata ([[time, metadata], record],
		// retain_metadata_in_forward_mode): the time, the metadata left.
		n, rest, err := msgp.ReadArrayHeaderBytes(b)
		if err != nil || n != 2 || msgp.NextType(rest) == msgp.ArrayType {
			return 0, b, fmt.Errorf("time is an array of %d elements, want [time, metadata]", n)
		}
		if markerTime(rest) {
			if rest, err = msgp.Skip(rest); err == nil {
				rest, err = msgp.Skip(rest)
			}
			if err != nil {
				return 0, b, fmt.Errorf("group marker: %w", err)
			}
			d.marker = true // not hashed: not a record
			return 0, rest, nil
		}
		if t, rest, err = d.time(rest); err != nil {
			return 0, b, err
		}
		if typ := msgp.NextType(rest); typ != msgp.MapType && typ != msgp.NilType {
			return 0, b, fmt.Errorf("metadata is a %s, want a map", typ)
		}
		if rest, err = msgp.Skip(rest); err != nil {
			return 0, b, fmt.Errorf("metadata: %w", err)
		}
		return t, rest, nil
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
	case msgp.NilType:
		// No time: the time of arrival, as 0 (Fluentd reads it so).
		b = b[1:]
	default:
		return 0, b, fmt.Errorf("time is a %s, want an EventTime or a number", msgp.NextType(b))
	}
	d.times = (d.times ^ uint64(t)) * 0x100000001b3 // FNV-1a's prime, word by word
	if t == 0 {
		t = d.now().UnixNano()
	}
	return t, b, nil
}

// peekOptions returns option.compressed and option.fluent_signal without
// consuming the option.
func (d *decoder) peekOptions(b []byte, n uint32) (string, int64, error) {
	if n < 3 || msgp.NextType(b) == msgp.NilType {
		return "", 0, nil
	}
	var compressed string
	var signal int64
	err := eachOption(b, func(k string, v []byte) ([]byte, error) {
		switch k {
		case "fluent_signal":
			var rest []byte
			var err error
			signal, rest, err = readSignal(v)
			return rest, err
		case "compressed":
		default:
			return msgp.Skip(v)
		}
		if msgp.NextType(v) == msgp.NilType {
			return msgp.ReadNilBytes(v)
		}
		s, rest, err := msgp.ReadStringBytes(v)
		if err != nil {
			return v, fmt.Errorf("option compressed: %w", err)
		}
		compressed = s
		return rest, nil
	})
	return compressed, signal, err
}

// readSignal reads option.fluent_signal: 0 logs, 1 metrics, 2 traces
// (Fluent Bit sends an integer, Envoy a string of one). A value of another
// kind reads as 0, as the option was read before it was looked at.
func readSignal(v []byte) (int64, []byte, error) {
	rest, err := msgp.Skip(v)
	if err != nil {
		return 0, v, fmt.Errorf("option fluent_signal: %w", err)
	}
	switch msgp.NextType(v) {
	case msgp.IntType, msgp.UintType:
		if s, _, err := msgp.ReadInt64Bytes(v); err == nil {
			return s, rest, nil
		}
		return -1, rest, nil
	case msgp.StrType:
		if s, _, err := msgp.ReadStringBytes(v); err == nil {
			if n, err := strconv.ParseInt(s, 10, 64); err == nil {
				return n, rest, nil
			}
		}
	}
	return 0, rest, nil
}

// unsupportedSignal refuses a message of metrics or traces.
func unsupportedSignal(full, rest []byte, tag string, signal int64) *badMessage {
	what := map[int64]string{1: "metrics", 2: "traces"}[signal]
	if what == "" {
		what = "not logs"
	}
	return bad("unsupported_signal", full, rest, "fluent_signal %d (%s) for tag %q: this forwarder takes logs only; "+
		"leave the metrics and traces inputs out of the client's forward output (its Match)", signal, what, tag)
}

// options reads the option map and returns its chunk id, whether it had
// one, and its fluent_signal (0, logs, when absent).
func (d *decoder) options(b []byte) (string, bool, int64, []byte, error) {
	if msgp.NextType(b) == msgp.NilType {
		rest, err := msgp.ReadNilBytes(b)
		return "", false, 0, rest, err
	}
	var chunk string
	var signal int64
	present := false
	err := eachOption(b, func(k string, v []byte) ([]byte, error) {
		if k == "fluent_signal" {
			var rest []byte
			var err error
			signal, rest, err = readSignal(v)
			return rest, err
		}
		if k != "chunk" {
			return msgp.Skip(v) // size, compressed: nothing to do
		}
		present = true
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
		return "", false, 0, b, err
	}
	end, err := msgp.Skip(b)
	return chunk, present, signal, end, err
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

// gzipEntries decodes the entries of a CompressedPackedForward payload (one
// or more gzip members, at most maxUnpacked bytes in all once
// decompressed) as they come out of the decompressor: what is held of them
// is a window as large as the largest entry, not the whole payload.
func (d *decoder) gzipEntries(full, packed []byte) error {
	if err := d.hold.Grow(d.context(), gzipReaderBytes); err != nil {
		return d.budgetErr(err)
	}
	defer d.hold.Release(gzipReaderBytes)
	zr, err := inputs.GetGzip(bytes.NewReader(packed))
	if err != nil {
		return bad("bad_gzip", full, nil, "compressed entries: %v", err)
	}
	defer inputs.PutGzip(zr)
	return d.streamEntries(full, zr, "bad_gzip")
}

// gzipReaderBytes is what a gzip reader holds while it decompresses (its
// 32 KiB window and its tables: about 66 KiB measured), held from the
// inputs' budget.
const gzipReaderBytes = 80 << 10

// zstdDecoderBytes is what a zstd decoder holds besides its window while
// it decodes a frame (its block buffers: about 400 KiB measured with the
// low-memory decoder of one goroutine, whatever the window), held from the
// inputs' budget with the window.
const zstdDecoderBytes = 512 << 10

// maxZstdWindow is the largest window a zstd frame of a forward message
// may ask for (Fluentd's zstd, level 3, uses 2 MiB at most): the decoder
// holds it, from the inputs' budget.
const maxZstdWindow = 8 << 20

// zstdDecoders are the zstd decoders of the forward input, reused.
var zstdDecoders sync.Pool // *zstd.Decoder

// zstdEntries decodes the entries of a CompressedPackedForward payload in
// zstd (one or more frames), as gzipEntries does gzip's. The first frame's
// window, which every frame of the payload must keep within, is held from
// the inputs' budget while it decodes, with what the decoder holds besides.
func (d *decoder) zstdEntries(full, packed []byte) error {
	var h zstd.Header
	if err := h.Decode(packed); err != nil {
		return bad("bad_zstd", full, nil, "compressed entries: %v", err)
	}
	window := h.WindowSize
	if h.SingleSegment { // the frame's content is its window
		window = h.FrameContentSize
	}
	window = max(window, zstd.MinWindowSize)
	if window > maxZstdWindow {
		return bad("bad_zstd", full, nil, "compressed entries: a zstd window of %d bytes, at most %d", window, maxZstdWindow)
	}
	if err := d.hold.Grow(d.context(), int64(window)+zstdDecoderBytes); err != nil {
		return d.budgetErr(err)
	}
	defer d.hold.Release(int64(window) + zstdDecoderBytes)
	zr, _ := zstdDecoders.Get().(*zstd.Decoder)
	if zr == nil {
		var err error
		zr, err = zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true))
		if err != nil {
			return fmt.Errorf("zstd decoder: %w", err)
		}
	}
	// Both bound a frame's window when streaming (MaxMemory that of a
	// frame of one segment).
	if err := zr.ResetWithOptions(bytes.NewReader(packed), zstd.WithDecoderMaxWindow(window), zstd.WithDecoderMaxMemory(window)); err != nil {
		zstdDecoders.Put(zr)
		return bad("bad_zstd", full, nil, "compressed entries: %v", err)
	}
	defer func() {
		zr.Reset(nil) // holds nothing of the message
		zstdDecoders.Put(zr)
	}()
	return d.streamEntries(full, zr, "bad_zstd")
}

// streamEntries decodes entries as they come out of zr, a decompressor
// (reason is what its errors are counted as).
func (d *decoder) streamEntries(full []byte, zr io.Reader, reason string) error {
	defer d.dropWindow()
	var fr framer
	start, total, i := 0, 0, 0 // d.window[start:] is not decoded yet
	for {
		// Decode every entry the window holds whole.
		for start < len(d.window) {
			n, err := fr.next(d.window[start:])
			if err != nil {
				return bad("malformed", full, nil, "packed entry %d: %v", i, err)
			}
			if n == 0 {
				break
			}
			if _, err := d.entry(d.window[start : start+n]); err != nil {
				return d.entryErr(full, nil, "packed entry", i, err)
			}
			start += n
			i++
		}
		// Then read on, behind the rest of an entry.
		pending := len(d.window) - start
		if start > 0 && (pending == 0 || start >= cap(d.window)/2) {
			d.window = d.window[:copy(d.window, d.window[start:])]
			start = 0
		}
		if cap(d.window)-len(d.window) < minRoom {
			size := inputs.BufClass(max(2*cap(d.window), pending+minRoom, 64<<10))
			if err := d.hold.Grow(d.context(), int64(size)); err != nil {
				return d.budgetErr(err)
			}
			grown := append(inputs.GetBuf(size), d.window[start:]...)
			d.dropWindow()
			d.window, start = grown, 0
		}
		n, err := zr.Read(d.window[len(d.window):cap(d.window)])
		d.window = d.window[:len(d.window)+n]
		if total += n; total > d.maxUnpacked {
			return bad(reason, full, nil, "compressed entries: %v (limit %d bytes)", errTooBig, d.maxUnpacked)
		}
		switch {
		case err == io.EOF && start < len(d.window) && n == 0:
			return bad("malformed", full, nil, "packed entry %d: %v", i, msgp.ErrShortBytes)
		case err == io.EOF && n == 0:
			return nil
		case err != nil && err != io.EOF:
			return bad(reason, full, nil, "compressed entries: %v", err)
		}
	}
}
