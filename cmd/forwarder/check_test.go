package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckGoodConfig(t *testing.T) {
	t.Parallel()
	path, dataDir := writeConfig(t, inputsYAML, adminYAML, sinkYAML, `  - name: pods
    type: cloudwatch
    match: "pod.**"
    log_group: "/eks/${record.kubernetes.namespace_name}"
    log_stream: "${record.kubernetes.pod_name|unknown}"
`)
	r := forwarderCmd(t, "check", "-c", path)
	want := path + ": OK\n" +
		"2 sinks: archive (s3, 32MiB of memory), pods (cloudwatch, 16MiB of memory); inputs: forward on 127.0.0.1:0, http on 127.0.0.1:0; admin on 127.0.0.1:0; data_dir: " + dataDir + "; memory_limit: 128MiB\n"
	if r.code != exitOK || r.stdout != want || r.stderr != "" {
		t.Errorf("check: exit %d\nstdout %q\nstderr %q\nwant exit 0 and stdout %q", r.code, r.stdout, r.stderr, want)
	}

	path, _ = writeConfig(t, inputsYAML, "admin: {listen: \"127.0.0.1:0\", pprof: true}\n", sinkYAML)
	r = forwarderCmd(t, "check", "-c", path)
	if r.code != exitOK || !strings.Contains(r.stdout, "; admin on 127.0.0.1:0 (with /debug/pprof/); ") {
		t.Errorf("check with admin.pprof: exit %d\nstdout %q\nstderr %q\nwant it to name /debug/pprof/", r.code, r.stdout, r.stderr)
	}
}

func TestCheckBadConfig(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "bad.yaml")
	text := `data_dir: /var/lib/forwarder
wal:
  sync: sometimes
  max_byte: 1GiB
`
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	r := forwarderCmd(t, "check", "-c", path)
	want := path + `:3: wal.sync: "sometimes" is not one of always, interval` + "\n" +
		path + `:4: unknown key "max_byte" in wal` + "\n" +
		path + ": 2 problems\n"
	if r.code != exitFail || r.stderr != want || r.stdout != "" {
		t.Errorf("check: exit %d\nstdout %q\nstderr %q\nwant exit 1 and stderr %q", r.code, r.stdout, r.stderr, want)
	}
}

func TestCheckMissingFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "missing.yaml")
	r := forwarderCmd(t, "check", "-c", path)
	if r.code != exitFail || !strings.Contains(r.stderr, "forwarder check: read config:") || !strings.Contains(r.stderr, path) {
		t.Errorf("check of a missing file: exit %d, stderr %q; want exit 1 naming the file", r.code, r.stderr)
	}
}
