package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/logfwd/forwarder/config"
)

func TestCheckGoodConfig(t *testing.T) {
	t.Parallel()
	path, dataDir := writeConfig(t, inputsYAML, adminYAML, sinkYAML, `  - name: pods
    type: cloudwatch
    match: "pod.**"
    region: eu-west-1
    log_group: "/eks/${record.kubernetes.namespace_name}"
    log_stream: "${record.kubernetes.pod_name|unknown}-${hostname}"
`)
	r := forwarderCmd(t, "check", "-c", path)
	want := path + ": OK\n" +
		"2 sinks: archive (s3, 32MiB of memory), pods (cloudwatch, 16MiB of memory); inputs: forward on 127.0.0.1:0, http on 127.0.0.1:0; admin on 127.0.0.1:0; data_dir: " + dataDir + "; memory_limit: 128MiB\n" +
		"sink archive: region us-east-1, credentials from environment\n" +
		"sink pods: region eu-west-1, credentials from environment\n"
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
	cert, key := selfSignedFiles(t)
	files := fmt.Sprintf("{cert_file: %q, key_file: %q}", cert, key)
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
		{"with TLS", "inputs:\n  forward: {listen: \"0.0.0.0:24224\", shared_key: k, tls: " + files + "}\n  http: {listen: \"0.0.0.0:8080\", token: t, tls: " + files + "}\n", nil},
		{"loopback", inputsYAML, nil},
	} {
		path, _ := writeConfig(t, c.inputs, adminYAML, sinkYAML)
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
		path + `:4: unknown key "max_byte" in wal (did you mean "max_bytes"?)` + "\n" +
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
	// Without -c, and no file at the default path: how to give another.
	var stderr strings.Builder
	_, err := os.Open(filepath.Join(t.TempDir(), "none"))
	if _, ok := reportLoad("forwarder check", defaultConfigPath, &stderr, nil, fmt.Errorf("read config: %w", err)); ok || !strings.Contains(stderr.String(), "give another with -c FILE") {
		t.Errorf("no file at the default path: %q; want a hint to pass -c", stderr.String())
	}
}

// check finds every problem run would refuse to start for, before the WAL is opened,
// and run reports all of them too, each with its line: the same lines from both.
func TestCheckAndRunAgree(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, yaml string
		env        []string
		want       []string // the problem lines, after "FILE:" (the inputs and admin take lines 2 to 5)
	}{
		{"templates", `sinks:
  - name: strftime
    type: s3
    bucket: my-logs
    region: us-east-1
    key: "logs/%Q/${tag}/${seq}.json.gz"
  - name: stream
    type: cloudwatch
    region: us-east-1
    log_group: "/x/${ENVIRONMENT}"
    log_stream: "${seq}"
`, awsEnv, []string{
			`11: sink "strftime": key: "logs/%Q/${tag}/${seq}.json.gz": %Q at column 6: only %Y %m %d %H %M %S are supported`,
			`15: sink "stream": log_group: "/x/${ENVIRONMENT}": ${ENVIRONMENT} at column 4: unknown placeholder: for the environment variable ENVIRONMENT write ${env.ENVIRONMENT}; placeholders are tag, tag[N], record.FIELD, hostname, seq, uuid`,
			`16: sink "stream": log_stream: "${seq}": ${seq} at column 1: only S3 keys may use ${seq}`,
		}},
		{"no region", `sinks:
  - name: archive
    type: s3
    bucket: my-logs
  - name: pods
    type: cloudwatch
    log_group: "/x"
    log_stream: "s"
`, awsEnv, []string{
			`7: sink "archive": no AWS region: set region in the sink, or AWS_REGION in the service's environment, or region in the shared config's profile`,
			`10: sink "pods": no AWS region: set region in the sink, or AWS_REGION in the service's environment, or region in the shared config's profile`,
		}},
		// A region's name is checked for sinks bound for AWS: not with an
		// endpoint of their own, in the sink or in the environment
		// (AWS_ENDPOINT_URL_S3 here points every S3 sink elsewhere).
		{"regions", `sinks:
  - {name: typo, type: cloudwatch, log_group: g, log_stream: s, region: us-east1}
  - {name: zone, type: cloudwatch, log_group: g, log_stream: s, region: eu-west-3b}
  - {name: upper, type: cloudwatch, log_group: g, log_stream: s, region: US-EAST-1}
  - {name: gov, type: cloudwatch, log_group: g, log_stream: s, region: us-gov-west-1}
  - {name: eusc, type: cloudwatch, log_group: g, log_stream: s, region: eusc-de-east-1}
  - {name: iso, type: cloudwatch, log_group: g, log_stream: s, region: us-isob-east-1}
  - {name: fips, type: cloudwatch, log_group: g, log_stream: s, region: fips-us-east-1}
  - {name: global, type: cloudwatch, log_group: g, log_stream: s, region: aws-global}
  - {name: local, type: cloudwatch, log_group: g, log_stream: s, region: local, endpoint: "http://127.0.0.1:1"}
  - {name: garage, type: s3, bucket: my-logs, key: "garage/${hostname}/${seq}", region: garage}
`, append(slices.Clone(awsEnv), "AWS_ENDPOINT_URL_S3=http://127.0.0.1:1"), []string{
			`7: sink "typo": region: "us-east1" is not an AWS region's name (such as us-east-1 or eu-west-3); for a service other than AWS, set endpoint`,
			`8: sink "zone": region: "eu-west-3b" is an availability zone: its region is eu-west-3; for a service other than AWS, set endpoint`,
			`9: sink "upper": region: "US-EAST-1" is not an AWS region's name (such as us-east-1 or eu-west-3); for a service other than AWS, set endpoint`,
		}},
		// A problem with a key's value is told at the key's line.
		{"lines of keys", `sinks:
  - name: typo
    type: s3
    bucket: my-logs
    key: "t/${hostname}/${seq}"
    region: us-east1
    storage_class: GLACIERR
    tags:
      ok: "y"
      aws:team: x
`, awsEnv, []string{
			`11: sink "typo": region: "us-east1" is not an AWS region's name (such as us-east-1 or eu-west-3); for a service other than AWS, set endpoint`,
			`12: sink "typo": storage_class: "GLACIERR" is not one of Amazon S3's: ` + strings.Join(storageClasses(), ", ") + `; for a service other than AWS, set endpoint`,
			`15: sink "typo": tags: key "aws:team" begins with aws:, which AWS keeps for its own; for a service other than AWS, set endpoint`,
		}},
		{"region from the environment", `sinks:
  - name: archive
    type: s3
    bucket: my-logs
  - name: local
    type: s3
    bucket: my-logs
    key: "local/${seq}"
    endpoint: "http://127.0.0.1:1"
`, append(slices.Clone(awsEnv), "AWS_REGION=us-east-1a"), []string{
			`7: sink "archive": the region from the service's environment (AWS_REGION, AWS_DEFAULT_REGION) or the shared config's profile: "us-east-1a" is an availability zone: its region is us-east-1; for a service other than AWS, set endpoint`,
		}},
		// What Amazon S3 refuses at the first upload, pausing the sink; an
		// S3-compatible service may take other values.
		{"s3 settings", `sinks:
  - {name: typo, type: s3, bucket: my-logs, region: us-east-1, storage_class: GLACIERR}
  - {name: tagged, type: s3, bucket: my-logs, key: "t/${hostname}/${seq}", region: us-east-1, storage_class: GLACIER_IR, tags: {aws:team: x, ok: "y"}}
  - {name: minio, type: s3, bucket: my-logs, key: "m/${hostname}/${seq}", region: us-east-1, storage_class: GLACIERR, endpoint: "http://127.0.0.1:1"}
`, awsEnv, []string{
			`7: sink "typo": storage_class: "GLACIERR" is not one of Amazon S3's: ` + strings.Join(storageClasses(), ", ") + `; for a service other than AWS, set endpoint`,
			`8: sink "tagged": tags: key "aws:team" begins with aws:, which AWS keeps for its own; for a service other than AWS, set endpoint`,
		}},
		// What CloudWatch Logs refuses at CreateLogGroup, holding the
		// group's streams.
		{"cloudwatch settings", `sinks:
  - {name: cw, type: cloudwatch, region: us-east-1, log_group: "/k8s/${record.ns}", log_stream: "${hostname}", tags: {owner: "My App (prod)", "a,b": x, "Équipe 1": "a_b.c:d/e=f+g-h@i"}}
  - {name: local, type: cloudwatch, region: us-east-1, log_group: "/k8s/${record.ns}", log_stream: "${hostname}", endpoint: "http://127.0.0.1:1", tags: {owner: "My App (prod)"}}
`, awsEnv, []string{
			`7: sink "cw": tags: key "a,b": CloudWatch Logs takes only letters, spaces, digits and _ . : / = + - @ in tags; for a service other than AWS, set endpoint`,
			`7: sink "cw": tags: the value of "owner", "My App (prod)": CloudWatch Logs takes only letters, spaces, digits and _ . : / = + - @ in tags; for a service other than AWS, set endpoint`,
		}},
	} {
		path, _ := writeConfig(t, inputsYAML, adminYAML, c.yaml)
		var want strings.Builder
		for _, w := range c.want {
			want.WriteString(path + ":" + w + "\n")
		}
		want.WriteString(path + ": " + plural(len(c.want), "problem", "problems") + "\n")
		for _, cmd := range []string{"check", "run"} {
			r := forwarderCmdEnv(t, c.env, cmd, "-c", path)
			if r.code != exitFail || r.stderr != want.String() {
				t.Errorf("%s: %s: exit %d, stderr:\n%s\nwant exit 1 and:\n%s", c.name, cmd, r.code, r.stderr, want.String())
			}
		}
	}
}

// A data_dir that is a file, or under one, is told by check as run finds
// it, before the WAL is opened.
func TestCheckDataDirIsAFile(t *testing.T) {
	t.Parallel()
	path, dataDir := writeConfig(t, inputsYAML, adminYAML, sinkYAML)
	if err := os.WriteFile(dataDir, []byte("not a directory"), 0o600); err != nil {
		t.Fatal(err)
	}
	under := filepath.Join(filepath.Dir(path), "under.yaml")
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(under, bytes.Replace(text, []byte(dataDir), []byte(dataDir+"/wal"), 1), 0o600); err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{
		path:  path + ":1: data_dir: " + dataDir + " is a file, not a directory\n" + path + ": 1 problem\n",
		under: under + ":1: data_dir: " + dataDir + "/wal cannot be made: " + dataDir + " is a file, not a directory\n" + under + ": 1 problem\n",
	} {
		for _, cmd := range []string{"check", "run"} {
			if r := forwarderCmdEnv(t, awsEnv, cmd, "-c", file); r.code != exitFail || r.stderr != want {
				t.Errorf("%s -c %s: exit %d, stderr:\n%s\nwant exit 1 and:\n%s", cmd, file, r.code, r.stderr, want)
			}
		}
	}
}

// check loads the inputs' TLS files as the inputs will (a missing key, a
// client CA file that holds no certificate), and run refuses them before it
// opens the WAL; the same lines from both.
func TestCheckLoadsTLSFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	inputs := fmt.Sprintf(`inputs:
  forward:
    listen: "127.0.0.1:0"
    tls: {cert_file: %[1]q, key_file: %[1]q, client_ca_file: %[2]q}
  http:
    listen: "127.0.0.1:0"
    tls: {cert_file: %[3]q, key_file: %[3]q}
`, filepath.Join(dir, "missing.pem"), ca, filepath.Join(dir, "none.pem"))
	path, dataDir := writeConfig(t, inputs, adminYAML, sinkYAML)
	for _, cmd := range []string{"check", "run"} {
		r := forwarderCmdEnv(t, awsEnv, cmd, "-c", path)
		for _, want := range []string{
			path + ":5: inputs.forward.tls: load certificate " + filepath.Join(dir, "missing.pem"),
			path + ":8: inputs.http.tls: load certificate " + filepath.Join(dir, "none.pem"),
			path + ": 2 problems\n",
		} {
			if r.code != exitFail || !strings.Contains(r.stderr, want) {
				t.Errorf("%s: exit %d, stderr:\n%s\nwant exit 1 and %q", cmd, r.code, r.stderr, want)
			}
		}
	}
	if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
		t.Errorf("run made the data directory before refusing the TLS files: %v", err)
	}
	// A client CA file without a certificate, the certificate and key good.
	cert, key := selfSignedFiles(t)
	inputs = fmt.Sprintf("inputs:\n  forward:\n    listen: \"127.0.0.1:0\"\n    tls: {cert_file: %q, key_file: %q, client_ca_file: %q}\n", cert, key, ca)
	path, _ = writeConfig(t, inputs, adminYAML, sinkYAML)
	r := forwarderCmdEnv(t, awsEnv, "check", "-c", path)
	if want := path + ":5: inputs.forward.tls: no certificate in client CA file " + ca + "\n"; r.code != exitFail || !strings.Contains(r.stderr, want) {
		t.Errorf("check: exit %d, stderr:\n%s\nwant exit 1 and %q", r.code, r.stderr, want)
	}
}

// Without credentials anywhere, check and run say so (a warning: an instance role may
// exist where the service runs), naming where they were looked for.
func TestNoCredentialsWarns(t *testing.T) {
	t.Parallel()
	path, _ := writeConfig(t, inputsYAML, adminYAML, sinkYAML)
	env := append(noAWSEnv[:len(noAWSEnv):len(noAWSEnv)], "AWS_REGION=eu-west-1")
	r := forwarderCmdEnv(t, env, "check", "-c", path)
	want := path + `: warning: no AWS credentials found: not in the environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), no web identity token (IRSA`
	if r.code != exitOK || !strings.HasPrefix(r.stderr, want) || !strings.Contains(r.stderr, "until credentials are given (sink archive)\n") || !strings.Contains(r.stdout, "sink archive: region us-east-1, credentials from instance role") {
		t.Errorf("check without credentials: exit %d\nstdout %q\nstderr %q\nwant exit 0 and a warning starting %q", r.code, r.stdout, r.stderr, want)
	}
	r = forwarderCmd(t, "check", "-c", path)
	if r.code != exitOK || r.stderr != "" || !strings.Contains(r.stdout, "sink archive: region us-east-1, credentials from environment") {
		t.Errorf("check with credentials in the environment: exit %d\nstdout %q\nstderr %q", r.code, r.stdout, r.stderr)
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

// check warns about an S3 key whose extension names another compression than the
// objects': readers that pick the codec by it would fail.
func TestCheckWarnsAboutKeyExtension(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		key, compression string
		warned           bool
	}{
		{"logs/${hostname}-${seq}.json.gz", "gzip", false},
		{"logs/${hostname}-${seq}.json.gz", "zstd", true},
		{"logs/${hostname}-${seq}.json.gz", "none", true},
		{"logs/${hostname}-${seq}.json.zst", "gzip", true},
		{"logs/${hostname}-${seq}.json.zst", "zstd", false},
		{"logs/${hostname}-${seq}", "gzip", false},
		{"", "zstd", true}, // the default key, which ends .json.gz
	} {
		extra := fmt.Sprintf("    key: %q\n    compression: %s\n", c.key, c.compression)
		if c.key == "" {
			extra = fmt.Sprintf("    compression: %s\n", c.compression)
		}
		path, _ := writeConfig(t, inputsYAML, adminYAML, sinkYAML, extra)
		r := forwarderCmd(t, "check", "-c", path)
		if r.code != exitOK {
			t.Errorf("%s with %s: exit %d, stderr %q", c.key, c.compression, r.code, r.stderr)
			continue
		}
		if got := strings.Contains(r.stderr, "but the objects are compressed with "+c.compression); got != c.warned {
			t.Errorf("%s with %s: stderr %q, warned %v, want %v", c.key, c.compression, r.stderr, got, c.warned)
		}
	}
}

// A configuration that takes no records, or delivers none, passes with a warning that
// says so.
func TestCheckWarnsAboutNothingToDo(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		parts []string
		want  string
	}{
		{"no sinks", []string{inputsYAML, adminYAML}, "warning: no sinks: every record the inputs take is acknowledged and dropped"},
		{"no inputs", []string{"inputs:\n", adminYAML, sinkYAML}, "warning: no inputs: the service takes no records"},
		{"both", []string{inputsYAML, adminYAML, sinkYAML}, ""},
	} {
		path, _ := writeConfig(t, c.parts...)
		r := forwarderCmd(t, "check", "-c", path)
		if r.code != exitOK {
			t.Errorf("%s: exit %d, stderr %q", c.name, r.code, r.stderr)
			continue
		}
		if c.want == "" && r.stderr != "" || c.want != "" && !strings.HasPrefix(r.stderr, path+": "+c.want) {
			t.Errorf("%s: stderr %q, want %q", c.name, r.stderr, c.want)
		}
	}
}

// A shared key with white space at an end (a Secret made from a file) is
// warned about: clients whose key lacks it fail the handshake.
func TestCheckWarnsAboutSharedKeyWhiteSpace(t *testing.T) {
	t.Parallel()
	path, _ := writeConfig(t, "inputs:\n  forward: {listen: \"127.0.0.1:0\", shared_key: \"k\\n\"}\n", adminYAML, sinkYAML)
	r := forwarderCmd(t, "check", "-c", path)
	if r.code != exitOK || !strings.Contains(r.stderr, "warning: inputs.forward.shared_key begins or ends with white space") {
		t.Errorf("exit %d, stderr %q", r.code, r.stderr)
	}
}

// check warns about a stream template without ${hostname} (replicas would
// share streams) and about two sinks writing to one destination.
func TestCheckWarnsAboutSharedDestinations(t *testing.T) {
	t.Parallel()
	const noHost = "warning: sinks[pods]: neither log_group nor log_stream has ${hostname}"
	const twice = "warning: sinks[archive2] writes where sinks[archive] does"
	for _, c := range []struct {
		name, sinks string
		want        []string
	}{
		{"stream without hostname", "  - {name: pods, type: cloudwatch, region: us-east-1, log_group: g, log_stream: \"${tag}\"}\n", []string{noHost}},
		{"stream with hostname", "  - {name: pods, type: cloudwatch, region: us-east-1, log_group: g, log_stream: \"${tag}-${hostname}\"}\n", nil},
		{"group with hostname", "  - {name: pods, type: cloudwatch, region: us-east-1, log_group: \"g-${hostname}\", log_stream: \"${tag}\"}\n", nil},
		// A pod's name from the downward API (its host name) keeps replicas apart as
		// well; a variable that holds something else does not.
		{"stream from the environment", "  - {name: pods, type: cloudwatch, region: us-east-1, log_group: g, log_stream: \"${tag}-${env.POD_NAME}\"}\n", nil},
		{"stream from a shared variable", "  - {name: pods, type: cloudwatch, region: us-east-1, log_group: g, log_stream: \"${tag}-${env.CLUSTER}\"}\n", []string{noHost}},
		{"two sinks, one key", "  - {name: archive2, type: s3, region: r, bucket: test-bucket, endpoint: \"http://127.0.0.1:1\"}\n", []string{twice}},
		{"a key from the environment", "  - {name: archive2, type: s3, region: r, bucket: test-bucket, endpoint: \"http://127.0.0.1:1\", key: \"other/${env.POD_NAME}-${seq}.json.gz\"}\n", nil},
		{"two sinks, two keys", "  - {name: archive2, type: s3, region: r, bucket: test-bucket, endpoint: \"http://127.0.0.1:1\", key: \"other/${hostname}-${seq}.json.gz\"}\n", nil},
		// A name per minute or second of event time: a creation call each.
		{"stream per second", "  - {name: pods, type: cloudwatch, region: us-east-1, log_group: g, log_stream: \"${hostname}-%Y%m%d%H%M%S\"}\n",
			[]string{"warning: sinks[pods].log_stream has %M or %S: every minute (second) of event time names a new log stream"}},
		{"stream per hour", "  - {name: pods, type: cloudwatch, region: us-east-1, log_group: g, log_stream: \"${hostname}-%Y%m%d%H\"}\n", nil},
	} {
		path, _ := writeConfig(t, inputsYAML, adminYAML, sinkYAML, c.sinks)
		host, _ := os.Hostname()
		r := forwarderCmdEnv(t, append([]string{"POD_NAME=" + host, "CLUSTER=prod"}, awsEnv...), "check", "-c", path)
		if r.code != exitOK {
			t.Errorf("%s: exit %d, stderr %q", c.name, r.code, r.stderr)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("%s: stderr %q, want %q", c.name, r.stderr, w)
			}
		}
		if len(c.want) == 0 && r.stderr != "" {
			t.Errorf("%s: stderr %q, want nothing", c.name, r.stderr)
		}
	}
}

// A bucket name Amazon S3's rules refuse is a warning, not an error: a bucket made in
// us-east-1 before the rules may have one, and a compatible service (endpoint) its own.
func TestBucketNameWarning(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		bucket, endpoint string
		warned           bool
	}{
		{"My_Logs", "", true},
		{"my..logs", "", true},
		{"my-logs", "", false},
		{"$S3_BUCKET", "", false}, // the warning about $NAME says it all
		{"My_Logs", "http://127.0.0.1:9000", false},
	} {
		text := fmt.Sprintf("data_dir: /tmp/x\nsinks:\n  - name: archive\n    type: s3\n    bucket: %q\n    region: us-east-1\n", c.bucket)
		if c.endpoint != "" {
			text += fmt.Sprintf("    endpoint: %q\n", c.endpoint)
		}
		cfg, err := config.Parse([]byte(text), "f.yaml")
		if err != nil {
			t.Fatalf("%s: %v", c.bucket, err)
		}
		warned := false
		for _, w := range configWarnings(cfg) {
			if strings.HasPrefix(w.msg, fmt.Sprintf("sinks[archive].bucket %q ", c.bucket)) && strings.Contains(w.msg, "by Amazon S3's naming rules") {
				warned = true
			}
		}
		if warned != c.warned {
			t.Errorf("bucket %q, endpoint %q: warned %v, want %v", c.bucket, c.endpoint, warned, c.warned)
		}
	}
}

// A secret or bucket written $NAME, the shell's way, is taken as it is, with a warning
// that says how to write the variable (a secret may really be "$NAME": not an error).
func TestShellVariableWarning(t *testing.T) {
	t.Parallel()
	text := "data_dir: /tmp/x\ninputs:\n  forward: {listen: \"127.0.0.1:24224\", shared_key: \"$FORWARDER_SHARED_KEY\"}\n" +
		"  http: {listen: \"127.0.0.1:8080\", token: \"pa$TOKEN\"}\n"
	cfg, err := config.Parse([]byte(text), "f.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range configWarnings(cfg) {
		if strings.Contains(w.msg, "taken as it is: for the environment variable") {
			got = append(got, w.msg)
		}
	}
	want := []string{`inputs.forward.shared_key is "$FORWARDER_SHARED_KEY", taken as it is: for the environment variable write ${env.FORWARDER_SHARED_KEY}`}
	if !slices.Equal(got, want) {
		t.Errorf("warnings %q, want %q", got, want)
	}
}

func storageClasses() []string {
	var out []string
	for _, v := range types.StorageClass("").Values() {
		out = append(out, string(v))
	}
	return out
}

// A region of AWS's form that this build does not know is a warning (a new region
// works), naming the known one it is nearest to; known ones, and sinks with an endpoint
// of their own, are not warned about.
func TestCheckWarnsAboutUnknownRegion(t *testing.T) {
	t.Parallel()
	path, _ := writeConfig(t, inputsYAML, adminYAML, `sinks:
  - {name: typo, type: cloudwatch, log_group: g, log_stream: "s-${hostname}", region: us-esat-1}
  - {name: known, type: cloudwatch, log_group: g, log_stream: "s-${hostname}", region: ap-southeast-7}
  - {name: fips, type: cloudwatch, log_group: g, log_stream: "s-${hostname}", region: fips-us-gov-west-1}
  - {name: local, type: cloudwatch, log_group: g, log_stream: "s-${hostname}", region: xx-nowhere-9, endpoint: "http://127.0.0.1:1"}
`)
	r := forwarderCmdEnv(t, awsEnv, "check", "-c", path)
	want := `warning: region "us-esat-1" is not a region this build knows (did you mean "us-east-1"?): a misspelt one builds an endpoint that does not resolve, and the sink retries, unreachable, for ever (a region newer than this build works) (sink typo)`
	if r.code != exitOK || !strings.Contains(r.stderr, want) || strings.Count(r.stderr, "is not a region this build knows") != 1 {
		t.Errorf("check: exit %d\nstderr %q\nwant exit 0 and the one warning %q", r.code, r.stderr, want)
	}
}
