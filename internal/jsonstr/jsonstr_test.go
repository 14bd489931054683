package jsonstr

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// The rules of the package doc, byte for byte.
func TestRules(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		replaced bool
	}{
		{"", ``, false},
		{"plain text", `plain text`, false},
		{`"`, `\"`, false},
		{`\`, `\\`, false},
		{"\n\r\t", `\n\r\t`, false},
		{"\x00\x01\x1f", `\u0000\u0001\u001f`, false},
		{"\b\f", `\u0008\u000c`, false},
		{"\x7f", "\x7f", false},
		{" /<>&'", ` /<>&'`, false},
		{"\u2028\u2029", "\u2028\u2029", false},
		{"é€😀", "é€😀", false},
		{"\ufffd", "\ufffd", false}, // the sender's own U+FFFD is kept as it is
		{"\xff", `\ufffd`, true},
		{"a\xffb", `a\ufffdb`, true},
		{"\x80", `\ufffd`, true},                               // a stray continuation byte
		{"\xe2\x82", `\ufffd\ufffd`, true},                     // truncated: one per byte
		{"\xe2\x82x", `\ufffd\ufffdx`, true},                   // cut short by ASCII
		{"\xc0\xaf", `\ufffd\ufffd`, true},                     // overlong "/"
		{"\xe0\x80\xaf", `\ufffd\ufffd\ufffd`, true},           // overlong, three bytes
		{"\xed\xa0\x80", `\ufffd\ufffd\ufffd`, true},           // a surrogate
		{"\xf4\x90\x80\x80", `\ufffd\ufffd\ufffd\ufffd`, true}, // above U+10FFFF
		{"\xf5\x80", `\ufffd\ufffd`, true},
		{"\"\xff\n", `\"\ufffd\n`, true},
	} {
		got, replaced := AppendContent([]byte("x"), tc.in)
		if string(got) != "x"+tc.want || replaced != tc.replaced {
			t.Errorf("AppendContent(%q) = %s, %v; want %s, %v", tc.in, got[1:], replaced, tc.want, tc.replaced)
		}
		gotB, replacedB, _ := appendString(nil, []byte(tc.in), nil, false)
		if string(gotB) != tc.want || replacedB != tc.replaced {
			t.Errorf("AppendContent([]byte(%q)) = %s, %v; want %s, %v", tc.in, gotB, replacedB, tc.want, tc.replaced)
		}
		if n := ContentLen(tc.in); n != len(tc.want) {
			t.Errorf("ContentLen(%q) = %d, want %d", tc.in, n, len(tc.want))
		}
		if q, _ := Append(nil, tc.in); string(q) != `"`+tc.want+`"` {
			t.Errorf("Append(%q) = %s", tc.in, q)
		}
	}
}

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
		if load64(w[:], 0) != binary.LittleEndian.Uint64(w[:]) || load64(string(w[:]), 0) != binary.LittleEndian.Uint64(w[:]) {
			t.Fatalf("load64(% x) is not the little-endian word", w)
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

// runeLen takes what utf8.DecodeRune takes: every lead byte with every
// second byte, and the third and fourth bytes around the edges of the
// ranges, whole and cut short.
func TestRuneLen(t *testing.T) {
	edges := []byte{0x00, 0x41, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc2, 0xe0, 0xf4, 0xff}
	check := func(b []byte) {
		r, size := utf8.DecodeRune(b)
		want := size
		if r == utf8.RuneError && size == 1 {
			want = 0
		}
		if got := runeLen(b, 0); got != want {
			t.Fatalf("runeLen(% x) = %d, utf8.DecodeRune gives %d (%U)", b, got, size, r)
		}
		if got := runeLen(string(b), 0); got != want {
			t.Fatalf("runeLen(string % x) = %d, want %d", b, got, want)
		}
	}
	for c0 := 0x80; c0 < 0x100; c0++ {
		check([]byte{byte(c0)})
		for c1 := range 0x100 {
			check([]byte{byte(c0), byte(c1)})
			for _, c2 := range edges {
				check([]byte{byte(c0), byte(c1), c2})
				for _, c3 := range edges {
					check([]byte{byte(c0), byte(c1), c2, c3})
				}
			}
		}
	}
}

// replaced is s with each byte that is not valid UTF-8 replaced by U+FFFD:
// what encoding/json decodes such a byte to.
func replaced(s []byte) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && n == 1 {
			b.WriteRune(utf8.RuneError)
		} else {
			b.Write(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// check tests everything the package promises for s.
func check(t *testing.T, s []byte) {
	t.Helper()
	out, repl, _ := AppendGrow(nil, s, nil)
	if !json.Valid(out) {
		t.Fatalf("Append(%q) = %s: not JSON", s, out)
	}
	var back string
	if err := json.Unmarshal(out, &back); err != nil || back != replaced(s) {
		t.Fatalf("Append(%q) = %s: decodes to %q, %v; want %q", s, out, back, err, replaced(s))
	}
	if repl != !utf8.Valid(s) {
		t.Fatalf("Append(%q) reports replaced = %v", s, repl)
	}
	// encoding/json reads its own encoding of s the same.
	std, _ := json.Marshal(string(s))
	var stdBack string
	if err := json.Unmarshal(std, &stdBack); err != nil || stdBack != back {
		t.Fatalf("%q: encoding/json gives %q, this package %q", s, stdBack, back)
	}
	// What is escaped, and what is not.
	content := out[1 : len(out)-1]
	for i := 0; i < len(content); i++ {
		c := content[i]
		if c < 0x20 {
			t.Fatalf("Append(%q) = %s: control byte %#x written as it is", s, out, c)
		}
		if c == '"' {
			t.Fatalf("Append(%q) = %s: unescaped quote", s, out)
		}
		if c == '\\' {
			i++
			if i == len(content) || !strings.ContainsRune(`"\nrtu`, rune(content[i])) {
				t.Fatalf("Append(%q) = %s: a backslash that is not an escape of the rules", s, out)
			}
			if content[i] == 'u' {
				if e := string(content[i+1 : i+5]); e != "fffd" && (e[:2] != "00" || e[2] > '1') {
					t.Fatalf("Append(%q) = %s: \\u%s escapes what the rules keep as it is", s, out, e)
				}
			}
		}
	}
	for _, kept := range []string{"<", ">", "&", "\x7f", "\u2028", "\u2029", "\ufffd"} {
		if bytes.Count(content, []byte(kept)) != bytes.Count(s, []byte(kept)) {
			t.Fatalf("Append(%q) = %s: %q escaped", s, out, kept)
		}
	}
	if n := ContentLen(string(s)); n != len(content) {
		t.Fatalf("ContentLen(%q) = %d, Append wrote %d", s, n, len(content))
	}
	if str, strRepl := Append(nil, string(s)); !bytes.Equal(str, out) || strRepl != repl {
		t.Fatalf("Append(string %q) = %s, Append([]byte) = %s", s, str, out)
	}
	// AppendGrow, from every spare capacity up to enough: the same bytes,
	// with no room but what grow gave.
	for spare := range len(out) + 2 {
		g := &tightGrower{t: t, last: make([]byte, 1, 1+spare)}
		got, growRepl, err := AppendGrow(g.last, s, g.grow)
		if err != nil {
			t.Fatal(err)
		}
		g.check(got)
		if string(got[1:]) != string(out) || growRepl != repl {
			t.Fatalf("AppendGrow(%q) from %d spare = %s, %v; Append = %s", s, spare, got[1:], growRepl, out)
		}
	}
}

// tightGrower gives AppendGrow exactly the room it asks for, and fails the
// test when the buffer it is handed (or, with check, AppendGrow's output)
// is not the one it gave last: an append that grew the buffer by itself.
type tightGrower struct {
	t    *testing.T
	last []byte
}

func (g *tightGrower) grow(dst []byte, n int) ([]byte, error) {
	g.check(dst)
	g.last = make([]byte, len(dst), len(dst)+n)
	copy(g.last, dst)
	return g.last, nil
}

func (g *tightGrower) check(out []byte) {
	g.t.Helper()
	if cap(out) != cap(g.last) || &out[:1][0] != &g.last[:1][0] {
		g.t.Fatalf("the buffer grew by itself (cap %d, last given %d)", cap(out), cap(g.last))
	}
}

// A failing grow: its error, and nothing appended past the room there was.
func TestAppendGrowError(t *testing.T) {
	errFull := errors.New("full")
	full := func(dst []byte, n int) ([]byte, error) { return dst, errFull }
	dst := make([]byte, 0, 5)
	if out, _, err := AppendGrow(dst, []byte("abc"), full); err != nil || string(out) != `"abc"` {
		t.Errorf("AppendGrow with room enough: %s, %v", out, err)
	}
	for _, s := range []string{"a\"b", strings.Repeat("\n", 10)} {
		dst := make([]byte, 0, len(s)+2)
		if out, _, err := AppendGrow(dst, []byte(s), full); !errors.Is(err, errFull) || cap(out) != cap(dst) {
			t.Errorf("AppendGrow(%q) with a failing grow: %s (cap %d), %v", s, out, cap(out), err)
		}
		if _, _, err := AppendGrow(nil, []byte(s), full); !errors.Is(err, errFull) {
			t.Errorf("AppendGrow(nil, %q): %v, want the grow error", s, err)
		}
	}
	if out, _, err := AppendGrow(nil, []byte("a\x01"), nil); err != nil || string(out) != `"a\u0001"` {
		t.Errorf("AppendGrow with a nil grow: %s, %v", out, err) // Append's
	}
}

// Strings of every length around the eight-byte steps, with a byte that
// needs escaping, is beyond ASCII or is not UTF-8 at every position.
func TestRoundTrip(t *testing.T) {
	for n := range 40 {
		for pos := range n {
			for _, c := range []string{"\"", "\\", "\n", "\x01", "\x1f", "\x7f", "<", "é", "€", "\U0001F600", "\u2028", "\xff", "\xe2\x82", "\xed\xa0\x80"} {
				check(t, []byte(strings.Repeat("x", pos)+c+strings.Repeat("y", n-pos)))
			}
		}
	}
}

func FuzzAppend(f *testing.F) {
	for _, s := range []string{"", "abc", "a\"b\\c", "\n\r\t\x00\x1f", "é€😀", "\xff\xfe", "a\xe2\x82",
		"abcdefgh\xffabcdefgh", "<&>\u2028\u2029", "\xed\xa0\x80\xf4\x90\x80\x80", "0123456789abcdef\x7f\"x"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, s []byte) {
		check(t, s)
	})
}
