package s3sink

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/logfwd/forwarder/config"
	s3emu "github.com/logfwd/forwarder/emulator/s3emu"
	"github.com/logfwd/forwarder/queue"
	"github.com/logfwd/forwarder/wal"
)

// checkOnce fails unless every id in want appears exactly once in objs and
// nothing else does.
func checkOnce(t *testing.T, objs []stored, want []string) {
	t.Helper()
	seen := ids(t, objs)
	for _, id := range want {
		if seen[id] != 1 {
			t.Errorf("record %s stored %d times", id, seen[id])
		}
		delete(seen, id)
	}
	for id, n := range seen {
		t.Errorf("unexpected record %s stored %d times", id, n)
	}
}

func TestDrainCutsBySize(t *testing.T) {
	_, url := startEmu(t)
	cfg := testConfig(url)
	cfg.MaxObjectBytes = 4 * config.KiB
	cfg.MaxObjectAge = config.Duration(time.Hour) // only size cuts, but for the end
	s := newTestSink(t, cfg)
	w := openWAL(t, t.TempDir())

	at := time.Date(2025, 6, 15, 15, 6, 40, 0, time.UTC)
	var recs []wal.Record
	var want []string
	total := 0
	for i := range 600 {
		id := fmt.Sprintf("s%d", i)
		recs = append(recs, rec("app", id, at, i%100))
		want = append(want, id)
		r := sinkRecs(recs[i])[0]
		total += s.Size(&r)
	}
	res := appendRecs(t, w, recs)
	stop := runDrainer(t, w, "archive", s, drainerOptions())
	// All but the last object are full; wait for those, then stop, which
	// leaves the tail for the next start.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		n := 0
		for _, o := range readObjects(t, newReader(t, url), "logs/") {
			for _, l := range o.Lines {
				n += len(l) + 1
			}
		}
		if n > total-4096 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	objs := readObjects(t, newReader(t, url), "logs/")
	if len(objs) < 10 {
		t.Fatalf("%d objects, want many", len(objs))
	}
	for i, o := range objs {
		size := 0
		for _, l := range o.Lines {
			size += len(l) + 1
		}
		if size > 4096 {
			t.Errorf("object %s holds %d bytes of lines, over max_object_bytes", o.Key, size)
		}
		if i < len(objs)-1 && size < 4096-300 {
			t.Errorf("object %s holds %d bytes of lines: cut early", o.Key, size)
		}
		if !strings.HasPrefix(o.Key, "logs/app/2025/06/15/15/host1-") || o.ContentEncoding != "gzip" || o.ContentType != "application/x-ndjson" {
			t.Errorf("object %s: encoding %q, type %q", o.Key, o.ContentEncoding, o.ContentType)
		}
	}
	// Each key names its first record's sequence number; together the
	// objects cover the records in order.
	next := res.First
	for _, o := range objs {
		if want := fmt.Sprintf("host1-%020d.json.gz", next); !strings.HasSuffix(o.Key, want) {
			t.Errorf("object %s, want it to end %s", o.Key, want)
		}
		next += uint64(len(o.Lines))
	}

	// The rest goes at the next start, by age.
	cfg.MaxObjectAge = config.Duration(50 * time.Millisecond)
	s2 := newTestSink(t, cfg)
	runDrainer(t, w, "archive", s2, drainerOptions())
	waitCursor(t, w, "archive", res.Last, 10*time.Second)
	checkOnce(t, readObjects(t, newReader(t, url), "logs/"), want)
}

func TestDrainCutsByAgeAndTimeBucket(t *testing.T) {
	_, url := startEmu(t)
	cfg := testConfig(url)
	cfg.MaxObjectAge = config.Duration(300 * time.Millisecond)
	s := newTestSink(t, cfg)
	w := openWAL(t, t.TempDir())
	runDrainer(t, w, "archive", s, drainerOptions())

	h15 := time.Date(2025, 6, 15, 15, 59, 59, 0, time.UTC)
	h16 := h15.Add(time.Second)
	start := time.Now()
	res := appendRecs(t, w, []wal.Record{rec("app", "a", h15, 10), rec("app", "b", h16, 10), rec("app", "c", h15, 10), rec("web", "d", h16, 10)})
	waitCursor(t, w, "archive", res.Last, 10*time.Second)
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Errorf("delivered after %v, before max_object_age", took)
	}
	objs := readObjects(t, newReader(t, url), "logs/")
	got := map[string][]string{}
	for _, o := range objs {
		dir := o.Key[:strings.LastIndexByte(o.Key, '/')]
		for _, l := range o.Lines {
			got[dir] = append(got[dir], l[strings.Index(l, `"id"`):])
		}
	}
	want := map[string][]string{
		"logs/app/2025/06/15/15": {`"id":"a","msg":"xxxxxxxxxx"}`, `"id":"c","msg":"xxxxxxxxxx"}`},
		"logs/app/2025/06/15/16": {`"id":"b","msg":"xxxxxxxxxx"}`},
		"logs/web/2025/06/15/16": {`"id":"d","msg":"xxxxxxxxxx"}`},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) || len(objs) != 3 {
		t.Errorf("objects by prefix:\n%v\nwant\n%v", got, want)
	}
	if !strings.HasPrefix(objs[0].Lines[0], `{"@timestamp":"2025-06-15T15:59:59.000000000Z","id":"a"`) {
		t.Errorf("first line %s", objs[0].Lines[0])
	}
}

func TestCompressions(t *testing.T) {
	srv, url := startEmu(t)
	w := openWAL(t, t.TempDir())
	at := time.Date(2025, 6, 15, 15, 0, 0, 0, time.UTC)
	for i, c := range []struct {
		compression string
		level       int
		encoding    string
	}{{config.CompressionGzip, 6, "gzip"}, {config.CompressionZstd, 2, "zstd"}, {config.CompressionNone, 0, ""}} {
		cfg := testConfig(url)
		cfg.Compression, cfg.CompressionLevel = c.compression, c.level
		cfg.Key = c.compression + "/${tag}/${seq}"
		cfg.TagKey = "tag"
		name := "s" + c.compression
		var recs []wal.Record
		var want []string
		for j := range 200 {
			id := fmt.Sprintf("%s-%d", c.compression, j)
			recs = append(recs, rec("t", id, at, j))
			want = append(want, id)
		}
		res := appendRecs(t, w, recs)
		runDrainer(t, w, name, newTestSink(t, cfg), drainerOptions())
		waitCursor(t, w, name, res.Last, 10*time.Second)
		objs := readObjects(t, newReader(t, url), c.compression+"/")
		for _, o := range objs {
			if o.ContentEncoding != c.encoding || o.ContentType != "application/x-ndjson" {
				t.Errorf("%s: Content-Encoding %q, Content-Type %q", o.Key, o.ContentEncoding, o.ContentType)
			}
			if !strings.Contains(o.Lines[0], `,"tag":"t",`) {
				t.Errorf("%s: line %s has no tag", o.Key, o.Lines[0])
			}
		}
		checkOnce(t, objs, want)
		_ = i
		// The next sink's cursor starts at the oldest record in the WAL: wait
		// until retention has deleted these, or it would store them too.
		deadline := time.Now().Add(10 * time.Second)
		for w.Stats().FirstSeq <= res.Last {
			if time.Now().After(deadline) {
				t.Fatalf("records up to %d still in the WAL 10 s after every sink delivered them (%+v)", res.Last, w.Stats())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	for _, o := range mustObjects(t, srv) {
		if o.ChecksumSHA256 == "" {
			t.Errorf("%s was stored without its SHA-256 checksum", o.Key)
		}
	}
}

func TestObjectHeaders(t *testing.T) {
	srv, endpoint := startEmu(t)
	cfg := testConfig(endpoint)
	cfg.SSE, cfg.KMSKeyID = config.SSEKMS, "alias/logs"
	cfg.StorageClass, cfg.ACL = "STANDARD_IA", "bucket-owner-full-control"
	cfg.Tags = map[string]string{"team": "core", "cost center": "a&b"}
	w := openWAL(t, t.TempDir())
	res := appendRecs(t, w, []wal.Record{rec("app", "1", time.Now(), 5)})
	runDrainer(t, w, "archive", newTestSink(t, cfg), drainerOptions())
	waitCursor(t, w, "archive", res.Last, 10*time.Second)
	objs := mustObjects(t, srv)
	if len(objs) != 1 {
		t.Fatalf("objects %+v", objs)
	}
	o := objs[0]
	tags, _ := url.ParseQuery(o.Tagging)
	if o.SSE != "aws:kms" || o.SSEKMSKeyID != "alias/logs" || o.StorageClass != "STANDARD_IA" || o.ACL != "bucket-owner-full-control" ||
		tags.Get("team") != "core" || tags.Get("cost center") != "a&b" || o.ContentEncoding != "gzip" {
		t.Errorf("object %+v", o)
	}
}

func keysOf(objs []stored) []string {
	keys := make([]string, len(objs))
	for i, o := range objs {
		keys[i] = o.Key
	}
	return keys
}

func mustObjects(t *testing.T, srv *s3emu.Server) []s3emu.ObjectInfo {
	t.Helper()
	objs, err := srv.Objects(bucket)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func TestMaxOpenObjects(t *testing.T) {
	_, url := startEmu(t)
	cfg := testConfig(url)
	cfg.MaxOpenObjects = 2
	cfg.MaxObjectAge = config.Duration(time.Second)
	cfg.Key = "open/${tag}/${seq}"
	s := newTestSink(t, cfg)
	w := openWAL(t, t.TempDir())
	reg := prometheus.NewRegistry()
	opts := drainerOptions()
	opts.Metrics = queue.NewMetrics(reg)
	runDrainer(t, w, "archive", s, opts)

	// Five partitions in turn, one record each time: with two open at
	// most, the oldest is cut whenever a third opens.
	var want []string
	var last uint64
	for round := range 10 {
		for p := range 5 {
			id := fmt.Sprintf("p%d-%d", p, round)
			want = append(want, id)
			last = appendRecs(t, w, []wal.Record{rec(fmt.Sprintf("t%d", p), id, time.Now(), 1)}).Last
			// One record a read: records that arrive in one read are routed
			// before any early cut is sent, and would share fewer objects.
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitCursor(t, w, "archive", last, 10*time.Second)
	objs := readObjects(t, newReader(t, url), "open/")
	checkOnce(t, objs, want)
	if len(objs) < 20 {
		t.Errorf("%d objects for 5 partitions with max_open_objects 2: no early cuts", len(objs))
	}
	if n := testutil.ToFloat64(opts.Metrics.EarlyCuts.WithLabelValues("archive")); n == 0 {
		t.Error("no early cuts counted")
	}
}

func TestMultipart(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: multipart uploads of large objects; make test runs it")
	}
	t.Parallel()
	srv, url := startEmu(t)
	cfg := testConfig(url)
	cfg.Compression = config.CompressionNone
	cfg.Key = "mp/${tag}/${seq}.json"
	cfg.MultipartThreshold = 5 * config.MiB
	cfg.MaxObjectBytes = 12 * config.MiB
	cfg.MaxObjectAge = config.Duration(3 * time.Second) // every record is read long before, even on a slow machine
	reg := prometheus.NewRegistry()
	s, err := New(context.Background(), "archive", cfg, Options{Hostname: "host1", AWS: &aws.Config{Credentials: testCreds}, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	w := openWAL(t, t.TempDir())

	var recs []wal.Record
	var want []string
	for i := range 11 << 10 { // about 11 MiB of lines
		id := fmt.Sprintf("m%d", i)
		recs = append(recs, rec("big", id, time.Now(), 960))
		want = append(want, id)
	}
	res := appendRecs(t, w, recs)
	runDrainer(t, w, "archive", s, drainerOptions())
	waitCursor(t, w, "archive", res.Last, 30*time.Second)
	objs := readObjects(t, newReader(t, url), "mp/")
	if len(objs) != 1 {
		t.Fatalf("%d objects (%v), want 1", len(objs), keysOf(objs))
	}
	checkOnce(t, objs, want)
	calls := srv.Calls()
	if calls["CreateMultipartUpload"] != 1 || calls["UploadPart"] != 3 || calls["CompleteMultipartUpload"] != 1 || calls["PutObject"] != 0 {
		t.Errorf("calls %v, want one upload of 3 parts", calls)
	}
	if testutil.ToFloat64(s.m.multipart) != 1 || testutil.ToFloat64(s.m.objects) != 1 || testutil.ToFloat64(s.m.bytes) != float64(len(objs[0].Body)) {
		t.Errorf("metrics: multipart %v objects %v bytes %v", testutil.ToFloat64(s.m.multipart), testutil.ToFloat64(s.m.objects), testutil.ToFloat64(s.m.bytes))
	}
	if n, err := testutil.GatherAndCount(reg, "forwarder_s3_uncompressed_bytes_total"); err != nil || n != 1 {
		t.Errorf("uncompressed bytes series %d, %v", n, err)
	}
}

// TestMultipartCrashRecovered stops a sink in the middle of a multipart
// upload, as a crash would (its client dies after one part), and restarts
// on the same WAL: Recover aborts the upload the intent names and uploads
// the object again under the same key. Exactly one object, no upload left.
// With the sink's bucket changed before the restart, the upload is aborted
// in the bucket it began in and the object goes to the new one.
func TestMultipartCrashRecovered(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: multipart uploads interrupted and recovered; make test runs it")
	}
	t.Parallel()
	for _, moved := range []bool{false, true} {
		t.Run(fmt.Sprintf("bucket changed %v", moved), func(t *testing.T) {
			t.Parallel()
			multipartCrashRecovered(t, moved)
		})
	}
}

func multipartCrashRecovered(t *testing.T, moved bool) {
	srv, url := startEmu(t)
	cfg := testConfig(url)
	cfg.Compression = config.CompressionNone
	cfg.Key = "mp/${tag}/${seq}.json"
	cfg.MultipartThreshold = 5 * config.MiB
	cfg.MaxObjectBytes = 12 * config.MiB
	cfg.MaxObjectAge = config.Duration(3 * time.Second)
	dir := t.TempDir()
	w := openWAL(t, dir)

	var recs []wal.Record
	var want []string
	for i := range 11 << 10 {
		id := fmt.Sprintf("m%d", i)
		recs = append(recs, rec("big", id, time.Now(), 960))
		want = append(want, id)
	}
	res := appendRecs(t, w, recs)

	s := newTestSink(t, cfg)
	dying := &dyingAPI{s3API: s.api, budget: 1}
	s.api = dying
	stop := runDrainer(t, w, "archive", s, drainerOptions())
	deadline := time.Now().Add(20 * time.Second)
	for dying.alive() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	cl := newReader(t, url)
	up, err := cl.ListMultipartUploads(context.Background(), &s3.ListMultipartUploadsInput{Bucket: aws.String(bucket)})
	if err != nil || len(up.Uploads) != 1 {
		t.Fatalf("uploads in progress after the crash: %+v, %v", up, err)
	}
	if objs, _ := srv.Objects(bucket); len(objs) != 0 {
		t.Fatalf("objects after the crash: %+v", objs)
	}

	w = openWAL(t, dir)
	newBucket := bucket
	if moved {
		newBucket = "moved-bucket"
		if err := srv.CreateBucket(newBucket); err != nil {
			t.Fatal(err)
		}
		cfg.Bucket = newBucket
	}
	s2 := newTestSink(t, cfg)
	runDrainer(t, w, "archive", s2, drainerOptions())
	// Records skipped for a delivered mark do not move the cursor; the
	// next delivery does.
	tail := appendRecs(t, w, []wal.Record{rec("small", "tail", time.Now(), 1)})
	waitCursor(t, w, "archive", tail.Last, 30*time.Second)
	// The interrupted object is finished under its own key; records read
	// after its cut (by age, on a slow machine) are in later objects. Each
	// record is in exactly one.
	objs := readBucketObjects(t, cl, newBucket, "mp/big/")
	if len(objs) == 0 || objs[0].Key != fmt.Sprintf("mp/big/%020d.json", res.First) {
		t.Fatalf("%d objects: %v", len(objs), keysOf(objs))
	}
	checkOnce(t, objs, want)
	for _, b := range []string{bucket, newBucket} {
		up, err = cl.ListMultipartUploads(context.Background(), &s3.ListMultipartUploadsInput{Bucket: aws.String(b)})
		if err != nil || len(up.Uploads) != 0 {
			t.Errorf("uploads left in %s: %+v, %v", b, up.Uploads, err)
		}
	}
	if old, _ := srv.Objects(bucket); moved && len(old) != 0 {
		t.Errorf("objects in the bucket of before: %v", old)
	}
	if testutil.ToFloat64(s2.m.recovered) != 1 {
		t.Errorf("recovered %v intents, want 1", testutil.ToFloat64(s2.m.recovered))
	}
}
