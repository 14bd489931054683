package template

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

func TestFallbackLog(t *testing.T) {
	tmpl, err := Parse("/eks/${record.kubernetes.namespace}/${tag[2]}/${record.pod|none}", Options{})
	if err != nil {
		t.Fatal(err)
	}
	d := &Data{Tag: "kube.x", Body: []byte(`{"kubernetes":{"namespace_name":"shop"}}`)}
	if got := strings.Join(tmpl.Missing(d), " "); got != "${record.kubernetes.namespace} ${tag[2]}" {
		t.Fatalf("missing %q", got)
	}
	var buf bytes.Buffer
	l := &FallbackLog{Log: slog.New(slog.NewTextHandler(&buf, nil)), What: "log group or stream"}
	for range 5 {
		l.Note(tmpl, d, "unknown")
	}
	out := buf.String()
	want := `level=WARN msg="records lack what the log group or stream template names and go under the fallback \"unknown\": check the template against the records (a field name may be misspelt), or give the field a default with ${record.FIELD|default}" template=/eks/${record.kubernetes.namespace}/${tag[2]}/${record.pod|none} missing=${record.kubernetes.namespace},${tag[2]} tag=kube.x records=1 interval=1m0s`
	if strings.Count(out, "level=WARN") != 1 || !strings.Contains(out, want) {
		t.Fatalf("want one line\n%s\ngot\n%s", want, out)
	}
}
