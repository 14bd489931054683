package httpin

import (
	"encoding/json"
	"errors"
	"fmt"
)

// maxDepth bounds the nesting of objects and arrays in a record. encoding/json
// allows 10000; no log record needs a thousand, and the scanner recurses.
const maxDepth = 1000

var (
	errEOF     = errors.New("unexpected end of JSON input")
	errTooDeep = fmt.Errorf("nesting deeper than %d levels", maxDepth)
)

// strSafe marks the bytes a string can hold that need no second look:
// printable ASCII other than the quote and the backslash.
var strSafe = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// scanner validates JSON (RFC 8259, as strictly as encoding/json) and
// appends it to out without insignificant whitespace, in one pass over the
// input. Of an object scanned at depth 1 it also notes where, in out, the
// value of the top-level key timeField is (the last one, as encoding/json
// would take). It never allocates but for out and for keys with escapes.
type scanner struct {
	data []byte
	pos  int
	out  []byte

	timeField string
	timeStart int  // offset in out of the time field's value; -1: none seen
	timeEnd   int  // end of that value
	nonASCII  bool // a string held a byte >= 0x80 since the caller reset it
	// nonFiniteSeen counts the non-finite numbers read as null (nonFinite);
	// timeNonFinite: the time field's value was one (null now, no time).
	nonFiniteSeen int
	timeNonFinite bool
	// grow makes room in out for n more bytes (from the inputs' budget);
	// nil: out grows as append grows it.
	grow func(n int) error
}

func (s *scanner) skipSpace() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// value scans one value inside a container at depth.
func (s *scanner) value(depth int) error {
	if s.pos >= len(s.data) {
		return errEOF
	}
	switch c := s.data[s.pos]; {
	case c == '{':
		return s.object(depth + 1)
	case c == '[':
		return s.array(depth + 1)
	case c == '"':
		return s.str()
	case c == '-' || c >= '0' && c <= '9':
		if c == '-' && s.pos+1 < len(s.data) && !isDigit(s.data[s.pos+1]) {
			if ok, err := s.nonFinite(); ok || err != nil {
				return err
			}
		}
		return s.number()
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		if ok, err := s.nonFinite(); ok || err != nil {
			return err
		}
		return s.literal("null")
	case c == 'N' || c == 'i' || c == 'I':
		if ok, err := s.nonFinite(); ok || err != nil {
			return err
		}
	}
	return s.badChar(s.pos, "looking for beginning of value")
}

// nonFiniteWords are how senders write a number that is not finite where
// JSON has none: Fluent Bit (printf's %g: nan, -nan, inf, -inf) and
// Python's json (NaN, Infinity, -Infinity).
var nonFiniteWords = []string{"nan", "-nan", "inf", "-inf", "NaN", "-NaN", "Infinity", "-Infinity"}

// nonFinite reads one of nonFiniteWords at s.pos, whole (a delimiter or the
// end after it), as null, as the forward input writes NaN and infinities:
// a sender's one such value would otherwise make its whole request bad
// input. It reports whether it read one. "null" is longer than "nan" and
// "inf": out is grown first (grow) when the rest of the body would no
// longer fit, as compacting never needs otherwise.
func (s *scanner) nonFinite() (bool, error) {
	rest := s.data[s.pos:]
	for _, w := range nonFiniteWords {
		if len(rest) < len(w) || string(rest[:len(w)]) != w {
			continue
		}
		if len(rest) > len(w) {
			switch rest[len(w)] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
			default:
				continue
			}
		}
		if need := len(s.out) + len("null") + len(rest) - len(w); need > cap(s.out) && s.grow != nil {
			if err := s.grow(need - len(s.out)); err != nil {
				return false, err
			}
		}
		s.out = append(s.out, "null"...)
		s.pos += len(w)
		s.nonFiniteSeen++
		return true, nil
	}
	return false, nil
}

// object scans the object at s.pos, which is at depth (1: a record).
func (s *scanner) object(depth int) error {
	if depth > maxDepth {
		return errTooDeep
	}
	s.out = append(s.out, '{')
	s.pos++
	s.skipSpace()
	if s.pos < len(s.data) && s.data[s.pos] == '}' {
		s.out = append(s.out, '}')
		s.pos++
		return nil
	}
	for {
		if s.pos >= len(s.data) {
			return errEOF
		}
		if s.data[s.pos] != '"' {
			return s.badChar(s.pos, "looking for beginning of object key string")
		}
		keyStart := len(s.out)
		if err := s.str(); err != nil {
			return err
		}
		isTime := depth == 1 && s.timeField != "" && s.keyIs(s.out[keyStart:])
		s.skipSpace()
		if s.pos >= len(s.data) {
			return errEOF
		}
		if s.data[s.pos] != ':' {
			return s.badChar(s.pos, "after object key")
		}
		s.out = append(s.out, ':')
		s.pos++
		s.skipSpace()
		valueStart, nonFinite := len(s.out), s.nonFiniteSeen
		if err := s.value(depth); err != nil {
			return err
		}
		if isTime {
			s.timeStart, s.timeEnd = valueStart, len(s.out)
			s.timeNonFinite = s.nonFiniteSeen != nonFinite
		}
		s.skipSpace()
		if s.pos >= len(s.data) {
			return errEOF
		}
		switch s.data[s.pos] {
		case ',':
			s.out = append(s.out, ',')
			s.pos++
			s.skipSpace()
		case '}':
			s.out = append(s.out, '}')
			s.pos++
			return nil
		default:
			return s.badChar(s.pos, "after object key:value pair")
		}
	}
}

func (s *scanner) array(depth int) error {
	if depth > maxDepth {
		return errTooDeep
	}
	s.out = append(s.out, '[')
	s.pos++
	s.skipSpace()
	if s.pos < len(s.data) && s.data[s.pos] == ']' {
		s.out = append(s.out, ']')
		s.pos++
		return nil
	}
	for {
		if err := s.value(depth); err != nil {
			return err
		}
		s.skipSpace()
		if s.pos >= len(s.data) {
			return errEOF
		}
		switch s.data[s.pos] {
		case ',':
			s.out = append(s.out, ',')
			s.pos++
			s.skipSpace()
		case ']':
			s.out = append(s.out, ']')
			s.pos++
			return nil
		default:
			return s.badChar(s.pos, "after array element")
		}
	}
}

// str scans the string at s.pos and copies it, quotes and escapes as they
// are, to out. Bytes >= 0x80 are let through (and noted): invalid UTF-8 is
// replaced per record afterwards, not refused.
func (s *scanner) str() error {
	data := s.data
	start := s.pos
	i := start + 1
	for {
		for i < len(data) && strSafe[data[i]] {
			i++
		}
		if i >= len(data) {
			return errEOF
		}
		switch c := data[i]; {
		case c == '"':
			s.out = append(s.out, data[start:i+1]...)
			s.pos = i + 1
			return nil
		case c == '\\':
			i++
			if i >= len(data) {
				return errEOF
			}
			switch data[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i++
			case 'u':
				for j := i + 1; j <= i+4; j++ {
					if j >= len(data) {
						return errEOF
					}
					if !isHex(data[j]) {
						return s.badChar(j, "in \\u hexadecimal character escape")
					}
				}
				i += 5
			default:
				return s.badChar(i, "in string escape code")
			}
		case c < 0x20:
			return s.badChar(i, "in string literal")
		default:
			s.nonASCII = true
			i++
		}
	}
}

// number scans -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *scanner) number() error {
	data := s.data
	start := s.pos
	i := start
	if data[i] == '-' {
		i++
	}
	if i >= len(data) {
		return errEOF
	}
	switch c := data[i]; {
	case c == '0':
		i++
	case c >= '1' && c <= '9':
		i = digits(data, i+1)
	default:
		return s.badChar(i, "in numeric literal")
	}
	if i < len(data) && data[i] == '.' {
		i++
		if i >= len(data) {
			return errEOF
		}
		if !isDigit(data[i]) {
			return s.badChar(i, "after decimal point in numeric literal")
		}
		i = digits(data, i+1)
	}
	if i < len(data) && (data[i] == 'e' || data[i] == 'E') {
		i++
		if i < len(data) && (data[i] == '+' || data[i] == '-') {
			i++
		}
		if i >= len(data) {
			return errEOF
		}
		if !isDigit(data[i]) {
			return s.badChar(i, "in exponent of numeric literal")
		}
		i = digits(data, i+1)
	}
	s.out = append(s.out, data[start:i]...)
	s.pos = i
	return nil
}

func (s *scanner) literal(lit string) error {
	for j := 0; j < len(lit); j++ {
		i := s.pos + j
		if i >= len(s.data) {
			return errEOF
		}
		if s.data[i] != lit[j] {
			return s.badChar(i, "in literal "+lit)
		}
	}
	s.out = append(s.out, lit...)
	s.pos += len(lit)
	return nil
}

// keyIs reports whether the quoted key (as scanned: valid) names the time field.
func (s *scanner) keyIs(quoted []byte) bool {
	inner := quoted[1 : len(quoted)-1]
	escaped := false
	for _, c := range inner {
		if c == '\\' {
			escaped = true
			break
		}
	}
	if !escaped {
		return string(inner) == s.timeField
	}
	var key string
	if err := json.Unmarshal(quoted, &key); err != nil {
		return false
	}
	return key == s.timeField
}

func (s *scanner) badChar(i int, context string) error {
	return fmt.Errorf("invalid character %s %s", quoteChar(s.data[i]), context)
}

// quoteChar formats c for an error message that goes back to the client:
// printable ASCII as itself, anything else as its value.
func quoteChar(c byte) string {
	switch {
	case c == '\'':
		return `'\''`
	case c >= 0x20 && c < 0x7f:
		return "'" + string(rune(c)) + "'"
	}
	return fmt.Sprintf("byte 0x%02x", c)
}

func digits(data []byte, i int) int {
	for i < len(data) && isDigit(data[i]) {
		i++
	}
	return i
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}
