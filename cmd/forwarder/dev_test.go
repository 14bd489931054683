package main

import (
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// forwarder dev on a clean directory: the emulators start, --demo records reach
// CloudWatch Logs, and "forwarder dev ls" from another process shows them. It uses the
// fixed dev ports, so it does not run in parallel with anything else.
func TestDevMode(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(bin, "dev", "--demo", "--rate", "200")
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
		ls2 := exec.Command(bin, "dev", "ls")
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
	if !strings.Contains(out.String(), "curl -X POST http://127.0.0.1:8080/v1/logs/pod.shop") || !strings.Contains(out.String(), "forwarder dev ls") {
		t.Errorf("dev did not print how to send and see records:\n%s", out.String())
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
	if b, err := exec.Command(bin, "dev", "ls").CombinedOutput(); err == nil || !strings.Contains(string(b), "no forwarder dev answers") {
		t.Errorf("dev ls with nothing running: %v %s", err, b)
	}
}
