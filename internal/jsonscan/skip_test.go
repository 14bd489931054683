package jsonscan

import (
	"bytes"
	"testing"
)

// oldSkipString is SkipString as it was before indexQuote: bytes.IndexByte
// for each quote.
func oldSkipString(b []byte, i int) int {
	for j := i + 1; ; {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return -1
		}
		j += k
		n := 0
		for m := j - 1; m > i && b[m] == '\\'; m-- {
			n++
		}
		if n%2 == 0 {
			return j + 1
		}
		j++
	}
}

// skipStringCases are strings of every length around the 8-byte words and
// the shortString bytes that indexQuote looks through before
// bytes.IndexByte, with quotes, backslash runs and the end of the input
// at each place.
func skipStringCases() [][]byte {
	var out [][]byte
	for n := range shortString + 20 {
		for _, tail := range []string{`"`, `",`, `"}` + "        ", ``, `\"`, `\\"x"`, `\\\"x"`, `\`} {
			for _, pad := range []int{0, 3, 8, 40} {
				b := []byte(`"`)
				for k := range n {
					b = append(b, 'a'+byte(k%26))
				}
				b = append(b, tail...)
				b = append(b, bytes.Repeat([]byte("x"), pad)...)
				out = append(out, b)
				if n > 0 {
					c := bytes.Clone(b)
					c[1+n/2] = '\\'
					out = append(out, c)
					c = bytes.Clone(b)
					c[1+n/2] = '"'
					out = append(out, c)
				}
			}
		}
	}
	return out
}

func TestSkipStringMatchesOld(t *testing.T) {
	for _, b := range skipStringCases() {
		for i := range b {
			if b[i] != '"' {
				continue
			}
			if got, want := SkipString(b, i), oldSkipString(b, i); got != want {
				t.Fatalf("SkipString(%q, %d) = %d, was %d", b, i, got, want)
			}
		}
	}
}

func FuzzSkipString(f *testing.F) {
	for _, b := range skipStringCases()[:64] {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for i := range b {
			if b[i] != '"' {
				continue
			}
			if got, want := SkipString(b, i), oldSkipString(b, i); got != want {
				t.Fatalf("SkipString(%q, %d) = %d, was %d", b, i, got, want)
			}
		}
	})
}

// checkSkipKey checks SkipKey against SkipString and a look for a
// backslash in the string, as the template Finder did before SkipKey.
func checkSkipKey(t *testing.T, b []byte, i int) {
	t.Helper()
	end, escaped := SkipKey(b, i)
	if want := SkipString(b, i); end != want {
		t.Fatalf("SkipKey(%q, %d) = %d, SkipString %d", b, i, end, want)
	}
	if end >= 0 && escaped != (bytes.IndexByte(b[i+1:end-1], '\\') >= 0) {
		t.Fatalf("SkipKey(%q, %d): escaped %v", b, i, escaped)
	}
}

func TestSkipKey(t *testing.T) {
	for _, b := range skipStringCases() {
		for i := range b {
			if b[i] == '"' {
				checkSkipKey(t, b, i)
			}
		}
	}
}

func FuzzSkipKey(f *testing.F) {
	for _, b := range skipStringCases()[:64] {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for i := range b {
			if b[i] == '"' {
				checkSkipKey(t, b, i)
			}
		}
	})
}
