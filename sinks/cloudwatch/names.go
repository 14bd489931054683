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
	for _, c := range name {
		if !(c == '.' || c == '-' || c == '_' || c == '/' || c == '#' ||
			c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			c = '_'
		}
		dst = append(dst, c)
	}
	return clipAppended(dst, start, fallback)
}

// appendStreamName appends the log stream name name, sanitised: ":" and
// "*" become "_", each byte of invalid UTF-8 becomes U+FFFD, and the name
// is clipped (see clipAppended).
func appendStreamName(dst, name []byte, fallback string) []byte {
	start := len(dst)
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
