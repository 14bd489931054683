package cloudwatch

import (
	"strings"
)

const maxNameLen = 512

// groupName sanitises a rendered log group name.
func groupName(s, fallback string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c == '.' || c == '-' || c == '_' || c == '/' || c == '#' ||
			c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			b[i] = '_'
		}
	}
	s = string(b)
	if strings.HasPrefix(s, "aws/") {
		s = "_" + s
	}
	return clip(s, fallback)
}

// streamName sanitises a rendered log stream name.
func streamName(s, fallback string) string {
	s = strings.Map(func(r rune) rune {
		if r == ':' || r == '*' {
			return '_'
		}
		return r
	}, s)
	return clip(s, fallback)
}

func clip(s, fallback string) string {
	if s == "" {
		s = fallback
	}
	if len(s) > maxNameLen {
		s = s[:maxNameLen]
		for len(s) > 0 && s[len(s)-1]&0xc0 == 0x80 { // do not cut a UTF-8 sequence
			s = s[:len(s)-1]
		}
		if len(s) > 0 && s[len(s)-1] >= 0xc0 {
			s = s[:len(s)-1]
		}
	}
	return s
}
