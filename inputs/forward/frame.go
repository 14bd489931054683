package forward

import (
	"encoding/binary"
	"fmt"
)

// maxDepth bounds how deeply a message may nest arrays and maps. Records
// nest a few levels; this is far above any real one and keeps a hostile
// message from costing a deep recursion later.
const maxDepth = 512

// framer finds where one msgpack object ends in a byte stream that arrives
// in pieces, without decoding it: it resumes where it stopped when more
// bytes arrive, so a message costs one pass however it is split.
type framer struct {
	pos     int     // bytes of the current object scanned so far
	pending []int64 // elements still due in each open array or map
	started bool
}

// errFrame is malformed framing: a byte that is not a msgpack type.
type errFrame struct {
	offset int
	b      byte
}

func (e errFrame) Error() string {
	return fmt.Sprintf("byte 0x%02x is not a msgpack type", e.b)
}

// next scans buf, which starts with the current object, from where the
// last call stopped. It returns the object's length once it is complete,
// or 0 if more bytes are needed.
func (f *framer) next(buf []byte) (int, error) {
	for {
		if f.started && len(f.pending) == 0 {
			n := f.pos
			*f = framer{pending: f.pending[:0]}
			return n, nil
		}
		if f.pos >= len(buf) {
			return 0, nil
		}
		hdr, payload, elems, ok, err := headerAt(buf[f.pos:])
		if err != nil {
			return 0, errFrame{offset: f.pos, b: buf[f.pos]}
		}
		if !ok || int64(len(buf)-f.pos-hdr) < payload {
			return 0, nil // header or payload incomplete
		}
		f.started = true
		f.pos += hdr + int(payload)
		// This value fills one slot of the innermost open container.
		if len(f.pending) > 0 {
			f.pending[len(f.pending)-1]--
		}
		if elems > 0 {
			if len(f.pending) >= maxDepth {
				return 0, fmt.Errorf("nested deeper than %d levels at byte %d", maxDepth, f.pos)
			}
			f.pending = append(f.pending, elems)
		}
		for len(f.pending) > 0 && f.pending[len(f.pending)-1] == 0 {
			f.pending = f.pending[:len(f.pending)-1]
		}
	}
}

// headerAt reads the msgpack header at b: its length, the length of the
// payload that follows (str, bin, ext bodies and fixed-size scalars), and
// how many elements follow for an array (n) or map (2n). ok is false when
// b is too short to hold the header.
func headerAt(b []byte) (hdr int, payload int64, elems int64, ok bool, err error) {
	t := b[0]
	need := func(n int) bool { return len(b) >= n }
	switch {
	case t <= 0x7f, t >= 0xe0, t == 0xc0, t == 0xc2, t == 0xc3: // fixint, nil, bool
		return 1, 0, 0, true, nil
	case t >= 0x80 && t <= 0x8f: // fixmap
		return 1, 0, 2 * int64(t&0x0f), true, nil
	case t >= 0x90 && t <= 0x9f: // fixarray
		return 1, 0, int64(t & 0x0f), true, nil
	case t >= 0xa0 && t <= 0xbf: // fixstr
		return 1, int64(t & 0x1f), 0, true, nil
	}
	switch t {
	case 0xc4, 0xd9: // bin8, str8
		if !need(2) {
			return 0, 0, 0, false, nil
		}
		return 2, int64(b[1]), 0, true, nil
	case 0xc5, 0xda: // bin16, str16
		if !need(3) {
			return 0, 0, 0, false, nil
		}
		return 3, int64(binary.BigEndian.Uint16(b[1:])), 0, true, nil
	case 0xc6, 0xdb: // bin32, str32
		if !need(5) {
			return 0, 0, 0, false, nil
		}
		return 5, int64(binary.BigEndian.Uint32(b[1:])), 0, true, nil
	case 0xc7: // ext8: len, type
		if !need(3) {
			return 0, 0, 0, false, nil
		}
		return 3, int64(b[1]), 0, true, nil
	case 0xc8: // ext16
		if !need(4) {
			return 0, 0, 0, false, nil
		}
		return 4, int64(binary.BigEndian.Uint16(b[1:])), 0, true, nil
	case 0xc9: // ext32
		if !need(6) {
			return 0, 0, 0, false, nil
		}
		return 6, int64(binary.BigEndian.Uint32(b[1:])), 0, true, nil
	case 0xca, 0xce, 0xd2: // float32, uint32, int32
		return 1, 4, 0, true, nil
	case 0xcb, 0xcf, 0xd3: // float64, uint64, int64
		return 1, 8, 0, true, nil
	case 0xcc, 0xd0: // uint8, int8
		return 1, 1, 0, true, nil
	case 0xcd, 0xd1: // uint16, int16
		return 1, 2, 0, true, nil
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1, 2, 4, 8, 16: type byte + data
		return 2, int64(1) << (t - 0xd4), 0, true, nil
	case 0xdc: // array16
		if !need(3) {
			return 0, 0, 0, false, nil
		}
		return 3, 0, int64(binary.BigEndian.Uint16(b[1:])), true, nil
	case 0xdd: // array32
		if !need(5) {
			return 0, 0, 0, false, nil
		}
		return 5, 0, int64(binary.BigEndian.Uint32(b[1:])), true, nil
	case 0xde: // map16
		if !need(3) {
			return 0, 0, 0, false, nil
		}
		return 3, 0, 2 * int64(binary.BigEndian.Uint16(b[1:])), true, nil
	case 0xdf: // map32
		if !need(5) {
			return 0, 0, 0, false, nil
		}
		return 5, 0, 2 * int64(binary.BigEndian.Uint32(b[1:])), true, nil
	}
	return 0, 0, 0, false, fmt.Errorf("0xc1 is never used")
}
