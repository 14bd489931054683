package wal

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/logfwd/forwarder/internal/testseed"
)

const (
	crashChildEnv   = "WAL_TEST_CRASH_CHILD"
	crashRunEnv     = "WAL_TEST_CRASH_RUN"
	crashCompactEnv = "WAL_TEST_CRASH_COMPACT_MIN" // CompactMinFileBytes of the child; default 1 MiB
	crashKeep       = 2000                         // records the child's sink keeps behind the newest
)

// crashBody is what record i of append (run, g, n) holds, so the parent can
// check every byte of what it reads back.
func crashBody(run, g, n, i int) []byte {
	id := fmt.Sprintf("%d-%d-%d-%d", run, g, n, i)
	return []byte(fmt.Sprintf(`{"id":%q,"log":"%s"}`, id, strings.Repeat(id, 1+(n+i)%12)))
}

// crashChild appends from four goroutines and moves a cursor with its sink
// state until it is killed. It prints "OPENED" once the WAL is open, "A run
// g n first last" after each acknowledged append and "C pos" after each
// acknowledged cursor commit.
func crashChild(dir string) {
	run, _ := strconv.Atoi(os.Getenv(crashRunEnv))
	compactMin := int64(1 << 20)
	if v, err := strconv.ParseInt(os.Getenv(crashCompactEnv), 10, 64); err == nil {
		compactMin = v
	}
	w, err := Open(dir, Options{CompactMinFileBytes: compactMin})
	if err != nil {
		fmt.Println("OPEN", err)
		os.Exit(3)
	}
	ctx := context.Background()
	if _, err := w.RegisterCursor(ctx, "sink"); err != nil {
		fmt.Println("REGISTER", err)
		os.Exit(3)
	}
	fmt.Println("OPENED")
	var mu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	report := func(format string, args ...any) {
		mu.Lock()
		fmt.Fprintf(out, format+"\n", args...)
		out.Flush()
		mu.Unlock()
	}
	for g := 0; g < 4; g++ {
		go func(g int) {
			r := rand.New(rand.NewSource(int64(run*10 + g)))
			for n := 0; ; n++ {
				recs := make([]Record, 1+r.Intn(60))
				for i := range recs {
					recs[i] = Record{Time: int64(n), Tag: "t", Body: crashBody(run, g, n, i)}
				}
				res, err := w.Append(ctx, recs, AppendOptions{ChunkID: fmt.Sprintf("%d-%d-%d", run, g, n)})
				if err != nil {
					report("ERR %v", err)
					os.Exit(4)
				}
				report("A %d %d %d %d %d", run, g, n, res.First, res.Last)
			}
		}(g)
	}
	for i := 0; ; i++ {
		time.Sleep(2 * time.Millisecond)
		next := w.Stats().NextSeq
		if next <= crashKeep {
			continue
		}
		pos := next - crashKeep
		b := &Batch{}
		b.SetCursor("sink", pos)
		b.Put("sink", []byte("pos"), u64(pos))
		b.Put("sink", []byte(fmt.Sprintf("n/%d", i%50)), u64(pos))
		if err := w.Commit(ctx, b); err != nil {
			report("ERR %v", err)
			os.Exit(4)
		}
		report("C %d", pos)
	}
}

type ackedAppend struct {
	run, g, n   int
	first, last uint64
}

// TestCrashKeepsAcknowledgedRecords kills an appending child process with
// SIGKILL at random moments and checks, after each kill, that every
// acknowledged record is present, intact and in order, and that the cursor
// and the sink state committed with it agree. WAL_CRASH_RUNS sets the
// number of kills (make crash runs 200).
func TestCrashKeepsAcknowledgedRecords(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a SIGKILL loop of a child process; make test runs it")
	}
	runs := 20
	if v := os.Getenv("WAL_CRASH_RUNS"); v != "" {
		runs, _ = strconv.Atoi(v)
	}
	dir := t.TempDir()
	seed := testseed.Seed(t, "WAL_CRASH_SEED", "the kill times")
	rng := rand.New(rand.NewSource(seed))
	var acked []ackedAppend
	var maxCursor uint64
	totalAcked := 0
	for run := 0; run < runs; run++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+dir, crashRunEnv+"="+strconv.Itoa(run))
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := make(chan []string)
		opened := make(chan struct{})
		go func() {
			var all []string
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				all = append(all, sc.Text())
				if sc.Text() == "OPENED" {
					close(opened)
				}
			}
			lines <- all
		}()
		// The kill times count from the open: a busy machine can take
		// longer than the longest of them to start the child.
		select {
		case <-opened:
		case out := <-lines:
			cmd.Wait()
			t.Fatalf("run %d: the child ended before it opened the WAL: %s", run, strings.Join(out, "\n"))
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-lines
			cmd.Wait()
			t.Fatalf("run %d: the child did not open the WAL in 30 s", run)
		}
		time.Sleep(time.Duration(20+rng.Intn(400)) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		out := <-lines
		cmd.Wait()
		runAcked := 0
		for _, l := range out {
			f := strings.Fields(l)
			switch {
			case len(f) == 6 && f[0] == "A":
				a := ackedAppend{run: atoi(f[1]), g: atoi(f[2]), n: atoi(f[3]), first: uint64(atoi(f[4])), last: uint64(atoi(f[5]))}
				acked = append(acked, a)
				runAcked++
			case len(f) == 2 && f[0] == "C":
				maxCursor = max(maxCursor, uint64(atoi(f[1])))
			case len(f) > 0 && f[0] != "":
				// The last line may be cut by the kill; anything else is a failure.
				if f[0] == "ERR" || f[0] == "OPEN" || f[0] == "REGISTER" {
					t.Fatalf("run %d: child: %s", run, l)
				}
			}
		}
		totalAcked += runAcked
		checkAfterCrash(t, dir, run, acked, maxCursor)
	}
	t.Logf("%d kills, %d acknowledged appends checked", runs, totalAcked)
	if totalAcked == 0 {
		t.Fatal("the child acknowledged nothing: the test checked nothing")
	}
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }

func checkAfterCrash(t *testing.T, dir string, run int, acked []ackedAppend, maxCursor uint64) {
	t.Helper()
	ro, err := Open(dir, Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("run %d: reopen after SIGKILL: %v", run, err)
	}
	rep := ro.Verify()
	ro.Close()
	if len(rep.Problems) > 0 {
		t.Fatalf("run %d: verify: %v", run, rep.Problems)
	}
	w, err := Open(dir, Options{CompactRatio: -1})
	if err != nil {
		t.Fatalf("run %d: reopen after SIGKILL: %v", run, err)
	}
	defer w.Close()
	st := w.Stats()
	cursor := st.Cursors["sink"]
	if cursor < maxCursor {
		t.Fatalf("run %d: cursor %d is behind the acknowledged %d", run, cursor, maxCursor)
	}
	pos, _ := w.State("sink", []byte("pos"))
	if cursor > 0 && (len(pos) != 8 || binary.BigEndian.Uint64(pos) != cursor) {
		t.Fatalf("run %d: cursor %d but the state committed with it says %x", run, cursor, pos)
	}
	if st.FirstSeq > cursor+1 {
		t.Fatalf("run %d: retention deleted up to %d, past the cursor %d", run, st.FirstSeq-1, cursor)
	}
	recs := readAll(t, w, cursor+1)
	if len(recs) > 0 && recs[0].Seq != cursor+1 {
		t.Fatalf("run %d: first record after the cursor is %d, want %d", run, recs[0].Seq, cursor+1)
	}
	for i := 1; i < len(recs); i++ {
		if recs[i].Seq != recs[i-1].Seq+1 {
			t.Fatalf("run %d: sequence jumps from %d to %d", run, recs[i-1].Seq, recs[i].Seq)
		}
	}
	if uint64(len(recs)) != st.NextSeq-cursor-1 {
		t.Fatalf("run %d: %d records after the cursor, stats say %d", run, len(recs), st.NextSeq-cursor-1)
	}
	for _, a := range acked {
		if a.last <= cursor {
			continue
		}
		if a.last >= st.NextSeq {
			t.Fatalf("run %d: acknowledged append %d-%d is beyond the last record %d", run, a.first, a.last, st.NextSeq-1)
		}
		for s := max(a.first, cursor+1); s <= a.last; s++ {
			got := recs[s-cursor-1]
			if want := crashBody(a.run, a.g, a.n, int(s-a.first)); string(got.Body) != string(want) || got.Time != int64(a.n) {
				t.Fatalf("run %d: record %d holds %q, want %q", run, s, got.Body, want)
			}
		}
	}
	// The newest acknowledged chunk is known after the crash.
	if len(acked) > 0 {
		a := acked[len(acked)-1]
		res, err := w.Append(context.Background(), []Record{{Body: []byte(`{}`)}}, AppendOptions{ChunkID: fmt.Sprintf("%d-%d-%d", a.run, a.g, a.n)})
		if err != nil || !res.Duplicate || res.First != a.first || res.Last != a.last {
			t.Fatalf("run %d: re-sent chunk of %+v after the crash: %+v, %v", run, a, res, err)
		}
	}
}
