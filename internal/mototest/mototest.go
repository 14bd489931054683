//go:build unix

// Package mototest runs moto_server, an independent AWS emulator, for tests
// that check the project's clients and emulators against it.
package mototest

import (
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/logfwd/forwarder/internal/syncbuf"
)

// syncBuffer collects output while the test reads it.
type syncBuffer = syncbuf.Buffer

// Start runs moto_server on a free loopback port until the test ends and
// returns its URL. moto is part of this machine image (pip), not a Debian
// package: a missing moto_server fails the test and says how to install it.
func Start(t testing.TB) string {
	t.Helper()
	path, err := exec.LookPath("moto_server")
	if err != nil {
		t.Fatalf("moto_server is not on PATH (%v); install it with: pip install 'moto[server]'", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()

	var out syncBuffer
	cmd := exec.Command(path, "-H", "127.0.0.1", "-p", fmt.Sprint(port))
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start moto_server: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // its own process group
		<-exited
	})

	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := client.Get(url + "/moto-api/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return url
			}
		}
		select {
		case <-exited:
			t.Fatalf("moto_server exited before answering:\n%s", out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("moto_server did not answer on %s within 60 s (%v):\n%s", url, err, out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}
