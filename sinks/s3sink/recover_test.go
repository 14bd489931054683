package s3sink

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/internal/syncbuf"
	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// sentBatch sends recs (one partition) through a fresh sink and returns
// the state holding its intent, as a crash right after the upload would
// leave it, with the object's key and bytes.
func sentBatch(t *testing.T, cfg config.S3, get func(key string) []byte, recs []sinks.Record) (*memState, string, []byte) {
	t.Helper()
	st := newMemState(recs)
	if _, err := send(t, newTestSink(t, cfg), st, recs); err != nil {
		t.Fatal(err)
	}
	key := st.onlyKey(t)
	return st, key, get(key)
}

func batchRecs(tag string, n int) []sinks.Record {
	var recs []wal.Record
	at := time.Date(2025, 6, 15, 15, 0, 0, 0, time.UTC)
	for i := range n {
		recs = append(recs, rec(tag, fmt.Sprintf("%s%d", tag, i), at.Add(time.Duration(i)), i%40))
	}
	return sinkRecs(recs...)
}

func TestRecoverUploadsTheSameBytes(t *testing.T) {
	srv, url := startEmu(t)
	get := func(key string) []byte {
		b, err := srv.Get(bucket, key)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cfg := testConfig(url)
	for _, crash := range []string{"after the upload", "before the upload"} {
		t.Run(crash, func(t *testing.T) {
			// The batch's records are every other one of the range: the
			// others are another partition's.
			all := batchRecs("a"+strings.Fields(crash)[0], 200)
			var batch []sinks.Record
			for i := range all {
				if i%2 == 1 {
					all[i].Tag = "other"
				} else {
					batch = append(batch, all[i])
				}
			}
			st, key, body := sentBatch(t, cfg, get, batch)
			st.recs = all
			if crash == "before the upload" {
				deleteObject(t, url, key)
			}
			puts := srv.Calls()["PutObject"]
			s := newTestSink(t, cfg)
			if err := s.Recover(context.Background(), st); err != nil {
				t.Fatal(err)
			}
			if got := get(key); string(got) != string(body) {
				t.Errorf("re-uploaded %d bytes, first upload %d: they differ", len(got), len(body))
			}
			if n := srv.Calls()["PutObject"] - puts; n != 1 {
				t.Errorf("%d uploads, want 1", n)
			}
			p := s.Partition(&batch[0])
			if st.delivered[p] != batch[len(batch)-1].Seq || len(st.intents()) != 0 {
				t.Errorf("delivered %v, intents left %v", st.delivered, st.intents())
			}
			if testutil.ToFloat64(s.m.recovered) != 1 {
				t.Errorf("recovered %v", testutil.ToFloat64(s.m.recovered))
			}
		})
	}
}

// TestRecoverUsesTheIntentsSettings: a restart with another key template
// and compression still rebuilds the interrupted object as it was.
func TestRecoverUsesTheIntentsSettings(t *testing.T) {
	srv, url := startEmu(t)
	cfg := testConfig(url)
	recs := batchRecs("app", 50)
	st, key, body := sentBatch(t, cfg, func(k string) []byte { b, _ := srv.Get(bucket, k); return b }, recs)
	deleteObject(t, url, key)

	cfg2 := cfg
	cfg2.Key, cfg2.Compression, cfg2.CompressionLevel, cfg2.TimeKey = "other/${seq}", config.CompressionZstd, 3, "ts"
	s, err := New(context.Background(), "archive", cfg2, Options{Hostname: "another-host", AWS: &aws.Config{Credentials: testCreds}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Recover(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	got, err := srv.Get(bucket, key)
	if err != nil || string(got) != string(body) {
		t.Errorf("object %s: %d bytes (%v), want the %d first uploaded", key, len(got), err, len(body))
	}
	// Labelled with the compression it was built with, not the sink's now.
	objs, err := srv.Objects(bucket)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.Key == key && o.ContentEncoding != config.CompressionGzip {
			t.Errorf("object %s: Content-Encoding %q, want gzip", key, o.ContentEncoding)
		}
	}
}

// An upload interrupted by a stop before an upgrade that sanitises values
// is finished under the key it was given: its intent has no key rules, and
// its records are found again by the partition those rules rendered.
func TestRecoverAnIntentOfVerbatimKeys(t *testing.T) {
	srv, url := startEmu(t)
	cfg := testConfig(url)
	cfg.Key = "logs/${tag}/${seq}"
	recs := batchRecs("pod/a", 20)
	st, key, body := sentBatch(t, cfg, func(k string) []byte { b, _ := srv.Get(bucket, k); return b }, recs)
	deleteObject(t, url, key)
	// The intent as the version before wrote it.
	raw, _ := st.Get(intentKey(key))
	var in intent
	if err := json.Unmarshal(raw, &in); err != nil {
		t.Fatal(err)
	}
	verbatim, err := newKeyRenderer(in.KeyTemplate, in.Hostname, keyRulesVerbatim)
	if err != nil {
		t.Fatal(err)
	}
	in.Partition, _ = verbatim.partition(&recs[0])
	in.Key, in.KeyRules = objectKey(in.Partition, in.First, in.UUID), 0
	if !strings.HasPrefix(in.Key, "logs/pod/a/") {
		t.Fatalf("verbatim key %q", in.Key)
	}
	st.Delete(context.Background(), intentKey(key))
	if err := putIntent(context.Background(), st, intentKey(in.Key), &in); err != nil {
		t.Fatal(err)
	}
	s := newTestSink(t, cfg)
	if err := s.Recover(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	if got, err := srv.Get(bucket, in.Key); err != nil || string(got) != string(body) {
		t.Errorf("object %s: %d bytes (%v), want the %d bytes of the interrupted upload", in.Key, len(got), err, len(body))
	}
	if st.delivered[in.Partition] != recs[len(recs)-1].Seq || len(st.intents()) != 0 {
		t.Errorf("delivered %v, intents left %v", st.delivered, st.intents())
	}
}

func TestRecoverRefusesADisagreement(t *testing.T) {
	srv, url := startEmu(t)
	cfg := testConfig(url)
	recs := batchRecs("app", 20)
	st, key, _ := sentBatch(t, cfg, func(string) []byte { return nil }, recs)
	// The WAL now holds other bytes for a record of the range.
	st.recs[5].Body = []byte(`{"id":"changed"}`)
	puts := srv.Calls()["PutObject"]
	err := newTestSink(t, cfg).Recover(context.Background(), st)
	if err == nil || !strings.Contains(err.Error(), "intent/"+key) || !strings.Contains(err.Error(), "disagree") {
		t.Fatalf("Recover: %v, want a disagreement naming the intent", err)
	}
	var fe *fatalError
	if !errors.As(err, &fe) {
		t.Errorf("error %T is not fatal", err)
	}
	if srv.Calls()["PutObject"] != puts || len(st.intents()) != 1 {
		t.Errorf("uploaded or dropped the intent after a disagreement")
	}

	// A damaged intent is an error too.
	st = newMemState(nil)
	_ = st.Put(context.Background(), []byte("intent/x"), []byte("{not json"))
	if err := newTestSink(t, cfg).Recover(context.Background(), st); err == nil || !strings.Contains(err.Error(), `"intent/x" is damaged`) {
		t.Errorf("damaged intent: %v", err)
	}
}

// An upload interrupted before the sink's match changed is finished as it
// was begun: its records are those of the tags the sink took then (the
// intent keeps its globs), not today's. A key without ${tag} puts every
// tag in one partition: a wider match used to give Recover more records
// than the intent (a "disagreement" that refused every start), a narrower
// one fewer (taken for records the WAL dropped: the intent deleted, the
// object's records sent again under its key, which the landed object
// holds).
func TestRecoverAfterTheMatchChanged(t *testing.T) {
	for _, c := range []struct{ name, glob string }{{"wider", "**"}, {"narrower", "app.x"}} {
		t.Run(c.name, func(t *testing.T) {
			srv, url := startEmu(t)
			cfg := testConfig(url)
			cfg.Key = "logs/${hostname}-${seq}.json.gz"
			sink := func(globs ...string) *Sink {
				s, err := New(context.Background(), "archive", cfg, Options{Hostname: "host1", AWS: &aws.Config{Credentials: testCreds}, Logger: testLogger(t), Match: globs})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(s.Close)
				return s
			}
			all := batchRecs("app.a", 100)
			var batch []sinks.Record
			for i := range all {
				if i%2 == 1 {
					all[i].Tag = "sys.b"
				} else {
					batch = append(batch, all[i])
				}
			}
			st := newMemState(all)
			st.match = config.NewTagMatcher([]string{"app.*"}).Match
			if _, err := send(t, sink("app.*"), st, batch); err != nil {
				t.Fatal(err)
			}
			key := st.onlyKey(t)
			body, err := srv.Get(bucket, key)
			if err != nil {
				t.Fatal(err)
			}
			st.match = config.NewTagMatcher([]string{c.glob}).Match
			s := sink(c.glob)
			if err := s.Recover(context.Background(), st); err != nil {
				t.Fatalf("Recover after the match changed: %v", err)
			}
			if got, _ := srv.Get(bucket, key); string(got) != string(body) {
				t.Errorf("object %s: %d bytes, want the %d first uploaded", key, len(got), len(body))
			}
			p := s.Partition(&batch[0])
			if st.delivered[p] != batch[len(batch)-1].Seq || len(st.intents()) != 0 {
				t.Errorf("delivered %v, intents left %v; want %s delivered up to %d", st.delivered, st.intents(), p, batch[len(batch)-1].Seq)
			}
		})
	}
}

// An interrupted upload some of whose records the WAL no longer holds
// (drop_oldest, a damaged entry) cannot be rebuilt: given up when it did
// not land, its records left sent again; delivered when it did, every
// record with it (the records left sent again would go under the same key
// when the first survived, where this very object lies: a false "another
// writer's object" pause).
func TestRecoverDroppedRecords(t *testing.T) {
	for _, c := range []struct {
		name    string
		landed  bool
		dropped func([]sinks.Record) []sinks.Record
	}{
		{"not landed, the first eight dropped", false, func(r []sinks.Record) []sinks.Record { return r[8:] }},
		{"landed, the first eight dropped", true, func(r []sinks.Record) []sinks.Record { return r[8:] }},
		{"landed, a middle one lost", true, func(r []sinks.Record) []sinks.Record { return append(slices.Clone(r[:10]), r[11:]...) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv, url := startEmu(t)
			cfg := testConfig(url)
			recs := batchRecs("app", 20)
			st, key, _ := sentBatch(t, cfg, func(string) []byte { return nil }, recs)
			var in intent
			if raw, _ := st.Get(intentKey(key)); json.Unmarshal(raw, &in) != nil {
				t.Fatalf("intent %s", raw)
			}
			if !c.landed {
				deleteObject(t, url, key)
			}
			st.recs = c.dropped(st.recs)
			puts := srv.Calls()["PutObject"]
			if err := newTestSink(t, cfg).Recover(context.Background(), st); err != nil {
				t.Fatal(err)
			}
			if srv.Calls()["PutObject"] != puts || len(st.intents()) != 0 {
				t.Errorf("uploads %d, intents %v", srv.Calls()["PutObject"]-puts, st.intents())
			}
			if c.landed && st.delivered[in.Partition] != in.Last || !c.landed && len(st.delivered) != 0 {
				t.Errorf("delivered %v (the object landed: %v)", st.delivered, c.landed)
			}
		})
	}
}

// TestRecoverWaitsForS3: an outage at start does not fail Recover; it
// retries until S3 answers, or gives up with ctx.
// Recover does not wait out S3 itself: it returns the classified error
// and the drainer retries it (pausing the sink for a permanent one).
func TestRecoverReturnsClassifiedErrors(t *testing.T) {
	srv, url := startEmu(t)
	cfg := testConfig(url)
	st, key, _ := sentBatch(t, cfg, func(string) []byte { return nil }, batchRecs("app", 10))
	deleteObject(t, url, key)

	s := newTestSink(t, cfg)
	srv.SetFailures(1)
	err := s.Recover(context.Background(), st)
	if e := sinks.Classify(err); e.Class != sinks.Throttled || e.Reason != "SlowDown" {
		t.Fatalf("Recover during an outage: %v (%s)", err, e.Class)
	}
	srv.SetFailures(0)
	if err := s.Recover(context.Background(), st); err != nil {
		t.Fatalf("Recover after the outage: %v", err)
	}
	if _, err := srv.Get(bucket, key); err != nil {
		t.Error(err)
	}

	st, _, _ = sentBatch(t, cfg, func(string) []byte { return nil }, batchRecs("b", 10))
	srv.SetDenyAll(true)
	defer srv.SetDenyAll(false)
	err = s.Recover(context.Background(), st)
	if e := sinks.Classify(err); e.Class != sinks.SinkPermanent || e.Reason != "AccessDenied" {
		t.Errorf("Recover while denied: %v (%s), want sink-permanent AccessDenied", err, e.Class)
	}
}

func deleteObject(t *testing.T, url, key string) {
	t.Helper()
	if _, err := newReader(t, url).DeleteObject(context.Background(), &s3.DeleteObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)}); err != nil {
		t.Fatal(err)
	}
}

func TestIntentFormat(t *testing.T) {
	_, url := startEmu(t)
	cfg := testConfig(url)
	cfg.Key = "k/${tag}/${uuid}-${seq}"
	st, key, _ := sentBatch(t, cfg, func(string) []byte { return nil }, batchRecs("app", 3))
	raw, _ := st.Get([]byte(intentPrefix + key))
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"v", "key", "partition", "first", "last", "records", "bytes", "sha256", "lines_bytes", "lines_crc32c", "uuid", "key_template", "hostname", "encoding", "key_rules"} {
		if _, ok := m[k]; !ok {
			t.Errorf("intent %s has no %q", raw, k)
		}
	}
	if m["first"] != 1.0 || m["last"] != 3.0 || m["records"] != 3.0 || !strings.Contains(key, m["uuid"].(string)) || !strings.Contains(m["partition"].(string), "\x00seq\x00") {
		t.Errorf("intent %s", raw)
	}
}

// TestRecoverWithoutKMSDecrypt: S3 returns an object's checksum on HEAD
// only to credentials that may decrypt it (kms:Decrypt, for an object
// encrypted with KMS); the sink's own object, whose SHA-256 is in its
// metadata, is recognised by a plain HEAD: an upload whose delivery a
// crash lost is finished without that permission.
func TestRecoverWithoutKMSDecrypt(t *testing.T) {
	emu, _ := startEmu(t)
	var checksumHeads atomic.Int32
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodHead && strings.EqualFold(r.Header.Get("X-Amz-Checksum-Mode"), "ENABLED") {
			checksumHeads.Add(1)
			w.WriteHeader(http.StatusForbidden)
			return
		}
		emu.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	cfg := testConfig(front.URL)
	recs := batchRecs("app", 40)
	st, _, _ := sentBatch(t, cfg, func(string) []byte { return nil }, recs) // landed; its delivery lost
	if err := newTestSink(t, cfg).Recover(context.Background(), st); err != nil {
		t.Fatalf("Recover of the sink's own landed object: %v (%s)", err, sinks.Classify(err).Class)
	}
	if n := checksumHeads.Load(); n != 0 {
		t.Errorf("%d HEADs asked S3's checksum", n)
	}
	if len(st.intents()) != 0 {
		t.Errorf("intents left: %v", st.intents())
	}
}

// TestRecoverAfterTheBucketChanged: an upload interrupted before the
// sink's bucket was changed is finished by where it was begun: landed
// there, it stays there (its batch delivered, nothing written to the new
// bucket: no duplicate); not landed, it goes to the new bucket; the old
// bucket not readable (403), to the new one too, with a warning that its
// records may be in both.
func TestRecoverAfterTheBucketChanged(t *testing.T) {
	for _, c := range []struct {
		name      string
		crash     string // "after the upload" or "before the upload"
		denyOld   bool   // the old bucket answers 403 to everything
		denyAll   bool   // every bucket does (credentials refused): Recover fails, to be tried again
		inOld     bool   // the object is in the old bucket after Recover
		inNew     bool   // and in the new one
		logs      string
		recovered float64
	}{
		{"landed there", "after the upload", false, false, true, false, "had landed in the bucket it was begun in", 1},
		{"not landed", "before the upload", false, false, false, true, "it had not landed in the one it was begun in", 1},
		{"old bucket not readable", "after the upload", true, false, true, true, "level=WARN msg=\"finishing an interrupted upload in the sink's bucket of today: the bucket it was begun in, which the sink no longer names, cannot be read", 1},
		{"credentials refused", "after the upload", false, true, true, false, "", 0},
		// An intent of a build that did not record its bucket: the sink's
		// of today, with a warning.
		{"no bucket recorded", "before the upload", false, false, false, true, "level=WARN msg=\"finished an interrupted upload begun by an earlier build, which did not record its bucket, in the sink's bucket", 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv, url := startEmu(t)
			if err := srv.CreateBucket("new-bucket"); err != nil {
				t.Fatal(err)
			}
			cfg := testConfig(url)
			recs := batchRecs("app", 50)
			st, key, body := sentBatch(t, cfg, func(k string) []byte { b, _ := srv.Get(bucket, k); return b }, recs)
			if c.crash == "before the upload" {
				deleteObject(t, url, key)
			}
			if c.name == "no bucket recorded" {
				k := intentPrefix + key
				var in map[string]any
				if err := json.Unmarshal(st.kv[k], &in); err != nil || in["bucket"] != bucket {
					t.Fatalf("intent %s: %v", st.kv[k], err)
				}
				delete(in, "bucket")
				st.kv[k], _ = json.Marshal(in)
			}
			srv.SetDenyBucket(bucket, c.denyOld)
			srv.SetDenyAll(c.denyAll)
			cfg.Bucket = "new-bucket"
			var logs syncbuf.Buffer
			s, err := New(context.Background(), "archive", cfg, Options{Hostname: "host1", AWS: &aws.Config{Credentials: testCreds},
				Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			err = s.Recover(context.Background(), st)
			srv.SetDenyBucket(bucket, false)
			srv.SetDenyAll(false)
			if c.denyAll {
				// Nothing decided: the intent names the old bucket still,
				// and the new one holds nothing.
				if err == nil || len(st.intents()) != 1 || !strings.Contains(err.Error(), "began in bucket "+bucket) || !strings.Contains(err.Error(), "allow s3:GetObject and s3:ListBucket") {
					t.Fatalf("recover with credentials refused: %v, intents %v", err, st.intents())
				}
				if c := sinks.Classify(err).Class; c != sinks.SinkPermanent {
					t.Fatalf("recover with credentials refused: %v, want the sink paused (sink-permanent)", c)
				}
				if _, err := srv.Get("new-bucket", key); err == nil {
					t.Fatal("written to the new bucket")
				}
				return
			}
			if err != nil {
				t.Fatalf("recover: %v\n%s", err, logs.String())
			}
			old, errOld := srv.Get(bucket, key)
			nw, errNew := srv.Get("new-bucket", key)
			if (errOld == nil) != c.inOld || (errNew == nil) != c.inNew {
				t.Fatalf("object in the old bucket %v, in the new %v; want %v and %v", errOld == nil, errNew == nil, c.inOld, c.inNew)
			}
			for _, got := range [][]byte{old, nw} {
				if got != nil && string(got) != string(body) {
					t.Errorf("an object of %d bytes, the first upload %d: they differ", len(got), len(body))
				}
			}
			p := s.Partition(&recs[0])
			if st.delivered[p] != recs[len(recs)-1].Seq || len(st.intents()) != 0 {
				t.Errorf("delivered %v, intents left %v", st.delivered, st.intents())
			}
			if n := testutil.ToFloat64(s.m.recovered); n != c.recovered {
				t.Errorf("recovered %v, want %v", n, c.recovered)
			}
			if !strings.Contains(logs.String(), c.logs) {
				t.Errorf("the log does not say %q:\n%s", c.logs, logs.String())
			}
		})
	}
}

// TestRouterRefusesAnotherTypesPartitioning: the partitioning a CloudWatch
// sink of the same name stored is not read as an S3 sink's.
func TestRouterRefusesAnotherTypesPartitioning(t *testing.T) {
	s := newTestSink(t, testConfig("http://127.0.0.1:1"))
	if _, err := s.Router([]byte(`{"log_group":"g","log_stream":"s","fallback":"unknown","hostname":"h"}`), nil); err == nil || !strings.Contains(err.Error(), "not an S3 sink's") {
		t.Fatalf("a CloudWatch sink's partitioning: %v", err)
	}
	if _, err := s.Router(s.Partitioning(), nil); err != nil {
		t.Fatalf("its own: %v", err)
	}
}

// An interrupted upload of a version before one-stream gzip objects (its
// intent has no one_stream) is finished, after the upgrade, with the bytes
// it was begun with: gzip members one after the other, as its intent's
// SHA-256 says.
func TestRecoverOldGzipIntent(t *testing.T) {
	srv, url := startEmu(t)
	cfg := testConfig(url)
	cfg.Key = "oldgzip/${tag}/${seq}"
	s := newTestSink(t, cfg)
	recs := batchRecs("a", 300)
	st := newMemState(recs)
	old, err := newEncoder(encoding{Compression: config.CompressionGzip, Level: 1, TimeKey: cfg.TimeKey})
	if err != nil {
		t.Fatal(err)
	}
	obj, err := old.buildSplit(recs, []int{100, 200})
	if err != nil {
		t.Fatal(err)
	}
	p := s.Partition(&recs[0])
	in := &intent{Version: intentVersion, Partition: p, First: recs[0].Seq, Last: recs[len(recs)-1].Seq, Records: len(recs),
		KeyTemplate: cfg.Key, Hostname: "host1", KeyRules: keyRulesSanitised, Encoding: old.enc, Members: []int{100, 200}, Bucket: bucket}
	in.Key = objectKey(p, in.First, "")
	in.setObject(obj)
	raw, err := json.Marshal(in)
	if err != nil || bytes.Contains(raw, []byte("one_stream")) {
		t.Fatalf("an old intent: %s, %v", raw, err)
	}
	if err := st.Put(context.Background(), intentKey(in.Key), raw); err != nil {
		t.Fatal(err)
	}
	if err := s.Recover(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	got, err := srv.Get(bucket, in.Key)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, obj.body) {
		t.Error("the recovered object is not the old format's bytes")
	}
	if m, err := gzipMembers(got); m != 2 || err != nil {
		t.Errorf("%d gzip members (%v), want the old format's 2", m, err)
	}
}
