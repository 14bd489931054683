package queue

import (
	"bufio"
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

	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

const (
	crashChildEnv = "QUEUE_TEST_CRASH_CHILD"
	crashRunEnv   = "QUEUE_TEST_CRASH_RUN"
	crashMaxRecs  = 30
	crashConc     = 4
)

// fileSink is a destination that survives the process: it appends
// "run partition seq" lines for every accepted record and fsyncs before
// saying yes. One send in ten fails.
type fileSink struct {
	f   *os.File
	run int
	rng *rand.Rand
}

func (s *fileSink) Limits() sinks.Limits {
	return sinks.Limits{MaxRecords: crashMaxRecs, MaxBytes: 1 << 20, MaxAge: 5 * time.Millisecond, Concurrency: crashConc}
}
func (s *fileSink) Partition(r *sinks.Record) string { return r.Tag }
func (s *fileSink) Size(r *sinks.Record) int         { return len(r.Body) }
func (s *fileSink) Send(ctx context.Context, b *sinks.Batch) (sinks.Outcome, error) {
	if rand.Intn(10) == 0 {
		return sinks.Outcome{}, sinks.NewRetryable("flaky", nil)
	}
	var sb strings.Builder
	for _, r := range b.Records {
		fmt.Fprintf(&sb, "%d %s %d\n", s.run, b.Partition, r.Seq)
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
	f, err := os.OpenFile(filepath.Join(dir, "delivered"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		fmt.Println("OPEN", err)
		os.Exit(3)
	}
	go func() {
		for i := 0; ; i++ {
			var recs []wal.Record
			for j := 0; j < 40; j++ {
				recs = append(recs, wal.Record{Time: time.Now().UnixNano(), Tag: fmt.Sprintf("p%d", (i+j)%10), Body: []byte(`{"x":1}`)})
			}
			if _, err := w.Append(context.Background(), recs, wal.AppendOptions{}); err != nil {
				fmt.Println("APPEND", err)
				os.Exit(4)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	d := New(w, "file", &fileSink{f: f, run: run}, Options{RetryMin: time.Millisecond, RetryMax: 10 * time.Millisecond})
	if err := d.Run(context.Background()); err != nil {
		fmt.Println("RUN", err)
		os.Exit(5)
	}
}

type delivery struct {
	run       int
	partition string
}

func readDelivered(t *testing.T, path string) map[uint64][]delivery {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[uint64][]delivery{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var d delivery
		var seq uint64
		if _, err := fmt.Sscanf(sc.Text(), "%d %s %d", &d.run, &d.partition, &seq); err != nil {
			t.Fatalf("delivered line %q: %v", sc.Text(), err)
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
	runs := 10
	if v := os.Getenv("QUEUE_CRASH_RUNS"); v != "" {
		runs, _ = strconv.Atoi(v)
	}
	dir := t.TempDir()
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	for run := 0; run < runs; run++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+dir, crashRunEnv+"="+strconv.Itoa(run))
		out := &strings.Builder{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(100+rng.Intn(400)) * time.Millisecond)
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
	f, err := os.OpenFile(filepath.Join(dir, "delivered"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	last := w.Stats().NextSeq - 1
	r := start(w, "file", &reliableFileSink{fileSink{f: f, run: runs}}, Options{})
	waitCursor(t, w, "file", last, 30*time.Second)
	r.stop(t)

	got := readDelivered(t, filepath.Join(dir, "delivered"))
	dups := map[delivery]int{} // by the run that sent again, and partition
	total := 0
	for seq := uint64(1); seq <= last; seq++ {
		ds := got[seq]
		if len(ds) == 0 {
			t.Fatalf("record %d of %d never delivered", seq, last)
		}
		for _, d := range ds[1:] {
			if d.run == ds[0].run {
				t.Fatalf("record %d delivered twice within run %d: not a restart's re-send", seq, d.run)
			}
			dups[d]++
			total++
		}
	}
	for d, n := range dups {
		if n > crashMaxRecs {
			t.Fatalf("run %d re-sent %d records of partition %s: more than the one batch (%d) that can be in flight", d.run, n, d.partition, crashMaxRecs)
		}
	}
	t.Logf("%d kills, %d records, %d re-sent after restarts (bound %d)", runs, last, total, runs*10*crashMaxRecs)
	if last < uint64(runs)*100 {
		t.Fatalf("only %d records in %d runs: the child hardly ran", last, runs)
	}
}

type reliableFileSink struct{ fileSink }

func (s *reliableFileSink) Send(ctx context.Context, b *sinks.Batch) (sinks.Outcome, error) {
	var sb strings.Builder
	for _, r := range b.Records {
		fmt.Fprintf(&sb, "%d %s %d\n", s.run, b.Partition, r.Seq)
	}
	if _, err := s.f.WriteString(sb.String()); err != nil {
		return sinks.Outcome{}, err
	}
	return sinks.Outcome{}, s.f.Sync()
}
