package cloudwatch

import (
	"fmt"
	"strings"
	"testing"

	"github.com/logfwd/forwarder/sinks"
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
			g, changed := appendGroupName([]byte("x\x00"), []byte(n), fb)
			if got, want := string(g), "x\x00"+refGroup(n, fb); got != want || changed != (refGroup(n, fb) != n || n == "") {
				t.Errorf("group %q (fallback %q): %q (changed %v), want %q", n, fb, got, changed, want)
			}
			st, changed := appendStreamName([]byte("x\x00"), []byte(n), fb)
			if got, want := string(st), "x\x00"+refStream(n, fb); got != want || changed != (refStream(n, fb) != n || n == "") {
				t.Errorf("stream %q (fallback %q): %q (changed %v), want %q", n, fb, got, changed, want)
			}
		}
	}
}

// TestPartitionKeysKept: a record's key is its group and stream whether
// the key was kept in its slot or not (more streams than slots, each seen
// twice), and a stream's key seen before is not allocated again.
func TestPartitionKeysKept(t *testing.T) {
	s := newBodySink(t, "http://127.0.0.1:1")
	rec := func(i int) *sinks.Record {
		return &sinks.Record{Tag: "t", Body: fmt.Appendf(nil, `{"log":"x","kubernetes":{"namespace_name":"ns%d","pod_name":"pod:%d"}}`, i%7, i)}
	}
	for range 2 {
		for i := range keySlots + 1000 {
			if got, want := s.Partition(rec(i)), fmt.Sprintf("/eks/ns%d\x00pod_%d-test", i%7, i); got != want {
				t.Fatalf("record %d: key %q, want %q", i, got, want)
			}
		}
	}
	r := rec(3)
	s.Partition(r)
	if n := testing.AllocsPerRun(100, func() { s.Partition(r) }); n != 0 {
		t.Errorf("%v allocations per record of a stream seen before", n)
	}
}
