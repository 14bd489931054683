package inputs

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/logfwd/forwarder/internal/syncbuf"
	"github.com/logfwd/forwarder/wal"
)

// Records of tags no sink matches are acknowledged and not stored: said
// in a warning at once and then once a minute, naming the tags and their
// counts.
func TestUnroutedTagsWarn(t *testing.T) {
	var logs syncbuf.Buffer
	w, err := wal.Open(t.TempDir(), wal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	p := &Pipeline{WAL: w, Metrics: NewMetrics(nil), Routed: func(tag string) bool { return strings.HasPrefix(tag, "pod.") },
		Unrouted: &UnroutedLog{Log: slog.New(slog.NewTextHandler(&logs, nil))}}
	recs := func(tags ...string) []wal.Record {
		var out []wal.Record
		for _, tag := range tags {
			out = append(out, wal.Record{Tag: tag, Body: []byte(`{}`)})
		}
		return out
	}
	for range 3 {
		if _, err := p.Store(context.Background(), "forward", recs("kube.a", "kube.a", "pod.x", "kube.b"), wal.AppendOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if st := w.Stats(); st.Records != 3 {
		t.Fatalf("%d records stored, want the 3 routed", st.Records)
	}
	out := logs.String()
	if n := strings.Count(out, "level=WARN"); n != 1 || !strings.Contains(out, `msg="records of tags that no sink matches are acknowledged and not stored: check the sinks' match against these tags" records=2 tags="kube.a=2" other_tags_records=0 interval=1m0s`) {
		t.Fatalf("want one warning naming the tags and their counts:\n%s", out)
	}
}

// A message's records share a tag: its routing is asked once per run of
// one tag, not once per record.
func TestRoutedOncePerTag(t *testing.T) {
	w, err := wal.Open(t.TempDir(), wal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	asked := 0
	p := &Pipeline{WAL: w, Metrics: NewMetrics(nil), Routed: func(tag string) bool { asked++; return tag != "drop" },
		Unrouted: &UnroutedLog{Log: slog.New(slog.DiscardHandler)}}
	var recs []wal.Record
	for i := range 3000 {
		recs = append(recs, wal.Record{Tag: []string{"a", "drop", "b"}[i/1000], Body: []byte(`{}`)})
	}
	if _, err := p.Store(context.Background(), "forward", recs, wal.AppendOptions{}); err != nil {
		t.Fatal(err)
	}
	if asked != 3 {
		t.Errorf("routing asked %d times for 3 runs of one tag", asked)
	}
	if st := w.Stats(); st.Records != 2000 {
		t.Errorf("%d records stored, want 2000", st.Records)
	}
}
