//go:build unix

package s3sink

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/internal/mototest"
	"github.com/logfwd/forwarder/internal/racedetect"
	"github.com/logfwd/forwarder/internal/syncbuf"
	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

type syncBuffer = syncbuf.Buffer

// startMoto runs moto_server until the test ends and returns its URL,
// with the test bucket created.
func startMoto(t *testing.T) string {
	t.Helper()
	url := mototest.Start(t)
	if _, err := newReader(t, url).CreateBucket(context.Background(), &s3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
		t.Fatalf("create bucket in moto: %v", err)
	}
	return url
}

// TestMoto runs the sink's paths against moto_server: objects with their
// headers through the drainer, a multipart upload, a multipart upload
// interrupted and finished by Recover, the errors of a missing bucket, and
// the conditional writes (testConditionalWrites).
func TestMoto(t *testing.T) {
	racedetect.Heavy(t)
	if testing.Short() {
		t.Skip("-short: moto_server, started for the test; make test runs it")
	}
	t.Parallel()
	url := startMoto(t)
	cl := newReader(t, url)
	ctx := context.Background()

	// Staged, the objects are uploaded from their files.
	sink := func(t *testing.T, cfg config.S3, staged bool) *Sink {
		if staged {
			s, _ := newStagedSink(t, cfg)
			return s
		}
		return newTestSink(t, cfg)
	}
	for _, staged := range []bool{false, true} {
		mode := map[bool]string{false: "", true: " staged"}[staged]
		prefix := map[bool]string{false: "moto/", true: "motostaged/"}[staged]
		t.Run("objects"+mode, func(t *testing.T) {
			cfg := testConfig(url)
			cfg.Key = prefix + "${tag}/%Y/%m/%d/%H/${hostname}-${seq}.json.gz"
			cfg.MaxObjectBytes = 8 * config.KiB
			cfg.SSE, cfg.StorageClass = config.SSEAES256, "STANDARD_IA"
			cfg.Tags = map[string]string{"team": "core", "env": "test"}
			w := openWAL(t, t.TempDir())
			var want []string
			var recs []wal.Record
			for i := range 300 {
				id := fmt.Sprintf("m%d", i)
				want = append(want, id)
				recs = append(recs, rec(fmt.Sprintf("t%d", i%2), id, time.Now(), i%60))
			}
			res := appendRecs(t, w, recs)
			runDrainer(t, w, "archive", sink(t, cfg, staged), drainerOptions())
			waitCursor(t, w, "archive", res.Last, 30*time.Second)
			objs := readObjects(t, cl, prefix)
			checkOnce(t, objs, want)
			if len(objs) < 4 {
				t.Errorf("%d objects", len(objs))
			}
			o := objs[0]
			head, err := cl.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(bucket), Key: aws.String(o.Key)})
			if err != nil {
				t.Fatal(err)
			}
			if head.ServerSideEncryption != types.ServerSideEncryptionAes256 || head.StorageClass != types.StorageClassStandardIa ||
				aws.ToString(head.ContentEncoding) != "gzip" || aws.ToString(head.ContentType) != "application/x-ndjson" {
				t.Errorf("head %s: sse %q class %q encoding %q type %q", o.Key, head.ServerSideEncryption, head.StorageClass,
					aws.ToString(head.ContentEncoding), aws.ToString(head.ContentType))
			}
			tags, err := cl.GetObjectTagging(ctx, &s3.GetObjectTaggingInput{Bucket: aws.String(bucket), Key: aws.String(o.Key)})
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, tg := range tags.TagSet {
				got[aws.ToString(tg.Key)] = aws.ToString(tg.Value)
			}
			if fmt.Sprint(got) != fmt.Sprint(cfg.Tags) {
				t.Errorf("tags %v, want %v", got, cfg.Tags)
			}
		})
	}

	mpConfig := func() config.S3 {
		cfg := testConfig(url)
		cfg.Compression = config.CompressionZstd
		cfg.Key = "motomp/${tag}/${seq}.json.zst"
		cfg.MultipartThreshold = 5 * config.MiB
		cfg.MaxObjectBytes = 32 * config.MiB
		cfg.MaxObjectAge = config.Duration(3 * time.Second)
		return cfg
	}
	// Random-looking bodies, so that zstd leaves more than 5 MiB.
	bigRecs := func(tag string, n int) ([]wal.Record, []string) {
		var recs []wal.Record
		var want []string
		var x uint64 = 88172645463325252
		for i := range n {
			var b strings.Builder
			for range 40 {
				x ^= x << 13
				x ^= x >> 7
				x ^= x << 17
				fmt.Fprintf(&b, "%016x", x)
			}
			id := fmt.Sprintf("%s%d", tag, i)
			want = append(want, id)
			recs = append(recs, wal.Record{Time: time.Now().UnixNano(), Tag: tag, Body: fmt.Appendf(nil, `{"id":%q,"r":%q}`, id, b.String())})
		}
		return recs, want
	}

	for _, staged := range []bool{false, true} {
		tag := map[bool]string{false: "big", true: "bigstaged"}[staged]
		t.Run("multipart"+map[bool]string{false: "", true: " staged"}[staged], func(t *testing.T) {
			w := openWAL(t, t.TempDir())
			recs, want := bigRecs(tag, 18000) // 13 MB of lines, 7 MB compressed
			res := appendRecs(t, w, recs)
			s := sink(t, mpConfig(), staged)
			runDrainer(t, w, "archive", s, drainerOptions())
			waitCursor(t, w, "archive", res.Last, 60*time.Second)
			objs := readObjects(t, cl, "motomp/"+tag+"/")
			if len(objs) != 1 || len(objs[0].Body) <= 5<<20 {
				t.Fatalf("objects %v", keysOf(objs))
			}
			checkOnce(t, objs, want)
			if n := testutil.ToFloat64(s.m.multipart); n != 1 {
				t.Errorf("%v multipart uploads counted, want 1", n)
			}
		})
	}

	t.Run("multipart interrupted", func(t *testing.T) {
		dir := t.TempDir()
		w := openWAL(t, dir)
		recs, want := bigRecs("cut", 18000)
		res := appendRecs(t, w, recs)
		s := newTestSink(t, mpConfig())
		dying := &dyingAPI{s3API: s.api, budget: 1}
		s.api = dying
		stop := runDrainer(t, w, "archive", s, drainerOptions())
		waitFor(t, "the client to die", func() bool { return !dying.alive() })
		stop()
		w.Close()
		up, err := cl.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String(bucket), Prefix: aws.String("motomp/cut/")})
		if err != nil || len(up.Uploads) != 1 {
			t.Fatalf("uploads after the crash: %+v, %v", up, err)
		}

		w = openWAL(t, dir)
		runDrainer(t, w, "archive", newTestSink(t, mpConfig()), drainerOptions())
		tail := appendRecs(t, w, []wal.Record{rec("tail", "tail", time.Now(), 1)})
		waitCursor(t, w, "archive", tail.Last, 60*time.Second)
		objs := readObjects(t, cl, "motomp/cut/")
		if len(objs) != 1 || objs[0].Key != fmt.Sprintf("motomp/cut/%020d.json.zst", res.First) {
			t.Fatalf("objects %v", keysOf(objs))
		}
		checkOnce(t, objs, want)
		up, err = cl.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String(bucket), Prefix: aws.String("motomp/cut/")})
		if err != nil || len(up.Uploads) != 0 {
			t.Errorf("uploads left: %+v, %v", up.Uploads, err)
		}
	})

	t.Run("conditional writes", func(t *testing.T) { testConditionalWrites(t, url) })

	t.Run("missing bucket", func(t *testing.T) {
		cfg := testConfig(url)
		cfg.Bucket = "no-such-bucket-here"
		recs := sinkRecs(rec("a", "1", time.Now(), 1))
		_, err := send(t, newTestSink(t, cfg), newMemState(recs), recs)
		e := sinks.Classify(err)
		if e.Class != sinks.SinkPermanent || e.Reason != "NoSuchBucket" || !strings.Contains(e.Error(), "create it or fix sinks[archive].bucket") {
			t.Errorf("missing bucket: %v (%s)", err, e.Class)
		}
	})
}
