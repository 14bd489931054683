package forward

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/logfwd/forwarder/inputs"
	"github.com/logfwd/forwarder/internal/testseed"
	"github.com/logfwd/forwarder/wal"
)

const (
	crashChildEnv = "FORWARD_TEST_CRASH_CHILD"
	crashAddrEnv  = "FORWARD_TEST_CRASH_ADDR"
)

func crashChild(dir string) {
	w, err := wal.Open(dir, wal.Options{})
	if err != nil {
		fmt.Println("OPEN", err)
		os.Exit(3)
	}
	cfg := defaultCfg()
	cfg.Listen = os.Getenv(crashAddrEnv)
	s := New(cfg, &inputs.Pipeline{WAL: w, Metrics: inputs.NewMetrics(nil)}, slog.New(slog.DiscardHandler))
	if err := s.Start(); err != nil {
		fmt.Println("START", err)
		os.Exit(3)
	}
	s.Serve(context.Background())
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// crashMessage is the message of chunk; sent again, it is the same message
// (its records' times too), as a client re-sends a chunk.
func crashMessage(chunk int) []byte {
	var entries [][]byte
	at := eventTime(time.Unix(1_700_000_000+int64(chunk), 0))
	for i := 0; i < 10; i++ {
		entries = append(entries, entry(at, record("chunk", chunk, "i", i)))
	}
	return forwardMode("crash", entries, options(fmt.Sprint("chunk-", chunk)))
}

// TestCrashAckedRecordsExactlyOnce SIGKILLs the server while a client
// sends with acks, and restarts it. The client re-sends the message in
// flight at each kill and the last acknowledged one (as if its ack was
// lost). Afterwards every acknowledged message is in the WAL exactly once.
// FORWARD_CRASH_RUNS sets the number of kills.
func TestCrashAckedRecordsExactlyOnce(t *testing.T) {
	runs := 10
	if v := os.Getenv("FORWARD_CRASH_RUNS"); v != "" {
		runs, _ = strconv.Atoi(v)
	}
	dir := t.TempDir()
	addr := freeAddr(t)
	seed := testseed.Seed(t, "FORWARD_CRASH_SEED", "the kill times")
	rng := rand.New(rand.NewSource(seed))
	acked := map[int]bool{}
	next := 0
	for run := 0; run < runs; run++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+dir, crashAddrEnv+"="+addr)
		out := &strings.Builder{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		var c net.Conn
		var err error
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if c, err = net.Dial("tcp", addr); err == nil || time.Now().After(deadline) {
				break
			}
		}
		if err != nil {
			t.Fatalf("run %d: server did not come up: %v %s", run, err, out)
		}
		killAt := time.Now().Add(time.Duration(50+rng.Intn(300)) * time.Millisecond)
		killed := make(chan struct{})
		go func() {
			time.Sleep(time.Until(killAt))
			cmd.Process.Signal(syscall.SIGKILL)
			close(killed)
		}()
		// Re-send the last acknowledged message: its ack may have been lost.
		if next > 0 {
			next--
		}
		for {
			if _, err := c.Write(crashMessage(next)); err != nil {
				break
			}
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if id, err := readAckErr(c); err != nil || id != fmt.Sprint("chunk-", next) {
				break // killed: this message is in doubt and is sent again
			}
			acked[next] = true
			next++
		}
		<-killed
		cmd.Wait()
		c.Close()
	}
	w, err := wal.Open(dir, wal.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	recs, err := w.Read(1, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, r := range recs {
		seen[string(r.Body)]++
	}
	for chunk := range acked {
		for i := 0; i < 10; i++ {
			body := fmt.Sprintf(`{"chunk":%d,"i":%d}`, chunk, i)
			if seen[body] != 1 {
				t.Fatalf("acknowledged record %s stored %d times", body, seen[body])
			}
		}
	}
	for body, n := range seen {
		if n != 1 {
			t.Fatalf("record %s stored %d times", body, n)
		}
	}
	t.Logf("%d kills, %d acknowledged messages, %d records, each once", runs, len(acked), len(recs))
	if len(acked) < runs {
		t.Fatalf("only %d messages acknowledged in %d runs", len(acked), runs)
	}
}
