package s3sink

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/logfwd/forwarder/config"
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

// overflowed is the test's routing: records of tag "a" are admitted, those
// of any other go to the overflow partition. It returns the range's
// records, the overflow batch's, and a state that routes so.
func overflowed(n int) (all, batch []sinks.Record, st *memState) {
	all = batchRecs("x", n)
	for i := range all {
		if i%2 == 0 {
			all[i].Tag = "a"
		} else {
			all[i].Tag = fmt.Sprintf("t%d", i%3)
			batch = append(batch, all[i])
		}
	}
	st = newMemState(all)
	st.admit = func(family string, _ uint64) bool { return strings.Contains(family, "/a/") }
	return all, batch, st
}

// An interrupted upload of the overflow partition is rebuilt by Recover
// from the records the drainer routed there, not from those whose own
// partition the key renders.
func TestRecoverOverflowObject(t *testing.T) {
	srv, url := startEmu(t)
	cfg := testConfig(url)
	_, batch, st := overflowed(200)
	s := newTestSink(t, cfg)
	p := s.Overflow(&batch[0])
	if _, err := s.Send(context.Background(), &sinks.Batch{Partition: p, Records: batch, State: st, Final: true}); err != nil {
		t.Fatal(err)
	}
	key := st.onlyKey(t)
	if !strings.HasPrefix(key, "logs/unknown/") {
		t.Fatalf("the overflow object's key is %q", key)
	}
	body, err := srv.Get(bucket, key)
	if err != nil {
		t.Fatal(err)
	}
	deleteObject(t, url, key) // the crash came before the upload
	s = newTestSink(t, cfg)
	if err := s.Recover(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	if got, err := srv.Get(bucket, key); err != nil || string(got) != string(body) {
		t.Fatalf("re-uploaded %d bytes (%v), first upload %d: they differ", len(got), err, len(body))
	}
	if st.delivered[p] != batch[len(batch)-1].Seq || len(st.intents()) != 0 {
		t.Errorf("delivered %v, intents left %v", st.delivered, st.intents())
	}
}

// A staged overflow object whose file is lost is rebuilt in Send from the
// records the drainer routed to it.
func TestStagedOverflowFileLost(t *testing.T) {
	srv, url := startEmu(t)
	cfg := testConfig(url)
	cfg.MaxObjectBytes = config.MiB
	s, _ := newStagedSink(t, cfg)
	_, batch, st := overflowed(300)
	p := s.Overflow(&batch[0])
	out, err := s.Send(context.Background(), &sinks.Batch{Partition: p, Records: batch[:100], State: st})
	if err != nil || out.Carry == nil {
		t.Fatalf("outcome %+v, %v", out, err)
	}
	if err := os.Remove(out.Carry.(*openObject).path); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Send(context.Background(), &sinks.Batch{Partition: p, Records: batch[100:], State: st, Carry: out.Carry, Final: true}); err != nil {
		t.Fatal(err)
	}
	got, err := srv.Get(bucket, st.onlyKey(t))
	if err != nil {
		t.Fatal(err)
	}
	want, err := s.enc.buildSplit(batch, []int{100, len(batch) - 100})
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want.body) {
		t.Error("the rebuilt object differs from the one built in memory")
	}
}

// Family leaves the time bucket out: a tag's objects of every hour are one
// family; another tag or field is another.
func TestFamily(t *testing.T) {
	cfg := testConfig("http://127.0.0.1:1")
	s := newTestSink(t, cfg)
	at := time.Date(2026, 12, 2, 3, 4, 5, 0, time.UTC)
	fam := func(tag string, when time.Time) string {
		r := sinks.Record{Tag: tag, Time: when.UnixNano(), Body: []byte(`{}`)}
		return s.Family(&r, s.Partition(&r))
	}
	if a, b := fam("web", at), fam("web", at.Add(5*time.Hour)); a != b {
		t.Errorf("one tag, two hours: families %q and %q", a, b)
	}
	if a, b := fam("web", at), fam("db", at); a == b {
		t.Errorf("two tags, one family %q", a)
	}
	cfg.Key = "logs/${tag}/${seq}.gz" // no time: the family is the partition
	s = newTestSink(t, cfg)
	r := sinks.Record{Tag: "web", Time: at.UnixNano(), Body: []byte(`{}`)}
	if p := s.Partition(&r); s.Family(&r, p) != p {
		t.Errorf("family %q of partition %q", s.Family(&r, p), p)
	}
}
