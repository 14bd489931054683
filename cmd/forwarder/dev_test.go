package main

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/queue"
	"github.com/logfwd/forwarder/wal"
)

// forwarder dev on a clean directory: the emulators start, --demo records reach
// CloudWatch Logs, and "forwarder dev ls" from another process shows them. It moves the
// dev ports by an offset at which all of them are free, so that a forwarder dev of the
// developer's own may run beside it.
func TestDevMode(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts forwarder dev and its emulators (about 10 s); make test runs it")
	}
	dir := t.TempDir()
	offset := freeDevOffset(t)
	off := strconv.Itoa(offset)
	cmd := exec.Command(bin, "dev", "--demo", "--rate", "200", "--port-offset", off)
	cmd.Dir = dir
	var out, errOut syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	defer func() {
		select {
		case <-done:
		default:
			cmd.Process.Kill()
			<-done
		}
	}()
	deadline := time.Now().Add(40 * time.Second)
	var ls string
	for {
		select {
		case <-done:
			t.Fatalf("forwarder dev exited (%v):\nstdout:\n%s\nstderr:\n%s", cmd.ProcessState, out.String(), errOut.String())
		default:
		}
		ls2 := exec.Command(bin, "dev", "ls", "--port-offset", off)
		b, _ := ls2.CombinedOutput()
		ls = string(b)
		// CloudWatch events within a second or so; S3 objects once max_object_age (10s) cuts them.
		if strings.Contains(ls, "/eks/shop") && strings.Contains(ls, " events") && strings.Contains(ls, ".json.gz") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dev ls never showed events:\n%s\nstdout:\n%s\nstderr:\n%s", ls, out.String(), errOut.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !strings.Contains(ls, "  bucket forwarder-dev:\n") || strings.Contains(ls, "retention 0 days") || !strings.Contains(ls, "(retention 30 days)") {
		t.Errorf("dev ls does not name the bucket or says retention 0 days:\n%s", ls)
	}
	if !strings.Contains(out.String(), fmt.Sprintf("curl -X POST http://127.0.0.1:%d/v1/logs/pod.shop", 8080+offset)) || !strings.Contains(out.String(), "forwarder dev ls --port-offset "+off) {
		t.Errorf("dev did not print how to send and see records:\n%s", out.String())
	}
	checkPrintedCommands(t, out.String())
	// A second one in the same directory, or a --reset, would take its data.
	for _, args := range [][]string{{"dev", "--port-offset", strconv.Itoa(offset + 1)}, {"dev", "--reset", "--port-offset", strconv.Itoa(offset + 1)}} {
		second := exec.Command(bin, args...)
		second.Dir = dir
		b, err := second.CombinedOutput()
		if err == nil || !strings.Contains(string(b), "./dev-data is in use by another forwarder dev") {
			t.Errorf("%v beside a running one: %v %s", args, err, b)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "dev-data", "wal", wal.FileName)); err != nil {
		t.Errorf("the running one's WAL: %v", err)
	}
	// The runtime's soft memory limit is memory_limit's, as under run.
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", 9880+offset))
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := fmt.Sprintf("go_gc_gomemlimit_bytes %g\n", float64(config.Default().MemoryLimit)); !strings.Contains(string(metrics), want) {
		t.Errorf("/metrics lacks %q", want)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatalf("dev did not stop; stderr:\n%s", errOut.String())
	}
	if code := cmd.ProcessState.ExitCode(); code != exitOK {
		t.Fatalf("dev exited %d; stderr:\n%s", code, errOut.String())
	}
	if b, err := exec.Command(bin, "dev", "ls", "--port-offset", off).CombinedOutput(); err == nil || !strings.Contains(string(b), "no forwarder dev answers") {
		t.Errorf("dev ls with nothing running: %v %s", err, b)
	}
}

// checkPrintedCommands runs the forward client and aws CLI commands forwarder dev printed, as
// printed, in a shell with no AWS settings of its own: they must show the bucket's
// objects and the log group's streams.
func checkPrintedCommands(t *testing.T, banner string) {
	t.Helper()
	if _, err := exec.LookPath("aws"); err != nil {
		t.Fatalf("the aws CLI is not on PATH (Debian's awscli): it checks the commands forwarder dev prints")
	}
	var export string
	var cmds []string
	python := false
	for _, l := range strings.Split(banner, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "/usr/bin/python3 "):
			// The forward client's line (make deps installs python3-fluent-logger).
			python = true
			if b, err := exec.Command("sh", "-c", l).CombinedOutput(); err != nil || strings.TrimSpace(string(b)) != "sent" {
				t.Errorf("%s: %v, output %q, want sent", l, err, b)
			}
		case strings.HasPrefix(l, "export AWS_"):
			export, _, _ = strings.Cut(l, "#")
		case strings.HasPrefix(l, "aws "):
			cmds = append(cmds, l)
		}
	}
	if export == "" || len(cmds) != 2 || !python {
		t.Fatalf("dev printed no export line, not two aws commands, or no forward client's line:\n%s", banner)
	}
	home := t.TempDir() // no ~/.aws of the machine's
	for i, c := range cmds {
		sh := exec.Command("sh", "-c", export+"; "+c)
		sh.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home}
		b, err := sh.CombinedOutput()
		want := []string{".json.gz", "logStreamName"}[i]
		if err != nil || !strings.Contains(string(b), want) {
			t.Errorf("%s: %v, output lacks %q:\n%s", c, err, want, b)
		}
	}
}

// freeDevOffset finds a --port-offset at which every dev port is free now.
func freeDevOffset(t *testing.T) int {
	t.Helper()
	for try := 0; try < 50; try++ {
		offset := 10000 + rand.IntN(30000)
		ports, err := newDevPorts(offset)
		if err != nil {
			t.Fatal(err)
		}
		free := true
		for _, addr := range []string{ports.s3, ports.cw, ports.http, ports.forward, ports.admin} {
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				free = false
				break
			}
			ln.Close()
		}
		if free {
			return offset
		}
	}
	t.Fatal("no port offset with every dev port free")
	return 0
}

// A --rate the demo cannot keep is a usage error, before anything starts.
func TestDevRateOutOfRange(t *testing.T) {
	for _, rate := range []string{"0", "-5", "100001", "2000000000"} {
		cmd := exec.Command(bin, "dev", "--demo", "--rate", rate, "--port-offset", strconv.Itoa(freeDevOffset(t)))
		cmd.Dir = t.TempDir()
		b, _ := cmd.CombinedOutput()
		if code := cmd.ProcessState.ExitCode(); code != exitUsage || !strings.Contains(string(b), "--rate "+rate+": the demo sends 1 to 100000 records a second") {
			t.Errorf("--rate %s: exit %d, %s", rate, code, b)
		}
		if _, err := os.Stat(filepath.Join(cmd.Dir, "dev-data")); err == nil {
			t.Errorf("--rate %s: dev-data made", rate)
		}
	}
}

// A --reset while a dev port is taken deletes nothing: the start would
// fail, and only the data would be gone.
func TestDevResetWithAPortTaken(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "dev-data", "kept")
	if err := os.MkdirAll(filepath.Dir(marker), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	offset := freeDevOffset(t)
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", 4567+offset))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cmd := exec.Command(bin, "dev", "--reset", "--port-offset", strconv.Itoa(offset))
	cmd.Dir = dir
	b, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(b), fmt.Sprintf("127.0.0.1:%d is in use; nothing was deleted", 4567+offset)) {
		t.Errorf("dev --reset with a port taken: %v %s", err, b)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("the data: %v", err)
	}
}

// The dev pipeline is config.yaml's: its CloudWatch sink takes Fluent
// Bit's Kubernetes tags as well as pod.NAMESPACE.
func TestDevConfigMatchesKubernetesTags(t *testing.T) {
	ports, err := newDevPorts(0)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := devConfig(t.TempDir(), ports, "http://127.0.0.1:4566", "http://127.0.0.1:4567")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range cfg.Sinks {
		if s.CloudWatch == nil {
			continue
		}
		m := config.NewTagMatcher(s.Match)
		for _, tag := range []string{"kube.var.log.containers.shop_web-1_app-0123.log", "pod.shop"} {
			if !m.Match(tag) {
				t.Errorf("the dev CloudWatch sink (match %v) does not take %s", s.Match, tag)
			}
		}
	}
}

// dev ls before any record says that there are no log groups yet, rather
// than printing an empty heading.
func TestDevLsWithNoGroups(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts forwarder dev and its emulators; make test runs it")
	}
	off := strconv.Itoa(freeDevOffset(t))
	cmd := exec.Command(bin, "dev", "--port-offset", off)
	cmd.Dir = t.TempDir()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	var ls string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		b, err := exec.Command(bin, "dev", "ls", "--port-offset", off).CombinedOutput()
		if ls = string(b); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dev ls never answered: %v\n%s", err, ls)
		}
	}
	if !strings.Contains(ls, "  no log groups yet (records of tags the sink matches, kube.** or pod.**, make them)\n") {
		t.Errorf("dev ls with no groups:\n%s", ls)
	}
}

// The dev status line counts the records taken since it began, not the
// WAL's sequence numbers, which a new WAL takes from the clock.
func TestStatusTextCountsRecordsTaken(t *testing.T) {
	first := wal.NewFirstSeq(time.Now())
	st := wal.Stats{NextSeq: first + 3, Records: 3, Bytes: 300}
	got := statusText(st, first, []queue.Status{{Sink: "archive", State: "running", Delivered: 2, LagRecords: 1}})
	if want := "in 3 records | wal 3 records, 300 B | archive: running, delivered 2, lag 1"; got != want {
		t.Fatalf("status line %q, want %q", got, want)
	}
}
