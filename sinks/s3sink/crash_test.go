package s3sink

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/klauspost/compress/gzip"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/logfwd/forwarder/config"
	s3emu "github.com/logfwd/forwarder/emulator/s3emu"
	"github.com/logfwd/forwarder/internal/testseed"
	"github.com/logfwd/forwarder/queue"
	"github.com/logfwd/forwarder/wal"
)

// The child of TestCrashExactlyOnce is this test binary run again with
// these variables set; TestMain hands it to crashChild.
const (
	crashChildEnv = "S3_CRASH_CHILD" // the run's number
	crashDirEnv   = "S3_CRASH_DIR"   // the WAL's directory
	crashURLEnv   = "S3_CRASH_URL"   // the parent's emulator
	// crashStagingEnv, when set, stages open objects in the WAL's directory.
	crashStagingEnv = "S3_CRASH_STAGING"
	crashSeedEnv    = "S3_CRASH_CHILD_SEED" // what the child's records come from
)

// crashOptions are the sink's options in the child and in the parent's
// drains: with staging, under the WAL's directory, as the service does.
func crashOptions(cfg *config.S3, dir string, staged bool, log *slog.Logger) Options {
	opts := Options{Hostname: "crash-host", Logger: log, AWS: &aws.Config{Credentials: testCreds}}
	if staged {
		cfg.StagingMaxBytes = 64 * config.MiB
		opts.StagingDir = stagingDir(dir)
	}
	return opts
}

func stagingDir(dir string) string { return filepath.Join(dir, "s3-staging", "archive") }

// stagedFiles counts the files in a staging directory.
func stagedFiles(t *testing.T, dir string) int {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return len(ents)
}

// crashConfig makes many small objects in per-minute, per-tag partitions,
// two of them at most (max_partitions) for three tags: the records of the
// others go to the overflow key (crash/unknown/...), which a restart must
// route them to again.
func crashConfig(url string) config.S3 {
	cfg := testConfig(url)
	cfg.Key = "crash/${tag}/%Y/%m/%d/%H/%M/${hostname}-${seq}.json.gz"
	cfg.MaxPartitions = 2
	cfg.MaxObjectBytes = 2 * config.KiB
	cfg.MaxObjectAge = config.Duration(100 * time.Millisecond)
	return cfg
}

// crashChild appends records with unique ids to the WAL and drains it into
// S3 until it is killed. It prints "ready" once draining, and "acked RUN
// FROM TO" after each append returns (records RUN-FROM to RUN-TO are then
// durable).
func crashChild() int {
	run := os.Getenv(crashChildEnv)
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "crash child:", err)
		return 2
	}
	w, err := wal.Open(os.Getenv(crashDirEnv), wal.Options{})
	if err != nil {
		return fail(err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	cfg := crashConfig(os.Getenv(crashURLEnv))
	s, err := New(context.Background(), "archive", cfg, crashOptions(&cfg, os.Getenv(crashDirEnv), os.Getenv(crashStagingEnv) != "", log))
	if err != nil {
		return fail(err)
	}
	opts := drainerOptions()
	opts.Logger = log
	opts.Fingerprint = s.Fingerprint()
	d := queue.New(w, "archive", s, opts)
	go func() {
		if err := d.Run(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, "crash child: drainer:", err)
			os.Exit(3)
		}
	}()
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintln(out, "ready")
	out.Flush()
	// The records come from the parent's seed and the run (the kill times
	// vary with the child's timing all the same).
	seed, _ := strconv.ParseUint(os.Getenv(crashSeedEnv), 10, 64)
	rng := rand.New(rand.NewPCG(seed, 7))
	for n := 0; ; {
		k := 1 + rng.IntN(20)
		recs := make([]wal.Record, k)
		for i := range recs {
			id := fmt.Sprintf("%s-%d", run, n+i)
			recs[i] = wal.Record{Time: time.Now().UnixNano(), Tag: fmt.Sprintf("app.%d", rng.IntN(3)),
				Body: fmt.Appendf(nil, `{"id":%q,"msg":%q}`, id, strings.Repeat("z", rng.IntN(100)))}
		}
		if _, err := w.Append(context.Background(), recs, wal.AppendOptions{}); err != nil {
			return fail(err)
		}
		fmt.Fprintf(out, "acked %s %d %d\n", run, n, n+k-1)
		out.Flush()
		n += k
		time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
	}
}

// emuIDs counts the record ids of every object under prefix, read straight
// from the emulator, and the objects.
func emuIDs(t *testing.T, srv *s3emu.Server, prefix string) (seen map[string]int, objects, multi int) {
	t.Helper()
	objs, err := srv.Objects(bucket)
	if err != nil {
		t.Fatal(err)
	}
	seen = map[string]int{}
	for _, o := range objs {
		if !strings.HasPrefix(o.Key, prefix) {
			continue
		}
		objects++
		body, err := srv.Get(bucket, o.Key)
		if err != nil {
			t.Fatal(err)
		}
		if m, err := gzipPieces(body); err != nil {
			t.Fatalf("%s: %v", o.Key, err)
		} else if m > 1 {
			multi++
		}
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err != nil {
			t.Fatalf("%s: %v", o.Key, err)
		}
		lines, err := io.ReadAll(zr)
		if err != nil {
			t.Fatalf("%s: %v", o.Key, err)
		}
		for _, l := range bytes.Split(bytes.TrimSuffix(lines, []byte("\n")), []byte("\n")) {
			var v struct {
				ID string `json:"id"`
			}
			if err := json.Unmarshal(l, &v); err != nil {
				t.Fatalf("%s: line %q: %v", o.Key, l, err)
			}
			seen[v.ID]++
		}
	}
	return seen, objects, multi
}

// severalMembers matches a restart's line about an interrupted upload of
// an object built of more than one member.
var severalMembers = regexp.MustCompile(`finished an interrupted upload.* members=([2-9]|[1-9][0-9]+) `)

// overflowRecovered matches a restart's line about an interrupted upload
// of the overflow key.
var overflowRecovered = regexp.MustCompile(`finished an interrupted upload.* key=crash/unknown/`)

// alreadyThere matches a restart's line about an interrupted upload that
// had landed before the kill.
var alreadyThere = regexp.MustCompile(`finished an interrupted upload.* already_in_s3=true`)

// gzipPieces counts the pieces a gzip object was built of, each
// compressed on its own: the sync flushes that end them (an empty stored
// block, 00 00 ff ff, which compressed data holds by chance only rarely)
// in an object of one gzip stream, which every object of this sink is.
func gzipPieces(body []byte) (int, error) {
	members, err := gzipMembers(body)
	if err != nil {
		return 0, err
	}
	if members != 1 {
		return 0, fmt.Errorf("%d gzip members, want one stream", members)
	}
	return bytes.Count(body, []byte{0, 0, 0xff, 0xff}), nil
}

// gzipMembers counts the gzip members of body.
func gzipMembers(body []byte) (int, error) {
	br := bytes.NewReader(body) // an io.ByteReader: the gzip reader reads no further than a member
	zr, err := gzip.NewReader(br)
	if err != nil {
		return 0, err
	}
	for n := 1; ; n++ {
		zr.Multistream(false)
		if _, err := io.Copy(io.Discard, zr); err != nil {
			return n, err
		}
		if err := zr.Reset(br); err == io.EOF {
			return n, nil
		} else if err != nil {
			return n, err
		}
	}
}

// TestCrashExactlyOnce kills, with SIGKILL at random moments, a child that
// appends records and drains them into S3 (an emulator in this process,
// which outlives the children), then starts it again on the same WAL. No
// record may ever be stored twice, and once drained every acknowledged
// record is stored exactly once. Every object holds the bytes its intent
// recorded (its x-amz-meta-forwarder-sha256), whether uploaded from memory,
// from a staged file or rebuilt from the WAL by a restart, which never
// finds other bytes than the intent's. With staging, a restart removes
// what the killed child staged. S3_CRASH_RUNS sets the number of kills
// (default 10) of each: open objects held in memory, and staged.
func TestCrashExactlyOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a SIGKILL loop of a child process; make test runs it")
	}
	t.Parallel()
	t.Run("in memory", func(t *testing.T) { testCrashExactlyOnce(t, false) })
	t.Run("staged", func(t *testing.T) { testCrashExactlyOnce(t, true) })
}

// rebuiltOther matches a restart's line about an object rebuilt from the
// WAL into other bytes than its intent recorded.
const rebuiltOther = "other compressed bytes"

func testCrashExactlyOnce(t *testing.T, staged bool) {
	runs := 10 // each way: 20 kills in all
	if v := os.Getenv("S3_CRASH_RUNS"); v != "" {
		var err error
		if runs, err = strconv.Atoi(v); err != nil || runs < 1 {
			t.Fatalf("S3_CRASH_RUNS=%q: want a positive number", v)
		}
	}
	srv, url := startEmu(t)
	dir := t.TempDir()
	acked := map[string]bool{}
	// recoveredThere: interrupted uploads that had landed before the kill,
	// which the restart found in S3 (412) and counted as delivered.
	recovered, recoveredMulti, recoveredThere, recoveredOverflow := 0, 0, 0, 0
	seed := uint64(testseed.Seed(t, "S3_CRASH_SEED", "the kill times and the child's records"))
	rng := rand.New(rand.NewPCG(seed, 1))

	checkAtMostOnce := func(when string) map[string]int {
		seen, _, _ := emuIDs(t, srv, "crash/")
		for id, n := range seen {
			if n > 1 {
				t.Errorf("%s: record %s stored %d times, in %v", when, id, n, objectsWith(t, srv, id))
				t.FailNow()
			}
		}
		return seen
	}
	// stale: files the last kill left staged, that the next start must
	// remove (it says how many); killsStaged: kills that left some.
	stale, killsStaged := 0, 0
	checkCleaned := func(when, log string) {
		if stale > 0 && !regexp.MustCompile(fmt.Sprintf(`removed the staged objects a previous run left.* files=%d\n`, stale)).MatchString(log) {
			t.Errorf("%s: the start did not say it removed the %d files the kill left staged:\n%s", when, stale, log)
		}
		if strings.Contains(log, rebuiltOther) {
			t.Errorf("%s: a restart rebuilt an object into other bytes than its intent recorded:\n%s", when, log)
		}
	}
	// drain runs the sink in this process until every acknowledged record
	// is in S3, and checks each is there once.
	drain := func(when string) {
		w := openWAL(t, dir)
		defer w.Close()
		var logged syncBuffer
		cfg := crashConfig(url)
		s, err := New(context.Background(), "archive", cfg, crashOptions(&cfg, dir, staged, slog.New(slog.NewTextHandler(&logged, nil))))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		opts := drainerOptions()
		opts.Fingerprint = s.Fingerprint()
		stop := runDrainer(t, w, "archive", s, opts)
		defer func() {
			stop()
			recovered += int(testutil.ToFloat64(s.m.recovered))
			recoveredThere += int(testutil.ToFloat64(s.m.conflictSame))
			checkCleaned(when, logged.String())
			stale = stagedFiles(t, stagingDir(dir)) // a stop leaves open objects staged too
		}()
		deadline := time.Now().Add(30 * time.Second)
		for {
			seen := checkAtMostOnce(when)
			missing := 0
			for id := range acked {
				if seen[id] == 0 {
					missing++
				}
			}
			if missing == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d acknowledged records not in S3 after 30 s", when, missing)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	// On a loaded machine a child may spend its short life starting up,
	// before any object is open: a staged run kills again, up to three
	// times the runs in all, until a kill meets a staged object.
	extra := 0
	for run := 0; run < runs || (staged && killsStaged == 0 && run < 3*runs); run++ {
		if run >= runs {
			extra++
		}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+strconv.Itoa(run), crashDirEnv+"="+dir, crashURLEnv+"="+url,
			crashSeedEnv+"="+strconv.FormatUint(seed+uint64(run), 10))
		if staged {
			cmd.Env = append(cmd.Env, crashStagingEnv+"=1")
		}
		var stderr syncBuffer
		cmd.Stderr = &stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		ready := make(chan struct{})
		read := make(chan struct{})
		go func() {
			defer close(read)
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				f := strings.Fields(sc.Text())
				switch {
				case len(f) == 1 && f[0] == "ready":
					close(ready)
				case len(f) == 4 && f[0] == "acked":
					from, _ := strconv.Atoi(f[2])
					to, _ := strconv.Atoi(f[3])
					mu.Lock()
					for i := from; i <= to; i++ {
						acked[f[1]+"-"+strconv.Itoa(i)] = true
					}
					mu.Unlock()
				}
			}
		}()
		select {
		case <-ready:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-read
			_ = cmd.Wait()
			t.Fatalf("run %d: the child did not start:\n%s", run, stderr.String())
		}
		time.Sleep(time.Duration(50+rng.IntN(400)) * time.Millisecond)
		if err := cmd.Process.Kill(); err != nil { // SIGKILL
			t.Fatal(err)
		}
		<-read
		err = cmd.Wait()
		if cmd.ProcessState.ExitCode() != -1 { // -1: killed by a signal
			t.Fatalf("run %d: the child ended by itself (%v):\n%s", run, err, stderr.String())
		}
		recovered += strings.Count(stderr.String(), "finished an interrupted upload")
		recoveredThere += len(alreadyThere.FindAllString(stderr.String(), -1))
		recoveredMulti += len(severalMembers.FindAllString(stderr.String(), -1))
		recoveredOverflow += len(overflowRecovered.FindAllString(stderr.String(), -1))
		if strings.Contains(stderr.String(), "level=ERROR") {
			t.Errorf("run %d: the child logged errors:\n%s", run, stderr.String())
		}
		checkCleaned(fmt.Sprintf("run %d", run), stderr.String())
		if stale = stagedFiles(t, stagingDir(dir)); stale > 0 {
			killsStaged++
		}
		if !staged && stale > 0 {
			t.Fatalf("run %d: %d files staged without staging", run, stale)
		}
		mu.Lock()
		checkAtMostOnce(fmt.Sprintf("after kill %d", run+1))
		mu.Unlock()
		if (run+1)%5 == 0 {
			drain(fmt.Sprintf("drained after kill %d", run+1))
		}
	}
	drain("at the end")
	seen, objects, multi := emuIDs(t, srv, "crash/")
	for id := range acked {
		if seen[id] != 1 {
			t.Errorf("acknowledged record %s stored %d times", id, seen[id])
		}
	}
	if extra > 0 {
		t.Logf("%d kills more than %d: the first met no staged object", extra, runs)
	}
	runs += extra
	t.Logf("%d kills; %d records acknowledged, %d stored (the rest were durable when the child died before saying so); %d objects, %d of several members; %d interrupted uploads finished by a restart, %d of several members, %d found in S3 already",
		runs, len(acked), len(seen), objects, multi, recovered, recoveredMulti, recoveredThere)
	if multi == 0 {
		t.Error("no object was built of several members: the crashes never met a carried object")
	}
	if recovered == 0 && runs >= 10 {
		// 4 to 12 in 10 kills: none says the intents went untested.
		t.Error("no interrupted upload was finished by a restart: the crashes never met an intent, or Recover finished none")
	}
	if staged && killsStaged == 0 {
		t.Error("no kill left a staged object: the crashes never met one")
	}
	t.Logf("%d of %d kills left staged objects", killsStaged, runs)
	overSeen, overObjects, _ := emuIDs(t, srv, "crash/unknown/")
	t.Logf("%d records in %d objects of the overflow key (max_partitions 2 of 3 tags); %d interrupted uploads of it finished by a restart",
		len(overSeen), overObjects, recoveredOverflow)
	if overObjects == 0 {
		t.Error("no object under the overflow key: max_partitions was never reached")
	}
	checkIntentBytes(t, srv, "crash/")
}

// checkIntentBytes checks that every object under prefix holds the bytes
// its intent recorded, which the object's metadata repeats, and as many
// lines, read through every member, as its metadata says it holds records.
func checkIntentBytes(t *testing.T, srv *s3emu.Server, prefix string) {
	t.Helper()
	objs, err := srv.Objects(bucket)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if !strings.HasPrefix(o.Key, prefix) {
			continue
		}
		body, err := srv.Get(bucket, o.Key)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(body)
		if got, want := hex.EncodeToString(sum[:]), o.Metadata[metaSHA256]; got != want {
			t.Errorf("object %s has SHA-256 %s, its intent recorded %s", o.Key, got, want)
		}
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err != nil {
			t.Fatalf("object %s: %v", o.Key, err)
		}
		lines, err := io.ReadAll(zr)
		if err != nil {
			t.Fatalf("object %s: %v", o.Key, err)
		}
		if got, want := strconv.Itoa(bytes.Count(lines, []byte("\n"))), o.Metadata[metaRecords]; got != want {
			t.Errorf("object %s holds %s lines, its metadata says %q records", o.Key, got, want)
		}
	}
}

// objectsWith names the objects that hold record id, with their first and
// last ids.
func objectsWith(t *testing.T, srv *s3emu.Server, id string) []string {
	objs, _ := srv.Objects(bucket)
	var out []string
	for _, o := range objs {
		body, _ := srv.Get(bucket, o.Key)
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err != nil {
			continue
		}
		lines, _ := io.ReadAll(zr)
		if bytes.Contains(lines, []byte(`"id":"`+id+`"`)) {
			ls := bytes.Split(bytes.TrimSpace(lines), []byte("\n"))
			out = append(out, fmt.Sprintf("%s (%d lines, %.30s .. %.30s)", o.Key, len(ls), ls[0][47:], ls[len(ls)-1][47:]))
		}
	}
	return out
}
