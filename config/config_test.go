package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// setGoodEnv sets the variables testdata/good/env.yaml refers to.
func setGoodEnv(t *testing.T) {
	t.Setenv("FWD_DATA_DIR", "/srv/data")
	t.Setenv("FWD_TOKEN", `a "quoted": token # not a comment`)
	t.Setenv("FWD_BODY", "2MiB")
	t.Setenv("FWD_BUCKET", "env-bucket")
	t.Setenv("FWD_PREFIX", "prefix")
	t.Setenv("FWD_EMPTY", "")
}

func TestGoodConfigs(t *testing.T) {
	setGoodEnv(t)
	files, err := filepath.Glob("testdata/good/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no good configs: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			if _, err := Load(file); err != nil {
				t.Fatalf("Load: %v", err)
			}
		})
	}
}

func TestExampleConfig(t *testing.T) {
	cfg, err := Load("../config.yaml")
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if cfg.DataDir != "./data" || cfg.WAL.MaxBytes != GiB || len(cfg.Sinks) != 2 {
		t.Errorf("data_dir %q, wal.max_bytes %s, %d sinks", cfg.DataDir, cfg.WAL.MaxBytes, len(cfg.Sinks))
	}
	for _, listen := range []string{cfg.Inputs.Forward.Listen, cfg.Inputs.HTTP.Listen, cfg.Admin.Listen} {
		if !strings.HasPrefix(listen, "127.0.0.1:") {
			t.Errorf("listen %q is not on loopback", listen)
		}
	}
}

// load parses a file's text for a test, failing the test on problems.
func load(t *testing.T, text string) *Config {
	t.Helper()
	cfg, err := Parse([]byte(text), "test.yaml")
	if err != nil {
		t.Fatalf("Parse:\n%v", err)
	}
	cfg.pos = nil // positions are checked through problems, not here
	return cfg
}

// The defaults as README.md's configuration table states them, written out rather than
// taken from Default.
var (
	designDefaults = Config{
		DataDir:         "/var/lib/forwarder",
		Log:             Log{Level: "info", Format: "text"},
		ShutdownTimeout: Duration(30 * time.Second),
		MemoryLimit:     128 << 20,
		WAL: WAL{
			MaxBytes:     10 << 30,
			WhenFull:     "block",
			Sync:         "always",
			DedupWindow:  Duration(10 * time.Minute),
			MinFreeBytes: 64 << 20,
		},
		Inputs: Inputs{
			Forward: &Forward{Listen: "127.0.0.1:24224", MaxMessageBytes: 16 << 20, MaxConnections: 1024, HandshakeTimeout: Duration(10 * time.Second),
				MaxRecordsPerMessage: 100000},
			HTTP: &HTTP{Listen: "127.0.0.1:8080", MaxBodyBytes: 16 << 20, TimeField: "time", MaxConnections: 1024, ReadHeaderTimeout: Duration(10 * time.Second),
				MaxRecordsPerRequest: 100000},
		},
		Admin: Admin{Listen: "127.0.0.1:9880"},
	}
	designS3 = S3{
		Bucket:             "my-logs", // no default: set by the test file
		Key:                "logs/${tag}/%Y/%m/%d/%H/${hostname}-${seq}.json.gz",
		Compression:        "gzip",
		CompressionLevel:   1,
		MaxObjectBytes:     64 << 20,
		MaxObjectAge:       Duration(5 * time.Minute),
		MaxOpenObjects:     10_000,
		MaxPartitions:      20_000,
		MultipartThreshold: 16 << 20,
		TimeKey:            "@timestamp",
		StagingMaxBytes:    10 * GiB / 8, // an eighth of wal.max_bytes
	}
	designCloudWatch = CloudWatch{
		LogGroup:             "/logs",       // no default: set by the test file
		LogStream:            "${hostname}", // no default: set by the test file
		Fallback:             "unknown",
		CreateGroup:          true,
		CreateStream:         true,
		RetentionDays:        30,
		LogGroupClass:        "STANDARD",
		FlushInterval:        Duration(5 * time.Second),
		MaxConcurrentStreams: 64,
		MaxPartitions:        20_000,
		Settle:               Duration(10 * time.Second),
		ReadRate:             10,
		CreateRate:           10,
		GroupCreateRate:      1,
	}
)

func TestDefaults(t *testing.T) {
	for _, text := range []string{"", "# only a comment\n", "---\n", "sinks: []\n"} {
		cfg := load(t, text)
		cfg.file = ""
		if cfg.Sinks != nil && len(cfg.Sinks) == 0 {
			cfg.Sinks = nil
		}
		if !reflect.DeepEqual(*cfg, designDefaults) {
			t.Errorf("%q:\ngot  %+v\nwant %+v", text, *cfg, designDefaults)
		}
	}
	def := Default()
	if !reflect.DeepEqual(*def, designDefaults) {
		t.Errorf("Default():\ngot  %+v\nwant %+v", *def, designDefaults)
	}
}

func TestSinkDefaults(t *testing.T) {
	cfg := load(t, `
sinks:
  - name: archive
    type: s3
    bucket: my-logs
  - name: cloudwatch
    type: cloudwatch
    log_group: /logs
    log_stream: "${hostname}"
`)
	archive, cloudwatch := cfg.Sinks[0], cfg.Sinks[1]
	if !reflect.DeepEqual(archive.Match, []string{"**"}) || archive.CloudWatch != nil || archive.Line != 3 {
		t.Errorf("archive: match %q, cloudwatch %v, line %d", archive.Match, archive.CloudWatch, archive.Line)
	}
	if !reflect.DeepEqual(*archive.S3, designS3) {
		t.Errorf("s3:\ngot  %+v\nwant %+v", *archive.S3, designS3)
	}
	if !reflect.DeepEqual(cloudwatch.Match, []string{"**"}) || cloudwatch.S3 != nil || cloudwatch.Line != 6 {
		t.Errorf("cloudwatch: match %q, s3 %v, line %d", cloudwatch.Match, cloudwatch.S3, cloudwatch.Line)
	}
	if !reflect.DeepEqual(*cloudwatch.CloudWatch, designCloudWatch) {
		t.Errorf("cloudwatch:\ngot  %+v\nwant %+v", *cloudwatch.CloudWatch, designCloudWatch)
	}
}

func TestFullConfig(t *testing.T) {
	cfg, err := Load("testdata/good/full.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		DataDir:         "/srv/forwarder",
		Log:             Log{Level: "debug", Format: "json"},
		ShutdownTimeout: Duration(time.Minute),
		MemoryLimit:     512 * MiB,
		WAL:             WAL{MaxBytes: 2 * GiB, WhenFull: "drop_oldest", Sync: "interval", DedupWindow: Duration(90 * time.Minute), MinFreeBytes: 256 * MiB},
		Inputs: Inputs{
			Forward: &Forward{
				Listen:               "0.0.0.0:24225",
				SharedKey:            "secret",
				Users:                []User{{"alice", "a-pass"}, {"bob", "b-pass"}},
				TLS:                  TLS{"/etc/forwarder/tls.crt", "/etc/forwarder/tls.key", "/etc/forwarder/ca.crt"},
				MaxMessageBytes:      8 * MiB,
				MaxConnections:       10,
				HandshakeTimeout:     Duration(5 * time.Second),
				MaxRecordsPerMessage: 5000,
			},
			HTTP: &HTTP{
				Listen:               "[::1]:8081",
				Token:                "t0ken",
				TLS:                  HTTPTLS{"/etc/forwarder/http.crt", "/etc/forwarder/http.key"},
				MaxBodyBytes:         1000000,
				TimeField:            "ts",
				MaxConnections:       100,
				ReadHeaderTimeout:    Duration(3 * time.Second),
				MaxRecordsPerRequest: 20000,
			},
		},
		Admin: Admin{Listen: "127.0.0.1:9881", Pprof: true},
		Sinks: []Sink{
			{
				Name: "archive", Type: "s3", Match: []string{"app.**"}, Line: 43,
				S3: &S3{
					Bucket:             "my-logs",
					Region:             "eu-west-1",
					Endpoint:           "http://127.0.0.1:4566",
					PathStyle:          true,
					Key:                "archive/${tag}/%Y/%m/%d/${hostname}-${uuid}.json.zst",
					Compression:        "zstd",
					CompressionLevel:   3,
					MaxObjectBytes:     128 * MiB,
					MaxObjectAge:       Duration(10 * time.Minute),
					MaxOpenObjects:     16,
					MaxPartitions:      5000,
					MultipartThreshold: 5 * MiB,
					StagingMaxBytes:    512 * MiB,
					TimeKey:            "ts",
					TagKey:             "tag",
					SSE:                "aws:kms",
					KMSKeyID:           "alias/logs",
					StorageClass:       "STANDARD_IA",
					ACL:                "bucket-owner-full-control",
					Tags:               map[string]string{"team": "platform", "env": "prod"},
				},
			},
			{
				Name: "cloudwatch", Type: "cloudwatch", Match: []string{"pod.**"}, Line: 66,
				CloudWatch: &CloudWatch{
					Region:               "eu-west-1",
					Endpoint:             "http://127.0.0.1:4567",
					LogGroup:             "/eks/${record.kubernetes.namespace_name}",
					LogStream:            "${record.kubernetes.pod_name|unknown}-${hostname}",
					Fallback:             "none",
					CreateGroup:          false, // explicit false kept over the default true
					CreateStream:         false,
					RetentionDays:        0, // explicit 0 kept over the default 30
					LogGroupClass:        "INFREQUENT_ACCESS",
					KMSKeyID:             "arn:aws:kms:eu-west-1:111122223333:key/abc",
					Tags:                 map[string]string{"team": "platform"},
					MessageKey:           "log",
					FlushInterval:        Duration(2 * time.Second),
					MaxConcurrentStreams: 8,
					MaxPartitions:        3000,
					Settle:               Duration(30 * time.Second),
					ReadRate:             5,
					CreateRate:           20,
					GroupCreateRate:      2,
				},
			},
		},
	}
	cfg.file, cfg.pos = "", nil
	if !reflect.DeepEqual(*cfg, want) {
		t.Errorf("got  %+v\nwant %+v", *cfg, want)
		for i := range min(len(cfg.Sinks), len(want.Sinks)) {
			t.Errorf("sink %d:\ngot  %+v %+v\nwant %+v %+v", i, cfg.Sinks[i].S3, cfg.Sinks[i].CloudWatch, want.Sinks[i].S3, want.Sinks[i].CloudWatch)
		}
	}
}

func TestEnvExpansion(t *testing.T) {
	setGoodEnv(t)
	cfg, err := Load("testdata/good/env.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s3 := cfg.Sinks[0].S3
	for _, c := range []struct{ name, got, want string }{
		{"data_dir", cfg.DataDir, "/srv/data"},
		{"token", cfg.Inputs.HTTP.Token, `a "quoted": token # not a comment`},
		{"max_body_bytes", cfg.Inputs.HTTP.MaxBodyBytes.String(), "2MiB"},
		{"bucket", s3.Bucket, "env-bucket"},
		{"key", s3.Key, "logs/prefix/${tag}/$${env.FWD_PREFIX}-${seq}.json.gz"},
		{"tags.owner", s3.Tags["owner"], ""},
	} {
		if c.got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, c.got, c.want)
		}
	}
}

func TestEscapedEnvSurvives(t *testing.T) {
	t.Setenv("X", "expanded")
	cfg := load(t, `
sinks:
  - name: cloudwatch
    type: cloudwatch
    log_group: "/a/${env.X}"
    log_stream: "$${env.X}/${env.X}/$$$${env.X}-${tag}-${record.a.b|x}"
`)
	cw := cfg.Sinks[0].CloudWatch
	if cw.LogGroup != "/a/expanded" {
		t.Errorf("log_group %q", cw.LogGroup)
	}
	if cw.LogStream != "$${env.X}/expanded/$$$${env.X}-${tag}-${record.a.b|x}" {
		t.Errorf("log_stream %q", cw.LogStream)
	}
}

func TestEnvExpandsOnce(t *testing.T) {
	t.Setenv("OUTER", "${env.INNER}")
	t.Setenv("INNER", "no")
	cfg := load(t, "data_dir: ${env.OUTER}\n")
	if cfg.DataDir != "${env.INNER}" {
		t.Errorf("data_dir %q, want the value as it was", cfg.DataDir)
	}
}

func TestExpandEnvString(t *testing.T) {
	env := map[string]string{"A": "1", "EMPTY": "", "ODD": "a$b%Y${tag}"}
	lookup := func(name string) (string, bool) { v, ok := env[name]; return v, ok }
	for _, c := range []struct {
		in, want string
		problems []string
		template bool // the value of key, log_group or log_stream
	}{
		{"plain", "plain", nil, false},
		{"${env.A}", "1", nil, false},
		{"x${env.A}y${env.A}z", "x1y1z", nil, false},
		{"[${env.EMPTY}]", "[]", nil, false},
		{"$${env.A}", "$${env.A}", nil, false},
		{"$$$${env.A}", "$$$${env.A}", nil, false},
		{"$$${env.A}", "$$1", nil, false},
		{"${tag}/${record.a|b}/${hostname}/${seq}/$5", "${tag}/${record.a|b}/${hostname}/${seq}/$5", nil, true},
		{"${tag}/${env.A}", "${tag}/1", nil, true},
		{"${ENV.A}", "${ENV.A}", nil, true}, // the template says what it makes of it
		{"a/${tag}", "a/${tag}", []string{"${tag}: not a reference this file knows; for an environment variable write ${env.NAME} (only key, log_group and log_stream are templates; a value that holds ${ as it is can come from a variable, whose value is not expanded again)"}, false},
		{"${ENV.SHARED_KEY}", "${ENV.SHARED_KEY}", []string{"${ENV.SHARED_KEY}: not a reference this file knows; for an environment variable write ${env.NAME} (only key, log_group and log_stream are templates; a value that holds ${ as it is can come from a variable, whose value is not expanded again)"}, false},
		{"${env:TOKEN}x", "${env:TOKEN}x", []string{"${env:TOKEN}: not a reference this file knows; for an environment variable write ${env.NAME} (only key, log_group and log_stream are templates; a value that holds ${ as it is can come from a variable, whose value is not expanded again)"}, false},
		{"$TOKEN", "$TOKEN", nil, false},     // a warning of run and check (ShellRef)
		{"pa$TOKEN", "pa$TOKEN", nil, false}, // a $ inside a secret is the secret's
		{"$5", "$5", nil, false},
		{"${env.B}", "", []string{"environment variable B is not set"}, false},
		{"${env.A-B}", "", []string{"${env.A-B}: not a valid environment variable name"}, false},
		{"${env.}", "", []string{"${env.}: not a valid environment variable name"}, false},
		{"x${env.A", "x${env.A", []string{"${env. without a closing }"}, false},
		{"${SHARED_KEY}", "${SHARED_KEY}", []string{"${SHARED_KEY}: for the environment variable write ${env.SHARED_KEY}"}, false},
		{"k-${A}", "k-${A}", []string{"${A}: for the environment variable write ${env.A}"}, false},
		{"$${SHARED_KEY}", "$${SHARED_KEY}", nil, false},
		{"${_}${lower_case}${9}", "${_}${lower_case}${9}", nil, true},
		{`#{ENV['KEY']}`, `#{ENV['KEY']}`, []string{`#{ENV['KEY']}: Fluentd's syntax; for an environment variable write ${env.NAME}`}, false},
		// In a template too: taken as text, it would be every key's prefix.
		{`#{ENV['PREFIX']}/${tag}`, `#{ENV['PREFIX']}/${tag}`, []string{`#{ENV['PREFIX']}/${tag}: Fluentd's syntax; for an environment variable write ${env.NAME}`}, true},
		// A value in a template is text: its $ and % are no placeholders.
		{"${env.ODD}/${tag}", "a$$b%%Y$${tag}/${tag}", nil, true},
		{"${env.ODD}", "a$b%Y${tag}", nil, false},
	} {
		got, problems := expandEnvString(c.in, lookup, !c.template)
		if got != c.want || !reflect.DeepEqual(problems, c.problems) {
			t.Errorf("%q: got %q %q, want %q %q", c.in, got, problems, c.want, c.problems)
		}
	}
}

// A secret from a variable set but empty would turn authentication off:
// a problem, at its line. Elsewhere an empty value is the user's.
func TestEmptySecretFromEnv(t *testing.T) {
	t.Setenv("EMPTY", "")
	text := "inputs:\n  forward:\n    listen: 127.0.0.1:0\n    shared_key: ${env.EMPTY}\n  http:\n    listen: 127.0.0.1:0\n    token: \"${env.EMPTY}\"\n" +
		"sinks:\n  - name: a\n    type: s3\n    bucket: bucket${env.EMPTY}\n    region: us-east-1\n"
	_, err := Parse([]byte(text), "f.yaml")
	want := "f.yaml:4: inputs.forward.shared_key: ${env.EMPTY} gives an empty value (the environment variable is set but empty): set it, or remove shared_key to go without\n" +
		"f.yaml:7: inputs.http.token: ${env.EMPTY} gives an empty value (the environment variable is set but empty): set it, or remove token to go without"
	if err == nil || err.Error() != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
	// On one line, another key's empty variable is not the secret's.
	if _, err := Parse([]byte("inputs:\n  forward: {listen: \"127.0.0.1:0\", tls: {client_ca_file: \"${env.EMPTY}\"}, shared_key: \"\"}\n"), "f.yaml"); err != nil {
		t.Errorf("an empty shared_key written as such, beside another key's empty variable: %v", err)
	}
	// ${NAME} in a template is the template's to report, with its placeholders.
	_, err = Parse([]byte("sinks:\n  - name: a\n    type: s3\n    bucket: bucket\n    region: us-east-1\n    key: \"x/${ENVIRONMENT}/${seq}\"\n"), "f.yaml")
	if err == nil || !strings.Contains(err.Error(), "placeholders are tag") || strings.Contains(err.Error(), "\n") {
		t.Errorf("template with ${ENVIRONMENT}: %v", err)
	}
}

func TestMatchAsList(t *testing.T) {
	cfg, err := Load("testdata/good/match_list.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"pod.**", "node.*.kubelet", "app.web-*"}
	if got := cfg.Sinks[0].Match; !reflect.DeepEqual(got, want) {
		t.Errorf("match %q, want %q", got, want)
	}
}

func TestInputsSection(t *testing.T) {
	for _, c := range []struct {
		name, text    string
		forward, http bool
	}{
		{"absent", "data_dir: ./data\n", true, true},
		{"empty", "inputs: {}\n", false, false},
		{"null", "inputs:\n", false, false},
		{"forward only", "inputs:\n  forward: {}\n", true, false},
		{"http as null", "inputs:\n  http:\n", false, true},
		{"both", "inputs:\n  forward: {}\n  http: {max_body_bytes: 1MiB}\n", true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := load(t, c.text).Inputs
			if (in.Forward != nil) != c.forward || (in.HTTP != nil) != c.http {
				t.Fatalf("forward %v, http %v; want %v, %v", in.Forward != nil, in.HTTP != nil, c.forward, c.http)
			}
			if in.Forward != nil && !reflect.DeepEqual(in.Forward, designDefaults.Inputs.Forward) {
				t.Errorf("forward %+v, want the defaults", in.Forward)
			}
			if in.HTTP != nil && in.HTTP.Listen != "127.0.0.1:8080" {
				t.Errorf("http %+v, want the defaults", in.HTTP)
			}
		})
	}
}

func TestNullAndEmptyValues(t *testing.T) {
	cfg := load(t, `
sinks:
  - name: archive
    type: s3
    bucket: my-logs
    time_key:
    tag_key: ""
    compression_level: ~
    tags:
  - name: copy
    type: s3
    bucket: my-logs
    time_key: ""
`)
	if got := cfg.Sinks[0].S3; got.TimeKey != "@timestamp" || got.CompressionLevel != 1 || got.Tags != nil {
		t.Errorf("null values: time_key %q, compression_level %d, tags %v; want the defaults", got.TimeKey, got.CompressionLevel, got.Tags)
	}
	if got := cfg.Sinks[1].S3.TimeKey; got != "" {
		t.Errorf(`time_key: "" gave %q`, got)
	}
}

func TestAliases(t *testing.T) {
	cfg := load(t, `
sinks:
  - name: a
    type: cloudwatch
    match: &pods ["pod.**", "node.**"]
    log_group: &group /logs
    log_stream: s
  - name: b
    type: cloudwatch
    match: *pods
    log_group: *group
    log_stream: s
`)
	if b := cfg.Sinks[1]; len(b.Match) != 2 || b.CloudWatch.LogGroup != "/logs" {
		t.Errorf("sink b: match %q, log_group %q", b.Match, b.CloudWatch.LogGroup)
	}
}

// badConfigs pairs each file of testdata/bad with exactly the problems it must give, in order.
var badConfigs = []struct {
	file     string
	problems []string // "line: message"
}{
	{"unknown_key.yaml", []string{`2: unknown key "shutdown_timout" (did you mean "shutdown_timeout"?)`}},
	{"unknown_nested_key.yaml", []string{`7: unknown key "ca_file" in inputs.forward.tls`}},
	{"unknown_sink_key.yaml", []string{
		`2: sink "archive": bucket is required`,
		`4: unknown key "buket" in sink "archive" (type s3) (did you mean "bucket"?)`,
	}},
	{"s3_key_on_cloudwatch.yaml", []string{
		`6: unknown key "bucket" in sink "cloudwatch" (type cloudwatch): bucket is a key of s3 sinks`,
	}},
	{"http_client_ca.yaml", []string{`6: unknown key "client_ca_file" in inputs.http.tls`}},
	{"repeated_key.yaml", []string{`3: wal.sync is repeated (first at line 2)`}},
	{"bad_size.yaml", []string{
		`2: wal.max_bytes: "12XB" is not a size (write bytes or a number with a unit: 100B, 512KiB, 64MiB, 10GiB, 1GB)`,
	}},
	{"negative_size.yaml", []string{`3: inputs.http.max_body_bytes: "-1" is negative`}},
	{"bad_duration.yaml", []string{
		`1: shutdown_timeout: "30" is not a duration (write a number with a unit: 500ms, 30s, 5m, 1h30m)`,
		`3: wal.dedup_window: "ten minutes" is not a duration (write a number with a unit: 500ms, 30s, 5m, 1h30m)`,
	}},
	{"bad_int.yaml", []string{`3: inputs.forward.max_connections: "many" is not an integer`}},
	{"bad_bool.yaml", []string{`5: sink "archive": path_style: "yes" is not true or false`}},
	{"bad_kind.yaml", []string{
		`1: log: expected a mapping, got "debug"`,
		`4: inputs.forward.users: expected a list, got "alice"`,
	}},
	{"top_not_mapping.yaml", []string{`1: expected a mapping at the top level, got a list`}},
	{"bad_enum.yaml", []string{
		`2: log.level: "verbose" is not one of debug, info, warn, error`,
		`4: wal.when_full: "drop" is not one of block, drop_oldest`,
		`5: wal.sync: "never" is not one of always, interval`,
	}},
	{"empty_values.yaml", []string{
		`1: data_dir is required`,
		`2: shutdown_timeout: must be greater than 0, not 0s`,
	}},
	{"inputs.yaml", []string{
		`3: inputs.forward.listen: "localhost" is not host:port`,
		`4: inputs.forward.users: need shared_key: users are checked in the handshake it enables`,
		`5: inputs.forward.users[0].password is required`,
		`7: inputs.forward.tls: cert_file needs key_file`,
		`9: inputs.http.listen: port "70000" is not a number from 0 to 65535`,
	}},
	{"forward_limits.yaml", []string{
		`3: inputs.forward.max_connections: must be at least 1, not 0`,
		`4: inputs.forward.handshake_timeout: must be greater than 0, not 0s`,
		`5: inputs.forward.max_records_per_message: must be at least 1, not 0`,
	}},
	{"self_hostname.yaml", []string{`3: inputs.forward.self_hostname: needs shared_key: it is the name the handshake it enables gives`}},
	{"self_hostname_control.yaml", []string{`4: inputs.forward.self_hostname: at most 255 bytes of valid UTF-8 without control characters`}},
	{"http_limits.yaml", []string{
		`3: inputs.http.max_connections: must be at least 1, not 0`,
		`4: inputs.http.read_header_timeout: must be greater than 0, not 0s`,
		`5: inputs.http.max_records_per_request: must be at least 1, not -1`,
	}},
	{"same_port.yaml", []string{`6: admin.listen: 0.0.0.0:24224 is also inputs.forward.listen`}},
	{"duplicate_sink_names.yaml", []string{`5: duplicate sink name "archive" (first at line 2)`}},
	{"sink_type.yaml", []string{
		`3: sink "kafka": type: "kafka" is not one of s3, cloudwatch`,
		`4: unknown key "brokers" in sink "kafka"`,
		`5: sink "my archive": name: "my archive" may hold only letters, digits, _ and -`,
		`5: sink "my archive": type is required (s3 or cloudwatch)`,
	}},
	{"max_partitions.yaml", []string{
		`6: sink "cloudwatch": max_partitions: must be 1 to 1000000, not 0`,
		`11: sink "archive": max_partitions: must be 1 to 1000000, not 2000000`,
	}},
	{"cloudwatch_create_rate.yaml", []string{
		`6: sink "cloudwatch": create_rate: must be 1 to 1000, not 0`,
		`7: sink "cloudwatch": group_create_rate: must be 1 to 1000, not 5000`,
	}},
	{"missing_bucket.yaml", []string{`2: sink "archive": bucket is required`}},
	{"templates.yaml", []string{
		`5: sink "strftime": key: "logs/%Q/${tag}/${seq}.json.gz": %Q at column 6: only %Y %m %d %H %M %S are supported`,
		`9: sink "unclosed": key: "logs/${tag/${seq}.json.gz": unclosed ${ at column 6`,
		`13: sink "environment": key: "${ENVIRONMENT}/logs/${tag}/${seq}.json.gz": ${ENVIRONMENT} at column 1: unknown placeholder: for the environment variable ENVIRONMENT write ${env.ENVIRONMENT}; placeholders are tag, tag[N], record.FIELD, hostname, seq, uuid`,
		`17: sink "seq-in-stream": log_stream: "${seq}": ${seq} at column 1: only S3 keys may use ${seq}`,
		`20: sink "group": log_group: "/x/${record.a.}": ${record.a.} at column 4: empty field name in "a."`,
	}},
	{"key_without_seq.yaml", []string{
		`5: sink "archive": key: "logs/${tag}/%Y/%m/%d/${hostname}.json.gz" must contain ${seq} or ${uuid}`,
	}},
	{"s3_limits.yaml", []string{
		`4: sink "archive": bucket: "ab" must be 3 to 63 characters long`,
		`6: sink "archive": compression_level: must be 1 to 9, not 12`,
		`7: sink "archive": multipart_threshold: must be at least 5MiB, not 1MiB`,
		`8: sink "archive": max_open_objects: must be at least 1, not 0`,
		`9: sink "archive": kms_key_id: needs sse: aws:kms`,
		`13: sink "huge": multipart_threshold: must be at most 5GiB (the largest object one PutObject takes), not 6GiB`,
	}},
	{"sink_text.yaml", []string{
		`5: sink "slash": key: "/logs/${tag}/${seq}.json.gz": must not begin with /: S3 would keep an empty first segment`,
		`6: sink "slash": endpoint: "127.0.0.1:4566" is not an http:// or https:// URL with a host (such as https://logs.eu-west-1.amazonaws.com or http://127.0.0.1:4566)`,
		`7: sink "slash": acl: "publc-read" is not one of "", private, public-read, public-read-write, authenticated-read, aws-exec-read, bucket-owner-read, bucket-owner-full-control`,
		`11: sink "dots": key: "logs/../${tag}/${seq}.json.gz": has a ".." segment, which tools reading the bucket as paths resolve away`,
		`15: sink "empty": key: "logs//${tag}/${seq}.json.gz": has an empty segment (//)`,
		`18: sink "cw": endpoint: "localhost:4566" is not an http:// or https:// URL with a host (such as https://logs.eu-west-1.amazonaws.com or http://127.0.0.1:4566)`,
		`23: sink "cwnames": log_group: "my group:${record.ns}": has ' ', ':', which log group names cannot hold (letters, digits and . - _ / #)`,
		`24: sink "cwnames": log_stream: "${record.pod}*${tag}": has '*', which log stream names cannot hold (no : or *)`,
		`27: sink "cwaws": log_group: "aws/${tag}": begins with aws/, which AWS keeps for its own log groups`,
		`31: sink "cwlong": log_group: "/` + strings.Repeat("g", 520) + `/${tag}": renders at least 539 bytes (its text, its value at the 16 bytes a long one is shortened to), over the 512 a name may hold: names would be cut there, and what the template renders after the cut (${hostname}) lost`,
		`35: sink "newline": bucket: "my-bucket\n" must not contain white space or control characters`,
		`39: sink "s3long": key: "logs/${tag}/${seq}/` + strings.Repeat("a", 1000) + `": renders at least 1044 bytes (its text, ${seq} as 20 digits, its value at the 16 bytes a long one is shortened to); S3 keys are at most 1024`,
		`44: sink "cwfallback": fallback: "no pod:here" stands in a log group name for a missing value, and has ' ', ':', which log group names cannot hold (letters, digits and . - _ / #)`,
		`48: sink "braces": key: "logs/{{ kubernetes.pod_name }}/${seq}": {{ kubernetes.pod_name }} at column 6: placeholders are written ${...}: for a field of the record, ${record.kubernetes.pod_name}`,
		`57: sink "cwroom": log_stream: "` + strings.Repeat("d", 495) + `-%Y-%m-%d-${tag}": renders at least 523 bytes (its text, the date and time, its value at the 16 bytes a long one is shortened to), over the 512 a name may hold: names would be cut there, and what the template renders after the cut (${hostname}) lost`,
	}},
	{"cloudwatch_limits.yaml", []string{
		`2: sink "cloudwatch": log_group is required`,
		`4: sink "cloudwatch": match: tag glob "pod..x" has an empty part`,
		`4: sink "cloudwatch": match: a tag glob must not be empty`,
		`4: sink "cloudwatch": match: tag glob "{kube,pod}.**": braces, commas and spaces are not glob syntax here (Fluentd's {a,b} or "a b"); give each glob as an item of a match list`,
		`4: sink "cloudwatch": match: tag glob "kube.* pod.*": braces, commas and spaces are not glob syntax here (Fluentd's {a,b} or "a b"); give each glob as an item of a match list`,
		`6: sink "cloudwatch": retention_days: 10 is not 0 (don't set) or one of 1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653`,
		`7: sink "cloudwatch": log_group_class: "COLD" is not one of STANDARD, INFREQUENT_ACCESS`,
		`8: sink "cloudwatch": flush_interval: must be greater than 0, not 0s`,
		`9: sink "cloudwatch": max_concurrent_streams: must be 1 to 10000, not 0`,
		`10: sink "cloudwatch": settle: must be at most 1h, not 2h (every start with calls in doubt waits that long)`,
		`11: sink "cloudwatch": read_rate: must be 1 to 1000, not 0`,
	}},
	// The unset variable is reported once: not again as a missing bucket.
	{"unset_env.yaml", []string{`5: environment variable FORWARDER_TEST_UNSET_VARIABLE is not set`}},
	// Nor a TLS key or certificate named by one as missing.
	{"unset_env_tls.yaml", []string{
		`5: environment variable FORWARDER_TEST_UNSET_VARIABLE is not set`,
		`11: environment variable FORWARDER_TEST_UNSET_VARIABLE is not set`,
	}},
	{"two_problems.yaml", []string{
		`3: wal.max_bytes: must be at least 1MiB, not 512KiB`,
		`8: sink "archive": compression: "lz4" is not one of gzip, zstd, none`,
	}},
	{"memory_limit.yaml", []string{`2: memory_limit: must be at least 32MiB, not 16MiB`}},
	{"min_free_bytes.yaml", []string{`4: wal.min_free_bytes: must be at least 1MiB, not 64KiB`, `5: wal.dedup_window: must be greater than 0, not 0s`}},
	// The ARN is named as one, whatever its length; a URL as one.
	{"bucket_names.yaml", []string{
		`5: sink "arn": bucket: "arn:aws:s3:::my-logs-with-a-name-long-enough-to-pass-sixty-three-characters" is an ARN: give the bucket's name (what follows arn:aws:s3:::)`,
		`8: sink "url": bucket: "s3://forwarder-dev" is a URL: give the bucket's name, without s3:// (prefixes go in key)`,
	}},
	{"drop_cursors.yaml", []string{
		`5: wal.drop_cursors[1]: is empty: name the cursor of a removed sink (forwarder wal stats lists the cursors)`,
		`6: wal.drop_cursors[2]: "archive" is a configured sink: dropping its cursor at every start would deliver again what it has delivered; list only sinks removed from sinks`,
	}},
	{"bad_syntax.yaml", []string{`4: invalid yaml: did not find expected key`}},
	{"bad_syntax_first_line.yaml", []string{`1: invalid yaml: mapping values are not allowed in this context`}},
	{"bad_syntax_tab.yaml", []string{`3: invalid yaml: found a tab character that violates indentation`}},
	{"bad_syntax_tab_indent.yaml", []string{`2: invalid yaml: found character that cannot start any token (the line holds a tab: YAML indents with spaces only)`}},
	{"bad_syntax_flow.yaml", []string{`6: invalid yaml: did not find expected ',' or ']'`}},
	{"two_documents.yaml", []string{`2: invalid yaml: more than one document; the file must hold one`}},
	{"two_documents_after_empty.yaml", []string{`5: invalid yaml: more than one document; the file must hold one`}},
	{"merge_key.yaml", []string{
		`7: merge keys (<<) are not supported in sink "b": write the keys out, or alias the whole mapping (*name)`,
		`7: sink "b": type is required (s3 or cloudwatch)`,
	}},
}

func TestBadConfigs(t *testing.T) {
	t.Setenv("FORWARDER_TEST_UNSET_VARIABLE", "") // restored after the test
	os.Unsetenv("FORWARDER_TEST_UNSET_VARIABLE")
	for _, c := range badConfigs {
		t.Run(c.file, func(t *testing.T) {
			path := filepath.Join("testdata", "bad", c.file)
			cfg, err := Load(path)
			if err == nil {
				t.Fatalf("Load succeeded: %+v", cfg)
			}
			var problems Problems
			if !errors.As(err, &problems) {
				t.Fatalf("error is %T, not Problems: %v", err, err)
			}
			var got []string
			for _, p := range problems {
				if p.File != path {
					t.Errorf("problem in file %q, want %q", p.File, path)
				}
				got = append(got, fmt.Sprintf("%d: %s", p.Line, p.Msg))
			}
			if !reflect.DeepEqual(got, c.problems) {
				t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(c.problems, "\n"))
			}
		})
	}
}

// TestBadConfigsAreAllListed keeps a file of testdata/bad from going untested for want of a row.
func TestBadConfigsAreAllListed(t *testing.T) {
	listed := map[string]bool{}
	for _, c := range badConfigs {
		listed[c.file] = true
	}
	files, _ := filepath.Glob("testdata/bad/*.yaml")
	for _, file := range files {
		if !listed[filepath.Base(file)] {
			t.Errorf("%s has no row in badConfigs", file)
		}
	}
}

func TestProblemsError(t *testing.T) {
	ps := Problems{
		{File: "config.yaml", Line: 3, Column: 5, Msg: `unknown key "x"`},
		{File: "config.yaml", Line: 9, Msg: "data_dir is required"},
		{Msg: "no place"},
	}
	want := "config.yaml:3: unknown key \"x\"\nconfig.yaml:9: data_dir is required\nno place"
	if got := ps.Error(); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestValidateInCode(t *testing.T) {
	cfg := Default()
	cfg.WAL.Sync = "sometimes"
	cfg.Sinks = []Sink{{Name: "archive", Type: SinkS3, Match: []string{"**"}, S3: defaultS3()}}
	err := cfg.Validate()
	var problems Problems
	if !errors.As(err, &problems) || len(problems) != 2 {
		t.Fatalf("Validate: %v", err)
	}
	if got := problems[0].Error(); got != `wal.sync: "sometimes" is not one of always, interval` {
		t.Errorf("first problem %q", got)
	}
	if got := problems[1].Error(); got != `sink "archive": bucket is required` {
		t.Errorf("second problem %q", got)
	}
	cfg.WAL.Sync = SyncAlways
	cfg.Sinks[0].S3.Bucket = "my-logs"
	if err := cfg.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
}

func TestEnvInKeysNotComments(t *testing.T) {
	t.Setenv("FWD_KEY", "data_dir")
	cfg := load(t, "# ${env.FWD_NOT_SET_IN_A_COMMENT}\n${env.FWD_KEY}: ./x\n")
	if cfg.DataDir != "./x" {
		t.Errorf("data_dir %q, want ./x", cfg.DataDir)
	}
}

func TestSinkBuffers(t *testing.T) {
	cfg := load(t, `
memory_limit: 256MiB
sinks:
  - {name: archive, type: s3, bucket: my-logs}
  - {name: cw1, type: cloudwatch, log_group: g, log_stream: s}
  - {name: cw2, type: cloudwatch, log_group: g, log_stream: s}
`)
	got := cfg.SinkBuffers()
	// 3/8 of 256 MiB is 96 MiB: 48 for the S3 sink, 24 for each CloudWatch sink.
	want := map[string]int{"archive": 48 << 20, "cw1": 24 << 20, "cw2": 24 << 20}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("SinkBuffers() = %v, want %v", got, want)
	}
	// A CloudWatch sink alone: at most an eighth of the limit, 32 MiB, not all 96.
	alone := *cfg
	alone.Sinks = cfg.Sinks[1:2]
	if got, want := alone.SinkBuffers(), map[string]int{"cw1": 32 << 20}; !reflect.DeepEqual(got, want) {
		t.Errorf("a CloudWatch sink alone: SinkBuffers() = %v, want %v", got, want)
	}
	// An S3 sink alone takes all 96.
	alone.Sinks = cfg.Sinks[:1]
	if got, want := alone.SinkBuffers(), map[string]int{"archive": 96 << 20}; !reflect.DeepEqual(got, want) {
		t.Errorf("an S3 sink alone: SinkBuffers() = %v, want %v", got, want)
	}
	got = cfg.SinkBuffers()
	want = map[string]int{"archive": 48 << 20, "cw1": 24 << 20, "cw2": 24 << 20}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("SinkBuffers() = %v, want %v", got, want)
	}
	// At 32 MiB: 12 MiB in all, 6 for S3, and the CloudWatch sinks' 3 raised to the floor.
	cfg.MemoryLimit = 32 * MiB
	want = map[string]int{"archive": 6 << 20, "cw1": 4 << 20, "cw2": 4 << 20}
	if got := cfg.SinkBuffers(); !reflect.DeepEqual(got, want) {
		t.Errorf("at 32 MiB: SinkBuffers() = %v, want %v", got, want)
	}
}

// The inputs' budget is three eighths of memory_limit, whatever the sinks.
func TestInputMemory(t *testing.T) {
	for _, c := range []struct {
		limit Size
		want  int64
	}{{128 * MiB, 48 << 20}, {32 * MiB, 12 << 20}, {1 * GiB, 384 << 20}} {
		cfg := load(t, fmt.Sprintf("memory_limit: %s\nsinks:\n  - {name: archive, type: s3, bucket: my-logs}\n", c.limit))
		if got := cfg.InputMemory(); got != c.want {
			t.Errorf("memory_limit %s: InputMemory() = %d, want %d", c.limit, got, c.want)
		}
	}
}

// A token with white space at an end cannot match any request (HTTP trims
// header values): refused, not left to answer 401 to everyone.
func TestTokenWhiteSpace(t *testing.T) {
	t.Setenv("TOKEN", "secret\n")
	_, err := Parse([]byte("inputs:\n  http:\n    listen: 127.0.0.1:0\n    token: ${env.TOKEN}\n"), "f.yaml")
	if err == nil || !strings.Contains(err.Error(), "f.yaml:4: inputs.http.token: begins or ends with white space") {
		t.Errorf("got %v", err)
	}
}

func TestSameListener(t *testing.T) {
	for _, c := range []struct {
		a, b string
		same bool
	}{
		{"127.0.0.1:9880", "127.0.0.1:9880", true},
		{"localhost:9880", "127.0.0.1:9880", true}, // the listener binds what localhost resolves to
		{"0.0.0.0:9880", "127.0.0.1:9880", true},
		{":9880", "10.0.0.5:9880", true},
		{"[::1]:9880", "[0:0:0:0:0:0:0:1]:9880", true},
		{"127.0.0.1:9880", "127.0.0.1:9881", false},
		{"10.0.0.5:9880", "10.0.0.6:9880", false},
		{"127.0.0.1:0", "127.0.0.1:0", false}, // each picks a free port
	} {
		if got := sameListener(c.a, c.b); got != c.same {
			t.Errorf("sameListener(%q, %q) = %v, want %v", c.a, c.b, got, c.same)
		}
	}
}

func TestBucketNameProblem(t *testing.T) {
	for name, want := range map[string]string{
		"my.logs-2026":        "",
		"myap-abc123-s3alias": "", // an access point alias takes uploads
		"My_Logs":             "has 'M': only lowercase letters, digits, dots and hyphens are allowed",
		"my..logs":            "must not have two dots in a row",
		"192.168.1.10":        "must not be an IP address",
		"-logs":               "must begin and end with a letter or a digit",
		"xn--logs":            "must not begin with xn-- or sthree-",
		"fn-abc123--ol-s3":    "must not end with --ol-s3 (an Object Lambda access point's alias, which takes no uploads)",
	} {
		if got := BucketNameProblem(name); got != want {
			t.Errorf("%q: %q, want %q", name, got, want)
		}
	}
}

func TestUnknownRegion(t *testing.T) {
	for region, want := range map[string]string{
		"us-east-1":          "",
		"fips-us-east-1":     "",
		"us-gov-west-1-fips": "",
		"aws-global":         "",
		"eu-wset-1":          `"eu-wset-1" is not a region this build knows (did you mean "eu-west-1"?)`,
		"zz-far-away-9":      `"zz-far-away-9" is not a region this build knows:`,
	} {
		got := UnknownRegion(region)
		if want == "" && got != "" || want != "" && !strings.HasPrefix(got, want) {
			t.Errorf("UnknownRegion(%q) = %q, want %q...", region, got, want)
		}
	}
}

// TestNearestKey: a key one or two edits from a known one is suggested, a
// swap of two neighbours counting as one edit; a key far from all is not.
func TestNearestKey(t *testing.T) {
	keys := []string{"level", "key", "format", "log_group", "max_object_bytes"}
	for key, want := range map[string]string{
		"levle": "level", "kye": "key", "fromat": "format", "log_gruop": "log_group",
		"levl": "level", "max_object_byte": "max_object_bytes", "zzz": "", "lgo": "",
	} {
		if got := nearest(key, keys); got != want {
			t.Errorf("nearest(%q) = %q, want %q", key, got, want)
		}
	}
	if d := editDistance("ab", "ba"); d != 1 {
		t.Errorf("distance of a swap: %d", d)
	}
}
