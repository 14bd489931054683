package cloudwatch

import (
	"unicode/utf8"
)

const maxNameLen = 512

// groupName sanitises a rendered log group name.
func groupName(s, fallback string) string {
	return string(appendGroupName(nil, []byte(s), fallback))
}

// streamName sanitises a rendered log stream name.
func streamName(s, fallback string) string {
	return string(appendStreamName(nil, []byte(s), fallback))
}

// appendGroupName appends the log group name name, sanitised: every byte
// outside [.\-_/#A-Za-z0-9] becomes "_", a name starting "aws/" gets a "_"
// before it, and the name is clipped (see clipAppended).
func appendGroupName(dst, name []byte, fallback string) []byte {
	start := len(dst)
	if len(name) >= 4 && string(name[:4]) == "aws/" {
		dst = append(dst, '_')
	}
	i := 0 // the bytes kept as they are, appended at once
	for i < len(name) && groupByte[name[i]] {
		i++
	}
	dst = append(dst, name[:i]...)
	for _, c := range name[i:] {
		if !groupByte[c] {
			c = '_'
		}
		dst = append(dst, c)
	}
	return clipAppended(dst, start, fallback)
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
// is clipped (see clipAppended).
func appendStreamName(dst, name []byte, fallback string) []byte {
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
				c = '_'
			}
			dst = append(dst, c)
			name = name[1:]
			continue
		}
		r, n := utf8.DecodeRune(name)
		if r == utf8.RuneError && n == 1 {
			dst = utf8.AppendRune(dst, utf8.RuneError)
		} else {
			dst = append(dst, name[:n]...)
		}
		name = name[n:]
	}
	return clipAppended(dst, start, fallback)
}

// clipAppended makes the name dst[start:] the fallback when it is empty,
// and cuts it to 512 bytes, not within a UTF-8 sequence, when it is longer.
func clipAppended(dst []byte, start int, fallback string) []byte {
	if len(dst) == start {
		dst = append(dst, fallback...)
	}
	if len(dst)-start > maxNameLen {
		dst = dst[:start+maxNameLen]
		for len(dst) > start && dst[len(dst)-1]&0xc0 == 0x80 { // do not cut a UTF-8 sequence
			dst = dst[:len(dst)-1]
		}
		if len(dst) > start && dst[len(dst)-1] >= 0xc0 {
			dst = dst[:len(dst)-1]
		}
	}
	return dst
}
