package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/logfwd/forwarder/config"
)

// The packaged unit and the production configuration, from this package's directory.
var (
	unitPath          = filepath.Join("..", "..", "packaging", "systemd", "forwarder.service")
	packagingYAMLPath = filepath.Join("..", "..", "packaging", "forwarder.yaml")
)

// packagingEnv is what /etc/forwarder/forwarder.env provides to packaging/forwarder.yaml,
// and systemd: CREDENTIALS_DIRECTORY, for the unit's LoadCredential=.
var packagingEnv = map[string]string{
	"FORWARDER_SHARED_KEY":  "a-shared-key",
	"FORWARDER_HTTP_TOKEN":  "a-token",
	"S3_BUCKET":             "logfwd-archive",
	"AWS_REGION":            "eu-west-1",
	"CREDENTIALS_DIRECTORY": "/run/credentials/forwarder.service",
}

// The unit passes systemd-analyze verify: every directive known and valid, the binary
// executable. verify checks that ExecStart's binary exists, so it runs on a copy of the unit
// that starts the binary this test built.
func TestSystemdUnitVerifies(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatal("systemd-analyze is not installed, so the unit cannot be verified: install systemd (apt-get install -y systemd) — make deps does")
	}
	unit, err := os.ReadFile(unitPath)
	if err != nil {
		t.Fatal(err)
	}
	const execStart = "\nExecStart=/usr/bin/forwarder "
	if n := strings.Count(string(unit), execStart); n != 1 {
		t.Fatalf("%s has %d lines starting %q, want one", unitPath, n, strings.TrimSpace(execStart))
	}
	path := filepath.Join(t.TempDir(), "forwarder.service")
	text := strings.Replace(string(unit), execStart, "\nExecStart="+bin+" ", 1)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}

	// --man=no: verify does not look for man pages, which a build machine may lack.
	// --generators=no: generators need root and describe this machine, not the unit.
	// --recursive-errors=no: only this unit's errors count, not those of the machine's units
	// it is ordered after.
	cmd := exec.Command(analyze, "verify", "--man=no", "--generators=no", "--recursive-errors=no", path)
	cmd.Env = append(os.Environ(), "SYSTEMD_LOG_COLOR=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze verify %s: %v\n%s", unitPath, err, out)
	}
	// A warning (an unknown key, a value it ignores) names the unit and still exits 0.
	var other []string
	for line := range strings.Lines(string(out)) {
		if strings.Contains(line, "forwarder.service") {
			t.Errorf("systemd-analyze verify %s: %s", unitPath, strings.TrimSpace(line))
		} else {
			other = append(other, line)
		}
	}
	if len(other) > 0 {
		t.Logf("systemd-analyze verify said, about other units of this machine:\n%s", strings.Join(other, ""))
	}
}

// The production configuration loads, with the variables the unit's EnvironmentFile sets,
// and agrees with the unit: its data_dir is the unit's state directory, and systemd waits
// longer than shutdown_timeout before it kills a stopping service.
func TestPackagingConfig(t *testing.T) {
	for name, value := range packagingEnv {
		t.Setenv(name, value)
	}
	cfg, err := config.Load(packagingYAMLPath)
	if err != nil {
		t.Fatalf("load %s: %v", packagingYAMLPath, err)
	}
	if cfg.Inputs.Forward == nil || cfg.Inputs.Forward.SharedKey != packagingEnv["FORWARDER_SHARED_KEY"] {
		t.Errorf("forward input %+v, want it enabled with shared_key from FORWARDER_SHARED_KEY", cfg.Inputs.Forward)
	}
	if cfg.Inputs.HTTP == nil || cfg.Inputs.HTTP.Token != packagingEnv["FORWARDER_HTTP_TOKEN"] {
		t.Errorf("http input %+v, want it enabled with token from FORWARDER_HTTP_TOKEN", cfg.Inputs.HTTP)
	}
	if len(cfg.Sinks) != 2 || cfg.Sinks[0].S3 == nil || cfg.Sinks[0].S3.Bucket != packagingEnv["S3_BUCKET"] || cfg.Sinks[1].CloudWatch == nil {
		t.Errorf("sinks %+v, want an s3 sink on S3_BUCKET and a cloudwatch sink", cfg.Sinks)
	}
	// Nothing in clear, nothing open: the service starts without a warning.
	for _, w := range configWarnings(cfg) {
		t.Errorf("the production configuration is warned about: %s (%s %s)", w.msg, w.about, w.name)
	}

	unit := readUnit(t)
	// The TLS keys are credentials the unit loads.
	for _, key := range []string{cfg.Inputs.Forward.TLS.KeyFile, cfg.Inputs.HTTP.TLS.KeyFile} {
		dir, name := filepath.Split(key)
		if filepath.Clean(dir) != packagingEnv["CREDENTIALS_DIRECTORY"] || !strings.HasPrefix(unit["LoadCredential"], name+":") {
			t.Errorf("key_file %s: want ${env.CREDENTIALS_DIRECTORY}/NAME with LoadCredential=NAME:... in the unit (it has LoadCredential=%s)", key, unit["LoadCredential"])
		}
	}
	if want := filepath.Join("/var/lib", unit["StateDirectory"]); cfg.DataDir != want {
		t.Errorf("data_dir %s, want the unit's state directory %s (StateDirectory=%s)", cfg.DataDir, want, unit["StateDirectory"])
	}
	stop, err := time.ParseDuration(unit["TimeoutStopSec"])
	if err != nil {
		t.Fatalf("%s: TimeoutStopSec=%s: %v", unitPath, unit["TimeoutStopSec"], err)
	}
	if shutdown := time.Duration(cfg.ShutdownTimeout); stop <= shutdown {
		t.Errorf("TimeoutStopSec=%v is not above shutdown_timeout %v: systemd would kill the service before its own deadline", stop, shutdown)
	}
	if unit["ExecStart"] != "/usr/bin/forwarder run -c /etc/forwarder/forwarder.yaml" {
		t.Errorf("ExecStart=%s, want the service on /etc/forwarder/forwarder.yaml", unit["ExecStart"])
	}
}

// Without the environment file the configuration does not load: each missing variable is a
// problem, which is why the unit's EnvironmentFile= is required.
func TestPackagingConfigNeedsEnvironment(t *testing.T) {
	for name := range packagingEnv {
		t.Setenv(name, "")
		os.Unsetenv(name) // t.Setenv restores it after the test
	}
	_, err := config.Load(packagingYAMLPath)
	if err == nil {
		t.Fatalf("load %s without its environment: no error", packagingYAMLPath)
	}
	for name := range packagingEnv {
		if !strings.Contains(err.Error(), "environment variable "+name+" is not set") {
			t.Errorf("load %s without %s: %v; want it named", packagingYAMLPath, name, err)
		}
	}
}

// readUnit returns the packaged unit's settings, by key; for a key set more than once, the
// last value.
func readUnit(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open(unitPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	settings := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' || line[0] == '[' {
			continue
		}
		if key, value, ok := strings.Cut(line, "="); ok {
			settings[strings.TrimSpace(key)] = strings.TrimSpace(value)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return settings
}
