package s3sink

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/queue"
	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// The conditional-write tests run against any S3 endpoint (the emulator,
// moto_server) through the SDK alone, in a bucket of their own with
// versioning on: a version is kept for every write, so that a test sees
// an object written twice even when the bytes were the same.
const sharedBucket = "shared-logs"

// versionedBucket creates sharedBucket at url, if it is not there yet,
// with versioning on, and returns a client for it.
func versionedBucket(t *testing.T, url string) *s3.Client {
	t.Helper()
	cl := newReader(t, url)
	ctx := context.Background()
	if _, err := cl.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(sharedBucket)}); err != nil {
		if _, err := cl.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(sharedBucket)}); err != nil {
			t.Fatalf("create bucket %s: %v", sharedBucket, err)
		}
	}
	if _, err := cl.PutBucketVersioning(ctx, &s3.PutBucketVersioningInput{Bucket: aws.String(sharedBucket),
		VersioningConfiguration: &types.VersioningConfiguration{Status: types.BucketVersioningStatusEnabled}}); err != nil {
		t.Fatalf("turn versioning on in %s: %v", sharedBucket, err)
	}
	return cl
}

// versions counts the versions of key.
func versions(t *testing.T, cl *s3.Client, key string) int {
	t.Helper()
	out, err := cl.ListObjectVersions(context.Background(), &s3.ListObjectVersionsInput{Bucket: aws.String(sharedBucket), Prefix: aws.String(key)})
	if err != nil {
		t.Fatalf("list versions of %s: %v", key, err)
	}
	n := 0
	for _, v := range out.Versions {
		if aws.ToString(v.Key) == key {
			n++
		}
	}
	return n
}

// objectsUnder reads every object under prefix: key → bytes.
func objectsUnder(t *testing.T, cl *s3.Client, prefix string) map[string][]byte {
	t.Helper()
	ctx := context.Background()
	out := map[string][]byte{}
	p := s3.NewListObjectsV2Paginator(cl, &s3.ListObjectsV2Input{Bucket: aws.String(sharedBucket), Prefix: aws.String(prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			t.Fatalf("list %s: %v", prefix, err)
		}
		for _, c := range page.Contents {
			out[aws.ToString(c.Key)] = getBytes(t, cl, aws.ToString(c.Key))
		}
	}
	return out
}

func getBytes(t *testing.T, cl *s3.Client, key string) []byte {
	t.Helper()
	g, err := cl.GetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String(sharedBucket), Key: aws.String(key)})
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	defer g.Body.Close()
	b, err := io.ReadAll(g.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func openUploads(t *testing.T, cl *s3.Client, prefix string) int {
	t.Helper()
	out, err := cl.ListMultipartUploads(context.Background(), &s3.ListMultipartUploadsInput{Bucket: aws.String(sharedBucket), Prefix: aws.String(prefix)})
	var ae smithy.APIError
	if errors.As(err, &ae) && ae.ErrorCode() == "NoSuchUpload" {
		return 0 // gofakes3's answer for a bucket where no upload was ever begun
	}
	if err != nil {
		t.Fatalf("list uploads under %s: %v", prefix, err)
	}
	return len(out.Uploads)
}

// writer is one sink and its drainer on a WAL of its own, as one forwarder
// runs them, with its log and metrics.
type writer struct {
	t    *testing.T
	w    *wal.WAL
	sink *Sink
	reg  *prometheus.Registry
	log  *syncBuffer
	stop func()
}

// newWriter opens (or reopens) the WAL in dir and builds a sink for cfg
// there, registered in a registry of its own; api, if set, wraps the SDK
// client. The drainer starts with run.
func newWriter(t *testing.T, dir string, cfg config.S3, api func(s3API) s3API) *writer {
	t.Helper()
	wr := &writer{t: t, w: openWAL(t, dir), reg: prometheus.NewRegistry(), log: &syncBuffer{}}
	t.Cleanup(func() { wr.w.Close() })
	log := slog.New(slog.NewTextHandler(wr.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s, err := New(context.Background(), "archive", cfg, Options{Hostname: "host1", AWS: &aws.Config{Credentials: testCreds}, Logger: log, Registerer: wr.reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if api != nil {
		s.api = api(s.api)
	}
	wr.sink = s
	return wr
}

func (wr *writer) run() {
	opts := drainerOptions()
	opts.Fingerprint = wr.sink.Fingerprint()
	opts.Metrics = queue.NewMetrics(wr.reg)
	opts.Logger = slog.New(slog.NewTextHandler(wr.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	wr.stop = runDrainer(wr.t, wr.w, "archive", wr.sink, opts)
}

// metric sums the series of name whose labels include those given.
func (wr *writer) metric(name string, labels ...string) float64 {
	wr.t.Helper()
	fams, err := wr.reg.Gather()
	if err != nil {
		wr.t.Fatal(err)
	}
	sum := 0.0
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if hasLabels(m, labels) {
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

func hasLabels(m *dto.Metric, kv []string) bool {
	for i := 0; i+1 < len(kv); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == kv[i] && l.GetValue() == kv[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// errorLines are the writer's error-level log lines.
func (wr *writer) errorLines() []string {
	var out []string
	for _, l := range strings.Split(wr.log.String(), "\n") {
		if strings.Contains(l, "level=ERROR") {
			out = append(out, l)
		}
	}
	return out
}

// waitPaused waits until the sink is paused, and then a few probes more.
func (wr *writer) waitPaused() {
	wr.t.Helper()
	waitFor(wr.t, "pause", func() bool { return wr.metric("forwarder_sink_paused") == 1 })
	time.Sleep(5 * drainerOptions().PauseRetry)
	if wr.metric("forwarder_sink_paused") != 1 {
		wr.t.Errorf("the sink was paused, and is not any more:\n%s", wr.log.String())
	}
}

// checkPausedFor checks the one error line of a pause for another
// writer's object under key.
func (wr *writer) checkPausedFor(key string) {
	wr.t.Helper()
	lines := wr.errorLines()
	if len(lines) != 1 {
		wr.t.Fatalf("%d error lines, want one:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	for _, want := range []string{"sink paused", "reason=PreconditionFailed", "bucket " + sharedBucket, key, "${hostname}", "sinks[archive].key"} {
		if !strings.Contains(lines[0], want) {
			wr.t.Errorf("the error line does not say %s:\n%s", want, lines[0])
		}
	}
}

// conflictConfig is a sink configuration for sharedBucket whose keys have
// no ${hostname}: every forwarder renders the same keys for the same
// records. Objects are cut by size (the last by age). With multipart, the
// first object is over multipart_threshold.
func conflictConfig(url, prefix string, multipart bool) config.S3 {
	cfg := testConfig(url)
	cfg.Bucket = sharedBucket
	cfg.Key = prefix + "/${tag}/${seq}.json.gz"
	cfg.MaxObjectBytes = 4 * config.KiB
	cfg.MaxObjectAge = config.Duration(time.Second)
	if multipart {
		cfg.Key = prefix + "/${tag}/${seq}.json"
		cfg.Compression, cfg.CompressionLevel = config.CompressionNone, 0
		cfg.MultipartThreshold = 5 * config.MiB
		cfg.MaxObjectBytes = 5*config.MiB + 256*config.KiB
		// The first object must reach multipart_threshold before it is
		// a second old: on a loaded machine 1s took 4.2 MiB of it.
		cfg.MaxObjectAge = config.Duration(3 * time.Second)
	}
	return cfg
}

// conflictRecs are records of tag: 5.5 MiB of them with multipart (an
// object over multipart_threshold and a small one), else 200 small ones.
func conflictRecs(tag, idPrefix string, multipart bool) ([]wal.Record, []string) {
	at := time.Date(2025, 6, 15, 15, 0, 0, 0, time.UTC)
	n, pad := 200, 20
	if multipart {
		n, pad = 5632, 960
	}
	var recs []wal.Record
	var ids []string
	for i := range n {
		id := fmt.Sprintf("%s%d", idPrefix, i)
		recs = append(recs, rec(tag, id, at.Add(time.Duration(i)), pad))
		ids = append(ids, id)
	}
	return recs, ids
}

// dieAfterWrite passes calls on until a PutObject or
// CompleteMultipartUpload has stored its object; then the process "dies":
// that answer and every call after it is lost.
func dieAfterWrite(api s3API) s3API { return &dyingAPI{s3API: api, budget: -1, afterWrite: true} }

// testConditionalWrites is the conditional-write behaviour of the sink
// against the S3 endpoint at url.
func testConditionalWrites(t *testing.T, url string) {
	cl := versionedBucket(t, url)
	kinds := []struct {
		name      string
		multipart bool
	}{{"put", false}, {"multipart", true}}

	// A crash after the upload and before its delivery was committed:
	// the restart's upload finds the object there with the same bytes,
	// counts the batch as delivered and writes nothing (one version).
	for _, k := range kinds {
		t.Run("crash after the upload/"+k.name, func(t *testing.T) {
			prefix := "crash-" + k.name
			cfg := conflictConfig(url, prefix, k.multipart)
			dir := t.TempDir()
			recs, ids := conflictRecs("app", "c", k.multipart)
			first := newWriter(t, dir, cfg, dieAfterWrite)
			res := appendRecs(t, first.w, recs)
			first.run()
			dying := first.sink.api.(*dyingAPI)
			waitFor(t, "the write that kills the client", func() bool { return !dying.alive() })
			first.stop()
			first.w.Close()
			key := fmt.Sprintf("%s/app/%020d.json", prefix, res.First)
			if !k.multipart {
				key += ".gz"
			}
			stored := getBytes(t, cl, key)

			second := newWriter(t, dir, cfg, nil)
			second.run()
			waitCursor(t, second.w, "archive", res.Last, time.Minute)
			if got := getBytes(t, cl, key); !bytes.Equal(got, stored) {
				t.Errorf("%s changed: %d bytes, were %d", key, len(got), len(stored))
			}
			if n := versions(t, cl, key); n != 1 {
				t.Errorf("%s has %d versions: the restart wrote it again", key, n)
			}
			if n := second.metric("forwarder_s3_conditional_conflicts_total", "outcome", "same"); n != 1 {
				t.Errorf("conflicts with the same object: %v, want 1", n)
			}
			if n := second.metric("forwarder_s3_conditional_conflicts_total", "outcome", "other"); n != 0 {
				t.Errorf("conflicts with another object: %v, want 0", n)
			}
			if n := second.metric("forwarder_s3_recovered_intents_total"); n != 1 {
				t.Errorf("recovered intents: %v, want 1", n)
			}
			objs := objectsUnder(t, cl, prefix+"/")
			if n := second.metric("forwarder_s3_objects_uploaded_total"); n != float64(len(objs)-1) {
				t.Errorf("objects uploaded by the restart: %v of %d, want all but the one that was there", n, len(objs))
			}
			if n := second.metric("forwarder_sink_paused"); n != 0 || len(second.errorLines()) != 0 {
				t.Errorf("paused %v, error lines %q", n, second.errorLines())
			}
			if n := openUploads(t, cl, prefix+"/"); n != 0 {
				t.Errorf("%d multipart uploads left open", n)
			}
			if k.multipart && int64(len(stored)) <= int64(cfg.MultipartThreshold) {
				t.Errorf("%s holds %d bytes: not a multipart upload", key, len(stored))
			}
			checkOnce(t, storedObjects(t, objs, cfg), ids)
		})
	}

	// Another writer's object under the key the sink is about to write:
	// the sink pauses with one error line that names the bucket, the key
	// and the fix; the object is left as it was, and the records stay in
	// the WAL, neither dropped nor dead-lettered.
	for _, k := range kinds {
		t.Run("another writer's object/"+k.name, func(t *testing.T) {
			prefix := "foreign-" + k.name
			cfg := conflictConfig(url, prefix, k.multipart)
			recs, _ := conflictRecs("app", "f", k.multipart)
			wr := newWriter(t, t.TempDir(), cfg, nil)
			res := appendRecs(t, wr.w, recs)
			key := fmt.Sprintf("%s/app/%020d.json", prefix, res.First)
			if !k.multipart {
				key += ".gz"
			}
			foreign := []byte("another forwarder's object\n")
			if _, err := cl.PutObject(context.Background(), &s3.PutObjectInput{Bucket: aws.String(sharedBucket), Key: aws.String(key), Body: bytes.NewReader(foreign)}); err != nil {
				t.Fatal(err)
			}
			wr.run()
			wr.waitPaused()
			wr.checkPausedFor(key)
			if got := getBytes(t, cl, key); !bytes.Equal(got, foreign) {
				t.Errorf("%s was overwritten: %d bytes", key, len(got))
			}
			if n := versions(t, cl, key); n != 1 {
				t.Errorf("%s has %d versions, want the foreign one only", key, n)
			}
			if pos, _ := wr.w.Cursor("archive"); pos >= res.First {
				t.Errorf("cursor at %d: it passed records that were not delivered (first %d)", pos, res.First)
			}
			if n := wr.metric("forwarder_sink_dead_letters_total"); n != 0 {
				t.Errorf("%v records dead-lettered", n)
			}
			if n := wr.metric("forwarder_s3_conditional_conflicts_total", "outcome", "other"); n != 1 {
				t.Errorf("conflicts with another object: %v, want 1", n)
			}
			if n := openUploads(t, cl, prefix+"/"); n != 0 {
				t.Errorf("%d multipart uploads left open", n)
			}
			if k.multipart {
				// The refused upload was multipart: its intent has its id.
				wr.sink.mu.Lock()
				var in *intent
				for _, o := range wr.sink.open {
					if o.Key == key {
						in = o
					}
				}
				wr.sink.mu.Unlock()
				if in == nil || in.UploadID == "" || in.Bytes <= int64(cfg.MultipartThreshold) {
					t.Errorf("intent of %s: %+v, want a multipart upload's", key, in)
				}
			}
		})
	}

	// Two forwarders, each with its WAL, sharing the bucket and a key
	// template without ${hostname}: the second finds the first's objects
	// under its keys and pauses; nothing of the first's is overwritten.
	// The second also has records of a tag the first never had, whose
	// objects it may deliver before it pauses: the pause holds all the
	// same (one error line), since the collision needs a new key template.
	t.Run("two writers", func(t *testing.T) {
		prefix := "two"
		cfg := conflictConfig(url, prefix, false)
		recsA, idsA := conflictRecs("app", "a", false)
		a := newWriter(t, t.TempDir(), cfg, nil)
		resA := appendRecs(t, a.w, recsA)
		a.run()
		waitCursor(t, a.w, "archive", resA.Last, time.Minute)
		a.stop()
		before := objectsUnder(t, cl, prefix+"/")
		if len(before) < 2 {
			t.Fatalf("the first writer wrote %d objects, want several", len(before))
		}
		checkOnce(t, storedObjects(t, before, cfg), idsA)

		recsB, _ := conflictRecs("app", "b", false)
		own, _ := conflictRecs("own", "o", false)
		b := newWriter(t, t.TempDir(), cfg, nil)
		resB := appendRecs(t, b.w, append(recsB, own...))
		b.run()
		b.waitPaused()
		after := objectsUnder(t, cl, prefix+"/")
		for key, body := range before {
			if !bytes.Equal(after[key], body) {
				t.Errorf("%s was overwritten", key)
			}
			if n := versions(t, cl, key); n != 1 {
				t.Errorf("%s has %d versions", key, n)
			}
		}
		if len(b.errorLines()) != 1 || !strings.Contains(b.errorLines()[0], prefix+"/app/") {
			t.Errorf("error lines %q, want one naming a key under %s/app/", b.errorLines(), prefix)
		}
		if pos, _ := b.w.Cursor("archive"); pos >= resB.Last {
			t.Errorf("the second writer's cursor passed its records (%d of %d)", pos, resB.Last)
		}
		if n := b.metric("forwarder_sink_dead_letters_total"); n != 0 {
			t.Errorf("%v records dead-lettered", n)
		}
		if n := b.metric("forwarder_s3_conditional_conflicts_total", "outcome", "other"); n != 1 {
			t.Errorf("conflicts with another object: %v, want 1", n)
		}
	})
}

func keysOfMap(m map[string][]byte) []string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}

// storedObjects decodes objects read back with objectsUnder.
func storedObjects(t *testing.T, objs map[string][]byte, cfg config.S3) []stored {
	t.Helper()
	enc := ""
	if cfg.Compression != config.CompressionNone {
		enc = cfg.Compression
	}
	var out []stored
	for key, body := range objs {
		out = append(out, stored{Key: key, Body: body, Lines: splitLines(t, key, decompress(t, enc, body))})
	}
	return out
}

func TestConditionalWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: racing conditional writes against the emulator and moto_server; make test runs it")
	}
	t.Parallel()
	_, url := startEmu(t)
	testConditionalWrites(t, url)
}

// Recover meets another writer's object under an intent's key: with the
// key template it was rendered with, the sink stays paused (the object is
// left alone, the intent kept); once the template no longer renders that
// key (the fix), the intent is given up and its records go out again
// under the new keys.
func TestRecoverMeetsAnotherWritersObject(t *testing.T) {
	srv, url := startEmu(t)
	cfg := testConfig(url)
	cfg.Key = "r/${tag}/${seq}.json.gz"
	recs := batchRecs("app", 30)
	st, key, _ := sentBatch(t, cfg, func(string) []byte { return nil }, recs)
	foreign := []byte("another writer's object\n")
	deleteObject(t, url, key) // see TestTakenKeyComparison
	if _, err := newReader(t, url).PutObject(context.Background(), &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), Body: bytes.NewReader(foreign)}); err != nil {
		t.Fatal(err)
	}
	paused := newTestSink(t, cfg)
	for probe := range 3 { // the drainer calls Recover again every pause_retry
		before := srv.Calls()
		err := paused.Recover(context.Background(), st)
		if e := sinks.Classify(err); e.Class != sinks.SinkPermanent || e.Reason != "PreconditionFailed" ||
			!strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), "put ${hostname} or another per-replica field in sinks[archive].key") {
			t.Fatalf("Recover %d: %v (%s %s), want a sink-permanent error naming the key and the fix", probe, err, e.Class, e.Reason)
		}
		// The first meets the object; the probes after it do not send
		// the object again to meet the same refusal.
		if n := srv.Calls()["PutObject"] - before["PutObject"]; probe > 0 && n != 0 {
			t.Errorf("Recover %d uploaded the object again (%d PutObject)", probe, n)
		}
	}
	if len(st.intents()) != 1 || len(st.delivered) != 0 {
		t.Errorf("intents %v, delivered %v: the intent must wait", st.intents(), st.delivered)
	}

	fixed := cfg
	fixed.Key = "r/${tag}/${hostname}-${seq}.json.gz"
	var logs syncBuffer
	s, err := New(context.Background(), "archive", fixed, Options{Hostname: "host1", AWS: &aws.Config{Credentials: testCreds},
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Recover(context.Background(), st); err != nil {
		t.Fatalf("Recover with a key template that keeps replicas apart: %v", err)
	}
	if len(st.intents()) != 0 || len(st.delivered) != 0 {
		t.Errorf("intents %v, delivered %v: want the intent given up, nothing delivered", st.intents(), st.delivered)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), key) {
		t.Errorf("no warning naming %s:\n%s", key, logs.String())
	}
	if got, _ := srv.Get(bucket, key); !bytes.Equal(got, foreign) {
		t.Errorf("%s was overwritten", key)
	}
}

// How a taken key is told to hold the sink's own object: by the SHA-256 in
// its metadata; for an object written without it, by its whole-object
// SHA-256 checksum (a PutObject of an earlier version), or by its bytes.
// The same size with other bytes is another writer's in every case.
func TestTakenKeyComparison(t *testing.T) {
	srv, url := startEmu(t)
	cfg := testConfig(url)
	cl := newReader(t, url)
	for i, c := range []struct {
		name     string
		body     func([]byte) []byte
		checksum bool
		same     bool
	}{
		{"the same bytes, with a checksum", func(b []byte) []byte { return b }, true, true},
		{"the same bytes, without checksum", func(b []byte) []byte { return b }, false, true},
		{"other bytes of the same size, with a checksum", flipLast, true, false},
		{"other bytes of the same size, without checksum", flipLast, false, false},
		{"other bytes, longer", func(b []byte) []byte { return append(bytes.Clone(b), '\n') }, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			recs := batchRecs(fmt.Sprintf("t%d", i), 40)
			st, key, body := sentBatch(t, cfg, func(k string) []byte { b, _ := srv.Get(bucket, k); return b }, recs)
			// The object as a writer without the metadata left it (deleted
			// first: gofakes3's in-memory store would keep the metadata of
			// the object a PUT replaces, which S3 does not).
			deleteObject(t, url, key)
			put := &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), Body: bytes.NewReader(c.body(body))}
			if c.checksum {
				put.ChecksumSHA256 = aws.String(sha256b64(c.body(body)))
			}
			if _, err := cl.PutObject(context.Background(), put); err != nil {
				t.Fatal(err)
			}
			reg := prometheus.NewRegistry()
			s, err := New(context.Background(), "archive", cfg, Options{Hostname: "host1", AWS: &aws.Config{Credentials: testCreds}, Registerer: reg})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			gets := srv.Calls()["GetObject"]
			err = s.Recover(context.Background(), st)
			if c.same && err != nil || !c.same && !keyTaken(err) {
				t.Fatalf("Recover: %v; want the key found to hold the same object: %v", err, c.same)
			}
			if got, _ := srv.Get(bucket, key); !bytes.Equal(got, c.body(body)) {
				t.Error("the object was rewritten")
			}
			if n := srv.Calls()["GetObject"] - gets; (n > 0) != (!c.checksum && len(c.body(body)) == len(body)) {
				t.Errorf("%d GETs: want one only for an object of the same size without metadata or checksum", n)
			}
		})
	}
}

func flipLast(b []byte) []byte {
	b = bytes.Clone(b)
	b[len(b)-1] ^= 1
	return b
}

func sha256b64(b []byte) string {
	sum := sha256.Sum256(b)
	return base64.StdEncoding.EncodeToString(sum[:])
}

// A taken key that the sink may not read (no s3:GetObject) pauses it with
// what to allow; a key found taken and then free is retried.
func TestTakenKeyNotReadable(t *testing.T) {
	emu, _ := startEmu(t)
	var headStatus atomic.Int32
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodHead {
			if st := int(headStatus.Load()); st != 0 {
				w.WriteHeader(st)
				return
			}
		}
		emu.ServeHTTP(w, r)
	}))
	defer front.Close()
	cfg := testConfig(front.URL)
	recs := batchRecs("app", 10)
	s := newTestSink(t, cfg)
	key := objectKey(s.Partition(&recs[0]), recs[0].Seq, "")
	if _, err := newReader(t, front.URL).PutObject(context.Background(), &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), Body: strings.NewReader("x")}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		status int
		class  sinks.Class
		msg    string
	}{
		{http.StatusForbidden, sinks.SinkPermanent, "allow s3:GetObject on arn:aws:s3:::logs/*"},
		{http.StatusNotFound, sinks.Retryable, "which was there a moment ago"},
	} {
		headStatus.Store(int32(c.status))
		_, err := send(t, s, newMemState(recs), recs)
		if e := sinks.Classify(err); e.Class != c.class || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("HEAD answering %d: %v (%s), want %s with %q", c.status, err, e.Class, c.class, c.msg)
		}
	}
}

// An object that landed before a crash, compressed by a compressor that
// has changed since: Recover rebuilds other bytes of the same records, and
// the key's object is still this sink's (counted as delivered), not
// another writer's.
func TestRecoverAfterTheCompressorChanged(t *testing.T) {
	for _, failFirst := range []bool{false, true} {
		t.Run(fmt.Sprint("first upload fails ", failFirst), func(t *testing.T) { testRecoverAfterTheCompressorChanged(t, failFirst) })
	}
}

func testRecoverAfterTheCompressorChanged(t *testing.T, failFirst bool) {
	srv, url := startEmu(t)
	cfg := testConfig(url)
	recs := batchRecs("app", 300)
	st, key, _ := sentBatch(t, cfg, func(string) []byte { return nil }, recs)
	// What the old compressor made of the records: here, gzip level 9.
	obj := gzipAt(t, cfg, recs, 9)
	in := landedAs(t, url, st, key, obj, nil)
	newSink := func() *Sink {
		s, err := New(context.Background(), "archive", cfg, Options{Hostname: "host1", AWS: &aws.Config{Credentials: testCreds}, Registerer: prometheus.NewRegistry()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	s := newSink()
	if failFirst {
		// The first try's upload of the rebuilt object fails (S3 busy)
		// after the intent was rewritten with it; the next start tries
		// again, knowing the object first uploaded all the same.
		srv.SetFailures(1)
		err := s.Recover(context.Background(), st)
		srv.SetFailures(0)
		var again intent
		raw, _ := st.Get(intentKey(key))
		if err == nil || json.Unmarshal(raw, &again) != nil || again.SHA256 == obj.sha256 {
			t.Fatalf("the first Recover: %v; intent %s: want a failed upload of the rebuilt object", err, raw)
		}
		s = newSink()
	}
	if err := s.Recover(context.Background(), st); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	if st.delivered[in.Partition] != in.Last || len(st.intents()) != 0 {
		t.Errorf("delivered %v, intents %v", st.delivered, st.intents())
	}
	if got, _ := srv.Get(bucket, key); !bytes.Equal(got, obj.body) {
		t.Error("the object was rewritten")
	}
	if n := testutil.ToFloat64(s.m.conflictSame); n != 1 {
		t.Errorf("conflicts with the same object: %v, want 1", n)
	}
}

// HEAD of a taken key answered 400 without a body (how S3 answers a HEAD
// with expired credentials, or a header it refuses): the sink asks again
// with GET, whose answer names the error, or compares the object it reads.
func TestTakenKeyHeadBadRequest(t *testing.T) {
	emu, _ := startEmu(t)
	var getExpired atomic.Bool
	var heads atomic.Int32
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodHead:
			heads.Add(1)
			w.WriteHeader(http.StatusBadRequest)
			return
		case r.Method == http.MethodGet && getExpired.Load():
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>ExpiredToken</Code><Message>The provided token has expired.</Message></Error>`)
			return
		}
		emu.ServeHTTP(w, r)
	}))
	defer front.Close()
	cfg := testConfig(front.URL)
	cfg.Tags = map[string]string{"team": "platform"} // a bare 400 was once taken for refused tags
	recs := batchRecs("app", 10)
	s := newTestSink(t, cfg)
	key := objectKey(s.Partition(&recs[0]), recs[0].Seq, "")
	if _, err := newReader(t, front.URL).PutObject(context.Background(), &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), Body: strings.NewReader("x")}); err != nil {
		t.Fatal(err)
	}

	getExpired.Store(true)
	_, err := send(t, s, newMemState(recs), recs)
	// The test's credentials are static: fetched again, the same.
	if e := sinks.Classify(err); e.Reason != "expired_credentials" || strings.Contains(err.Error(), "tags") {
		t.Errorf("HEAD 400, GET ExpiredToken: %v (%s), want the expired credentials named", err, e.Reason)
	}
	getExpired.Store(false)
	_, err = send(t, s, newMemState(recs), recs)
	if !keyTaken(err) {
		t.Errorf("HEAD 400, GET of another writer's object: %v, want the key taken", err)
	}
	if heads.Load() == 0 {
		t.Fatal("no HEAD was made")
	}

	// The sink's own object, read by GET, is delivered, not another writer's.
	recs = batchRecs("own", 40)
	st, _, _ := sentBatch(t, cfg, func(string) []byte { return nil }, recs)
	if err := newTestSink(t, cfg).Recover(context.Background(), st); err != nil {
		t.Errorf("Recover of the sink's own object behind HEAD 400: %v", err)
	}
}

// TestRecoverAfterTheCompressorChangedTwice: an object first uploaded with
// one compressor (gzip level 9 stands for it), rebuilt at a restart by a
// second (level 5), whose upload landed but whose delivery a crash lost,
// and rebuilt again at the next restart by a third (this build's): the
// object the second put under the key is recognised as the sink's own.
func TestRecoverAfterTheCompressorChangedTwice(t *testing.T) {
	srv, url := startEmu(t)
	cfg := testConfig(url)
	recs := batchRecs("app", 300)
	st, key, _ := sentBatch(t, cfg, func(string) []byte { return nil }, recs)
	first, second := gzipAt(t, cfg, recs, 9), gzipAt(t, cfg, recs, 5)
	// As the second restart left it: the first object in was, the
	// second's in place.
	in := landedAs(t, url, st, key, second, []wasObject{{Bytes: int64(len(first.body)), SHA256: first.sha256}})
	s := newTestSink(t, cfg)
	if err := s.Recover(context.Background(), st); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	if st.delivered[in.Partition] != in.Last || len(st.intents()) != 0 {
		t.Errorf("delivered %v, intents %v", st.delivered, st.intents())
	}
	if got, _ := srv.Get(bucket, key); !bytes.Equal(got, second.body) {
		t.Error("the object was rewritten")
	}
}

// gzipAt is the object of recs compressed with gzip at level: what another
// compressor than this build's made of them.
func gzipAt(t *testing.T, cfg config.S3, recs []sinks.Record, level int) *object {
	t.Helper()
	enc, err := newEncoder(encoding{Compression: config.CompressionGzip, Level: level, TimeKey: cfg.TimeKey})
	if err != nil {
		t.Fatal(err)
	}
	o, err := enc.build(recs)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// landedAs puts obj under key, as an upload that landed did, and makes the
// intent of key in st describe it, with was: it returns the intent.
func landedAs(t *testing.T, url string, st *memState, key string, obj *object, was []wasObject) intent {
	t.Helper()
	deleteObject(t, url, key) // see TestTakenKeyComparison
	if _, err := newReader(t, url).PutObject(context.Background(), &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(key),
		Body: bytes.NewReader(obj.body), Metadata: map[string]string{metaSHA256: obj.sha256}}); err != nil {
		t.Fatal(err)
	}
	raw, _ := st.Get(intentKey(key))
	var in intent
	if err := json.Unmarshal(raw, &in); err != nil {
		t.Fatal(err)
	}
	in.Was, in.Bytes, in.SHA256 = was, int64(len(obj.body)), obj.sha256
	if err := putIntent(context.Background(), st, intentKey(key), &in); err != nil {
		t.Fatal(err)
	}
	return in
}
