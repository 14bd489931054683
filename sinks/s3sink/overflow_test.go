package s3sink

import (
	"fmt"
	"testing"
	"time"

	"github.com/logfwd/forwarder/sinks"
)

// Overflow is the key rendered as for a record without fields, at the
// record's time bucket; Explain names the placeholder that took a value
// per record.
func TestOverflowAndExplain(t *testing.T) {
	cfg := testConfig("http://127.0.0.1:1")
	cfg.Key = "logs/${tag}/${record.app|none}/%Y/%m/%d/%H/${hostname}-${seq}.json.gz"
	s := newTestSink(t, cfg)
	at := time.Date(2026, 12, 2, 3, 4, 5, 0, time.UTC)
	r := sinks.Record{Seq: 9, Tag: "kube.web", Time: at.UnixNano(), Body: []byte(`{"app":"web"}`)}
	if got, want := objectKey(s.Overflow(&r), 9, ""), "logs/unknown/none/2026/12/02/03/host1-00000000000000000009.json.gz"; got != want {
		t.Errorf("Overflow key %q, want %q", got, want)
	}
	var recs []sinks.Record
	for i := range 30 {
		recs = append(recs, sinks.Record{Tag: fmt.Sprintf("kube.c%d", i), Time: at.UnixNano(), Body: []byte(`{"app":"web"}`)})
	}
	want := `key "logs/${tag}/${record.app|none}/%Y/%m/%d/%H/${hostname}-${seq}.json.gz": ${tag} took 30 values in 30 records, e.g. "kube.c0", "kube.c1"`
	if got := s.Explain(recs); got != want {
		t.Errorf("Explain:\n%s\nwant\n%s", got, want)
	}
}
