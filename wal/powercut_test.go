package wal

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/logfwd/forwarder/internal/diskfree"
	"github.com/logfwd/forwarder/internal/faultfs"
	"github.com/logfwd/forwarder/internal/racedetect"
	"github.com/logfwd/forwarder/internal/testseed"
)

// Power cuts. Every test in crash_test.go kills a process: the kernel keeps
// its page cache, so whatever the process wrote reaches the disk, fsynced
// or not. These tests run the WAL on faultfs (internal/faultfs), which
// keeps everything not fsynced in its daemon and drops it at a cut, so
// that a missing fsync, or one in the wrong order, loses records here.

const powerOpenChildEnv = "WAL_TEST_POWERCUT_OPEN" // the child only opens the WAL, then waits

// powerOpenChild opens the WAL as the service does (compacting it when it
// is due), says OPENED and waits to be killed.
func powerOpenChild(dir string) {
	w, err := Open(dir, Options{CompactMinFileBytes: 1 << 20})
	if err != nil {
		fmt.Println("OPEN", err)
		os.Exit(3)
	}
	fmt.Println("OPENED")
	time.Sleep(time.Hour)
	w.Close()
}

// powerTally adds up what the checks after the cuts saw.
type powerTally struct {
	cuts      int
	checked   map[uint64]bool // acknowledged records found intact at least once
	lost      int             // acknowledged records missing after a cut
	corrupt   int             // acknowledged records present with other bytes
	tornMeta  int             // cuts that kept a torn write to one of bbolt's meta pages
	damaged   int             // of those, meta pages verify then reported damaged
	tornWrite int             // cuts that kept a torn prefix of a write
	dirOps    int             // cuts that kept some unsynced directory changes
}

func (p *powerTally) String() string {
	return fmt.Sprintf("power cuts: %d, acknowledged records checked: %d, lost: %d, corrupt: %d", p.cuts, len(p.checked), p.lost, p.corrupt)
}

func (p *powerTally) cut(rep faultfs.CutReport) {
	p.cuts++
	if rep.Torn != nil && rep.Torn.Kept > 0 {
		p.tornWrite++
	}
	if tornMetaPage(rep) {
		p.tornMeta++
	}
	if rep.KeptDirOps > 0 {
		p.dirOps++
	}
}

// randomCut picks what a cut keeps besides what was fsynced.
func randomCut(rng *rand.Rand) faultfs.CutOptions {
	o := faultfs.CutOptions{Seed: rng.Int63(), DirOps: faultfs.DirOps(rng.Intn(3))}
	switch rng.Intn(3) {
	case 1:
		o.Tear = 512
	case 2:
		o.Tear = 4096
	}
	return o
}

// tornMetaPage reports whether a cut kept part of a write to one of
// bbolt's two meta pages, which leaves that page damaged.
func tornMetaPage(rep faultfs.CutReport) bool {
	tw := rep.Torn
	page := int64(os.Getpagesize())
	return tw != nil && tw.Kept > 0 && tw.Path == FileName && (tw.Off == 0 || tw.Off == page) && tw.Kept < int(page)
}

// verifyAfterCut opens the WAL read-only and verifies it, as forwarder wal
// verify does after the power comes back. A damaged meta page is allowed
// only when the cut tore a write to one.
func verifyAfterCut(t *testing.T, dir, label string, rep faultfs.CutReport, tally *powerTally) {
	t.Helper()
	ro, err := Open(dir, Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("%s: open read-only after the cut (%+v): %v", label, rep, err)
	}
	vr := ro.Verify()
	ro.Close()
	for _, p := range vr.Problems {
		var ce *CorruptionError
		if len(vr.Problems) == 1 && tornMetaPage(rep) && errors.As(p, &ce) && strings.Contains(p.Error(), "meta page") {
			tally.damaged++
			continue
		}
		t.Fatalf("%s: verify after the cut (torn %+v): %v", label, rep.Torn, p)
	}
}

// TestPowerCut cuts the power under the WAL at random moments and at every
// fsync of its opening, and checks after each cut that the WAL opens, that
// every acknowledged record is there with its bytes, that cursors and sink
// state agree with what was acknowledged, and that verify is clean.
// WAL_POWERCUT_RUNS sets the number of random cuts (20; make powercut runs
// 500) and WAL_POWERCUT_SEED replays one run's cut times and choices.
func TestPowerCut(t *testing.T) {
	racedetect.Heavy(t)
	if testing.Short() {
		t.Skip("-short: power cuts on faultfs (about 15 s); make test runs it")
	}
	if why := faultfs.Unavailable(); why != "" {
		t.Skipf("%s (README: Tests that skip)", why)
	}
	runs := 20
	if v := os.Getenv("WAL_POWERCUT_RUNS"); v != "" {
		runs, _ = strconv.Atoi(v)
	}
	seed := testseed.Seed(t, "WAL_POWERCUT_SEED", "the cut times and what each cut keeps")
	rng := rand.New(rand.NewSource(seed))
	tally := &powerTally{checked: map[uint64]bool{}}
	start := time.Now()
	t.Run("first open", func(t *testing.T) { powerCutEveryOpenSync(t, rng, tally, nil) })
	t.Run("compaction at open", func(t *testing.T) { powerCutEveryOpenSync(t, rng, tally, prepareCompaction) })
	t.Run("under load", func(t *testing.T) { powerCutUnderLoad(t, rng, tally, runs) })
	// bbolt's meta (a 16-byte page header and 64 bytes) lies in the first
	// 512 bytes of its page: a write torn at a sector boundary keeps it
	// whole or not at all, so a damaged meta page is not expected here.
	t.Logf("%d cuts kept a torn write (%d of them to a meta page, %d of which verify reported damaged until the next commit), %d kept unsynced directory changes; %v",
		tally.tornWrite, tally.tornMeta, tally.damaged, tally.dirOps, time.Since(start).Round(100*time.Millisecond))
	t.Log(tally)
	if tally.lost > 0 || tally.corrupt > 0 {
		t.Fatalf("acknowledged records lost or damaged by power cuts (seed %d)", seed)
	}
}

// prepareCompaction writes a WAL that the next open compacts: a file of
// a few MiB whose live records take less than a quarter of it. It returns
// the records that must survive.
func prepareCompaction(t *testing.T, dir string) []Record {
	w := openT(t, dir, Options{CompactRatio: -1})
	ctx := context.Background()
	if _, err := w.RegisterCursor(ctx, "sink"); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewSource(1))
	for i := 0; i < 40; i++ {
		appendT(t, w, makeRecords(r, fmt.Sprint(i), 200, 500), fmt.Sprintf("chunk-%d", i))
	}
	var b Batch
	b.SetCursor("sink", 7500)
	b.Put("sink", []byte("pos"), u64(7500))
	commitT(t, w, &b)
	keep := readAll(t, w, 7501)
	w.Close()
	if fi, err := os.Stat(filepath.Join(dir, FileName)); err != nil || fi.Size() < 2<<20 {
		t.Fatalf("prepared WAL: %v, %v: want a file of at least 2 MiB", fi, err)
	}
	return keep
}

// powerCutEveryOpenSync cuts the power at each fsync, in turn, of a child
// that opens the WAL: a new one (prepare nil: the file is created) or one
// that prepare made (compaction: a new file, fsynced, renamed over the old
// one, the directory fsynced). After each cut the WAL must open and hold
// every record it held before.
func powerCutEveryOpenSync(t *testing.T, rng *rand.Rand, tally *powerTally, prepare func(*testing.T, string) []Record) {
	initial := t.TempDir()
	var keep []Record
	if prepare != nil {
		keep = prepare(t, initial)
	}
	backing := t.TempDir()
	restore := func() {
		os.RemoveAll(backing)
		if err := os.CopyFS(backing, os.DirFS(initial)); err != nil {
			t.Fatal(err)
		}
	}
	// How many fsyncs the open makes, uncut.
	restore()
	m := faultfs.Start(t, backing)
	if kind := diskfree.Network(m.Dir); kind != "fuse" {
		t.Errorf("diskfree.Network of a faultfs mount: %q, want fuse", kind) // run warns of such a data_dir
	}
	child := startPowerOpenChild(t, m.Dir)
	if l := child.next(t); l != "OPENED" {
		t.Fatalf("child: %q", l)
	}
	syncs := m.Stats().Syncs
	child.kill()
	m.Cut(faultfs.CutOptions{})
	if syncs < 2 {
		t.Fatalf("the open made %d fsyncs", syncs)
	}
	var dirSyncs int
	for n := int64(1); n <= syncs; n++ {
		// Each fsync with four cuts: nothing unsynced kept; every
		// directory change kept; that and a torn last write; and one at
		// random.
		for _, o := range []faultfs.CutOptions{{}, {DirOps: faultfs.KeepDirOps}, {DirOps: faultfs.KeepDirOps, Tear: 512, Seed: rng.Int63()}, randomCut(rng)} {
			if powerCutAtOpenSync(t, n, syncs, o, restore, backing, keep, tally).Dir {
				dirSyncs++
			}
		}
	}
	if dirSyncs == 0 {
		t.Fatal("no cut at a directory fsync: the open neither created nor compacted the file")
	}
	t.Logf("%d cuts, four at each of the %d fsyncs of the open", 4*syncs, syncs)
}

// powerCutAtOpenSync cuts the power with o at the n-th fsync of a child
// that opens the WAL in backing (as restore left it) and checks that the
// WAL then opens and holds keep.
func powerCutAtOpenSync(t *testing.T, n, syncs int64, o faultfs.CutOptions, restore func(), backing string, keep []Record, tally *powerTally) faultfs.FreezeReport {
	t.Helper()
	restore()
	m := faultfs.Start(t, backing)
	m.FreezeAtSync(n)
	child := startPowerOpenChild(t, m.Dir)
	for !m.Frozen().Frozen {
		if child.exited() {
			t.Fatalf("fsync %d of %d: the child exited: %s", n, syncs, child.rest())
		}
		time.Sleep(2 * time.Millisecond)
	}
	fr := m.Frozen()
	// The frozen fsync is with the daemon: the kernel waits for its
	// answer even for a killed process. SIGKILL first, so that the
	// child runs nothing more; the cut answers it (EIO) and the child
	// is gone.
	child.cmd.Process.Signal(syscall.SIGKILL)
	rep := m.Cut(o)
	child.kill()
	tally.cut(rep)
	label := fmt.Sprintf("cut at fsync %d of %d (%s) with %+v", n, syncs, fr.Path, o)
	m = faultfs.Start(t, backing)
	if _, err := os.Stat(filepath.Join(m.Dir, FileName)); err == nil {
		verifyAfterCut(t, m.Dir, label, rep, tally)
	}
	w, err := Open(m.Dir, Options{CompactMinFileBytes: 1 << 20})
	if err != nil {
		t.Fatalf("%s, kept %+v: start-up refused: %v", label, rep, err)
	}
	var recs []Record
	if len(keep) > 0 {
		recs = readAll(t, w, keep[0].Seq)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if len(recs) < len(keep) {
		tally.lost += len(keep) - len(recs)
		t.Errorf("%s: %d records, want %d", label, len(recs), len(keep))
	}
	for i := range min(len(recs), len(keep)) {
		if recs[i].Seq != keep[i].Seq || string(recs[i].Body) != string(keep[i].Body) {
			tally.corrupt++
			t.Errorf("%s: record %d is %d %q, want %d %q", label, i, recs[i].Seq, recs[i].Body, keep[i].Seq, keep[i].Body)
			break
		}
		tally.checked[keep[i].Seq] = true
	}
	verifyAfterCut(t, m.Dir, label, faultfs.CutReport{}, tally)
	m.Unmount()
	return fr
}

// powerChild is a child process and its output lines.
type powerChild struct {
	cmd   *exec.Cmd
	lines chan string
	done  chan struct{}
}

func startPowerChild(t *testing.T, env ...string) *powerChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &powerChild{cmd: cmd, lines: make(chan string, 1<<16), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		io.Copy(io.Discard, stdout)
		close(c.lines)
	}()
	go func() {
		cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(c.kill)
	return c
}

func startPowerOpenChild(t *testing.T, dir string) *powerChild {
	return startPowerChild(t, powerOpenChildEnv+"="+dir)
}

// next returns the child's next line ("" when it is gone).
func (c *powerChild) next(t *testing.T) string {
	t.Helper()
	select {
	case l := <-c.lines:
		return l
	case <-time.After(30 * time.Second):
		t.Fatal("no line from the child within 30s")
		return ""
	}
}

func (c *powerChild) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// kill SIGKILLs the child and waits until it is gone.
func (c *powerChild) kill() {
	c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
}

// rest returns every line left, once the child is gone.
func (c *powerChild) rest() string {
	var out []string
	for l := range c.lines {
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}

// powerCutUnderLoad runs crashChild (four appenders, a cursor with sink
// state 2,000 records behind, so that retention deletes as it goes and the
// file is compacted at most opens) on faultfs and cuts the power at random
// moments, some of them early, while the child opens the WAL.
func powerCutUnderLoad(t *testing.T, rng *rand.Rand, tally *powerTally, runs int) {
	backing := t.TempDir()
	m := faultfs.Start(t, backing)
	// The WAL exists before the first cut ("first open" cuts its creation).
	w := openT(t, m.Dir, Options{})
	w.Close()
	var acked []ackedAppend
	var maxCursor uint64
	var appends, compactions int
	var openTime time.Duration // how long the last child took to open the WAL
	for run := 0; run < runs; run++ {
		before := m.Stats()
		started := time.Now()
		child := startPowerChild(t, crashChildEnv+"="+m.Dir, crashRunEnv+"="+strconv.Itoa(run), crashCompactEnv+"="+strconv.Itoa(256<<10))
		var when string
		if openTime > 0 && rng.Intn(4) == 0 {
			// While it opens the WAL, and compacts it when that is due.
			wait := time.Duration(rng.Int63n(int64(openTime)))
			when = fmt.Sprintf("%v after its start, while it opens", wait.Round(time.Millisecond))
			time.Sleep(wait)
		} else {
			l := child.next(t)
			if l != "OPENED" {
				t.Fatalf("run %d: child: %q", run, l)
			}
			openTime = time.Since(started)
			wait := time.Duration(rng.Intn(300)) * time.Millisecond
			when = fmt.Sprintf("%v after it opened the WAL", wait)
			time.Sleep(wait)
		}
		child.kill()
		for _, l := range strings.Split(child.rest(), "\n") {
			f := strings.Fields(l)
			switch {
			case len(f) == 6 && f[0] == "A":
				acked = append(acked, ackedAppend{run: atoi(f[1]), g: atoi(f[2]), n: atoi(f[3]), first: uint64(atoi(f[4])), last: uint64(atoi(f[5]))})
				appends++
			case len(f) == 2 && f[0] == "C":
				maxCursor = max(maxCursor, uint64(atoi(f[1])))
			case len(f) > 0 && (f[0] == "ERR" || f[0] == "OPEN" || f[0] == "REGISTER"):
				t.Fatalf("run %d: child: %s", run, l)
			}
		}
		if st := m.Stats(); st.DirSyncs > before.DirSyncs {
			compactions++ // the only directory fsync after creation is compaction's
		}
		o := randomCut(rng)
		rep := m.Cut(o)
		tally.cut(rep)
		m = faultfs.Start(t, backing)
		label := fmt.Sprintf("run %d (cut %s, keeping %+v)", run, when, rep)
		verifyAfterCut(t, m.Dir, label, rep, tally)
		checkRecordsAfterCut(t, m.Dir, label, acked, maxCursor, tally)
		verifyAfterCut(t, m.Dir, label+", after start-up", faultfs.CutReport{}, tally)
		// Forget what the cursor has passed: retention may delete it.
		cursor := cursorIn(t, m.Dir)
		kept := acked[:0]
		for _, a := range acked {
			if a.last > cursor {
				kept = append(kept, a)
			}
		}
		acked = kept
	}
	ro := openT(t, m.Dir, Options{ReadOnly: true})
	first := ro.Stats().FirstSeq
	ro.Close()
	m.Unmount()
	t.Logf("%d cuts under load: %d acknowledged appends, %d opens compacted the file, retention deleted up to record %d", runs, appends, compactions, first-1)
	if first <= 1 && appends > 0 {
		t.Fatal("retention deleted nothing: no cut landed among its deletes")
	}
	if appends == 0 {
		t.Fatal("the child acknowledged nothing: the test checked nothing")
	}
}

// cursorIn reads the sink's cursor.
func cursorIn(t *testing.T, dir string) uint64 {
	ro, err := Open(dir, Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	return ro.Stats().Cursors["sink"]
}

// checkRecordsAfterCut opens the WAL as the service does and checks it
// against what the child acknowledged; lost and damaged records are
// counted (and fail the test) rather than stopping at the first.
func checkRecordsAfterCut(t *testing.T, dir, label string, acked []ackedAppend, maxCursor uint64, tally *powerTally) {
	t.Helper()
	w, err := Open(dir, Options{CompactRatio: -1})
	if err != nil {
		t.Fatalf("%s: start-up refused: %v", label, err)
	}
	defer w.Close()
	st := w.Stats()
	cursor := st.Cursors["sink"]
	if cursor < maxCursor {
		t.Fatalf("%s: cursor %d is behind the acknowledged %d", label, cursor, maxCursor)
	}
	pos, _ := w.State("sink", []byte("pos"))
	if cursor > 0 && (len(pos) != 8 || binary.BigEndian.Uint64(pos) != cursor) {
		t.Fatalf("%s: cursor %d but the state committed with it says %x", label, cursor, pos)
	}
	if st.FirstSeq > cursor+1 {
		t.Fatalf("%s: retention deleted up to %d, past the cursor %d", label, st.FirstSeq-1, cursor)
	}
	recs, err := w.Read(cursor+1, 0, 0)
	if err != nil {
		tally.corrupt++
		t.Fatalf("%s: read from %d: %v", label, cursor+1, err)
	}
	for i := range recs {
		if recs[i].Seq != cursor+1+uint64(i) {
			t.Fatalf("%s: record %d where %d should be", label, recs[i].Seq, cursor+1+uint64(i))
		}
	}
	for _, a := range acked {
		for s := max(a.first, cursor+1); s <= a.last; s++ {
			if s >= st.NextSeq {
				tally.lost++
				t.Errorf("%s: acknowledged record %d is gone (the WAL ends at %d)", label, s, st.NextSeq-1)
				continue
			}
			got := recs[s-cursor-1]
			if want := crashBody(a.run, a.g, a.n, int(s-a.first)); string(got.Body) != string(want) || got.Time != int64(a.n) {
				tally.corrupt++
				t.Errorf("%s: record %d holds %q, want %q", label, s, got.Body, want)
				continue
			}
			tally.checked[s] = true
		}
	}
	// The newest acknowledged chunk is known after the cut.
	if len(acked) > 0 {
		a := acked[len(acked)-1]
		res, err := w.Append(context.Background(), []Record{{Body: []byte(`{}`)}}, AppendOptions{ChunkID: fmt.Sprintf("%d-%d-%d", a.run, a.g, a.n)})
		if err != nil || !res.Duplicate || res.First != a.first || res.Last != a.last {
			t.Fatalf("%s: re-sent chunk of %+v after the cut: %+v, %v", label, a, res, err)
		}
	}
}
