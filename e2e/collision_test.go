package e2e

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestReplicasSharingKeys runs two forwarders, each with its data_dir,
// writing to one bucket with a key template without ${hostname}, as two
// replicas would whose WALs began in the same second (their first sequence
// numbers come from the clock: pods started together): both warn about
// the key at start; the second renders the first's keys for its own
// records, finds them taken and pauses its S3 sink with one error line
// naming the bucket, the key and the fix. No object of the first is
// overwritten, and the second's records wait in its WAL, neither dropped
// nor dead-lettered.
func TestReplicasSharingKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: two replicas and their S3 conflicts; make test runs it")
	}
	t.Parallel()
	srv, url := startS3(t)
	sink := s3Sink("archive", url, bucket) + "    key: \"shared/${tag}/${seq}.json.gz\"\n"
	const keyWarning = "sinks[archive].key has neither ${hostname} nor ${uuid}"
	replica := func(name string) *forwarder {
		return newForwarder(t, fwdConfig{DataDir: filepath.Join(t.TempDir(), name), Forward: freeAddr(t), HTTP: freeAddr(t), Admin: freeAddr(t),
			Sinks: []string{sink}})
	}
	send := func(f *forwarder, prefix string) { t.Helper(); postIDs(t, f, prefix, 500) }

	first, second := replica("first"), replica("second")
	first.start()
	first.stop()
	// The second's WAL begins where the first's does.
	walFile, err := os.ReadFile(filepath.Join(first.cfg.DataDir, "wal.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(second.cfg.DataDir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(second.cfg.DataDir, "wal.db"), walFile, 0o600); err != nil {
		t.Fatal(err)
	}
	seq := regexp.MustCompile(`msg="wal opened" .* first_seq=([0-9]+)`).FindStringSubmatch(first.tail(100))
	if seq == nil {
		t.Fatalf("no first_seq in the first's log:\n%s", first.tail(30))
	}
	firstKey := fmt.Sprintf("shared/app/%s%s.json.gz", strings.Repeat("0", 20-len(seq[1])), seq[1]) // 20 digits
	first.start()
	send(first, "a")
	first.waitSink("archive", 30*time.Second)
	first.stop()
	objs, err := srv.Objects(bucket)
	if err != nil || len(objs) == 0 {
		t.Fatalf("the first forwarder's objects: %d, %v", len(objs), err)
	}
	before := map[string][]byte{}
	for _, o := range objs {
		if before[o.Key], err = srv.Get(bucket, o.Key); err != nil {
			t.Fatal(err)
		}
	}

	second.start()
	send(second, "b")
	if !waitFor(30*time.Second, func() bool {
		st, err := second.status()
		return err == nil && len(st.Sinks) == 1 && st.Sinks[0].State == "paused"
	}) {
		st, _ := second.status()
		t.Fatalf("the second forwarder's sink did not pause: %+v\n%s", st.Sinks, second.tail(20))
	}
	time.Sleep(2 * time.Second) // the sends in flight when it paused end
	st, err := second.status()
	if err != nil {
		t.Fatal(err)
	}
	if s := st.Sinks[0]; s.State != "paused" || s.DeadLettered != 0 || s.Cursor+1 >= st.WAL.NextSeq ||
		!strings.Contains(s.LastError, firstKey) {
		t.Errorf("the second forwarder's sink: %+v (WAL next %d), want paused before its records, none dead-lettered", s, st.WAL.NextSeq)
	}
	m := second.mustMetrics()
	if n := m[`forwarder_s3_conditional_conflicts_total{outcome="other",sink="archive"}`]; n != 1 {
		t.Errorf("conflicts with another writer's object: %v, want 1", n)
	}
	if n := m[`forwarder_sink_paused{sink="archive"}`]; n != 1 {
		t.Errorf("forwarder_sink_paused %v, want 1", n)
	}
	second.stop()

	if n := second.logCount("level=ERROR"); n != 1 {
		t.Errorf("%d error lines from the second forwarder, want one:\n%s", n, second.tail(30))
	}
	for _, want := range []string{`msg="sink paused`, "reason=PreconditionFailed", "bucket " + bucket, `key \"` + firstKey + `\"`,
		"put ${hostname} or another per-replica field in sinks[archive].key"} {
		if second.logCount(want) == 0 {
			t.Errorf("the error line does not say %s:\n%s", want, second.tail(30))
		}
	}
	for f, starts := range map[*forwarder]int{first: 2, second: 1} {
		if n := f.logCount(keyWarning); n != starts {
			t.Errorf("%d warnings about the key in %d starts:\n%s", n, starts, f.tail(30))
		}
	}
	after := map[string][]byte{}
	objs, _ = srv.Objects(bucket)
	for _, o := range objs {
		after[o.Key], _ = srv.Get(bucket, o.Key)
	}
	for key, b := range before {
		if !bytes.Equal(after[key], b) {
			t.Errorf("%s was overwritten", key)
		}
	}
	if len(after) != len(before) {
		t.Errorf("%d objects after the second forwarder, %d before: it wrote under keys the first had not taken", len(after), len(before))
	}
}

// TestNewDataDir: a forwarder started on a new data_dir (a volume lost,
// the setting changed) makes a new WAL, says so, and delivers: its records
// are numbered past those of its earlier WAL, so its S3 keys (the same
// template and host) are not the earlier ones, which would pause the sink.
func TestNewDataDir(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: two runs of the binary; make test runs it")
	}
	t.Parallel()
	_, url := startS3(t)
	sink := s3Sink("archive", url, bucket) + "    key: \"logs/${tag}/%Y/%m/%d/%H/${hostname}-${seq}.json.gz\"\n"
	f := newForwarder(t, fwdConfig{DataDir: filepath.Join(t.TempDir(), "a"), Forward: freeAddr(t), HTTP: freeAddr(t), Admin: freeAddr(t), Sinks: []string{sink}})
	send := func(prefix string) { t.Helper(); postIDs(t, f, prefix, 200) }
	f.start()
	send("a")
	f.waitSink("archive", 30*time.Second)
	f.stop()
	if f.logCount("wal: created a new WAL") != 1 {
		t.Fatalf("the first start does not say it made a WAL:\n%s", f.tail(20))
	}
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second))) // the next second: a WAL made in the same one numbers alike

	// The same forwarder (host, configuration) on a new data_dir.
	cfg := f.cfg
	cfg.DataDir = filepath.Join(t.TempDir(), "b")
	f.setConfig(cfg)
	f.start()
	send("b")
	f.waitSink("archive", 30*time.Second)
	f.stop()
	if f.logCount("wal: created a new WAL") != 2 || f.logCount(`msg="sink paused`) != 0 {
		t.Fatalf("the start on a new data_dir: made a WAL %d times of 2, paused %d times:\n%s", f.logCount("wal: created a new WAL"), f.logCount(`msg="sink paused`), f.tail(30))
	}
	got := readS3(t, url, bucket)
	if len(got.Counts) != 400 || got.Lines != 400 || len(got.Bad) > 0 {
		t.Fatalf("%d records in %d lines of %d objects (%v), want the 400 sent once each", len(got.Counts), got.Lines, got.Objects, got.Bad)
	}
}

// postIDs posts n records of tag app, ids prefix0 to prefix<n-1>, to f's
// HTTP input in one request, and fails the test unless they are stored.
func postIDs(t *testing.T, f *forwarder, prefix string, n int) {
	t.Helper()
	var b bytes.Buffer
	for i := range n {
		fmt.Fprintf(&b, `{"id":"%s%d","msg":"%s"}`+"\n", prefix, i, strings.Repeat("x", i%50))
	}
	code, _, body, err := postNDJSON(&http.Client{Timeout: 10 * time.Second}, f.cfg.HTTP, "app", "", b.Bytes())
	if err != nil || code != http.StatusOK {
		t.Fatalf("post to %s: %d %s %v", f.cfg.HTTP, code, body, err)
	}
}
