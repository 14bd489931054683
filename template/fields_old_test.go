package template

import (
	"bytes"
	"strings"
	"testing"

	"github.com/logfwd/forwarder/internal/jsonscan"
)

// oldFind is Finder.Find as it was before scanObject and SkipKey: each
// value skipped with jsonscan.SkipValue, then an object scanned again
// within its end; a key's backslash looked for with bytes.IndexByte.
func oldFind(paths [][]string, body []byte) [maxFound]foundValue {
	var out [maxFound]foundValue
	var pend [maxFound]int8
	for i := range paths {
		pend[i] = int8(i)
	}
	oldScan(paths, body, 0, pend, len(paths), &out)
	for i := range paths {
		if fv := &out[i]; fv.ok {
			fv.v, fv.ok = scalarText(jsonscan.TrimSpace(fv.v)) // objects and arrays are no longer values
		}
	}
	return out
}

func oldScan(paths [][]string, obj []byte, depth int, idx [maxFound]int8, n int, out *[maxFound]foundValue) {
	i := jsonscan.SkipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return
	}
	i++
	left := n
	for left > 0 {
		i = jsonscan.SkipSpace(obj, i)
		if i >= len(obj) || obj[i] != '"' {
			return
		}
		kEnd := jsonscan.SkipString(obj, i)
		if kEnd < 0 {
			return
		}
		k := obj[i:kEnd]
		i = jsonscan.SkipSpace(obj, kEnd)
		if i >= len(obj) || obj[i] != ':' {
			return
		}
		i = jsonscan.SkipSpace(obj, i+1)
		vEnd := jsonscan.SkipValue(obj, i)
		if vEnd < 0 {
			return
		}
		raw := k[1 : len(k)-1]
		escaped := bytes.IndexByte(raw, '\\') >= 0
		var sub [maxFound]int8
		m := 0
		for j, x := range idx[:n] {
			if x < 0 {
				continue
			}
			key := paths[x][depth]
			if escaped && !jsonscan.KeyEquals(k, key) || !escaped && string(raw) != key {
				continue
			}
			idx[j] = -1
			left--
			if len(paths[x]) == depth+1 {
				out[x] = foundValue{obj[i:vEnd], true}
			} else {
				sub[m] = x
				m++
			}
		}
		if m > 0 {
			oldScan(paths, obj[i:vEnd], depth+1, sub, m, out)
		}
		i = jsonscan.SkipSpace(obj, vEnd)
		if i < len(obj) && obj[i] == ',' {
			i++
		}
	}
}

// findMatchesOld checks that a Finder of paths finds in body what it
// found before scanObject and SkipKey.
func findMatchesOld(t *testing.T, body []byte, paths ...[]string) {
	t.Helper()
	var tps []*Template
	for _, p := range paths {
		tps = append(tps, &Template{parts: []part{{kind: field, path: p}}})
	}
	f := NewFinder(tps...)
	var fs Fields
	f.Find(body, &fs)
	want := oldFind(f.paths, body)
	for i := range f.paths {
		got := fs.vals[i]
		if got.ok != want[i].ok || !bytes.Equal(got.v, want[i].v) {
			t.Fatalf("body %q, path %q: found %q %v, before %q %v", body, f.paths[i], got.v, got.ok, want[i].v, want[i].ok)
		}
	}
}

var oldFindBodies = []string{
	`{"log":"x","stream":"stdout","kubernetes":{"namespace_name":"shop","pod_name":"web-1"},"id":"1"}`,
	`{"kubernetes":{"namespace_name":"shop","pod_name":"web-1","labels":{"app":"x","b":[1,{"c":"}"}]},"n":1}}`,
	`{"kubernetes":{"a":x{,"pod_name":"b"}}`,
	`{"kubernetes":{"a":x{,"pod_name":"b"}}}`,
	`{"kubernetes":{"a":t"}","pod_name":"b"},"kubernetes":{"pod_name":"c"}}`,
	`{"kubernetes":{"a":x[,"pod_name":"b"}]}`,
	`{"kubernetes":{"pod_name":"b"]}`,
	`{"kubernetes":{"pod_name":"b"]},"id":"1"}`,
	`{"kubernetes":{"pod_name":"b",x:1}}`,
	`{"kubernetes":{"pod_name":"b",x:1}},"id":"2"}`,
	`{"kubernetes":{"pod_name":"b","namespace_name":"c",x:1}}`,
	`{"kubernetes":{"pod_name":"b","namespace_name":"c"],"id":"3"}`,
	`{"kubernetes":{"pod_name":"b","namespace_name":"c","x":"}`,
	`{"kubernetes":{"pod_name":"b","namespace_name":"c"`,
	`{"kubernetes":{"pod_name":"b"`,
	`{"kubernetes":{"pod_name":{"x":"y"}},"id":"4"}`,
	`{"kubernetes":{"pod_name":{"x":"y"],"id":"5"}`,
	`{"kubernetes":{"pod_name":"b" "namespace_name":"c"} "id":"6"}`,
	`{"kubernetes" : { "pod_name" : "b" , "namespace_name" : "c" } , "id" : 7 }`,
	`{"kubernetes":{"pod_name":1,"namespace_name":null,"q":tr"ue}`,
	`{"kubernetes":{"q":,"pod_name":"b"},"id":"8"}`,
	`{"kubernetes":{"q":}"pod_name":"b"},"id":"9"}`,
	`{"kubernetes":{"pod\u005fname":"b\"c","namespace_name":"d\\"}}`,
	`{"kubernetes":{"pod_name":"b"}}}}`,
	`{"kubernetes":[{"pod_name":"b"}],"id":"10"}`,
	`{"kubernetes":"{\"pod_name\":\"b\"}","id":"11"}`,
	`{"a":{"b":{"c":"d","e":f[},"g":"h"},"i":"j"}`,
	`{"a":{"b":{"c":"d"},"x":y"},"g":"h"}`,
	`{"a":{"b":{"c":"d"},"x":"y"`,
	`{"a":{"b":{"c":"d"`,
	`{"a":{"b":{"c":"d"}`,
	``, `{`, `{"`, `{"a"`, `{"a":`, `{"a":{`, `[`, `"a"`,
}

func TestFinderMatchesOld(t *testing.T) {
	sets := [][][]string{
		{{"kubernetes", "namespace_name"}, {"kubernetes", "pod_name"}},
		{{"kubernetes", "namespace_name"}, {"kubernetes", "pod_name"}, {"kubernetes"}, {"id"}},
		{{"kubernetes", "pod_name", "x"}, {"kubernetes", "pod_name"}, {"id"}},
		{{"a", "b", "c"}, {"a", "x"}, {"g"}, {"a", "i"}, {"i"}},
		{{"a", "b", "c"}, {"a", "b", "e"}},
	}
	for _, body := range oldFindBodies {
		for _, paths := range sets {
			findMatchesOld(t, []byte(body), paths...)
		}
	}
	// Keys of 63 bytes and more share a length bit.
	long := func(n int) string { return strings.Repeat("k", n) }
	for _, body := range []string{
		`{"` + long(64) + `":1,"` + long(70) + `":{"` + long(63) + `":2},"` + long(62) + `":3}`,
		`{"` + long(70) + `":1,"` + long(64) + `":{"` + long(62) + `":2},"k\u006b":4,"kk":5}`,
	} {
		findMatchesOld(t, []byte(body), []string{long(70)}, []string{long(64), long(62)}, []string{long(62)}, []string{"kk"})
		findMatchesOld(t, []byte(body), []string{long(64)}, []string{long(70), long(63)}, []string{long(63)})
	}
	// Each body with each byte replaced by one that counts, or cut there.
	for _, body := range oldFindBodies[:12] {
		for i := range len(body) {
			for _, c := range []byte(`{}[]"\,: x`) {
				b := []byte(body)
				b[i] = c
				for _, paths := range sets[:3] {
					findMatchesOld(t, b, paths...)
					findMatchesOld(t, b[:i], paths...)
				}
			}
		}
	}
}

// FuzzFinderOld checks that a Finder finds what it found before
// scanObject and SkipKey.
func FuzzFinderOld(f *testing.F) {
	for _, b := range oldFindBodies {
		f.Add([]byte(b), "kubernetes", "pod_name", "namespace_name", "id")
	}
	f.Add([]byte(`{"a":{"b":{"c":"d","e":f[},"g":"h"},"i":"j"}`), "a", "b", "c", "g")
	f.Fuzz(func(t *testing.T, body []byte, k1, k2, k3, k4 string) {
		findMatchesOld(t, body, []string{k1, k2}, []string{k1, k3}, []string{k4}, []string{k1, k2, k3}, []string{k1})
	})
}
