// Package jsonscan finds members of JSON objects without decoding them:
// record bodies are compact JSON objects produced by the inputs, and the
// sinks and templates need one or two fields of each, many times a second.
package jsonscan

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math/bits"
)

// member returns the value of key in the object obj.
func Member(obj []byte, key string) ([]byte, bool) {
	i := SkipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return nil, false
	}
	i++
	for {
		i = SkipSpace(obj, i)
		if i >= len(obj) || obj[i] == '}' {
			return nil, false
		}
		if obj[i] != '"' {
			return nil, false
		}
		kEnd := SkipString(obj, i)
		if kEnd < 0 {
			return nil, false
		}
		k := obj[i:kEnd]
		i = SkipSpace(obj, kEnd)
		if i >= len(obj) || obj[i] != ':' {
			return nil, false
		}
		i = SkipSpace(obj, i+1)
		vEnd := SkipValue(obj, i)
		if vEnd < 0 {
			return nil, false
		}
		if KeyEquals(k, key) {
			return obj[i:vEnd], true
		}
		i = SkipSpace(obj, vEnd)
		if i < len(obj) && obj[i] == ',' {
			i++
		}
	}
}

// keyEquals compares a quoted JSON key with key.
func KeyEquals(quoted []byte, key string) bool {
	raw := quoted[1 : len(quoted)-1]
	for _, c := range raw {
		if c == '\\' {
			s, ok := Unquote(quoted)
			return ok && string(s) == key
		}
	}
	return string(raw) == key
}

func Unquote(q []byte) ([]byte, bool) {
	raw := q[1 : len(q)-1]
	escaped := false
	for _, c := range raw {
		if c == '\\' {
			escaped = true
			break
		}
	}
	if !escaped {
		return raw, true
	}
	var s string
	if err := json.Unmarshal(q, &s); err != nil {
		return nil, false
	}
	return []byte(s), true
}

func SkipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

func TrimSpace(b []byte) []byte {
	i := SkipSpace(b, 0)
	j := len(b)
	for j > i && (b[j-1] == ' ' || b[j-1] == '\t' || b[j-1] == '\n' || b[j-1] == '\r') {
		j--
	}
	return b[i:j]
}

// skipString returns the index after the string starting at b[i] == '"'.
func SkipString(b []byte, i int) int {
	for j := i + 1; ; {
		k := indexQuote(b, j)
		if k < 0 {
			return -1
		}
		j = k
		// The quote ends the string unless an odd run of backslashes escapes it.
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

// SkipKey is SkipString, also reporting whether the string holds a
// backslash: an object's key, compared as it is when it holds none.
func SkipKey(b []byte, i int) (end int, escaped bool) {
	j := i + 1
	for ; j+8 <= len(b); j += 8 {
		w := binary.LittleEndian.Uint64(b[j:])
		if m := zeroBytes(w^(ones*'"')) | zeroBytes(w^(ones*'\\')); m != 0 {
			j += bits.TrailingZeros64(m) >> 3
			if b[j] == '"' {
				return j + 1, false
			}
			return SkipString(b, i), true
		}
	}
	for ; j < len(b); j++ {
		switch b[j] {
		case '"':
			return j + 1, false
		case '\\':
			return SkipString(b, i), true
		}
	}
	return -1, false
}

// ones has a 1 in each byte: ones*c has c in each.
const ones = 0x0101010101010101

// zeroBytes has the top bit set of the lowest zero byte of w (and perhaps
// of bytes above it, never below).
func zeroBytes(w uint64) uint64 { return (w - ones) &^ w & (ones * 0x80) }

// shortString is how far indexQuote looks 8 bytes at a time before
// bytes.IndexByte, whose call and setup cost more than a short string.
const shortString = 32

// indexQuote returns the index of the first '"' in b[j:] (from 0 of b), or -1.
func indexQuote(b []byte, j int) int {
	for end := min(len(b), j+shortString); j+8 <= end; j += 8 {
		if m := zeroBytes(binary.LittleEndian.Uint64(b[j:]) ^ (ones * '"')); m != 0 {
			return j + bits.TrailingZeros64(m)>>3
		}
	}
	k := bytes.IndexByte(b[j:], '"')
	if k < 0 {
		return -1
	}
	return j + k
}

// skipValue returns the index after the JSON value starting at i, or -1.
func SkipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return SkipString(b, i)
	case '{', '[':
		return SkipNested(b, i, 0)
	default: // number, true, false, null
		j := i
		for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\n' && b[j] != '\t' && b[j] != '\r' {
			j++
		}
		if j == i {
			return -1
		}
		return j
	}
}

// SkipNested returns the index after the object or array that SkipValue
// is skipping at b[j] with depth brackets open, or -1: it counts the
// brackets, '{' and '[' as one, '}' and ']' as one, outside strings.
func SkipNested(b []byte, j, depth int) int {
	for ; j < len(b); j++ {
		switch b[j] {
		case '"':
			if j = SkipString(b, j); j < 0 {
				return -1
			}
			j--
		case '{', '[':
			depth++
		case '}', ']':
			if depth--; depth == 0 {
				return j + 1
			}
		}
	}
	return -1
}
