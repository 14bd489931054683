package forward

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/tinylib/msgp/msgp"

	"github.com/logfwd/forwarder/internal/jsonstr"
)

// transcoder turns a msgpack record into the compact JSON object the WAL
// stores, in one pass and without intermediate maps, so key order is the
// sender's. The rules (doc.go, and README's forward input section):
//   - binary values become base64 strings;
//   - a map key that is not a string becomes its JSON text, as a string
//     (1 → "1", true → "true");
//   - NaN and infinities become null;
//   - EventTime (ext 0) and msgpack timestamps (ext -1) become RFC 3339
//     strings with nanoseconds, UTC; other extension values become base64
//     strings of their data;
//   - invalid UTF-8 in strings is replaced, each byte with the escape
//     \ufffd (U+FFFD), and counted.
//
// The JSON is appended to a buffer that never grows by itself: every
// append makes sure of its room first, and more room comes from grow,
// which reserves it from the inputs' budget (decoder.growJSON).
type transcoder struct {
	invalidUTF8 bool // the last record had invalid UTF-8 replaced
	// grow returns dst, or a copy of it, with room for n more bytes; nil:
	// a copy from the runtime (decoding without a budget). It may leave
	// the front of dst behind (decoder.growJSON, at a record's start):
	// moved counts the bytes it left, so that a position in dst kept
	// across a grow can follow.
	grow  jsonstr.GrowFunc
	moved int
}

// room returns dst with room for n more bytes.
func (t *transcoder) room(dst []byte, n int) ([]byte, error) {
	if cap(dst)-len(dst) >= n {
		return dst, nil
	}
	return t.more(dst, n)
}

func (t *transcoder) more(dst []byte, n int) ([]byte, error) {
	if t.grow == nil {
		return slices.Grow(dst, n), nil
	}
	return t.grow(dst, n)
}

// scalarRoom is room enough for any number, true, false, null, and a time
// as an RFC 3339 string (whose year may take up to 12 digits).
const scalarRoom = 64

// maxKeyText bounds the JSON of a map key that is not a string, which is
// copied twice to be made a string.
const maxKeyText = 64 << 10

var errNotMap = errors.New("record is not a map")

// record appends the JSON of the map at msg to dst and returns the rest.
func (t *transcoder) record(dst, msg []byte) ([]byte, []byte, error) {
	t.invalidUTF8 = false
	if msgp.NextType(msg) != msgp.MapType {
		return dst, msg, errNotMap
	}
	return t.value(dst, msg, 0)
}

func (t *transcoder) value(dst, msg []byte, depth int) ([]byte, []byte, error) {
	if depth > maxDepth {
		return dst, msg, fmt.Errorf("nested deeper than %d levels", maxDepth)
	}
	if s, rest, ok := fixStr(msg); ok {
		dst, err := t.str(dst, s)
		return dst, rest, err
	}
	var err error
	switch msgp.NextType(msg) {
	case msgp.MapType:
		var n uint32
		if n, msg, err = msgp.ReadMapHeaderBytes(msg); err != nil {
			return dst, msg, err
		}
		if dst, err = t.room(dst, 2); err != nil {
			return dst, msg, err
		}
		dst = append(dst, '{')
		for i := uint32(0); i < n; i++ {
			if i > 0 {
				if dst, err = t.room(dst, 1); err != nil {
					return dst, msg, err
				}
				dst = append(dst, ',')
			}
			if dst, msg, err = t.key(dst, msg, depth); err != nil {
				return dst, msg, err
			}
			if dst, err = t.room(dst, 1); err != nil {
				return dst, msg, err
			}
			dst = append(dst, ':')
			if dst, msg, err = t.value(dst, msg, depth+1); err != nil {
				return dst, msg, err
			}
		}
		if dst, err = t.room(dst, 1); err != nil {
			return dst, msg, err
		}
		return append(dst, '}'), msg, nil
	case msgp.ArrayType:
		var n uint32
		if n, msg, err = msgp.ReadArrayHeaderBytes(msg); err != nil {
			return dst, msg, err
		}
		if dst, err = t.room(dst, 1); err != nil {
			return dst, msg, err
		}
		dst = append(dst, '[')
		for i := uint32(0); i < n; i++ {
			if i > 0 {
				if dst, err = t.room(dst, 1); err != nil {
					return dst, msg, err
				}
				dst = append(dst, ',')
			}
			if dst, msg, err = t.value(dst, msg, depth+1); err != nil {
				return dst, msg, err
			}
		}
		if dst, err = t.room(dst, 1); err != nil {
			return dst, msg, err
		}
		return append(dst, ']'), msg, nil
	case msgp.StrType:
		var s []byte
		if s, msg, err = msgp.ReadStringZC(msg); err != nil {
			return dst, msg, err
		}
		dst, err = t.str(dst, s)
		return dst, msg, err
	case msgp.BinType:
		var b []byte
		if b, msg, err = msgp.ReadBytesZC(msg); err != nil {
			return dst, msg, err
		}
		dst, err = t.base64(dst, b)
		return dst, msg, err
	}
	// A scalar, or an extension.
	if dst, err = t.room(dst, scalarRoom); err != nil {
		return dst, msg, err
	}
	switch msgp.NextType(msg) {
	case msgp.IntType:
		var i int64
		if i, msg, err = msgp.ReadInt64Bytes(msg); err != nil {
			return dst, msg, err
		}
		return strconv.AppendInt(dst, i, 10), msg, nil
	case msgp.UintType:
		var u uint64
		if u, msg, err = msgp.ReadUint64Bytes(msg); err != nil {
			return dst, msg, err
		}
		return strconv.AppendUint(dst, u, 10), msg, nil
	case msgp.Float32Type, msgp.Float64Type:
		var f float64
		if f, msg, err = msgp.ReadFloat64Bytes(msg); err != nil {
			return dst, msg, err
		}
		return appendFloat(dst, f), msg, nil
	case msgp.BoolType:
		var b bool
		if b, msg, err = msgp.ReadBoolBytes(msg); err != nil {
			return dst, msg, err
		}
		return strconv.AppendBool(dst, b), msg, nil
	case msgp.NilType:
		if msg, err = msgp.ReadNilBytes(msg); err != nil {
			return dst, msg, err
		}
		return append(dst, "null"...), msg, nil
	default: // extensions, including the types msgp maps onto them
		var typ int8
		var data []byte
		if typ, data, msg, err = readExt(msg); err != nil {
			return dst, msg, err
		}
		if ts, ok := extTime(typ, data); ok {
			dst = append(dst, '"')
			dst = ts.UTC().AppendFormat(dst, time.RFC3339Nano)
			return append(dst, '"'), msg, nil
		}
		dst, err = t.base64(dst, data)
		return dst, msg, err
	}
}

// key appends a map key as a JSON string.
func (t *transcoder) key(dst, msg []byte, depth int) ([]byte, []byte, error) {
	if s, rest, ok := fixStr(msg); ok {
		dst, err := t.str(dst, s)
		return dst, rest, err
	}
	if msgp.NextType(msg) == msgp.StrType {
		s, rest, err := msgp.ReadStringZC(msg)
		if err != nil {
			return dst, msg, err
		}
		dst, err = t.str(dst, s)
		return dst, rest, err
	}
	// Any other key: its JSON text, as a string.
	start, moved := len(dst), t.moved
	dst, rest, err := t.value(dst, msg, depth+1)
	if err != nil {
		return dst, rest, err
	}
	start -= t.moved - moved // dst's front left behind by a grow
	if len(dst)-start > maxKeyText {
		return dst, rest, fmt.Errorf("a map key that is not a string takes %d bytes as JSON, at most %d", len(dst)-start, maxKeyText)
	}
	text := string(dst[start:])
	dst = dst[:start]
	if len(text) > 1 && text[0] == '"' { // a string already (binary, time)
		return append(dst, text...), rest, nil // it was there: the room is
	}
	dst, err = t.str(dst, []byte(text))
	return dst, rest, err
}

func appendFloat(dst []byte, f float64) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return append(dst, "null"...)
	}
	return strconv.AppendFloat(dst, f, 'g', -1, 64)
}

func (t *transcoder) base64(dst, b []byte) ([]byte, error) {
	dst, err := t.room(dst, base64.StdEncoding.EncodedLen(len(b))+2)
	if err != nil {
		return dst, err
	}
	dst = append(dst, '"')
	dst = base64.StdEncoding.AppendEncode(dst, b)
	return append(dst, '"'), nil
}

// str appends s as a JSON string (internal/jsonstr: what JSON requires
// escaped, each byte of invalid UTF-8 as \ufffd), with room from grow only.
func (t *transcoder) str(dst, s []byte) ([]byte, error) {
	dst, replaced, err := jsonstr.AppendGrow(dst, s, t.grow)
	t.invalidUTF8 = t.invalidUTF8 || replaced
	return dst, err
}

// readExt reads any msgpack extension: its type and data.
func readExt(b []byte) (typ int8, data, rest []byte, err error) {
	if len(b) < 2 {
		return 0, nil, b, msgp.ErrShortBytes
	}
	var n, hdr int
	switch b[0] {
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
		n, hdr = 1<<(b[0]-0xd4), 2
	case 0xc7:
		if len(b) < 3 {
			return 0, nil, b, msgp.ErrShortBytes
		}
		n, hdr = int(b[1]), 3
	case 0xc8:
		if len(b) < 4 {
			return 0, nil, b, msgp.ErrShortBytes
		}
		n, hdr = int(binary.BigEndian.Uint16(b[1:])), 4
	case 0xc9:
		if len(b) < 6 {
			return 0, nil, b, msgp.ErrShortBytes
		}
		n, hdr = int(binary.BigEndian.Uint32(b[1:])), 6
	default:
		return 0, nil, b, fmt.Errorf("unexpected msgpack type 0x%02x", b[0])
	}
	if len(b) < hdr+n {
		return 0, nil, b, msgp.ErrShortBytes
	}
	return int8(b[hdr-1]), b[hdr : hdr+n], b[hdr+n:], nil
}

// extTime decodes Fluent's EventTime (ext 0: uint32 seconds, uint32
// nanoseconds, big-endian) and the msgpack timestamp (ext -1).
func extTime(typ int8, d []byte) (time.Time, bool) {
	switch {
	case typ == 0 && len(d) == 8:
		ns := binary.BigEndian.Uint32(d[4:])
		if ns >= 1e9 {
			return time.Time{}, false
		}
		return time.Unix(int64(binary.BigEndian.Uint32(d[:4])), int64(ns)), true
	case typ == -1 && len(d) == 4:
		return time.Unix(int64(binary.BigEndian.Uint32(d)), 0), true
	case typ == -1 && len(d) == 8:
		v := binary.BigEndian.Uint64(d)
		ns := v >> 34
		if ns >= 1e9 {
			return time.Time{}, false
		}
		return time.Unix(int64(v&(1<<34-1)), int64(ns)), true
	case typ == -1 && len(d) == 12:
		ns := binary.BigEndian.Uint32(d[:4])
		if ns >= 1e9 {
			return time.Time{}, false
		}
		return time.Unix(int64(binary.BigEndian.Uint64(d[4:])), int64(ns)), true
	}
	return time.Time{}, false
}

// fixStr returns the string of the msgpack fixstr (up to 31 bytes: most
// keys and many values) at the start of msg, and what follows it; ok is
// false for anything else, a fixstr cut short included, which
// msgp.ReadStringZC then reads (or refuses) as before.
func fixStr(msg []byte) (s, rest []byte, ok bool) {
	if len(msg) == 0 || msg[0]&0xe0 != 0xa0 {
		return nil, msg, false
	}
	n := 1 + int(msg[0]&0x1f)
	if n > len(msg) {
		return nil, msg, false
	}
	return msg[1:n], msg[n:], true
}
