package s3sink

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"go.uber.org/goleak"

	"github.com/logfwd/forwarder/config"
	s3emu "github.com/logfwd/forwarder/emulator/s3emu"
	"github.com/logfwd/forwarder/queue"
	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

func TestMain(m *testing.M) {
	if os.Getenv(crashChildEnv) != "" {
		os.Exit(crashChild())
	}
	if os.Getenv(emuChildEnv) != "" {
		os.Exit(emuChild())
	}
	goleak.VerifyTestMain(m)
}

const bucket = "logs"

var testCreds = credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "")

// startEmu runs an in-process emulator with the test bucket until the test
// ends and returns it with its URL.
func startEmu(t testing.TB) (*s3emu.Server, string) {
	t.Helper()
	srv, err := s3emu.New(s3emu.Options{})
	if err != nil {
		t.Fatal(err)
	}
	url, err := srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	if err := srv.CreateBucket(bucket); err != nil {
		t.Fatal(err)
	}
	return srv, url
}

// testConfig is a sink configuration against url with small objects.
func testConfig(url string) config.S3 {
	return config.S3{
		Bucket: bucket, Region: "us-east-1", Endpoint: url, PathStyle: true,
		Key:         "logs/${tag}/%Y/%m/%d/%H/${hostname}-${seq}.json.gz",
		Compression: config.CompressionGzip, CompressionLevel: 1,
		MaxObjectBytes: 64 * config.KiB, MaxObjectAge: config.Duration(100 * time.Millisecond),
		MaxOpenObjects: 64, MultipartThreshold: 16 * config.MiB, TimeKey: "@timestamp",
	}
}

// newTestSink builds a sink through New with the real SDK client and
// static credentials.
func newTestSink(t testing.TB, cfg config.S3) *Sink {
	t.Helper()
	s, err := New(context.Background(), "archive", cfg, Options{Hostname: "host1", AWS: &aws.Config{Credentials: testCreds}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// newStagedSink is newTestSink with open objects staged in a directory of
// the test's, which it returns.
func newStagedSink(t testing.TB, cfg config.S3) (*Sink, string) {
	t.Helper()
	dir := t.TempDir()
	if cfg.StagingMaxBytes == 0 {
		cfg.StagingMaxBytes = 64 * config.MiB
	}
	s, err := New(context.Background(), "archive", cfg, Options{Hostname: "host1", AWS: &aws.Config{Credentials: testCreds}, Logger: testLogger(t), StagingDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, dir
}

// testLogger logs to the test's output (with -v).
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// newReader is an SDK client for reading back what the sink wrote.
func newReader(t testing.TB, url string) *s3.Client {
	t.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	return s3.New(s3.Options{
		Region: "us-east-1", Credentials: testCreds, BaseEndpoint: aws.String(url), UsePathStyle: true,
		HTTPClient: &http.Client{Transport: tr, Timeout: time.Minute}, Retryer: aws.NopRetryer{},
	})
}

func openWAL(t testing.TB, dir string) *wal.WAL {
	t.Helper()
	w, err := wal.Open(dir, wal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Closed after the drainers the test starts later stop (cleanups run
	// last first): a WAL closed under a running drainer fails its commits.
	t.Cleanup(func() { w.Close() })
	return w
}

// drainerOptions retry fast, so that tests of outages stay short.
func drainerOptions() queue.Options {
	return queue.Options{
		RetryMin: 10 * time.Millisecond, RetryMax: 200 * time.Millisecond, PauseRetry: 200 * time.Millisecond,
		ShutdownTimeout: 5 * time.Second, MaxBufferedBytes: 256 << 20,
	}
}

// runDrainer runs a drainer for sink until stop is called (or the test
// ends), then checks that Run returned nil.
func runDrainer(t testing.TB, w *wal.WAL, name string, sink sinks.Sink, opts queue.Options) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := queue.New(w, name, sink, opts)
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("drainer %s: %v", name, err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// waitCursor waits until cursor name has passed seq.
func waitCursor(t testing.TB, w *wal.WAL, name string, seq uint64, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if pos, _ := w.Cursor(name); pos >= seq {
			return
		}
		if time.Now().After(deadline) {
			pos, _ := w.Cursor(name)
			t.Fatalf("cursor %s at %d after %v, want %d", name, pos, timeout, seq)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// rec is a test record: a JSON body with a unique id and padding.
func rec(tag, id string, at time.Time, pad int) wal.Record {
	return wal.Record{Time: at.UnixNano(), Tag: tag, Body: fmt.Appendf(nil, `{"id":%q,"msg":%q}`, id, strings.Repeat("x", pad))}
}

func appendRecs(t testing.TB, w *wal.WAL, recs []wal.Record) wal.Result {
	t.Helper()
	res, err := w.Append(context.Background(), recs, wal.AppendOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// stored is one object as read back through the SDK.
type stored struct {
	Key             string
	ContentEncoding string
	ContentType     string
	Body            []byte   // as stored
	Lines           []string // decompressed
}

// readObjects lists every object under prefix and reads it back.
func readObjects(t testing.TB, cl *s3.Client, prefix string) []stored {
	t.Helper()
	return readBucketObjects(t, cl, bucket, prefix)
}

// readBucketObjects is readObjects of another bucket.
func readBucketObjects(t testing.TB, cl *s3.Client, bucket, prefix string) []stored {
	t.Helper()
	ctx := context.Background()
	var out []stored
	p := s3.NewListObjectsV2Paginator(cl, &s3.ListObjectsV2Input{Bucket: aws.String(bucket), Prefix: aws.String(prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			t.Fatalf("list objects: %v", err)
		}
		for _, c := range page.Contents {
			g, err := cl.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: c.Key})
			if err != nil {
				t.Fatalf("get %s: %v", aws.ToString(c.Key), err)
			}
			body, err := io.ReadAll(g.Body)
			g.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			o := stored{Key: aws.ToString(c.Key), ContentEncoding: aws.ToString(g.ContentEncoding), ContentType: aws.ToString(g.ContentType), Body: body}
			o.Lines = splitLines(t, o.Key, decompress(t, o.ContentEncoding, body))
			out = append(out, o)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

func decompress(t testing.TB, encoding string, body []byte) []byte {
	t.Helper()
	switch encoding {
	case "gzip":
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err != nil {
			t.Fatalf("gzip: %v", err)
		}
		b, err := io.ReadAll(zr)
		if err != nil {
			t.Fatalf("gzip: %v", err)
		}
		return b
	case "zstd":
		zr, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1))
		if err != nil {
			t.Fatal(err)
		}
		defer zr.Close()
		b, err := zr.DecodeAll(body, nil)
		if err != nil {
			t.Fatalf("zstd: %v", err)
		}
		return b
	case "":
		return body
	}
	t.Fatalf("unknown content encoding %q", encoding)
	return nil
}

func splitLines(t testing.TB, key string, b []byte) []string {
	t.Helper()
	if len(b) == 0 {
		t.Fatalf("object %s is empty", key)
	}
	if b[len(b)-1] != '\n' {
		t.Fatalf("object %s does not end with a newline", key)
	}
	return strings.Split(string(b[:len(b)-1]), "\n")
}

// ids counts the "id" member of every line of objs.
func ids(t testing.TB, objs []stored) map[string]int {
	t.Helper()
	seen := map[string]int{}
	for _, o := range objs {
		for _, l := range o.Lines {
			var v struct {
				ID string `json:"id"`
			}
			if err := json.Unmarshal([]byte(l), &v); err != nil {
				t.Fatalf("object %s: line %q is not JSON: %v", o.Key, l, err)
			}
			seen[v.ID]++
		}
	}
	return seen
}

// dyingAPI passes calls to a real client until it "dies": after `parts`
// successful UploadParts, or when kill is called, every call fails as if
// the process had stopped.
type dyingAPI struct {
	s3API
	mu     sync.Mutex
	parts  int
	budget int // UploadParts that succeed; < 0: no limit
	dead   bool
	// afterWrite: the first PutObject or CompleteMultipartUpload that
	// stores its object kills the client before its answer arrives.
	afterWrite bool
}

var errDied = errors.New("connection lost: the process died")

func (d *dyingAPI) alive() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return !d.dead
}

func (d *dyingAPI) kill() {
	d.mu.Lock()
	d.dead = true
	d.mu.Unlock()
}

func (d *dyingAPI) UploadPart(ctx context.Context, in *s3.UploadPartInput, opts ...func(*s3.Options)) (*s3.UploadPartOutput, error) {
	d.mu.Lock()
	if d.budget >= 0 && d.parts >= d.budget {
		d.dead = true
	}
	d.parts++
	dead := d.dead
	d.mu.Unlock()
	if dead {
		return nil, errDied
	}
	return d.s3API.UploadPart(ctx, in, opts...)
}

func (d *dyingAPI) PutObject(ctx context.Context, in *s3.PutObjectInput, opts ...func(*s3.Options)) (*s3.PutObjectOutput, error) {
	if !d.alive() {
		return nil, errDied
	}
	out, err := d.s3API.PutObject(ctx, in, opts...)
	if err == nil && d.afterWrite {
		d.kill()
		return nil, errDied
	}
	return out, err
}

func (d *dyingAPI) CreateMultipartUpload(ctx context.Context, in *s3.CreateMultipartUploadInput, opts ...func(*s3.Options)) (*s3.CreateMultipartUploadOutput, error) {
	if !d.alive() {
		return nil, errDied
	}
	return d.s3API.CreateMultipartUpload(ctx, in, opts...)
}

func (d *dyingAPI) CompleteMultipartUpload(ctx context.Context, in *s3.CompleteMultipartUploadInput, opts ...func(*s3.Options)) (*s3.CompleteMultipartUploadOutput, error) {
	if !d.alive() {
		return nil, errDied
	}
	out, err := d.s3API.CompleteMultipartUpload(ctx, in, opts...)
	if err == nil && d.afterWrite {
		d.kill()
		return nil, errDied
	}
	return out, err
}

func (d *dyingAPI) AbortMultipartUpload(ctx context.Context, in *s3.AbortMultipartUploadInput, opts ...func(*s3.Options)) (*s3.AbortMultipartUploadOutput, error) {
	if !d.alive() {
		return nil, errDied
	}
	return d.s3API.AbortMultipartUpload(ctx, in, opts...)
}

// memState is a sinks.State in memory, for tests of Send and Recover
// without a drainer.
type memState struct {
	mu        sync.Mutex
	kv        map[string][]byte
	recs      []sinks.Record
	delivered map[string]uint64
	// admit, when set, answers Admitted: false routes a record to the
	// overflow partition.
	admit func(family string, seq uint64) bool
	// match, when set, is the drainer's match globs: ReadRange passes over
	// the records of other tags, ReadRangeAll does not.
	match func(tag string) bool
}

func newMemState(recs []sinks.Record) *memState {
	return &memState{kv: map[string][]byte{}, recs: recs, delivered: map[string]uint64{}}
}

func (m *memState) Get(key []byte) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return bytes.Clone(m.kv[string(key)]), nil
}

func (m *memState) Scan(prefix []byte, fn func(k, v []byte) error) error {
	m.mu.Lock()
	keys := make([]string, 0, len(m.kv))
	for k := range m.kv {
		if strings.HasPrefix(k, string(prefix)) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	vals := make([][]byte, len(keys))
	for i, k := range keys {
		vals[i] = m.kv[k]
	}
	m.mu.Unlock()
	for i, k := range keys {
		if err := fn([]byte(k), vals[i]); err != nil {
			return err
		}
	}
	return nil
}

func (m *memState) Put(_ context.Context, key, value []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.kv[string(key)] = bytes.Clone(value)
	return nil
}

func (m *memState) Delete(_ context.Context, key []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.kv, string(key))
	return nil
}

func (m *memState) ReadRange(first, last uint64, keep func(*sinks.Record) bool) ([]sinks.Record, error) {
	return m.readRange(first, last, m.match, keep)
}

func (m *memState) ReadRangeAll(first, last uint64, keep func(*sinks.Record) bool) ([]sinks.Record, error) {
	return m.readRange(first, last, nil, keep)
}

func (m *memState) readRange(first, last uint64, match func(string) bool, keep func(*sinks.Record) bool) ([]sinks.Record, error) {
	var out []sinks.Record
	for _, r := range m.recs {
		if r.Seq >= first && r.Seq <= last && (match == nil || match(r.Tag)) && (keep == nil || keep(&r)) {
			out = append(out, r)
		}
	}
	return out, nil
}

func (m *memState) Delivered(_ context.Context, partition string, last uint64, del [][]byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.delivered[partition] = last
	for _, k := range del {
		delete(m.kv, string(k))
	}
	return nil
}

// Admitted is admit's answer; without admit, every record goes to its own
// partition, as a drainer routes them below max_partitions.
func (m *memState) Admitted(family string, seq uint64) bool {
	return m.admit == nil || m.admit(family, seq)
}

// Partitioning: a memState knows of no earlier configuration.
func (m *memState) Partitioning() []byte { return nil }

// onlyKey returns the object key of the one intent m holds, and fails t
// when there is not exactly one.
func (m *memState) onlyKey(t testing.TB) string {
	t.Helper()
	keys := m.intents()
	if len(keys) != 1 {
		t.Fatalf("intents %v, want one", keys)
	}
	return strings.TrimPrefix(keys[0], intentPrefix)
}

func (m *memState) intents() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for k := range m.kv {
		if strings.HasPrefix(k, intentPrefix) {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// sinkRecs numbers records from seq 1 as a drainer would hand them over.
func sinkRecs(recs ...wal.Record) []sinks.Record {
	out := make([]sinks.Record, len(recs))
	for i, r := range recs {
		out[i] = sinks.Record{Seq: uint64(i + 1), Time: r.Time, Tag: r.Tag, Body: r.Body}
	}
	return out
}
