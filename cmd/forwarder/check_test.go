package main

import (
	"fmt"
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

// check warns, on stderr and still exiting 0, about inputs other machines can reach
// without authentication or without TLS, as run does at start.
func TestCheckWarnsAboutCleartextInputs(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, inputs string
		want         []string
	}{
		{"authenticated in clear", "inputs:\n  forward: {listen: \"0.0.0.0:24224\", shared_key: k}\n  http: {listen: \"10.0.0.5:8080\", token: t}\n", []string{
			"warning: the forward input has no TLS: records, and the handshake that authenticates clients, cross the network in clear for anyone on the path to read or replay; set inputs.forward.tls.cert_file and key_file, or listen on a loopback address (address 0.0.0.0:24224)",
			"warning: the HTTP input has no TLS: records and the bearer token cross the network in clear for anyone on the path to read and reuse; set inputs.http.tls.cert_file and key_file, or listen on a loopback address (address 10.0.0.5:8080)",
		}},
		{"open", "inputs:\n  http: {listen: \":8080\"}\n", []string{
			"warning: the HTTP input accepts records from anyone who can reach it",
			"warning: the HTTP input has no TLS",
		}},
		{"with TLS", "inputs:\n  forward: {listen: \"0.0.0.0:24224\", shared_key: k, tls: {cert_file: /c, key_file: /k}}\n  http: {listen: \"0.0.0.0:8080\", token: t, tls: {cert_file: /c, key_file: /k}}\n", nil},
		{"loopback", inputsYAML, nil},
	} {
		path, _ := writeConfig(t, c.inputs, adminYAML)
		r := forwarderCmd(t, "check", "-c", path)
		if r.code != exitOK || !strings.HasPrefix(r.stdout, path+": OK\n") {
			t.Errorf("%s: exit %d, stdout %q", c.name, r.code, r.stdout)
		}
		lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
		if r.stderr == "" {
			lines = nil
		}
		if len(lines) != len(c.want) {
			t.Errorf("%s: stderr %q, want %d warnings", c.name, r.stderr, len(c.want))
			continue
		}
		for i, w := range c.want {
			if !strings.HasPrefix(lines[i], path+": "+w) {
				t.Errorf("%s: warning %d is %q, want it to start %q", c.name, i, lines[i], path+": "+w)
			}
		}
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

// check warns about an S3 key that another forwarder could render too: one without
// ${hostname} or ${uuid} ($${hostname} is a literal).
func TestCheckWarnsAboutKeysReplicasShare(t *testing.T) {
	t.Parallel()
	const warn = "warning: sinks[archive].key has neither ${hostname} nor ${uuid}, so its keys are this forwarder's alone only while no other forwarder writes to bucket test-bucket: " +
		"replicas sharing the bucket would render the same keys for their own records, and the conditional writes would then pause the second writer"
	for _, c := range []struct {
		key    string
		warned bool
	}{
		{"logs/${tag}/${seq}.json.gz", true},
		{"logs/${tag}/$${hostname}-${seq}.json.gz", true},
		{"logs/${tag}/${hostname}-${seq}.json.gz", false},
		{"logs/${tag}/${uuid}.json.gz", false},
	} {
		path, _ := writeConfig(t, inputsYAML, adminYAML, sinkYAML, fmt.Sprintf("    key: %q\n", c.key))
		r := forwarderCmd(t, "check", "-c", path)
		if r.code != exitOK || !strings.HasPrefix(r.stdout, path+": OK\n") {
			t.Errorf("%s: exit %d, stdout %q, stderr %q", c.key, r.code, r.stdout, r.stderr)
			continue
		}
		if got := strings.HasPrefix(r.stderr, path+": "+warn) && strings.HasSuffix(r.stderr, "put ${hostname} in the key (sink archive)\n"); got != c.warned {
			t.Errorf("%s: stderr %q, warned %v, want %v", c.key, r.stderr, got, c.warned)
		}
		if !c.warned && r.stderr != "" {
			t.Errorf("%s: stderr %q, want nothing", c.key, r.stderr)
		}
	}
}
