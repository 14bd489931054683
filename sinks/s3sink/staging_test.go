package s3sink

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	bolt "go.etcd.io/bbolt"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/internal/diskfree"
	"github.com/logfwd/forwarder/internal/racedetect"
	"github.com/logfwd/forwarder/internal/tmpfstest"
	"github.com/logfwd/forwarder/queue"
	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// TestManyPartitionsStayOpen drains 2,000 partitions (a tag each, as an
// aggregator sees a cluster's containers) through a memory share that
// holds a fraction of their records: with staging, every record is taken
// into its partition's open object (members cut as memory runs short) and
// no object is finished early, by memory or by max_open_objects at its
// default; each partition's records then go in one object, finished by
// max_object_age (here, by the drain that stands for it, so that the test
// does not depend on the machine's speed).
func TestManyPartitionsStayOpen(t *testing.T) {
	racedetect.Heavy(t)
	if testing.Short() {
		t.Skip("-short: 2,000 partitions staged on disk; make test runs it")
	}
	t.Parallel()
	const tags, perTag = 2000, 30
	srv, url := startEmu(t)
	cfg := testConfig(url)
	cfg.Key = "many/${tag}/${hostname}-${seq}.json.gz"
	cfg.MaxObjectBytes = 64 * config.MiB
	cfg.MaxObjectAge = config.Duration(time.Hour)
	cfg.MaxOpenObjects = 0 // the default
	s, dir := newStagedSink(t, cfg)
	w := openWAL(t, t.TempDir())
	opts := drainerOptions()
	opts.MaxBufferedBytes = 8 << 20 // less than half of what the records take
	opts.Fingerprint = s.Fingerprint()
	counted := &carryCounter{Sink: s}
	d := queue.New(w, "archive", counted, opts)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- d.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("drainer: %v", err)
		}
	}()

	var want []string
	var res wal.Result
	var peak atomic.Int64
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Add(1)
	go func() { // the staged bytes, as they come
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
				if n := s.staging.bytes(); n > peak.Load() {
					peak.Store(n)
				}
			}
		}
	}()
	lines := 0
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range perTag {
		recs := make([]wal.Record, tags)
		for j := range recs {
			id := fmt.Sprintf("c%d-%d", j, i)
			// Hex of random bytes: compressed, the records take more than
			// the memory share as well.
			recs[j] = wal.Record{Time: time.Now().UnixNano(), Tag: fmt.Sprintf("pod-%04d", j),
				Body: fmt.Appendf(nil, `{"id":%q,"msg":"%x"}`, id, rng.Uint64()^rng.Uint64()<<1)}
			for range 12 {
				recs[j].Body = fmt.Appendf(recs[j].Body[:len(recs[j].Body)-2], ` %016x"}`, rng.Uint64())
			}
			want = append(want, id)
			r := sinkRecs(recs[j])[0]
			lines += s.Size(&r)
		}
		res = appendRecs(t, w, recs)
	}
	if lines < 2*opts.MaxBufferedBytes {
		t.Fatalf("%d bytes of lines: memory would hold them", lines)
	}
	// Every record is read once what was taken in stops growing: what is
	// not is queued, in less than half the memory share.
	for last, stable, deadline := int64(-1), 0, time.Now().Add(2*time.Minute); stable < 50 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if n := counted.carried.Load(); n != last {
			last, stable = n, 0
		} else {
			stable++
		}
	}
	if n := srv.Calls()["PutObject"]; n != 0 || counted.carried.Load() < int64(len(want)/2) {
		t.Fatalf("%d objects finished early; %d of %d records taken into open objects", n, counted.carried.Load(), len(want))
	}
	t.Logf("%d of %d records taken into open objects, none finished", counted.carried.Load(), len(want))
	dctx, dcancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer dcancel()
	if err := d.Drain(dctx); err != nil {
		t.Fatal(err)
	}
	close(done)
	wg.Wait()
	if pos, _ := w.Cursor("archive"); pos != res.Last {
		t.Fatalf("cursor %d, want %d", pos, res.Last)
	}
	objs := readObjects(t, newReader(t, url), "many/")
	checkOnce(t, objs, want)
	if len(objs) != tags {
		t.Errorf("%d objects for %d partitions: cut early", len(objs), tags)
	}
	multi := 0
	for _, o := range objs {
		if len(o.Lines) != perTag {
			t.Errorf("object %s holds %d records, want all %d of its tag", o.Key, len(o.Lines), perTag)
			break
		}
		if m, err := gzipPieces(o.Body); err != nil {
			t.Fatalf("%s: %v", o.Key, err)
		} else if m > 1 {
			multi++
		}
	}
	if n := testutil.ToFloat64(s.m.stagingFull); n != 0 {
		t.Errorf("staging full %v times", n)
	}
	if peak.Load() == 0 {
		t.Error("nothing was staged")
	}
	if n := stagedFiles(t, dir); n != 0 {
		t.Errorf("%d files staged once every object is uploaded", n)
	}
	t.Logf("%d objects, %d of several members; at most %d bytes staged", len(objs), multi, peak.Load())
}

// carryCounter counts the records Send took into carries.
type carryCounter struct {
	*Sink
	carried atomic.Int64
}

func (c *carryCounter) Send(ctx context.Context, b *sinks.Batch) (sinks.Outcome, error) {
	out, err := c.Sink.Send(ctx, b)
	if err == nil && out.Carry != nil {
		c.carried.Add(int64(len(b.Records)))
	}
	return out, err
}

// TestStagingFull: with staging_max_bytes too small for the open objects,
// members that do not fit finish their objects early (or, for a new
// object, are held in memory), counted, with one warning a minute; the
// staged bytes never pass the bound, and every record is delivered once.
func TestStagingFull(t *testing.T) {
	const tags, perTag = 20, 300
	_, url := startEmu(t)
	cfg := testConfig(url)
	cfg.Key = "full/${tag}/${hostname}-${seq}.json.gz"
	cfg.MaxObjectBytes = 4 * config.MiB
	cfg.MaxObjectAge = config.Duration(3 * time.Second)
	cfg.StagingMaxBytes = 16 * config.KiB
	var logged syncBuffer
	dir := t.TempDir()
	s, err := New(context.Background(), "archive", cfg, Options{Hostname: "host1", AWS: &aws.Config{Credentials: testCreds},
		Logger: slog.New(slog.NewTextHandler(&logged, nil)), StagingDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	w := openWAL(t, t.TempDir())
	opts := drainerOptions()
	opts.MaxBufferedBytes = 256 << 10 // members of a few KiB each
	runDrainer(t, w, "archive", s, opts)

	var over atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
				// Every file is at most what is counted for it (a file grows
				// after its room is counted, shrinks or goes before it is
				// given back), and what is counted is within the bound: so
				// the files never hold more. Summing sizes read one after
				// another would add up moments that never were at once.
				st := s.staging
				st.mu.Lock()
				ents, _ := os.ReadDir(dir)
				for _, e := range ents {
					path := filepath.Join(dir, e.Name())
					if fi, err := os.Stat(path); err == nil && fi.Size() > st.sizes[path] {
						over.Store(fi.Size())
						t.Errorf("staged file %s holds %d bytes, %d counted", e.Name(), fi.Size(), st.sizes[path])
					}
				}
				total := st.total
				st.mu.Unlock()
				if total > int64(cfg.StagingMaxBytes) {
					over.Store(total)
				}
			}
		}
	}()
	var want []string
	var res wal.Result
	for i := range perTag {
		recs := make([]wal.Record, tags)
		for j := range recs {
			id := fmt.Sprintf("f%d-%d", j, i)
			recs[j] = rec(fmt.Sprintf("t%d", j), id, time.Now(), 300)
			want = append(want, id)
		}
		res = appendRecs(t, w, recs)
	}
	waitCursor(t, w, "archive", res.Last, 60*time.Second)
	close(done)
	wg.Wait()
	objs := readObjects(t, newReader(t, url), "full/")
	checkOnce(t, objs, want)
	if n := over.Load(); n > 0 {
		t.Errorf("%d bytes staged, over staging_max_bytes %d", n, cfg.StagingMaxBytes)
	}
	if n := testutil.ToFloat64(s.m.stagingFull); n == 0 {
		t.Error("staging full: not counted")
	}
	if len(objs) <= tags {
		t.Errorf("%d objects for %d partitions: none finished early", len(objs), tags)
	}
	if n := strings.Count(logged.String(), "S3 staging is full (staging_max_bytes)"); n != 1 {
		t.Errorf("%d warnings of a full staging, want 1 (at most one a minute):\n%s", n, logged.String())
	}
	t.Logf("%d objects; staging full %v times", len(objs), testutil.ToFloat64(s.m.stagingFull))
}

// TestStaleStagingRemoved: what a previous run left in the staging
// directory (its open objects, lost with it) is removed at start, before
// any record is read, and said once; the records are delivered from the
// WAL.
func TestStaleStagingRemoved(t *testing.T) {
	_, url := startEmu(t)
	cfg := testConfig(url)
	cfg.StagingMaxBytes = config.MiB
	dir := t.TempDir()
	stage := filepath.Join(dir, "s3-staging", "archive")
	if err := os.MkdirAll(filepath.Join(stage, "odd"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210", "odd/x"} {
		if err := os.WriteFile(filepath.Join(stage, name), []byte("a member of an object a crash lost"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var logged syncBuffer
	s, err := New(context.Background(), "archive", cfg, Options{Hostname: "host1", AWS: &aws.Config{Credentials: testCreds},
		Logger: slog.New(slog.NewTextHandler(&logged, nil)), StagingDir: stage})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	w := openWAL(t, dir)
	res := appendRecs(t, w, []wal.Record{rec("app", "r1", time.Now(), 10), rec("app", "r2", time.Now(), 10)})
	if err := s.Recover(context.Background(), &walState{}); err != nil {
		t.Fatal(err)
	}
	if n := stagedFiles(t, stage); n != 0 {
		t.Fatalf("%d entries left in the staging directory", n)
	}
	if !strings.Contains(logged.String(), "removed the staged objects a previous run left") || !strings.Contains(logged.String(), "files=3") {
		t.Errorf("log:\n%s", logged.String())
	}
	runDrainer(t, w, "archive", s, drainerOptions())
	waitCursor(t, w, "archive", res.Last, 10*time.Second)
	checkOnce(t, readObjects(t, newReader(t, url), "logs/"), []string{"r1", "r2"})
}

// TestStagingRemovedBeforeStart: a staging directory removed while the
// sink waited to start (an operator freeing the disk) is no reason to
// stop the sink: Recover finds nothing to remove, the directory is made
// again at the first object, and the records are delivered once.
func TestStagingRemovedBeforeStart(t *testing.T) {
	_, url := startEmu(t)
	cfg := testConfig(url)
	cfg.StagingMaxBytes = config.MiB
	var logged syncBuffer
	dir := t.TempDir()
	stage := filepath.Join(dir, "s3-staging", "archive")
	s, err := New(context.Background(), "archive", cfg, Options{Hostname: "host1", AWS: &aws.Config{Credentials: testCreds},
		Logger: slog.New(slog.NewTextHandler(&logged, nil)), StagingDir: stage})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := os.RemoveAll(filepath.Join(dir, "s3-staging")); err != nil {
		t.Fatal(err)
	}
	w := openWAL(t, dir)
	res := appendRecs(t, w, []wal.Record{rec("app", "r1", time.Now(), 10), rec("app", "r2", time.Now(), 10)})
	stop := runDrainer(t, w, "archive", s, drainerOptions()) // Recover first: a failure stops the test
	defer stop()
	waitCursor(t, w, "archive", res.Last, 10*time.Second)
	checkOnce(t, readObjects(t, newReader(t, url), "logs/"), []string{"r1", "r2"})
	if strings.Contains(logged.String(), "level=ERROR") {
		t.Errorf("log:\n%s", logged.String())
	}
}

// TestStaleStagingLeftOnAReadOnlyDisk: what a previous run left and start
// cannot remove (the file system is read-only) is warned about, the sink
// starts, and the files count against staging_max_bytes, as they take the
// disk.
func TestStaleStagingLeftOnAReadOnlyDisk(t *testing.T) {
	_, url := startEmu(t)
	cfg := testConfig(url)
	cfg.StagingMaxBytes = config.MiB
	mnt := tmpfstest.Mount(t, "1m")
	stage := filepath.Join(mnt, "archive")
	var logged syncBuffer
	reg := prometheus.NewRegistry()
	s, err := New(context.Background(), "archive", cfg, Options{Hostname: "host1", AWS: &aws.Config{Credentials: testCreds},
		Logger: slog.New(slog.NewTextHandler(&logged, nil)), StagingDir: stage, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := os.WriteFile(filepath.Join(stage, "0123456789abcdef0123456789abcdef"), make([]byte, 1000), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("", mnt, "", syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
		t.Fatalf("remount read-only: %v", err)
	}
	defer syscall.Mount("", mnt, "", syscall.MS_REMOUNT, "")
	if err := s.Recover(context.Background(), &walState{}); err != nil {
		t.Fatalf("Recover with staged files it cannot remove: %v", err)
	}
	if !strings.Contains(logged.String(), "could not remove what a previous run left in S3 staging") || !strings.Contains(logged.String(), "files_left=1") {
		t.Errorf("log:\n%s", logged.String())
	}
	if got := s.staging.bytes(); got != 1000 {
		t.Errorf("staging counts %d bytes, want the 1000 left", got)
	}
	if got := testutil.ToFloat64(s.m.stagingBytes); got != 1000 {
		t.Errorf("forwarder_s3_staging_bytes %v, want 1000", got)
	}
}

// walState is a sink state without intents.
type walState struct{ sinks.State }

func (walState) Scan(prefix []byte, fn func(k, v []byte) error) error { return nil }

// TestStagedFileLost: a staged object whose file is gone (or damaged) at
// upload is rebuilt from the WAL, with the same bytes, and counted.
func TestStagedFileLost(t *testing.T) {
	srv, url := startEmu(t)
	for _, damage := range []string{"removed", "flipped"} {
		t.Run(damage, func(t *testing.T) {
			cfg := testConfig(url)
			cfg.Key = "lost/" + damage + "/${tag}/${seq}"
			cfg.MaxObjectBytes = config.MiB
			s, _ := newStagedSink(t, cfg)
			recs := batchRecs("a", 300)
			st := newMemState(recs)
			p := s.Partition(&recs[0])
			var carry sinks.Carry
			for i := 0; i < 200; i += 100 {
				out, err := s.Send(context.Background(), &sinks.Batch{Partition: p, Records: recs[i : i+100], State: st, Carry: carry})
				if err != nil || out.Carry == nil {
					t.Fatalf("outcome %+v, %v", out, err)
				}
				carry = out.Carry
			}
			path := carry.(*openObject).path
			if damage == "removed" {
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
			} else {
				b, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				b[len(b)/2] ^= 1
				if err := os.WriteFile(path, b, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.Send(context.Background(), &sinks.Batch{Partition: p, Records: recs[200:], State: st, Carry: carry, Final: true}); err != nil {
				t.Fatal(err)
			}
			if n := testutil.ToFloat64(s.m.stagingRebuilt); n != 1 {
				t.Errorf("%v rebuilt, want 1", n)
			}
			got, err := srv.Get(bucket, st.onlyKey(t))
			if err != nil {
				t.Fatal(err)
			}
			want, err := s.enc.buildSplit(recs, []int{100, 100, 100})
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want.body) {
				t.Error("the rebuilt object differs from the one built in memory")
			}
		})
	}
}

// A staged object the drainer gives up (sinks.Discarder) lets its file and
// its bytes go: they no longer count against staging_max_bytes.
func TestDiscardedObjectLeavesStaging(t *testing.T) {
	_, url := startEmu(t)
	s, _ := newStagedSink(t, testConfig(url))
	recs := sinkRecs(wal.Record{Seq: 1, Time: time.Now().UnixNano(), Tag: "app", Body: []byte(`{"id":"a"}`)},
		wal.Record{Seq: 2, Time: time.Now().UnixNano(), Tag: "app", Body: []byte(`{"id":"b"}`)})
	var open *openObject
	for i := range recs {
		m, err := s.enc.compress(recs[i:i+1], open.chain())
		if err != nil {
			t.Fatal(err)
		}
		if open, err = s.carry(open, &m, "p", recs[0].Seq, recs[i].Seq); err != nil || !open.staged() {
			t.Fatalf("carry: %v, staged %v", err, open.staged())
		}
	}
	if s.staging.bytes() != open.size || open.size == 0 {
		t.Fatalf("staging holds %d bytes, the object %d", s.staging.bytes(), open.size)
	}
	open.Discard()
	if n := s.staging.bytes(); n != 0 {
		t.Errorf("staging counts %d bytes after the object was discarded", n)
	}
	if _, err := os.Stat(open.path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the staged file is still there: %v", err)
	}
}

// TestStagedPieceNotWrittenIsCutOff: a piece added to a staged object's file
// that the file system cannot take (here a full tmpfs) is cut off again: the
// file holds the object's earlier pieces, byte for byte, and staging counts
// them.
func TestStagedPieceNotWrittenIsCutOff(t *testing.T) {
	mnt := tmpfstest.Mount(t, "64k")
	m, err := newMetrics(prometheus.NewRegistry(), "archive")
	if err != nil {
		t.Fatal(err)
	}
	st, err := newStaging(filepath.Join(mnt, "archive"), int64(config.MiB), 0, testLogger(t), m)
	if err != nil {
		t.Fatal(err)
	}
	first, second := make([]byte, 40<<10), make([]byte, 40<<10)
	for i := range first {
		first[i], second[i] = byte(i*7), byte(i*13)
	}
	path := st.path("p")
	if err := st.stage(path, 0, first); err != nil {
		t.Fatal(err)
	}
	if err := st.stage(path, int64(len(first)), second); err == nil {
		t.Fatal("a second piece of 40 KiB fit in a tmpfs of 64 KiB")
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the object's file: %v", err)
	}
	if !bytes.Equal(got, first) {
		t.Errorf("the file holds %d bytes, not the first piece's %d", len(got), len(first))
	}
	if n := st.bytes(); n != int64(len(first)) {
		t.Errorf("staging counts %d bytes, want %d", n, len(first))
	}
}

// TestStagingWriteFailureFinishesFromTheFile: an object whose next piece
// cannot be staged is finished at once from its file and the piece, with
// the bytes an object built in memory has, and not rebuilt from the WAL.
func TestStagingWriteFailureFinishesFromTheFile(t *testing.T) {
	srv, url := startEmu(t)
	mnt := tmpfstest.Mount(t, "64k")
	cfg := testConfig(url)
	cfg.Key = "cutoff/${tag}/${seq}"
	cfg.Compression = config.CompressionNone
	cfg.MaxObjectBytes = config.MiB
	cfg.StagingMaxBytes = config.MiB
	s, err := New(context.Background(), "archive", cfg, Options{Hostname: "host1", AWS: &aws.Config{Credentials: testCreds}, Logger: testLogger(t), StagingDir: filepath.Join(mnt, "archive")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	recs := batchRecs("a", 900)
	st := newMemState(recs)
	p := s.Partition(&recs[0])
	out, err := s.Send(context.Background(), &sinks.Batch{Partition: p, Records: recs[:300], State: st})
	if err != nil || out.Carry == nil {
		t.Fatalf("outcome %+v, %v", out, err)
	}
	staged := out.Carry.(*openObject).size
	if staged < 24<<10 || staged > 40<<10 {
		t.Fatalf("the first piece is %d bytes; the test wants 24 to 40 KiB, so that the second, twice as large, does not fit in 64 KiB", staged)
	}
	out, err = s.Send(context.Background(), &sinks.Batch{Partition: p, Records: recs[300:], State: st, Carry: out.Carry})
	if err != nil {
		t.Fatal(err)
	}
	if out.Carry != nil {
		t.Fatalf("outcome %+v: want the object finished, not carried", out)
	}
	if n := testutil.ToFloat64(s.m.stagingFull); n != 1 {
		t.Errorf("forwarder_s3_staging_full_total %v, want 1", n)
	}
	if n := testutil.ToFloat64(s.m.stagingRebuilt); n != 0 {
		t.Errorf("the object was rebuilt from the WAL %v times, want 0: its file held its first piece", n)
	}
	got, err := srv.Get(bucket, st.onlyKey(t))
	if err != nil {
		t.Fatal(err)
	}
	want, err := s.enc.buildSplit(recs, []int{300, 600})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want.body) {
		t.Error("the object differs from the one built in memory")
	}
}

// loseOneAnswer stores the first PutObject and answers it with a network
// error, as a timeout after S3 took the object would.
type loseOneAnswer struct {
	s3API
	mu   sync.Mutex
	lost bool
}

func (l *loseOneAnswer) PutObject(ctx context.Context, in *s3.PutObjectInput, opts ...func(*s3.Options)) (*s3.PutObjectOutput, error) {
	out, err := l.s3API.PutObject(ctx, in, opts...)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err == nil && !l.lost {
		l.lost = true
		return nil, errors.New("read tcp: connection reset by peer")
	}
	return out, err
}

// A batch that staging had no room for finished its object (its intent
// committed, the upload landed, its answer lost). The drainer sends the
// same batch again; staging has room by then, yet the object is finished
// again rather than taken in: the upload finds its own object under the
// key and the batch is delivered. Taken in, the object would have grown
// and found the key taken by the first one (the sink paused for good,
// "another writer's object").
func TestStagingFullRetryFinishesTheSameObject(t *testing.T) {
	e, url := startEmu(t)
	cfg := testConfig(url)
	cfg.Key = "retry/${tag}/${seq}"
	cfg.Compression = config.CompressionNone
	cfg.MaxObjectBytes = config.MiB
	cfg.StagingMaxBytes = 16 * config.KiB
	s, _ := newStagedSink(t, cfg)
	s.api = &loseOneAnswer{s3API: s.api}
	ctx := context.Background()

	recs := batchRecs("a", 300)
	other := batchRecs("b", 100)
	for i := range other {
		other[i].Seq += 1000
	}
	st := newMemState(append(append([]sinks.Record{}, recs...), other...))
	p, q := s.Partition(&recs[0]), s.Partition(&other[0])
	out, err := s.Send(ctx, &sinks.Batch{Partition: p, Records: recs[:30], State: st})
	if err != nil || out.Carry == nil {
		t.Fatalf("first batch: %+v %v", out, err)
	}
	c1 := out.Carry
	// Another partition takes the rest of staging.
	outQ, err := s.Send(ctx, &sinks.Batch{Partition: q, Records: other, State: st})
	if err != nil || outQ.Carry == nil || !outQ.Carry.(*openObject).staged() {
		t.Fatalf("other partition: %+v %v", outQ, err)
	}
	// No room for the next member: the object is finished, and the answer lost.
	if _, err := s.Send(ctx, &sinks.Batch{Partition: p, Records: recs[30:130], State: st, Carry: c1}); err == nil {
		t.Fatal("second batch: no error; staging had room?")
	}
	outQ.Carry.(*openObject).Discard() // staging has room again
	out, err = s.Send(ctx, &sinks.Batch{Partition: p, Records: recs[30:130], State: st, Carry: c1})
	if err != nil {
		t.Fatalf("second batch again: %v", err)
	}
	if out.Carry != nil {
		t.Fatal("second batch again: taken in, although its object is in S3")
	}
	if len(out.DeleteState) != 1 {
		t.Errorf("second batch again: delete state %q, want its intent", out.DeleteState)
	}
	objs, err := e.Objects(bucket)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 1 {
		t.Fatalf("%d objects, want 1: %v", len(objs), objs)
	}
	body, _ := e.Get(bucket, objs[0].Key)
	if n := bytes.Count(body, []byte("\n")); n != 130 {
		t.Errorf("object %s holds %d records, want 130", objs[0].Key, n)
	}
}

// gateSink holds the first final send, once it is called, until the test
// opens the gate.
type gateSink struct {
	*Sink
	final chan struct{} // closed when the first final send is called
	open  chan struct{}
	held  atomic.Bool
}

func (g *gateSink) Send(ctx context.Context, b *sinks.Batch) (sinks.Outcome, error) {
	if b.Final && g.held.CompareAndSwap(false, true) {
		close(g.final)
		<-g.open
	}
	return g.Sink.Send(ctx, b)
}

// TestStagedFileAndWALEntryLost: a staged object whose file is damaged
// when the WAL lost some of its records too (a damaged entry, replaced by
// placeholders) can be built from neither. The sink gives it up and the
// drainer reads the records the WAL still holds again: they are delivered
// once, and the sink goes on (before, the rebuild failed at every retry and
// the partition stood still for good).
func TestStagedFileAndWALEntryLost(t *testing.T) {
	_, url := startEmu(t)
	dir := t.TempDir()
	w, err := wal.Open(dir, wal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.RegisterCursor(context.Background(), "archive"); err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	var want []string
	var last uint64
	for e := range 3 { // entries of records 1-100, 101-200, 201-300
		var recs []wal.Record
		for i := range 100 {
			id := fmt.Sprintf("r%d-%d", e, i)
			recs = append(recs, rec("app", id, at, 60))
			if e != 1 {
				want = append(want, id)
			}
		}
		last = appendRecs(t, w, recs).Last
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	// Where the middle entry's stored bytes are in the file: they are
	// damaged there while the WAL is open, once the sink has staged them.
	walPath := filepath.Join(dir, wal.FileName)
	value := entryValue(t, walPath, 101)
	w = openWAL(t, dir)

	cfg := testConfig(url)
	cfg.Key = "both/${tag}/${seq}"
	cfg.MaxObjectBytes = 64 * config.KiB // members of 8 KiB: the 300 records are carried in several
	cfg.MaxObjectAge = config.Duration(500 * time.Millisecond)
	s, _ := newStagedSink(t, cfg)
	g := &gateSink{Sink: s, final: make(chan struct{}), open: make(chan struct{})}
	opts := drainerOptions()
	opts.Logger = testLogger(t)
	opts.Metrics = queue.NewMetrics(prometheus.NewRegistry())
	runDrainer(t, w, "archive", g, opts)
	select {
	case <-g.final:
	case <-time.After(10 * time.Second):
		t.Fatal("no final send")
	}
	staged, err := filepath.Glob(filepath.Join(s.staging.dir, "*"))
	if err != nil || len(staged) != 1 {
		t.Fatalf("staged files %q, %v", staged, err)
	}
	flipAll(t, staged[0], nil)
	flipAll(t, walPath, value)
	close(g.open)

	waitCursor(t, w, "archive", last, 20*time.Second)
	checkOnce(t, readObjects(t, newReader(t, url), "both/"), want)
	if n := w.Stats().DamagedRecords; n != 100 {
		t.Errorf("%d records counted damaged, want 100", n)
	}
	if n := testutil.ToFloat64(s.m.stagingGivenUp); n != 1 {
		t.Errorf("%v staged objects given up, want 1", n)
	}
	if n := testutil.ToFloat64(s.m.stagingRebuilt); n != 0 {
		t.Errorf("%v staged objects counted rebuilt, want 0", n)
	}
	if st := s.staging.bytes(); st != 0 {
		t.Errorf("staging holds %d bytes after the drain", st)
	}
}

// TestStagedFileAndWALEntryLostAfterALandedUpload: an earlier attempt's
// upload of a staged object landed with its answer lost; then its file is
// damaged and the WAL loses some of its records. The retry finds the
// object in S3, whole, and delivers the batch: it does not give it up (the
// records left, sent again, would have made an object of the same key, the
// first record's, which the conditional write would have found taken by
// "another writer", pausing the sink for good).
func TestStagedFileAndWALEntryLostAfterALandedUpload(t *testing.T) {
	_, url := startEmu(t)
	cfg := testConfig(url)
	cfg.Key = "landed/${tag}/${seq}"
	cfg.MaxObjectBytes = config.MiB
	s, _ := newStagedSink(t, cfg)
	s.api = &loseOneAnswer{s3API: s.api}
	ctx := context.Background()
	recs := batchRecs("a", 300)
	st := newMemState(recs)
	p := s.Partition(&recs[0])
	var carry sinks.Carry
	for i := 0; i < 200; i += 100 {
		out, err := s.Send(ctx, &sinks.Batch{Partition: p, Records: recs[i : i+100], State: st, Carry: carry})
		if err != nil || out.Carry == nil {
			t.Fatalf("outcome %+v, %v", out, err)
		}
		carry = out.Carry
	}
	final := &sinks.Batch{Partition: p, Records: recs[200:], State: st, Carry: carry, Final: true}
	if _, err := s.Send(ctx, final); err == nil {
		t.Fatal("the first attempt succeeded: its answer was to be lost")
	}
	flipAll(t, carry.(*openObject).path, nil)
	st.recs = append(slices.Clone(recs[:100]), recs[200:]...) // 101-200 lost to a damaged entry

	out, err := s.Send(ctx, final)
	if err != nil {
		t.Fatalf("the retry: %v; want the landed object found and the batch delivered", err)
	}
	if len(out.DeleteState) != 1 {
		t.Errorf("the retry's outcome %+v: want the intent deleted with the delivery", out)
	}
	var want []string
	for i := range recs {
		want = append(want, fmt.Sprintf("a%d", i)) // batchRecs' ids
	}
	checkOnce(t, readObjects(t, newReader(t, url), "landed/"), want)
	if n := testutil.ToFloat64(s.m.stagingGivenUp); n != 0 {
		t.Errorf("%v staged objects given up, want 0", n)
	}
}

// entryValue returns the stored value of the WAL entry whose key is seq,
// read from the closed WAL's file.
func entryValue(t *testing.T, path string, seq uint64) []byte {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var value []byte
	key := binary.BigEndian.AppendUint64(nil, seq)
	db.View(func(tx *bolt.Tx) error {
		value = bytes.Clone(tx.Bucket([]byte("entries")).Get(key)) // the WAL's bucket of entries (wal/doc.go)
		return nil
	})
	if value == nil {
		t.Fatalf("no entry at %d", seq)
	}
	return value
}

// flipAll flips a byte in the middle of every copy of value in the file at
// path (nil: the middle byte of the file), writing in place, as a disk
// that damages data under a running process would.
func flipAll(t *testing.T, path string, value []byte) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	flip := func(off int) {
		if _, err := f.WriteAt([]byte{data[off] ^ 0xff}, int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	if value == nil {
		flip(len(data) / 2)
		return
	}
	n := 0
	for i := 0; ; {
		j := bytes.Index(data[i:], value)
		if j < 0 {
			break
		}
		flip(i + j + len(value)/2)
		n++
		i += j + 1
	}
	if n == 0 {
		t.Fatal("the value is not in the file")
	}
}

// TestStagedFileAndWALEntryLostWithoutListBucket: a staged object's file
// is damaged and the WAL lost some of its records; whether an earlier
// upload landed is asked of S3, which answers 403 for the missing key to
// credentials without s3:ListBucket. The sink pauses saying to allow
// s3:ListBucket (not that the key is taken), gives nothing up meanwhile,
// and once allowed gives the object up and sends the records left again.
func TestStagedFileAndWALEntryLostWithoutListBucket(t *testing.T) {
	emu, url := startEmu(t)
	cfg := testConfig(url)
	cfg.Key = "nolist/${tag}/${seq}"
	cfg.MaxObjectBytes = config.MiB
	s, _ := newStagedSink(t, cfg)
	ctx := context.Background()
	recs := batchRecs("a", 300)
	st := newMemState(recs)
	p := s.Partition(&recs[0])
	var carry sinks.Carry
	for i := 0; i < 200; i += 100 {
		out, err := s.Send(ctx, &sinks.Batch{Partition: p, Records: recs[i : i+100], State: st, Carry: carry})
		if err != nil || out.Carry == nil {
			t.Fatalf("outcome %+v, %v", out, err)
		}
		carry = out.Carry
	}
	final := &sinks.Batch{Partition: p, Records: recs[200:], State: st, Carry: carry, Final: true}
	emu.SetDenyAll(true)
	if _, err := s.Send(ctx, final); err == nil {
		t.Fatal("the first attempt succeeded: it was to be refused")
	}
	emu.SetDenyAll(false)
	flipAll(t, carry.(*openObject).path, nil)
	st.recs = append(slices.Clone(recs[:100]), recs[200:]...) // 101-200 lost to a damaged entry

	emu.SetNoListBucket(true)
	_, err := s.Send(ctx, final)
	if e := sinks.Classify(err); e.Class != sinks.SinkPermanent || !strings.Contains(err.Error(), "s3:ListBucket") || strings.Contains(err.Error(), "is taken") {
		t.Fatalf("without s3:ListBucket: %v (%v); want the sink paused, saying to allow s3:ListBucket", err, e.Class)
	}
	if n := testutil.ToFloat64(s.m.stagingGivenUp); n != 0 {
		t.Errorf("%v staged objects given up without knowing, want 0", n)
	}
	emu.SetNoListBucket(false)
	if _, err := s.Send(ctx, final); !errors.Is(err, sinks.ErrCarryLost) {
		t.Fatalf("with s3:ListBucket: %v; want the object given up (sinks.ErrCarryLost)", err)
	}
	if n := testutil.ToFloat64(s.m.stagingGivenUp); n != 1 {
		t.Errorf("%v staged objects given up, want 1", n)
	}
}

// TestStagingLeavesTheDiskReserve: staging refuses a piece that would
// leave less than its minFree on the file system (the WAL's reserve), and
// says so, even with staging_max_bytes far off.
func TestStagingLeavesTheDiskReserve(t *testing.T) {
	mnt := tmpfstest.Mount(t, "512k")
	m, err := newMetrics(prometheus.NewRegistry(), "archive")
	if err != nil {
		t.Fatal(err)
	}
	var logged syncBuffer
	const minFree = 256 << 10
	st, err := newStaging(filepath.Join(mnt, "archive"), int64(config.GiB), minFree, slog.New(slog.NewTextHandler(&logged, nil)), m)
	if err != nil {
		t.Fatal(err)
	}
	piece := make([]byte, 40<<10)
	var refused error
	for i := 0; i < 20 && refused == nil; i++ {
		refused = st.stage(st.path(fmt.Sprint(i)), 0, piece)
	}
	if !errors.Is(refused, errStagingDisk) {
		t.Fatalf("staging 800 KiB on a disk of 512 KiB keeping 256 KiB free: %v, want errStagingDisk", refused)
	}
	if free, ok := diskfree.Free(mnt); !ok || free < minFree {
		t.Fatalf("%d bytes left free (%v), want at least %d", free, ok, minFree)
	}
	st.full(refused, "objects are finished early")
	if !strings.Contains(logged.String(), "S3 staging leaves the disk's last free space (twice wal.min_free_bytes) to the WAL") {
		t.Errorf("no warning naming the reserve:\n%s", logged.String())
	}
}

// TestStagingSmallerThanAPiece: staging_max_bytes smaller than one piece
// stages nothing, and the warning says so (not "full" with nothing staged).
func TestStagingSmallerThanAPiece(t *testing.T) {
	m, err := newMetrics(prometheus.NewRegistry(), "archive")
	if err != nil {
		t.Fatal(err)
	}
	var logged syncBuffer
	st, err := newStaging(filepath.Join(t.TempDir(), "archive"), 100, 0, slog.New(slog.NewTextHandler(&logged, nil)), m)
	if err != nil {
		t.Fatal(err)
	}
	err = st.stage(st.path("p"), 0, make([]byte, 101))
	if !errors.Is(err, errStagingSmall) || !errors.Is(err, errStagingFull) {
		t.Fatalf("a 101-byte piece into 100 bytes of staging: %v", err)
	}
	st.full(err, "new objects are held in memory")
	if !strings.Contains(logged.String(), "S3 staging cannot hold one piece of an object") || !strings.Contains(logged.String(), "staging_max_bytes=100") || st.bytes() != 0 {
		t.Errorf("staged %d bytes; log:\n%s", st.bytes(), logged.String())
	}
	if err := st.stage(st.path("p"), 0, make([]byte, 100)); err != nil {
		t.Fatalf("a piece of staging_max_bytes: %v", err)
	}
}

// TestStagingDirectoryMadeAgain: the staging directory removed while the
// sink runs is made again at the next object, with a warning, rather than
// staging nothing until a restart.
func TestStagingDirectoryMadeAgain(t *testing.T) {
	m, err := newMetrics(prometheus.NewRegistry(), "archive")
	if err != nil {
		t.Fatal(err)
	}
	var logged syncBuffer
	dir := filepath.Join(t.TempDir(), "archive")
	st, err := newStaging(dir, int64(config.MiB), 0, slog.New(slog.NewTextHandler(&logged, nil)), m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	path := st.path("p")
	if err := st.stage(path, 0, []byte("piece")); err != nil {
		t.Fatalf("staging after the directory was removed: %v", err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "piece" {
		t.Fatalf("the staged file: %q, %v", b, err)
	}
	if !strings.Contains(logged.String(), "the S3 staging directory was removed while the sink ran: made again") {
		t.Errorf("no warning:\n%s", logged.String())
	}
	// A piece added to a file whose directory someone removed fails; the
	// warning says so, and the file no longer counts.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	err = st.stage(path, 5, []byte(" more"))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a piece added to a removed file: %v", err)
	}
	st.full(err, "objects are finished early")
	if !strings.Contains(logged.String(), "a staged object's file was removed while the sink ran") || st.bytes() != 0 {
		t.Errorf("staged bytes %d after the file was removed; log:\n%s", st.bytes(), logged.String())
	}
}

// changeOnFirstPart writes over the staged file at off as part 1 of a
// multipart upload is sent: the file changes after the object was checked
// against its intent, while its parts are read.
type changeOnFirstPart struct {
	s3API
	path string
	off  int64
	once sync.Once
	err  error
}

func (c *changeOnFirstPart) UploadPart(ctx context.Context, in *s3.UploadPartInput, opts ...func(*s3.Options)) (*s3.UploadPartOutput, error) {
	if *in.PartNumber == 1 {
		c.once.Do(func() {
			f, err := os.OpenFile(c.path, os.O_WRONLY, 0)
			if err == nil {
				_, err = f.WriteAt([]byte("XXXXXXXXXXXXXXXX"), c.off)
				f.Close()
			}
			c.err = err
		})
	}
	return c.s3API.UploadPart(ctx, in, opts...)
}

// A staged file that changes while its multipart upload sends its parts
// (after the check against its intent's SHA-256) does not complete an
// object of other bytes: S3 checks each part only against the MD5 taken
// as it was read. The upload is aborted and the send retried, which
// rebuilds the object from the WAL.
func TestStagedFileChangedDuringMultipart(t *testing.T) {
	e, url := startEmu(t)
	cfg := testConfig(url)
	cfg.Key = "rev/${tag}/${seq}"
	cfg.Compression = config.CompressionNone
	cfg.MaxObjectBytes = 32 * config.MiB
	cfg.MultipartThreshold = 5 * config.MiB
	s, _ := newStagedSink(t, cfg)
	recs := batchRecs("a", 120000)
	st := newMemState(recs)
	p := s.Partition(&recs[0])
	var carry sinks.Carry
	for i := 0; i < 100000; i += 20000 {
		out, err := s.Send(t.Context(), &sinks.Batch{Partition: p, Records: recs[i : i+20000], State: st, Carry: carry})
		if err != nil || out.Carry == nil {
			t.Fatalf("outcome %+v, %v", out, err)
		}
		carry = out.Carry
	}
	path := carry.(*openObject).path
	if fi, err := os.Stat(path); err != nil || fi.Size() < 6<<20 {
		t.Fatalf("staged file %v, %v: want more than 6 MiB, beyond the first part", fi, err)
	}
	real := s.api
	change := &changeOnFirstPart{s3API: real, path: path, off: 5<<20 + 100} // in part 2
	s.api = change
	final := &sinks.Batch{Partition: p, Records: recs[100000:], State: st, Carry: carry, Final: true}
	_, err := s.Send(t.Context(), final)
	if change.err != nil {
		t.Fatal(change.err)
	}
	if e := sinks.Classify(err); err == nil || e.Class != sinks.Retryable || e.Reason != "staging" {
		t.Fatalf("send of an object whose file changed during its upload: %v, want a retryable staging error", err)
	}
	if up, err := newReader(t, url).ListMultipartUploads(t.Context(), &s3.ListMultipartUploadsInput{Bucket: aws.String(bucket)}); err != nil || len(up.Uploads) != 0 {
		t.Errorf("uploads left open: %+v, %v", up, err)
	}
	s.api = real
	if _, err := s.Send(t.Context(), final); err != nil {
		t.Fatalf("send again: %v", err)
	}
	got, err := e.Get(bucket, st.onlyKey(t))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := s.enc.buildSplit(recs, []int{20000, 20000, 20000, 20000, 20000, 20000})
	if !bytes.Equal(got, want.body) {
		t.Errorf("the object in S3 is not the records' (changed bytes in it: %v)", bytes.Contains(got, []byte("XXXXXXXXXXXXXXXX")))
	}
	if testutil.ToFloat64(s.m.stagingRebuilt) != 1 {
		t.Errorf("staging_rebuilt_total %v, want 1", testutil.ToFloat64(s.m.stagingRebuilt))
	}
}

// loseCreateAnswer makes the first CreateMultipartUpload and answers it
// with a network error, as a timeout after S3 created the upload would.
type loseCreateAnswer struct {
	s3API
	mu   sync.Mutex
	lost bool
}

func (l *loseCreateAnswer) CreateMultipartUpload(ctx context.Context, in *s3.CreateMultipartUploadInput, opts ...func(*s3.Options)) (*s3.CreateMultipartUploadOutput, error) {
	out, err := l.s3API.CreateMultipartUpload(ctx, in, opts...)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err == nil && !l.lost {
		l.lost = true
		return nil, errors.New("read tcp: connection reset by peer")
	}
	return out, err
}

// A multipart upload created with its answer lost (its id unknown) is
// aborted by the next attempt, in the same process: it would otherwise
// stay open, costing storage, until a lifecycle rule ends it.
func TestLostCreateAnswerUploadAborted(t *testing.T) {
	e, url := startEmu(t)
	cfg := testConfig(url)
	cfg.Compression = config.CompressionNone
	cfg.MultipartThreshold = 5 * config.MiB
	cfg.MaxObjectBytes = 32 * config.MiB
	s := newTestSink(t, cfg)
	recs := batchRecs("a", 80000)
	st := newMemState(recs)
	lose := &loseCreateAnswer{s3API: s.api}
	s.api = lose
	b := &sinks.Batch{Partition: s.Partition(&recs[0]), Records: recs, State: st, Final: true}
	if _, err := s.Send(t.Context(), b); err == nil {
		t.Fatal("the send whose creation answer was lost succeeded")
	}
	if !lose.lost {
		t.Fatal("no multipart upload was created")
	}
	if _, err := s.Send(t.Context(), b); err != nil {
		t.Fatalf("send again: %v", err)
	}
	if objs, _ := e.Objects(bucket); len(objs) != 1 {
		t.Fatalf("objects %+v, want one", objs)
	}
	if up, err := newReader(t, url).ListMultipartUploads(t.Context(), &s3.ListMultipartUploadsInput{Bucket: aws.String(bucket)}); err != nil || len(up.Uploads) != 0 {
		t.Errorf("uploads left open after the object was stored: %+v, %v", up.Uploads, err)
	}
}
