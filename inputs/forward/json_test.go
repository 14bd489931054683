package forward

import (
	"encoding/binary"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestPlainWord(t *testing.T) {
	plain := func(b byte) bool { return b >= 0x20 && b != '"' && b != '\\' && b < 0x80 }
	check := func(w [8]byte) {
		want := true
		for _, b := range w {
			want = want && plain(b)
		}
		if got := plainWord(binary.LittleEndian.Uint64(w[:])); got != want {
			t.Fatalf("plainWord(% x) = %v, want %v", w, got, want)
		}
	}
	for v := range 256 {
		for pos := range 8 {
			w := [8]byte{'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a'}
			w[pos] = byte(v)
			check(w)
			w = [8]byte{0x1f, 0x1f, 0x1f, 0x1f, 0x1f, 0x1f, 0x1f, 0x1f} // borrows everywhere
			w[pos] = byte(v)
			check(w)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		var w [8]byte
		for i := range w {
			w[i] = byte(0x18 + rng.IntN(0x70)) // around the edges: 0x18 to 0x87
		}
		check(w)
	}
}

// Strings of every length around the eight-byte steps, with a byte that needs escaping (or
// is not ASCII) at every position, come back unchanged through encoding/json.
func TestStrRoundTrip(t *testing.T) {
	var tc transcoder
	for n := range 40 {
		for pos := range n {
			for _, c := range []string{"\"", "\\", "\n", "\x01", "\x7f", "é", "€", "\U0001F600"} {
				s := strings.Repeat("x", pos) + c + strings.Repeat("y", n-pos)
				out := tc.str(nil, []byte(s))
				var back string
				if err := json.Unmarshal(out, &back); err != nil || back != s {
					t.Fatalf("str(%q) = %s: decoded %q, %v", s, out, back, err)
				}
			}
		}
	}
	if tc.invalidUTF8 {
		t.Fatal("valid UTF-8 flagged as invalid")
	}
	out := tc.str(nil, []byte("abcdefgh\xffabcdefgh"))
	if string(out) != "\"abcdefgh\ufffdabcdefgh\"" || !tc.invalidUTF8 {
		t.Fatalf("invalid byte: %s, flagged %v", out, tc.invalidUTF8)
	}
}
