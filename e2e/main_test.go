package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// forwarderBin is the forwarder binary, built once by TestMain.
var forwarderBin string

// long is set by E2E_LONG=1: more kills, longer loads (make soak).
var long = os.Getenv("E2E_LONG") == "1"

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	root, err := moduleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	dir, err := os.MkdirTemp("", "forwarder-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	forwarderBin = filepath.Join(dir, "forwarder")
	// Built as make image builds what ships: static, without the build's paths (so that
	// make image, after make test, compiles nothing again: it only links).
	build := exec.Command("go", "build", "-trimpath", "-o", forwarderBin, "./cmd/forwarder")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: go build ./cmd/forwarder: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// moduleRoot is the directory of the module's go.mod, as `go env GOMOD` says.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("go env GOMOD: not inside a module (%q)", gomod)
	}
	return filepath.Dir(gomod), nil
}
