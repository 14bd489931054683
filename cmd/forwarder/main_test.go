package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/logfwd/forwarder/internal/syncbuf"
	"github.com/logfwd/forwarder/wal"
)

// testVersion is linked into the binary the tests run.
const testVersion = "v1.2.3-test"

// bin is the forwarder binary, built once by TestMain.
var bin string

// raceEnabled is set by race_test.go, so that the binary is built as the tests are.
var raceEnabled bool

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "forwarder-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	bin = filepath.Join(dir, "forwarder")
	args := []string{"build", "-o", bin, "-ldflags", "-X main.version=" + testVersion}
	if raceEnabled {
		args = append(args, "-race")
		// The race runtime sleeps a second before a clean exit; the children need not.
		os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	}
	build := exec.Command("go", append(args, ".")...)
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build forwarder: %v\n%s", err, out)
		return 1
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			return 1
		}
	}
	return code
}

// result is what a finished forwarder command left.
type result struct {
	code           int
	stdout, stderr string
}

// awsEnv gives a child static credentials and keeps it from the machine's own AWS
// configuration, so that what check and run say of credentials does not depend on
// where the tests run.
var awsEnv = append(noAWSEnv, "AWS_ACCESS_KEY_ID=AKIDTEST", "AWS_SECRET_ACCESS_KEY=test-secret")

// noAWSEnv leaves a child without any AWS credentials or configuration.
var noAWSEnv = []string{"AWS_ACCESS_KEY_ID=", "AWS_SECRET_ACCESS_KEY=", "AWS_SESSION_TOKEN=", "AWS_PROFILE=",
	"AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null", "AWS_WEB_IDENTITY_TOKEN_FILE=",
	"AWS_CONTAINER_CREDENTIALS_FULL_URI=", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI=", "AWS_EC2_METADATA_DISABLED=true",
	"AWS_REGION=", "AWS_DEFAULT_REGION="}

// forwarderCmd runs the binary with args and returns its exit status and output.
func forwarderCmd(t *testing.T, args ...string) result {
	t.Helper()
	return forwarderCmdEnv(t, awsEnv, args...)
}

// forwarderCmdEnv runs the binary with args and env added to the test's environment.
func forwarderCmdEnv(t *testing.T, env []string, args ...string) result {
	t.Helper()
	// A command expected to end that runs on (a run that should have
	// refused its configuration) fails the test, not the package's timeout.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("forwarder %s: still running after 2m (killed); stderr:\n%s", strings.Join(args, " "), stderr.String())
	}
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("forwarder %s: %v", strings.Join(args, " "), err)
	}
	return result{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}
}

// Pieces of a configuration file, on loopback with ports the system picks.
const (
	inputsYAML = `inputs:
  forward: {listen: "127.0.0.1:0"}
  http: {listen: "127.0.0.1:0"}
`
	adminYAML = "admin: {listen: \"127.0.0.1:0\"}\n"
	// sinkYAML's endpoint refuses connections: nothing leaves the machine.
	sinkYAML = `sinks:
  - name: archive
    type: s3
    bucket: test-bucket
    region: us-east-1
    endpoint: "http://127.0.0.1:1"
    path_style: true
`
	// shortShutdownYAML keeps a stuck shutdown from outlasting the test.
	shortShutdownYAML = "shutdown_timeout: 5s\n"
)

// writeConfig writes a configuration file of parts, with data_dir in a new temporary
// directory, and returns its path and the data directory.
func writeConfig(t *testing.T, parts ...string) (path, dataDir string) {
	t.Helper()
	dir := t.TempDir()
	dataDir = filepath.Join(dir, "data")
	text := fmt.Sprintf("data_dir: %q\n", dataDir) + strings.Join(parts, "")
	path = filepath.Join(dir, "forwarder.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, dataDir
}

// syncBuffer collects output while the test reads it.
type syncBuffer = syncbuf.Buffer

// service is "forwarder run" in a child process.
type service struct {
	t      *testing.T
	cmd    *exec.Cmd
	stderr syncBuffer
	done   chan struct{}
}

func startService(t *testing.T, configPath string, env ...string) *service {
	t.Helper()
	cmd := exec.Command(bin, "run", "-c", configPath)
	cmd.Env = append(append(os.Environ(), awsEnv...), env...)
	return startCommand(t, cmd)
}

// startCommand starts cmd, which runs the service (perhaps through another command that
// execs it), as a service.
func startCommand(t *testing.T, cmd *exec.Cmd) *service {
	t.Helper()
	s := &service{t: t, cmd: cmd, done: make(chan struct{})}
	s.cmd.Stderr = &s.stderr
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = s.cmd.Wait() // the exit status is read from ProcessState
		close(s.done)
	}()
	t.Cleanup(func() {
		select {
		case <-s.done:
		default:
			_ = s.cmd.Process.Kill()
			<-s.done
		}
	})
	return s
}

// waitFor waits until the service has logged want and the file at path exists.
func (s *service) waitFor(want, path string) {
	s.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := os.Stat(path)
		if err == nil && strings.Contains(s.stderr.String(), want) {
			return
		}
		select {
		case <-s.done:
			s.t.Fatalf("forwarder run exited (%v) before logging %q; stderr:\n%s", s.cmd.ProcessState, want, s.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("forwarder run did not log %q with %s present; stderr:\n%s", want, path, s.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (s *service) signal(sig os.Signal) {
	s.t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatal(err)
	}
}

// wait waits for the service to exit and returns its exit status.
// startStop runs the service of configPath until it has started, stops it with sig, and
// returns its log; it fails unless the service exits 0 within timeout.
func startStop(t *testing.T, configPath, dataDir string, sig os.Signal, timeout time.Duration) string {
	t.Helper()
	s := startService(t, configPath)
	s.waitFor("msg=started", filepath.Join(dataDir, wal.FileName))
	s.signal(sig)
	if code := s.wait(timeout); code != exitOK {
		t.Fatalf("exit status %d after %v, want 0; stderr:\n%s", code, sig, s.stderr.String())
	}
	return s.stderr.String()
}

func (s *service) wait(timeout time.Duration) int {
	s.t.Helper()
	select {
	case <-s.done:
		return s.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		s.t.Fatalf("forwarder run still running after %v; stderr:\n%s", timeout, s.stderr.String())
		return -1
	}
}
