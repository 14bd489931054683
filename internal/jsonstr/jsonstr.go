// Package jsonstr writes JSON strings. It is the project's one string
// escaper: the forward input's msgpack-to-JSON transcoder writes every
// string of a record body with it, and the S3 sink the tag it adds to a
// line under tag_key and the names of time_key and tag_key.
//
// # Rules
//
//   - `"` and `\` are written `\"` and `\\`;
//   - newline, carriage return and tab are written `\n`, `\r` and `\t`, the
//     other bytes below 0x20 `\u00XX` with lower-case hex digits (backspace
//     and form feed too: `\u0008`, `\u000c`);
//   - every other valid UTF-8 sequence is written as it is: DEL (0x7f),
//     `<`, `>`, `&`, U+2028 and U+2029 included. JSON does not ask for
//     their escapes (encoding/json writes the last five escaped by default,
//     for HTML and JavaScript), record bodies and JSON lines are not HTML,
//     and escaping them would change the bytes of bodies and lines that
//     were written without;
//   - each byte that does not belong to a valid UTF-8 sequence (the bytes
//     utf8.DecodeRune decodes as RuneError of length 1: stray continuation
//     bytes, truncated sequences, overlong forms, surrogates, code points
//     above U+10FFFF) is written as the escape `\ufffd`, six ASCII bytes,
//     which a JSON decoder reads as U+FFFD. The functions report whether
//     they replaced a byte, for the inputs' count of records with invalid
//     UTF-8 (forwarder_input_invalid_utf8_records_total).
//
// # Why the escape `\ufffd` and not U+FFFD itself
//
// An S3 object's bytes are a pure function of its records: after a crash,
// the sink rebuilds the object of each intent from the WAL and checks the
// lines against the length and CRC-32C the intent recorded before it
// uploads again under the same key, where the conditional write compares
// SHA-256s (sinks/s3sink doc.go). A line is the body as stored plus the time
// and the tag; the tag is escaped here. The S3 line builder always wrote
// `\ufffd` for invalid UTF-8, and a WAL written before the inputs refused
// such tags can hold forward records whose tags have it: writing U+FFFD
// itself instead would rebuild those lines into other bytes, and an intent
// an older binary left would fail its lines check at start. With `\ufffd`
// every line is rebuilt byte for byte across the upgrade.
//
// The forward transcoder wrote U+FFFD itself. Its output is made once, at
// ingest, and stored: a body in the WAL keeps its bytes, the sinks ship
// those, and only records received after an upgrade get the escape. The
// escape also tells a replaced byte from a U+FFFD the sender wrote, which
// is written as it is, and it is what encoding/json's Marshal writes.
//
// # Speed
//
// Strings are scanned eight bytes at a time while no byte of the eight
// needs escaping or is beyond ASCII, then a byte at a time with a table up
// to the byte that stopped them (the end of most strings), and copied in
// runs between escapes.
package jsonstr

import (
	"unicode/utf8"
)

// text is what the scan takes: the exported functions are not generic, so
// that a call from another package is one call, not two.
type text interface{ ~string | ~[]byte }

// replacement is what each byte of invalid UTF-8 becomes.
const replacement = `\ufffd`

// maxEscape is the longest that one byte of a string becomes.
const maxEscape = 6

// Append appends s to dst as a JSON string, quotes included, and reports
// whether it replaced invalid UTF-8.
func Append(dst []byte, s string) ([]byte, bool) {
	dst, replaced, _ := appendString(dst, s, nil, true)
	return dst, replaced
}

// AppendContent appends s to dst escaped for a JSON string, without the
// quotes, and reports whether it replaced invalid UTF-8.
func AppendContent(dst []byte, s string) ([]byte, bool) {
	dst, replaced, _ := appendString(dst, s, nil, false)
	return dst, replaced
}

// GrowFunc returns dst, or a copy of it, with room for n more bytes.
type GrowFunc func(dst []byte, n int) ([]byte, error)

// AppendGrow appends s to dst as Append does, for callers that account for
// the memory they use: dst gets more room only from grow, never from
// append. It asks for room for s as it is and the quotes, then, when an
// escape does not fit, for the rest of s with one escape: a string is
// never given six times its length up front. An error of grow is returned
// as it is, with dst as it was when grow failed. With a nil grow, dst
// grows as append grows it.
func AppendGrow(dst, s []byte, grow GrowFunc) ([]byte, bool, error) {
	return appendString(dst, s, grow, true)
}

// ContentLen is the length of what AppendContent appends for s.
func ContentLen(s string) int {
	n, start := 0, 0
	for {
		i := next(s, start)
		n += i - start
		if i == len(s) {
			return n
		}
		n += len(escapes[s[i]])
		start = i + 1
	}
}

// appendString appends s escaped, in quotes or not. With grow (AppendGrow,
// always quoted), dst has room for what is left of s and the closing
// quote, and keeps it: an escape that would take more makes room first.
func appendString[T text](dst []byte, s T, grow GrowFunc, quoted bool) ([]byte, bool, error) {
	if grow != nil && cap(dst)-len(dst) < len(s)+2 {
		var err error
		if dst, err = grow(dst, len(s)+2); err != nil {
			return dst, false, err
		}
	}
	if quoted {
		dst = append(dst, '"')
	}
	// The scan of next, inline: most strings are short, and a call per
	// string and per escape shows in the forward transcoder.
	replaced := false
	start := 0
	for i := 0; i < len(s); {
		for i+8 <= len(s) && plainWord(load64(s, i)) {
			i += 8
		}
		// Then a byte at a time up to the byte that stopped the words (or
		// to the end, fewer than eight bytes away).
		for i < len(s) && plainByte[s[i]] {
			i++
		}
		if i == len(s) {
			break
		}
		c := s[i]
		if c >= utf8.RuneSelf {
			if n := runeLen(s, i); n > 0 {
				i += n
				continue
			}
		}
		esc := escapes[c]
		// s[start:i], the escape, the rest after i and the quote.
		if grow != nil && cap(dst)-len(dst) < len(s)-start+len(esc) {
			var err error
			if dst, err = grow(dst, len(s)-start+maxEscape); err != nil {
				return dst, replaced, err
			}
		}
		dst = append(dst, s[start:i]...)
		dst = append(dst, esc...)
		replaced = replaced || c >= utf8.RuneSelf
		i++
		start = i
	}
	dst = append(dst, s[start:]...)
	if quoted {
		dst = append(dst, '"')
	}
	return dst, replaced, nil
}

// next returns the index of the first byte of s at or after i that is not
// written as it is, or len(s). appendContent has the same scan.
func next[T text](s T, i int) int {
	for i < len(s) {
		// Eight bytes at a time while none needs escaping or is beyond ASCII.
		for i+8 <= len(s) && plainWord(load64(s, i)) {
			i += 8
		}
		if i == len(s) {
			break
		}
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == '"' || c == '\\' {
				return i
			}
			i++
			continue
		}
		n := runeLen(s, i)
		if n == 0 {
			return i
		}
		i += n
	}
	return len(s)
}

// plainByte is whether a byte is written as it is on its own: ASCII from
// 0x20, but for `"` and `\`.
var plainByte = func() (p [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		p[c] = c != '"' && c != '\\'
	}
	return p
}()

// escapes holds the escape of each byte that next stops at: the control
// characters, `"` and `\`, and, for every byte from 0x80, the replacement
// (next stops at such a byte only when it is not part of valid UTF-8).
var escapes = func() (e [256]string) {
	const hex = "0123456789abcdef"
	for c := range 0x20 {
		e[c] = `\u00` + string(hex[c>>4]) + string(hex[c&0xf])
	}
	e['\n'], e['\r'], e['\t'] = `\n`, `\r`, `\t`
	e['"'], e['\\'] = `\"`, `\\`
	for c := utf8.RuneSelf; c < 256; c++ {
		e[c] = replacement
	}
	return e
}()

const (
	lowBits  = 0x0101010101010101
	highBits = 0x8080808080808080
)

// plainWord reports whether none of the eight bytes in x is a control
// character, '"', '\\' or a byte of 0x80 or above: bytes a JSON string
// takes as they are. A byte b is zero exactly when (b-1) &^ b has its high
// bit set and no lower byte borrowed; a borrow only happens above a byte
// that is itself a match, so "none" is exact.
func plainWord(x uint64) bool {
	ctl := (x - lowBits*0x20) &^ x
	q := x ^ (lowBits * '"')
	bs := x ^ (lowBits * '\\')
	return (ctl|(q-lowBits)&^q|(bs-lowBits)&^bs|x)&highBits == 0
}

// load64 is the little-endian word at s[i:i+8].
func load64[T text](s T, i int) uint64 {
	s = s[i : i+8]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// runeLen returns the length of the valid UTF-8 sequence that begins at
// s[i], a byte of 0x80 or above, or 0 when there is none: where
// utf8.DecodeRune returns RuneError of length 1. The ranges are those of
// the Unicode standard's table of well-formed sequences.
func runeLen[T text](s T, i int) int {
	c := s[i]
	lo, hi := byte(0x80), byte(0xbf) // the second byte's range
	var n int
	switch {
	case c < 0xc2: // a continuation byte, or the lead of an overlong form
		return 0
	case c < 0xe0:
		n = 2
	case c < 0xf0:
		n = 3
		if c == 0xe0 {
			lo = 0xa0 // overlong below
		} else if c == 0xed {
			hi = 0x9f // surrogates above
		}
	case c < 0xf5:
		n = 4
		if c == 0xf0 {
			lo = 0x90 // overlong below
		} else if c == 0xf4 {
			hi = 0x8f // above U+10FFFF
		}
	default:
		return 0
	}
	if len(s)-i < n {
		return 0
	}
	if b := s[i+1]; b < lo || b > hi {
		return 0
	}
	for j := i + 2; j < i+n; j++ {
		if b := s[j]; b < 0x80 || b > 0xbf {
			return 0
		}
	}
	return n
}
