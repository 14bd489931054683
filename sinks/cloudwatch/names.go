package cloudwatch

import (
	"unicode/utf8"
)

const maxNameLen = 512

// groupName sanitises a rendered log group name.
func groupName(s, fallback string) string {
	b, _ := appendGroupName(nil, []byte(s), fallback)
	return string(b)
}

// streamName sanitises a rendered log stream name.
func streamName(s, fallback string) string {
	b, _ := appendStreamName(nil, []byte(s), fallback)
	return string(b)
}

// appendGroupName appends the log group name name, sanitised: every byte
// outside [.\-_/#A-Za-z0-9] becomes "_", a name starting "aws/" gets a "_"
// before it, and the name is clipped (see clipAppended). changed reports
// whether the name is not name.
func appendGroupName(dst, name []byte, fallback string) (_ []byte, changed bool) {
	start := len(dst)
	if len(name) >= 4 && string(name[:4]) == "aws/" {
		dst, changed = append(dst, '_'), true
	}
	i := 0 // the bytes kept as they are, appended at once
	for i < len(name) && groupByte[name[i]] {
		i++
	}
	dst = append(dst, name[:i]...)
	for _, c := range name[i:] {
		if !groupByte[c] {
			c, changed = '_', true
		}
		dst = append(dst, c)
	}
	dst, clipped := clipAppended(dst, start, fallback)
	return dst, changed || clipped
}

// groupLen is the length of name as appendGroupName makes it, before it
// is clipped.
func groupLen(name []byte) int {
	if len(name) >= 4 && string(name[:4]) == "aws/" {
		return len(name) + 1
	}
	return len(name)
}

// streamLen is the length of name as appendStreamName makes it, before it
// is clipped: each byte of invalid UTF-8 becomes 3.
func streamLen(name []byte) int {
	n := len(name)
	for i := 0; i < len(name); {
		if name[i] < utf8.RuneSelf {
			i++
			continue
		}
		r, size := utf8.DecodeRune(name[i:])
		if r == utf8.RuneError && size == 1 {
			n += 2
		}
		i += size
	}
	return n
}

// groupByte and streamByte are whether a byte is kept as it is in a log
// group name ([.\-_/#A-Za-z0-9]) and in a log stream name (ASCII but ':'
// and '*').
var groupByte, streamByte = func() (g, s [256]bool) {
	for c := range 256 {
		g[c] = c == '.' || c == '-' || c == '_' || c == '/' || c == '#' ||
			c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		s[c] = c < utf8.RuneSelf && c != ':' && c != '*'
	}
	return g, s
}()

// appendStreamName appends the log stream name name, sanitised: ":" and
// "*" become "_", each byte of invalid UTF-8 becomes U+FFFD, and the name
// is clipped (see clipAppended). changed reports whether the name is not
// name.
func appendStreamName(dst, name []byte, fallback string) (_ []byte, changed bool) {
	start := len(dst)
	i := 0 // the bytes kept as they are, appended at once
	for i < len(name) && streamByte[name[i]] {
		i++
	}
	dst = append(dst, name[:i]...)
	name = name[i:]
	for len(name) > 0 {
		c := name[0]
		if c < utf8.RuneSelf {
			if c == ':' || c == '*' {
				c, changed = '_', true
			}
			dst = append(dst, c)
			name = name[1:]
			continue
		}
		r, n := utf8.DecodeRune(name)
		if r == utf8.RuneError && n == 1 {
			dst, changed = utf8.AppendRune(dst, utf8.RuneError), true
		} else {
			dst = append(dst, name[:n]...)
		}
		name = name[n:]
	}
	dst, clipped := clipAppended(dst, start, fallback)
	return dst, changed || clipped
}

// clipAppended makes the name dst[start:] the fallback when it is empty,
// and cuts it to 512 bytes, not within a UTF-8 sequence, when it is longer
// (a name whose values were shortened as far as they go: see
// Sink.partition). changed reports either.
func clipAppended(dst []byte, start int, fallback string) (_ []byte, changed bool) {
	if len(dst) == start {
		dst, changed = append(dst, fallback...), true
	}
	if len(dst)-start > maxNameLen {
		changed = true
		dst = dst[:start+maxNameLen]
		for len(dst) > start && dst[len(dst)-1]&0xc0 == 0x80 { // do not cut a UTF-8 sequence
			dst = dst[:len(dst)-1]
		}
		if len(dst) > start && dst[len(dst)-1] >= 0xc0 {
			dst = dst[:len(dst)-1]
		}
	}
	return dst, changed
}
