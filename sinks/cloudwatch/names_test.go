package cloudwatch

import (
	"strings"
	"testing"
)

// TestPartitionNamesAsBefore: log group and stream names sanitised into
// the key in place are those the string functions made before (kept here
// as the reference), for names with every kind of byte: invalid UTF-8,
// "aws/", ":" and "*", empty names, names and fallbacks past 512 bytes
// that end within a UTF-8 sequence.
func TestPartitionNamesAsBefore(t *testing.T) {
	refClip := func(s, fallback string) string {
		if s == "" {
			s = fallback
		}
		if len(s) > maxNameLen {
			s = s[:maxNameLen]
			for len(s) > 0 && s[len(s)-1]&0xc0 == 0x80 {
				s = s[:len(s)-1]
			}
			if len(s) > 0 && s[len(s)-1] >= 0xc0 {
				s = s[:len(s)-1]
			}
		}
		return s
	}
	refGroup := func(s, fallback string) string {
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
		return refClip(s, fallback)
	}
	refStream := func(s, fallback string) string {
		return refClip(strings.Map(func(r rune) rune {
			if r == ':' || r == '*' {
				return '_'
			}
			return r
		}, s), fallback)
	}
	names := []string{"", "a", "aws/x", "aws", "/eks/a b:c*d", "pod:1*2", "ok-é", "bad\xffutf8\xc3", "\xe6\x97", "日本語/ß",
		strings.Repeat("g", 600), strings.Repeat("é", 300), strings.Repeat("g", 511) + "é", strings.Repeat("g", 510) + "日x",
		"aws/" + strings.Repeat("a", 510), strings.Repeat("\xff", 200)}
	for c := range 256 { // every byte value, first, inside and last
		names = append(names, string(rune(c)), string([]byte{byte(c), 'a'}), "ab-"+string([]byte{byte(c)})+"-cd", "abc"+string([]byte{byte(c)}))
	}
	for _, fb := range []string{"unknown", strings.Repeat("é", 260), ""} {
		for _, n := range names {
			if got, want := string(appendGroupName([]byte("x\x00"), []byte(n), fb)), "x\x00"+refGroup(n, fb); got != want {
				t.Errorf("group %q (fallback %q): %q, want %q", n, fb, got, want)
			}
			if got, want := string(appendStreamName([]byte("x\x00"), []byte(n), fb)), "x\x00"+refStream(n, fb); got != want {
				t.Errorf("stream %q (fallback %q): %q, want %q", n, fb, got, want)
			}
		}
	}
}
