package main

import (
	"bufio"
	"fmt"
	"io"
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

	"github.com/tinylib/msgp/msgp"

	"github.com/logfwd/forwarder/wal"
)

// Out of file descriptors, the service waits instead of failing: under
// prlimit --nofile=200, idle HTTP connections take every descriptor the
// process may open, then a forward client connects and sends a message
// with a chunk id. The forward input cannot accept it (EMFILE); it says
// so once, counts it and tries again. Once the HTTP clients leave, the
// message is accepted, stored and acknowledged, and the service stops
// cleanly.
func TestRunOutOfFileDescriptors(t *testing.T) {
	t.Parallel()
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Fatalf("this test needs prlimit (Debian's util-linux): %v", err)
	}
	const limit = 200
	forwardAddr, httpAddr, adminAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	path, dataDir := writeConfig(t, shortShutdownYAML,
		fmt.Sprintf("inputs:\n  forward: {listen: %q}\n  http: {listen: %q}\n", forwardAddr, httpAddr),
		fmt.Sprintf("admin: {listen: %q}\n", adminAddr))
	s := startCommand(t, exec.Command(prlimit, fmt.Sprintf("--nofile=%d", limit), "--", bin, "run", "-c", path))
	s.waitFor("msg=started", filepath.Join(dataDir, wal.FileName))
	pid := s.cmd.Process.Pid // prlimit execs the service in its place

	// Idle HTTP connections until the service holds every descriptor it may.
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	deadline := time.Now().Add(20 * time.Second)
	for openFiles(t, pid) < limit {
		if time.Now().After(deadline) {
			t.Fatalf("the service holds %d files after %d connections, want %d", openFiles(t, pid), len(idle), limit)
		}
		if len(idle) < 2*limit {
			c, err := net.Dial("tcp", httpAddr)
			if err != nil {
				t.Fatal(err)
			}
			idle = append(idle, c)
		}
		time.Sleep(2 * time.Millisecond)
	}

	fwd, err := net.Dial("tcp", forwardAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer fwd.Close()
	msg := msgp.AppendArrayHeader(nil, 4)
	msg = msgp.AppendString(msg, "app.fd")
	msg = msgp.AppendInt64(msg, time.Now().Unix())
	msg = msgp.AppendMapHeader(msg, 1)
	msg = msgp.AppendString(msg, "log")
	msg = msgp.AppendString(msg, "sent while the service had no descriptor left")
	msg = msgp.AppendMapHeader(msg, 1)
	msg = msgp.AppendString(msg, "chunk")
	msg = msgp.AppendString(msg, "fd-chunk")
	if _, err := fwd.Write(msg); err != nil {
		t.Fatal(err)
	}
	s.waitForLine(func(line string) bool {
		return strings.Contains(line, "level=WARN") && strings.Contains(line, "the process has no file descriptor left") &&
			strings.Contains(line, "input=forward") && strings.Contains(line, "too many open files")
	})
	if err := s.cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the service is gone: %v\n%s", err, s.stderr.String())
	}

	for _, c := range idle {
		c.Close()
	}
	idle = nil
	fwd.SetReadDeadline(time.Now().Add(20 * time.Second))
	r := msgp.NewReader(fwd)
	if n, err := r.ReadMapHeader(); err != nil || n != 1 {
		t.Fatalf("no ack once descriptors were free: %v (%d keys)\n%s", err, n, s.stderr.String())
	}
	if k, _ := r.ReadString(); k != "ack" {
		t.Fatalf("answer key %q, want ack", k)
	}
	if id, _ := r.ReadString(); id != "fd-chunk" {
		t.Fatalf("ack %q, want fd-chunk", id)
	}

	if n := metric(t, adminAddr, `forwarder_input_accept_errors_total{input="forward"}`); n < 1 {
		t.Errorf("forward accept errors counted %v, want at least 1", n)
	}
	s.signal(syscall.SIGTERM)
	if code := s.wait(10 * time.Second); code != exitOK {
		t.Fatalf("exit status %d, want 0; stderr:\n%s", code, s.stderr.String())
	}
	if log := s.stderr.String(); strings.Contains(log, "level=ERROR") {
		t.Errorf("the service logged an error:\n%s", log)
	}
}

// openFiles counts the file descriptors process pid holds.
func openFiles(t *testing.T, pid int) int {
	t.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(fds)
}

// waitForLine waits until the service has logged a line that match accepts.
func (s *service) waitForLine(match func(line string) bool) {
	s.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, line := range strings.Split(s.stderr.String(), "\n") {
			if match(line) {
				return
			}
		}
		select {
		case <-s.done:
			s.t.Fatalf("forwarder run exited (%v) before logging the line awaited; stderr:\n%s", s.cmd.ProcessState, s.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("forwarder run did not log the line awaited; stderr:\n%s", s.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// metric reads one sample's value from the admin server's /metrics.
func metric(t *testing.T, adminAddr, sample string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + adminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if value, ok := strings.CutPrefix(sc.Text(), sample+" "); ok {
			v, err := strconv.ParseFloat(value, 64)
			if err != nil {
				t.Fatalf("%s: %v", sc.Text(), err)
			}
			return v
		}
	}
	io.Copy(io.Discard, resp.Body)
	t.Fatalf("/metrics has no %s", sample)
	return 0
}
