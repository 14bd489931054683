package wal

import (
	"encoding/binary"
	"math"
	"math/rand"
	"testing"
)

// TestUvarint: uvarint and varint read every input as binary.Uvarint and
// binary.Varint do: the encodings of values of every length, each cut
// short, followed by more bytes or by continuation bytes, and random bytes.
func TestUvarint(t *testing.T) {
	check := func(b []byte) {
		t.Helper()
		wx, wn := binary.Uvarint(b)
		gx, gn := uvarint(b)
		if wn > 0 && (gx != wx || gn != wn) || wn <= 0 && gn > 0 {
			t.Fatalf("uvarint(% x) = %d, %d; binary.Uvarint: %d, %d", b, gx, gn, wx, wn)
		}
		sx, sn := binary.Varint(b)
		vx, vn := varint(b)
		if sn > 0 && (vx != sx || vn != sn) || sn <= 0 && vn > 0 {
			t.Fatalf("varint(% x) = %d, %d; binary.Varint: %d, %d", b, vx, vn, sx, sn)
		}
	}
	r := rand.New(rand.NewSource(1))
	var values []uint64
	for s := 0; s < 64; s++ {
		v := uint64(1) << s
		values = append(values, v-1, v, v+1, v|r.Uint64()>>(63-s))
	}
	values = append(values, math.MaxUint64, math.MaxUint64-1, uint64(math.MaxInt64))
	tails := [][]byte{nil, {0}, {0x80}, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, {0x7f, 1, 2, 3, 4, 5, 6, 7, 8, 9}}
	for _, v := range values {
		enc := binary.AppendUvarint(nil, v)
		for _, tail := range tails {
			b := append(append([]byte{}, enc...), tail...)
			for i := 0; i <= len(b); i++ {
				check(b[:i])
			}
		}
	}
	// Too long, or a 10th byte that overflows.
	for n := 8; n <= 12; n++ {
		for _, last := range []byte{0, 1, 2, 0x7f} {
			b := make([]byte, n)
			for i := range b {
				b[i] = 0x80 | byte(r.Intn(128))
			}
			b[n-1] = last
			check(b)
		}
	}
	for range 200000 {
		b := make([]byte, r.Intn(14))
		for i := range b {
			// Mostly continuation bytes, so that long varints are common.
			b[i] = byte(r.Intn(256))
			if r.Intn(4) != 0 {
				b[i] |= 0x80
			}
		}
		check(b)
	}
}
