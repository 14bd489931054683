package queue

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/logfwd/forwarder/internal/racedetect"
	"github.com/logfwd/forwarder/internal/testseed"
	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

const (
	crashChildEnv  = "QUEUE_TEST_CRASH_CHILD"
	crashRunEnv    = "QUEUE_TEST_CRASH_RUN"
	crashCarryEnv  = "QUEUE_TEST_CRASH_CARRY"
	crashGuardEnv  = "QUEUE_TEST_CRASH_GUARD"
	crashGuardMax  = 6 // max_partitions with guard, of crashGuardTags tags
	crashGuardTags = 30
	crashMaxRecs   = 30
	crashCarryRecs = 100 // records a carrying fileSink delivers at once, at most
	crashConc      = 4
	crashBody      = `{"x":1}`
)

// fileSink is a destination that survives the process: it appends
// "run partition seq" lines for every accepted record and fsyncs before
// saying yes. With flaky, one send in ten fails. With carry, it takes batches in
// without delivering them (sinks.Outcome.Carry) until crashCarryRecs
// records or a final batch: then it delivers them all at once.
//
// With guard, the drainer bounds its partitions to crashGuardMax: records
// beyond go to partition "overflow".
type fileSink struct {
	f     *os.File
	run   int
	carry bool
	flaky bool // one send in ten fails
	guard bool
}

func (s *fileSink) Overflow(*sinks.Record) string           { return "overflow" }
func (s *fileSink) Family(_ *sinks.Record, p string) string { return p }
func (s *fileSink) Explain([]sinks.Record) string           { return "tags" }

var _ sinks.Overflower = (*fileSink)(nil)

// seqCarry is what a carrying fileSink hands back: the records it took in.
type seqCarry struct{ seqs []uint64 }

func (c *seqCarry) Mem() int  { return 8 * len(c.seqs) }
func (c *seqCarry) Room() int { return len(crashBody) * (crashCarryRecs - len(c.seqs)) }

func (s *fileSink) Limits() sinks.Limits {
	lim := sinks.Limits{MaxRecords: crashMaxRecs, MaxBytes: 1 << 20, MaxAge: 5 * time.Millisecond, Concurrency: crashConc}
	if s.carry {
		// Long enough that batches are carried before their records age,
		// however slow the run (a race build, a busy machine).
		lim.MaxAge = 100 * time.Millisecond
	}
	if s.guard {
		lim.MaxPartitions = crashGuardMax
	}
	return lim
}
func (s *fileSink) Partition(r *sinks.Record) string { return r.Tag }
func (s *fileSink) Size(r *sinks.Record) int         { return len(r.Body) }
func (s *fileSink) Send(ctx context.Context, b *sinks.Batch) (sinks.Outcome, error) {
	var seqs []uint64
	if c, ok := b.Carry.(*seqCarry); ok {
		seqs = c.seqs[:len(c.seqs):len(c.seqs)]
	}
	for _, r := range b.Records {
		seqs = append(seqs, r.Seq)
	}
	if s.carry && !b.Final && len(seqs) < crashCarryRecs {
		return sinks.Outcome{Carry: &seqCarry{seqs}}, nil
	}
	if len(seqs) > crashCarryRecs {
		// The drainer cut past the carry's room: a line the test refuses.
		fmt.Fprintf(s.f, "violation: %d records at once, more than the carry's room\n", len(seqs))
		_ = s.f.Sync()
		return sinks.Outcome{}, sinks.NewRetryable("too_many", nil)
	}
	if s.flaky && rand.Intn(10) == 0 {
		return sinks.Outcome{}, sinks.NewRetryable("flaky", nil)
	}
	var sb strings.Builder
	for _, seq := range seqs {
		fmt.Fprintf(&sb, "%d %s %d %d\n", s.run, b.Partition, seq, len(seqs))
	}
	if _, err := s.f.WriteString(sb.String()); err != nil {
		return sinks.Outcome{}, sinks.NewRetryable("write", err)
	}
	if err := s.f.Sync(); err != nil {
		return sinks.Outcome{}, sinks.NewRetryable("fsync", err)
	}
	return sinks.Outcome{}, nil
}

func crashChild(dir string) {
	run, _ := strconv.Atoi(os.Getenv(crashRunEnv))
	w, err := wal.Open(filepath.Join(dir, "wal"), wal.Options{})
	if err != nil {
		fmt.Println("OPEN", err)
		os.Exit(3)
	}
	f, err := openDelivered(filepath.Join(dir, "delivered"))
	if err != nil {
		fmt.Println("OPEN", err)
		os.Exit(3)
	}
	guard := os.Getenv(crashGuardEnv) != ""
	go func() {
		for i := 0; ; i++ {
			var recs []wal.Record
			for j := 0; j < 40; j++ {
				tag := fmt.Sprintf("p%d", (i+j)%10)
				if guard {
					// Five tags at a time, moving on by one every 50
					// appends: tags go idle, new ones come.
					tag = fmt.Sprintf("p%d", (i/50+j%5)%crashGuardTags)
				}
				recs = append(recs, wal.Record{Time: time.Now().UnixNano(), Tag: tag, Body: []byte(crashBody)})
			}
			if _, err := w.Append(context.Background(), recs, wal.AppendOptions{}); err != nil {
				fmt.Println("APPEND", err)
				os.Exit(4)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	d := New(w, "file", &fileSink{f: f, run: run, carry: os.Getenv(crashCarryEnv) != "", flaky: true, guard: guard},
		Options{RetryMin: time.Millisecond, RetryMax: 10 * time.Millisecond, PartitionIdle: 100 * time.Millisecond, checkInvariants: true})
	if err := d.Run(context.Background()); err != nil {
		fmt.Println("RUN", err)
		os.Exit(5)
	}
}

type delivery struct {
	run       int
	partition string
	size      int // records delivered at once with this one
}

// openDelivered opens the file of delivered records for appending. A kill
// can cut a write short (Linux stops copying a write at a fatal signal),
// leaving a partial last line: it is ended and marked "torn" on a line of
// its own, so that the next run's lines are not glued to it.
func openDelivered(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if st, err := f.Stat(); err == nil && st.Size() > 0 {
		last := make([]byte, 1)
		if _, err := f.ReadAt(last, st.Size()-1); err == nil && last[0] != '\n' {
			if _, err := f.WriteString("\ntorn\n"); err != nil {
				f.Close()
				return nil, err
			}
		}
	}
	return f, nil
}

func readDelivered(t *testing.T, path string) map[uint64][]delivery {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(raw), "\n"), "\n")
	out := map[uint64][]delivery{}
	for i, l := range lines {
		if l == "torn" || i+1 < len(lines) && lines[i+1] == "torn" || i == len(lines)-1 && !strings.HasSuffix(string(raw), "\n") {
			continue // a write a kill cut short: its batch was not committed
		}
		var d delivery
		var seq uint64
		if _, err := fmt.Sscanf(l, "%d %s %d %d", &d.run, &d.partition, &seq, &d.size); err != nil {
			t.Fatalf("delivered line %q: %v", l, err)
		}
		out[seq] = append(out[seq], d)
	}
	return out
}

// TestCrashRestartDeliversAndDuplicatesOnlyInFlight kills a process that
// appends and drains with SIGKILL at random moments. After each kill the
// cursor must not have passed an undelivered record; at the end every
// record is delivered, and a record is delivered twice only as part of a
// batch that was in flight at a kill: at most one batch per partition per
// kill. QUEUE_CRASH_RUNS sets the number of kills (make crash: 100).
func TestCrashRestartDeliversAndDuplicatesOnlyInFlight(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a SIGKILL loop of a child process; make test runs it")
	}
	t.Parallel() // mostly waiting for its children
	crashLoop(t, false, crashMaxRecs)
}

// TestCrashRestartWithCarries is the same with a sink that carries batches
// (sinks.Outcome.Carry): the cursor stays before records carried and not
// delivered, and what a kill re-sends is at most one delivery of a carry
// and its batch per partition.
func TestCrashRestartWithCarries(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a SIGKILL loop of a child process; make test runs it")
	}
	t.Parallel() // mostly waiting for its children
	crashLoop(t, true, crashCarryRecs)
}

// TestCrashRestartWithMaxPartitions is the same with the partitions
// bounded (max_partitions) below the tags the records have, tags going idle
// and new ones coming: besides the rules above, a record is delivered to
// the same partition, its own or the overflow, every time it is delivered.
func TestCrashRestartWithMaxPartitions(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a SIGKILL loop of a child process; make test runs it")
	}
	racedetect.Heavy(t) // its children are this binary: 15 s under -race, 8 s without
	t.Parallel()        // mostly waiting for its children
	crashLoopOpts(t, false, true, crashMaxRecs)
}

func crashLoop(t *testing.T, carry bool, maxDelivery int) {
	crashLoopOpts(t, carry, false, maxDelivery)
}

func crashLoopOpts(t *testing.T, carry, guard bool, maxDelivery int) {
	runs := 10
	if guard {
		runs = 6 // its children live longer
	}
	if v := os.Getenv("QUEUE_CRASH_RUNS"); v != "" {
		runs, _ = strconv.Atoi(v)
	}
	dir := t.TempDir()
	seed := testseed.Seed(t, "QUEUE_CRASH_SEED", "the kill times")
	rng := rand.New(rand.NewSource(seed))
	for run := 0; run < runs; run++ {
		var delivered int64 // the delivered file's size before the child
		if st, err := os.Stat(filepath.Join(dir, "delivered")); err == nil {
			delivered = st.Size()
		}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+dir, crashRunEnv+"="+strconv.Itoa(run))
		if carry {
			cmd.Env = append(cmd.Env, crashCarryEnv+"=1")
		}
		if guard {
			cmd.Env = append(cmd.Env, crashGuardEnv+"=1")
		}
		out := &strings.Builder{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// The kill times count from the child's first delivery: a child's
		// start-up (opening the WAL, recovering, the first read) takes long
		// on a busy machine, and a kill before it tests nothing.
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if st, err := os.Stat(filepath.Join(dir, "delivered")); err == nil && st.Size() > delivered {
				break
			} else if time.Now().After(deadline) {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("run %d: the child delivered nothing in 30 s: %s", run, out)
			}
		}
		life := time.Duration(100+rng.Intn(400)) * time.Millisecond
		if guard {
			// Long enough, some of the time, for the status ticks (every
			// second) that let idle partitions go.
			life = time.Duration(100+rng.Intn(1300)) * time.Millisecond
			if run == 0 {
				// Past two ticks at least once, whatever the seed: tags
				// admitted, overflowed and let go, then admitted again.
				life = time.Duration(2500+rng.Intn(1000)) * time.Millisecond
			}
		}
		time.Sleep(life)
		cmd.Process.Signal(syscall.SIGKILL)
		err := cmd.Wait()
		if s := out.String(); s != "" || err == nil || !strings.Contains(err.Error(), "killed") {
			t.Fatalf("run %d: the child ended by itself (%v): %s", run, err, s)
		}
		// The cursor never passes an undelivered record.
		w, err := wal.Open(filepath.Join(dir, "wal"), wal.Options{ReadOnly: true})
		if err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		cursor, _ := w.Cursor("file")
		w.Close()
		got := readDelivered(t, filepath.Join(dir, "delivered"))
		for seq := uint64(1); seq <= cursor; seq++ {
			if len(got[seq]) == 0 {
				t.Fatalf("run %d: cursor %d passed record %d, which was never delivered", run, cursor, seq)
			}
		}
	}
	// Drain what is left in this process, with a sink that never fails.
	w, err := wal.Open(filepath.Join(dir, "wal"), wal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	f, err := openDelivered(filepath.Join(dir, "delivered"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	last := w.Stats().NextSeq - 1
	r := start(w, "file", &fileSink{f: f, run: runs, carry: carry, guard: guard}, Options{PartitionIdle: 100 * time.Millisecond})
	waitCursor(t, w, "file", last, 30*time.Second)
	r.stop(t)

	got := readDelivered(t, filepath.Join(dir, "delivered"))
	type runPart struct {
		run       int
		partition string
	}
	dups := map[runPart]int{} // by the run that sent again, and partition
	total, largest, overflowed := 0, 0, 0
	for seq := uint64(1); seq <= last; seq++ {
		ds := got[seq]
		if len(ds) == 0 {
			t.Fatalf("record %d of %d never delivered", seq, last)
		}
		largest = max(largest, ds[0].size)
		if ds[0].partition == "overflow" {
			overflowed++
		}
		for _, d := range ds[1:] {
			if d.partition != ds[0].partition {
				t.Fatalf("record %d delivered to partition %s in run %d and to %s in run %d: routed differently after a restart", seq, ds[0].partition, ds[0].run, d.partition, d.run)
			}
			if d.run == ds[0].run {
				t.Fatalf("record %d delivered twice within run %d: not a restart's re-send", seq, d.run)
			}
			dups[runPart{d.run, d.partition}]++
			total++
		}
	}
	if carry && largest <= crashMaxRecs {
		t.Fatalf("no delivery held more than a batch (%d records): nothing was carried", largest)
	}
	for d, n := range dups {
		if n > maxDelivery {
			t.Fatalf("run %d re-sent %d records of partition %s: more than the one delivery (%d) that can be in flight", d.run, n, d.partition, maxDelivery)
		}
	}
	if guard {
		// Tags come back after going idle: some got room again.
		readmitted := 0
		for tag := range crashGuardTags {
			own, over, back := false, false, false
			for seq := uint64(1); seq <= last; seq++ {
				switch p := got[seq][0].partition; {
				case p == fmt.Sprintf("p%d", tag) && over:
					back = true
				case p == fmt.Sprintf("p%d", tag):
					own = true
				case p == "overflow" && own:
					over = true
				}
			}
			if back {
				readmitted++
			}
		}
		t.Logf("%d records in the overflow partition; %d tags admitted again after records of theirs overflowed", overflowed, readmitted)
		if overflowed == 0 || readmitted == 0 {
			t.Fatalf("%d records overflowed, %d tags admitted again: the bound was not exercised", overflowed, readmitted)
		}
	}
	t.Logf("%d kills, %d records, %d re-sent after restarts (bound %d)", runs, last, total, runs*10*maxDelivery)
	if last < uint64(runs)*100 {
		t.Fatalf("only %d records in %d runs: the child hardly ran", last, runs)
	}
}
