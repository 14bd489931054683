package wal

import (
	"encoding/binary"
	"math/bits"
)

// uvarint is binary.Uvarint: the same value and length for every input,
// and n <= 0 where it fails. Reading records is mostly reading varints
// (the time of a record takes 9 bytes), so it reads the first 8 bytes at
// once instead of a byte at a time.
func uvarint(b []byte) (uint64, int) {
	if len(b) > 0 && b[0] < 0x80 {
		return uint64(b[0]), 1
	}
	if len(b) < 9 {
		return uvarintSlow(b)
	}
	w := binary.LittleEndian.Uint64(b)
	stop := ^w & 0x8080808080808080 // the high bit of each byte that ends the varint
	if stop == 0 {
		// Not within 8 bytes: 9 bytes hold 63 bits, which always fit.
		if b[8] < 0x80 {
			return pack7(w) | uint64(b[8])<<56, 9
		}
		return uvarintSlow(b)
	}
	n := bits.TrailingZeros64(stop)>>3 + 1
	return pack7(w & (^uint64(0) >> (64 - 8*n))), n
}

// uvarintSlow is binary.Uvarint out of line, for the rare varints near the
// end of the bytes or of 10 bytes: uvarint stays small.
//
//go:noinline
func uvarintSlow(b []byte) (uint64, int) { return binary.Uvarint(b) }

// pack7 joins the low 7 bits of each byte of w (little-endian) into one
// 56-bit number: in lanes of 2, 4, then 8 bytes.
func pack7(w uint64) uint64 {
	w &= 0x7f7f7f7f7f7f7f7f
	w = w&0x007f007f007f007f | (w&0x7f007f007f007f00)>>1
	w = w&0x00003fff00003fff | (w&0x3fff00003fff0000)>>2
	return w&0x000000000fffffff | (w&0x0fffffff00000000)>>4
}

// varint is binary.Varint, by way of uvarint.
func varint(b []byte) (int64, int) {
	ux, n := uvarint(b)
	x := int64(ux >> 1)
	if ux&1 != 0 {
		x = ^x
	}
	return x, n
}
