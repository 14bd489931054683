package template

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestRender(t *testing.T) {
	body := []byte(`{"log":"x","kubernetes":{"namespace_name":"shop","pod_name":"web-1","labels":{"app":"web"},"n":3,"empty":"","nil":null},"esc\"key":"q\u00e9","s":"a\"b"}`)
	d := &Data{Tag: "pod.shop.web", Body: body, Time: time.Date(2026, 11, 30, 8, 5, 9, 0, time.FixedZone("x", 3600)), Seq: 42, UUID: "u-u-i-d"}
	tests := []struct {
		tmpl, want string
		missing    bool
	}{
		{"/eks/${record.kubernetes.namespace_name}", "/eks/shop", false},
		{"${record.kubernetes.pod_name|unknown}-${hostname}", "web-1-host1", false},
		{"${record.kubernetes.container|c0}", "c0", false},
		{"${record.kubernetes.empty|d}", "d", false},
		{"${record.kubernetes.nil|d}", "d", false},
		{"${record.kubernetes.missing}", "FB", true},
		{"${record.kubernetes.n}", "3", false},
		// An object is not a name: the fallback, noted missing.
		{"${record.kubernetes.labels}", "FB", true},
		{`${record.esc"key}`, "qé", false},
		{"${record.s}", `a"b`, false},
		{"${tag}/${tag[0]}/${tag[2]}", "pod.shop.web/pod/web", false},
		{"${tag[5]}", "FB", true},
		{"logs/${tag}/%Y/%m/%d/%H/%M/%S/${hostname}-${seq}.json.gz", "logs/pod.shop.web/2026/11/30/07/05/09/host1-00000000000000000042.json.gz", false},
		{"a$$b%%c-${uuid}", "a$b%c-u-u-i-d", false},
		{"%S%M%H-%d%m%Y-%S", "090507-30112026-09", false},
	}
	for _, tt := range tests {
		tp, err := Parse(tt.tmpl, Options{AllowSeq: true, Hostname: "host1"})
		if err != nil {
			t.Fatalf("parse %q: %v", tt.tmpl, err)
		}
		got, notes := tp.Render(d, "FB")
		if missing := notes&Missing != 0; got != tt.want || missing != tt.missing || notes&Sanitised != 0 {
			t.Errorf("%q: got %q (missing %v), want %q (missing %v)", tt.tmpl, got, missing, tt.want, tt.missing)
		}
	}
}

// A value from a record never adds, removes or climbs a path segment: a
// "/" inside it renders "_", and a segment it leaves empty, "." or ".."
// renders with "_" in place of what is missing. The template's own text is
// kept as written.
func TestValuesNeverChangeThePath(t *testing.T) {
	tests := []struct {
		tmpl, tag, body, want string
		sanitised             bool
	}{
		{"logs/${tag}/%Y/${seq}", "pod.a/../../b", `{}`, "logs/pod.a_.._.._b/2026/00000000000000000042", true},
		{"logs/${tag}/x", "../../etc/passwd", `{}`, "logs/.._.._etc_passwd/x", true},
		{"logs/${tag}/x", "..", `{}`, "logs/__/x", true},
		{"logs/${tag}/x", ".", `{}`, "logs/_/x", true},
		{"logs/${tag}/x", "", `{}`, "logs/_/x", true},
		{"${tag}/x", "", `{}`, "_/x", true},
		{"logs/${tag}", "", `{}`, "logs/_", true},
		{"logs/.${tag}/x", ".", `{}`, "logs/__/x", true},           // the value makes ".." with the text before it
		{"logs/${tag}${record.d|}/x", ".", `{}`, "logs/_/x", true}, // two values in one segment
		{"logs/${record.a|}/${record.b|}/x", "t", `{}`, "logs/_/_/x", true},
		{"logs/${record.ns}/x", "t", `{"ns":"a/b"}`, "logs/a_b/x", true},
		{"logs/${record.ns}/x", "t", `{"ns":".."}`, "logs/__/x", true},
		{"logs/${record.ns|../up}/x", "t", `{}`, "logs/.._up/x", true},
		{"logs/${tag[1]}/x", "a./.b", `{}`, "logs/_/x", true},
		// Dots that make no "." or ".." segment, and text as written, are kept.
		{"logs/${tag}/x", "...", `{}`, "logs/.../x", false},
		{"logs/${tag}/x", "..a", `{}`, "logs/..a/x", false},
		{"logs/${tag}.d/x", ".", `{}`, "logs/..d/x", false},
		{"logs/${tag}/x", "pod.shop.web", `{}`, "logs/pod.shop.web/x", false},
		{"/eks/${record.ns}", "t", `{"ns":"shop"}`, "/eks/shop", false},
		{"a//../${tag}", "t", `{}`, "a//../t", false},
		{"logs/${record.ns}/x", "t", `{"ns":"a.b"}`, "logs/a.b/x", false},
	}
	for _, tt := range tests {
		tp, err := Parse(tt.tmpl, Options{AllowSeq: true})
		if err != nil {
			t.Fatalf("parse %q: %v", tt.tmpl, err)
		}
		d := &Data{Tag: tt.tag, Body: []byte(tt.body), Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Seq: 42}
		got, notes := tp.Render(d, "FB")
		if got != tt.want || (notes&Sanitised != 0) != tt.sanitised {
			t.Errorf("%q with tag %q, body %s: got %q (notes %b), want %q (sanitised %v)", tt.tmpl, tt.tag, tt.body, got, notes, tt.want, tt.sanitised)
		}
		// Appending to a buffer that holds other text changes nothing before it.
		pre := []byte("keep/../")
		b, _ := tp.Append(pre, d, "FB")
		if string(b) != "keep/../"+tt.want {
			t.Errorf("%q with tag %q: appended %q, want %q", tt.tmpl, tt.tag, b, "keep/../"+tt.want)
		}
		// Unsanitised renders the values as they are.
		raw, _ := Parse(tt.tmpl, Options{AllowSeq: true, Unsanitised: true})
		if got, notes := raw.Render(d, "FB"); notes&Sanitised != 0 || strings.Contains(tt.tmpl, "${tag}") && !strings.Contains(got, tt.tag) {
			t.Errorf("%q with tag %q, unsanitised: %q (notes %b)", tt.tmpl, tt.tag, got, notes)
		}
	}
}

func TestParseErrors(t *testing.T) {
	tests := map[string]string{
		"${seq}":         "only S3 keys may use ${seq}",
		"${nope}":        "unknown placeholder",
		"${record.}":     "empty field name",
		"${tag[x]}":      "tag part must be a number",
		"${tag":          "unclosed ${ at column 1",
		"a$b":            "a lone $ at column 2",
		"%Y-%j":          "%j at column 4",
		"${env.HOME}":    "expanded when the configuration is loaded",
		"${env:CLUSTER}": "for the environment variable CLUSTER write ${env.CLUSTER}",
		"x/${record.a.}": "empty field name",
		// A placeholder without its $ would be text: every key the same.
		"logs/{tag}/${seq}":     "{tag} at column 6: a placeholder is written ${tag}",
		"{hostname}-x":          "{hostname} at column 1",
		"a/{record.k8s.ns}/b":   "{record.k8s.ns} at column 3",
		"a/{tag[1]}/${seq}":     "{tag[1]} at column 3",
		"logs/${tag}%":          "a lone % at column 12: write %% for a literal %",
		"${record.pod_name }-x": "${record.pod_name } at column 1: white space inside the braces: write ${record.pod_name}",
		"${ tag}":               "write ${tag}",
		// Another tool's placeholders: the same.
		"{{.Tag}}-${hostname}":         "{{.Tag}} at column 1: placeholders are written ${...}: ${tag}",
		"logs/{{ kubernetes.pod }}/x":  "for a field of the record, ${record.kubernetes.pod}",
		"a/{{ printf \"%s\" .Tag }}/x": "(${tag}, ${tag[N]}, ${record.FIELD}, ${hostname}, ${seq}, ${uuid})",
	}
	for tmpl, want := range tests {
		_, err := Parse(tmpl, Options{})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", tmpl, err, want)
		}
	}
}

func TestProperties(t *testing.T) {
	tp, _ := Parse("logs/${tag}/%Y/%m/%d/%H/${seq}", Options{AllowSeq: true})
	if !tp.UsesSeq() || tp.UsesUUID() || tp.Finest() != time.Hour || tp.Static() {
		t.Fatalf("seq %v uuid %v finest %v static %v", tp.UsesSeq(), tp.UsesUUID(), tp.Finest(), tp.Static())
	}
	st, _ := Parse("/fixed/${hostname}", Options{Hostname: "h"})
	if !st.Static() || st.Finest() != 0 {
		t.Fatal("a template of literals and ${hostname} is static")
	}
	if tp.UsesHostname() || !st.UsesHostname() {
		t.Fatalf("hostname: %v without, %v with ${hostname}", tp.UsesHostname(), st.UsesHostname())
	}
	if lit, _ := Parse("/fixed/$${hostname}", Options{Hostname: "h"}); lit.UsesHostname() {
		t.Fatal("$${hostname} is a literal, not ${hostname}")
	}
	d := &Data{Tag: "t", SeqText: "<SEQ>", Seq: 9}
	if got, _ := tp.Render(d, ""); !strings.HasSuffix(got, "/<SEQ>") {
		t.Fatalf("SeqText not used: %q", got)
	}
}

func TestLookupOddInput(t *testing.T) {
	for _, body := range []string{``, `[]`, `{`, `{"a"`, `{"a":`, `{"a":{"b":`, `"str"`, `{"a":1,}`, `{"a":"\`} {
		if v, ok := Lookup([]byte(body), []string{"a", "b"}); ok {
			t.Errorf("Lookup(%q) = %q, true", body, v)
		}
	}
	if v, ok := Lookup([]byte(` { "a" : { "b" : [1, {"c":"}"}] } } `), []string{"a", "b"}); !ok || string(v) != `[1, {"c":"}"}]` {
		t.Errorf("nested array: %q %v", v, ok)
	}
}

func FuzzLookup(f *testing.F) {
	f.Add([]byte(`{"a":{"b":"c"}}`), "a", "b")
	f.Add([]byte(`{"a":[{"b":1}],"b":"x\"y"}`), "b", "")
	f.Fuzz(func(t *testing.T, body []byte, k1, k2 string) {
		Lookup(body, []string{k1, k2}) // must not panic
	})
}

func BenchmarkRenderStream(b *testing.B) {
	body := []byte(`{"log":"2026-11-30T08:00:00Z INFO handled request path=/api/v1/items status=200","stream":"stdout","kubernetes":{"namespace_name":"shop","pod_name":"web-7d9f8b6c4-00012","container_name":"app"}}`)
	tp, _ := Parse("${record.kubernetes.pod_name|unknown}-${hostname}", Options{Hostname: "ip-10-0-1-2"})
	d := &Data{Tag: "pod.shop", Body: body}
	var dst []byte
	for i := 0; i < b.N; i++ {
		dst, _ = tp.Append(dst[:0], d, "unknown")
	}
}

// TestAppendFoundWithin: values too long for the bound are shortened, the
// template's own text kept whole; values that differ only in what is cut
// off render differently; a UTF-8 sequence is never cut.
func TestAppendFoundWithin(t *testing.T) {
	tm, err := Parse("/g/${tag}-${record.pod}-${hostname}", Options{Hostname: "replica-0"})
	if err != nil {
		t.Fatal(err)
	}
	length := func(b []byte) int { return len(b) }
	render := func(tag, pod string, limit int) (string, Notes) {
		d := &Data{Tag: tag, Body: []byte(`{"pod":"` + pod + `"}`)}
		b, notes := tm.AppendFoundWithin([]byte("prefix:"), d, nil, "FB", limit, length)
		if !strings.HasPrefix(string(b), "prefix:") {
			t.Fatalf("%q: what dst held is gone", b)
		}
		return strings.TrimPrefix(string(b), "prefix:"), notes
	}
	if got, notes := render("short", "p", 512); got != "/g/short-p-replica-0" || notes != 0 {
		t.Errorf("within the limit: %q %v", got, notes)
	}
	long := strings.Repeat("t", 600)
	a, notes := render(long+"a", "pod-1", 512)
	b, _ := render(long+"b", "pod-1", 512)
	switch {
	case len(a) > 512 || len(b) > 512:
		t.Errorf("over the limit: %d, %d bytes", len(a), len(b))
	case !strings.HasSuffix(a, "-pod-1-replica-0") || !strings.HasPrefix(a, "/g/ttt"):
		t.Errorf("the template's text or the short value was cut: %q", a)
	case a == b:
		t.Errorf("values that differ at their end render the same: %q", a)
	case notes&Shortened == 0:
		t.Errorf("notes %v: not Shortened", notes)
	case len(a) < 500:
		t.Errorf("shortened more than needed: %d bytes", len(a))
	}
	if again, _ := render(long+"a", "pod-1", 512); again != a {
		t.Errorf("not the same rendering twice: %q, %q", again, a)
	}
	// Two long values: both cut, both kept apart.
	c, _ := render(long, strings.Repeat("é", 300), 512)
	if len(c) > 512 || !utf8.ValidString(c) || !strings.HasSuffix(c, "-replica-0") || strings.Count(c, "~") != 2 {
		t.Errorf("two long values, one of 2-byte runes: %d bytes, valid UTF-8 %v: %q", len(c), utf8.ValidString(c), c)
	}
	// A limit the template's own text leaves no room for: values at their
	// least, and the caller sees it is still over.
	if d, _ := render(long, "p", 20); len(d) <= 20 || !strings.Contains(d, "~") {
		t.Errorf("limit too small for the text: %q", d)
	}
}
