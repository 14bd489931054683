package s3sink

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"

	s3emu "github.com/logfwd/forwarder/emulator/s3emu"
)

// emuChildEnv, when set, makes this test binary an emulator process (see
// emuChild) instead of running tests; TestMain hands it over.
const emuChildEnv = "S3_EMULATOR_CHILD"

// emuChild serves an in-memory emulator with the test bucket and prints
// "url URL". When its standard input closes it prints "objects N lines M"
// (the objects in the bucket and the lines they hold, decompressed) and
// exits.
func emuChild() int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "emulator child:", err)
		return 2
	}
	srv, err := s3emu.New(s3emu.Options{})
	if err != nil {
		return fail(err)
	}
	url, err := srv.Start("127.0.0.1:0")
	if err != nil {
		return fail(err)
	}
	if err := srv.CreateBucket(bucket); err != nil {
		return fail(err)
	}
	fmt.Printf("url %s\n", url)
	_, _ = io.Copy(io.Discard, os.Stdin)
	objs, err := srv.Objects(bucket)
	if err != nil {
		return fail(err)
	}
	lines := 0
	for _, o := range objs {
		body, err := srv.Get(bucket, o.Key)
		if err != nil {
			return fail(err)
		}
		if o.ContentEncoding == "gzip" {
			zr, err := gzip.NewReader(bytes.NewReader(body))
			if err != nil {
				return fail(fmt.Errorf("object %s: %w", o.Key, err))
			}
			if body, err = io.ReadAll(zr); err != nil {
				return fail(fmt.Errorf("object %s: %w", o.Key, err))
			}
		}
		lines += bytes.Count(body, []byte("\n"))
	}
	fmt.Printf("objects %d lines %d\n", len(objs), lines)
	if err := srv.Close(); err != nil {
		return fail(err)
	}
	return 0
}

// emuProcess is an emulator running in a child process, so that the CPU
// time it spends serving is not counted in this process's.
type emuProcess struct {
	URL    string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	out    *bufio.Scanner
	stderr bytes.Buffer
	done   bool
}

// startEmuProcess starts an emulator process with the test bucket; it is
// killed when the test ends unless stop was called.
func startEmuProcess(t testing.TB) *emuProcess {
	t.Helper()
	p := &emuProcess{cmd: exec.Command(os.Args[0], "-test.run=^$")}
	p.cmd.Env = append(os.Environ(), emuChildEnv+"=1")
	p.cmd.Stderr = &p.stderr
	var err error
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !p.done {
			_ = p.cmd.Process.Kill()
			_ = p.cmd.Wait()
		}
	})
	p.out = bufio.NewScanner(stdout)
	line := make(chan string, 1)
	go func() {
		if p.out.Scan() {
			line <- p.out.Text()
		}
		close(line)
	}()
	select {
	case l := <-line:
		url, ok := strings.CutPrefix(l, "url ")
		if !ok {
			t.Fatalf("emulator process said %q, want its URL", l)
		}
		p.URL = url
	case <-time.After(30 * time.Second):
		t.Fatal("emulator process did not start in 30 s")
	}
	return p
}

// stop ends the emulator process and returns the objects in the bucket and
// the lines they held.
func (p *emuProcess) stop(t testing.TB) (objects, lines int) {
	t.Helper()
	p.stdin.Close()
	var l string
	if p.out.Scan() {
		l = p.out.Text()
	}
	err := p.cmd.Wait()
	p.done = true
	if err != nil {
		t.Fatalf("emulator process: %v\n%s", err, p.stderr.String())
	}
	if _, err := fmt.Sscanf(l, "objects %d lines %d", &objects, &lines); err != nil {
		t.Fatalf("emulator process said %q: %v\n%s", l, err, p.stderr.String())
	}
	return objects, lines
}
