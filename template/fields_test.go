package template

import (
	"bytes"
	"strings"
	"testing"
)

// findMatchesLookup checks that a Finder of templates using paths finds
// in body what Lookup finds, path by path, and that the templates render
// the same with and without it.
func findMatchesLookup(t *testing.T, body []byte, paths ...[]string) {
	t.Helper()
	var tps []*Template
	for _, p := range paths {
		tp := &Template{parts: []part{{kind: literal, text: "x-"}, {kind: field, path: p}}}
		tps = append(tps, tp)
	}
	f := NewFinder(tps...)
	var fs Fields
	f.Find(body, &fs)
	d := &Data{Body: body}
	for i, tp := range tps {
		want, wantOK := lookupScalar(body, tp.parts[1].path)
		got, gotOK, known := fs.get(tp.parts[1].path)
		if len(tp.parts[1].path) > 0 && i < maxFound && !known {
			t.Fatalf("body %q: path %q not one of the Finder's", body, tp.parts[1].path)
		}
		if known && (gotOK != wantOK || !bytes.Equal(got, want)) {
			t.Fatalf("body %q, path %q: found %q %v, lookupScalar %q %v", body, tp.parts[1].path, got, gotOK, want, wantOK)
		}
		r1, n1 := tp.Append(nil, d, "fb")
		r2, n2 := tp.AppendFound(nil, d, &fs, "fb")
		if !bytes.Equal(r1, r2) || n1 != n2 {
			t.Fatalf("body %q, path %q: rendered %q %v, with the Finder %q %v", body, tp.parts[1].path, r1, n1, r2, n2)
		}
	}
}

func TestFinderMatchesLookup(t *testing.T) {
	k8s := [][]string{{"kubernetes", "namespace_name"}, {"kubernetes", "pod_name"}}
	for _, body := range []string{
		`{"log":"x","stream":"stdout","kubernetes":{"namespace_name":"shop","pod_name":"web-1"},"id":"1"}`,
		`{"kubernetes":{"pod_name":"web-1"}}`,
		`{"kubernetes":{"namespace_name":"a","namespace_name":"b","pod_name":"c"},"kubernetes":{"pod_name":"d"}}`,
		`{"kubernetes":"not an object","kubernetes":{"pod_name":"d"}}`,
		`{"kubernetes":{"namespace_name":null,"pod_name":""}}`,
		`{"kubernetes":{"namespace_name":12.5,"pod_name":{"a":[1,"}"]}}}`,
		`{"kube\u0072netes":{"pod_\u006eame":"esc\"aped\n"}}`,
		`{"kubernetes":{"namespace_name":"a","pod_name":"b"`,
		`{"kubernetes":{"namespace_name":"a"},"x":`,
		`{"kubernetes":{"namespace_name":"a" "pod_name":"b"}}`,
		` { "kubernetes" : { "namespace_name" : "a" , "pod_name" : "b" } } `,
		`["kubernetes"]`,
		`{"a\\":1,"kubernetes":{"pod_name":"x\\"}}`,
		``,
		`{`,
		`{"kubernetes":{"namespace_name":"a\ud800"}}`,
	} {
		findMatchesLookup(t, []byte(body), k8s...)
		findMatchesLookup(t, []byte(body), append(k8s, []string{"kubernetes"}, []string{"id"}, k8s[1])...)
		findMatchesLookup(t, []byte(body), []string{"kubernetes", "pod_name", "x"}, []string{"log"})
	}
	// More fields than a Finder takes: the rest are looked up one by one.
	var many [][]string
	for i := range maxFound + 3 {
		many = append(many, []string{"k" + strings.Repeat("x", i)})
	}
	findMatchesLookup(t, []byte(`{"k":1,"kxxxxxxxxx":2,"kxxxxxxxxxx":3}`), many...)
}

func TestFinderRendersTemplates(t *testing.T) {
	g, err := Parse("/eks/${record.kubernetes.namespace_name|default}", Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := Parse("${record.kubernetes.pod_name}-${tag[1]}", Options{})
	if err != nil {
		t.Fatal(err)
	}
	f := NewFinder(g, s)
	for _, body := range []string{
		`{"kubernetes":{"namespace_name":"shop","pod_name":"web/1"}}`,
		`{"kubernetes":{"pod_name":".."}}`,
		`{"other":1}`,
	} {
		d := &Data{Tag: "pod.x", Body: []byte(body)}
		var fs Fields
		f.Find(d.Body, &fs)
		for _, tp := range []*Template{g, s} {
			r1, n1 := tp.Append(nil, d, "unknown")
			r2, n2 := tp.AppendFound(nil, d, &fs, "unknown")
			if string(r1) != string(r2) || n1 != n2 {
				t.Errorf("%s on %s: %q %v, with the Finder %q %v", tp, body, r1, n1, r2, n2)
			}
		}
	}
}

// FuzzFinder checks that one pass finds what Lookup finds field by field.
func FuzzFinder(f *testing.F) {
	f.Add([]byte(`{"a":{"b":"c","d":1},"e":null}`), "a", "b", "d", "e")
	f.Add([]byte(`{"a":[{"b":1}],"b":"x\"y","a":{"b":2}}`), "a", "b", "", "b")
	f.Fuzz(func(t *testing.T, body []byte, k1, k2, k3, k4 string) {
		findMatchesLookup(t, body, []string{k1, k2}, []string{k1, k3}, []string{k4}, []string{k1, k2, k3})
	})
}
