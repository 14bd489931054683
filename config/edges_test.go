package config

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// An S3 object tag (or CloudWatch tag) named "key" is no template: its
// ${env.NAME} is expanded as any value's, its $ and % as they are.
func TestEnvInATagNamedKeyIsNoTemplate(t *testing.T) {
	t.Setenv("OWNER", "team$1%x")
	cfg := load(t, `
sinks:
  - name: a
    type: s3
    bucket: my-logs
    region: us-east-1
    tags:
      key: "${env.OWNER}"
      other: "${env.OWNER}"
`)
	tags := cfg.Sinks[0].S3.Tags
	if tags["other"] != "team$1%x" {
		t.Errorf("other: %q", tags["other"])
	}
	if tags["key"] != "team$1%x" {
		t.Errorf("tag named key: got %q, want %q", tags["key"], "team$1%x")
	}
}

// Outside the templates, ${...} that is not ${env.NAME} is an error, also
// under a tag named key.
func TestOtherRefInATagNamedKeyIsAnError(t *testing.T) {
	_, err := Parse([]byte(`
sinks:
  - name: a
    type: s3
    bucket: my-logs
    region: us-east-1
    tags:
      key: "${OWNER}"
`), "f.yaml")
	if err == nil {
		t.Errorf("${OWNER} in tags.key accepted as text")
	}
}

// A file that is not a mapping (an EnvironmentFile given by mistake: its
// KEY=value lines are one YAML scalar) is refused by the wal commands as
// by check: its defaults would point them at another WAL.
func TestLoadWALRefusesANonMapping(t *testing.T) {
	path := t.TempDir() + "/forwarder.env"
	if err := os.WriteFile(path, []byte("AWS_REGION=eu-west-1\nFWD_TOKEN=abc\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil {
		t.Fatal("Load accepted it")
	} else {
		t.Logf("Load: %v", err)
	}
	cfg, err := LoadWAL(path)
	if err == nil {
		t.Errorf("LoadWAL accepted a file that is not a mapping: data_dir %q", cfg.DataDir)
	}
}

// README: "The file holds one YAML document (empty ones around it aside)".
func TestEmptyDocumentsAroundTheOne(t *testing.T) {
	for _, text := range []string{
		"data_dir: /x\n---\n",
		"---\ndata_dir: /x\n---\n",
		"---\n---\ndata_dir: /x\n",
		"# c\n---\n# only a comment\n---\ndata_dir: /x\n",
	} {
		cfg, err := Parse([]byte(text), "f.yaml")
		if err != nil {
			t.Errorf("%q: %v", text, err)
		} else if cfg.DataDir != "/x" {
			t.Errorf("%q: data_dir %q", text, cfg.DataDir)
		}
	}
}

// Repeated sinks are refused by the wal commands as by check: the last
// list would make the first's sinks look removed.
func TestLoadWALRefusesRepeatedSinks(t *testing.T) {
	path := t.TempDir() + "/f.yaml"
	text := "data_dir: /x\nsinks:\n  - {name: archive, type: s3, bucket: abc, region: us-east-1}\nsinks:\n  - {name: pods, type: cloudwatch, log_group: g, log_stream: s, region: us-east-1}\n"
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil {
		t.Fatal("Load accepted repeated sinks")
	} else {
		t.Logf("Load: %v", err)
	}
	cfg, err := LoadWAL(path)
	if err == nil {
		t.Errorf("LoadWAL accepted repeated sinks: sinks %+v", cfg.Sinks)
	}
}

// An S3 sink's tag_key and time_key under one name would write it twice
// in each line, the time lost to readers that keep the last.
func TestTagKeyIsNotTimeKey(t *testing.T) {
	_, err := Parse([]byte(`
sinks:
  - name: a
    type: s3
    bucket: my-logs
    region: us-east-1
    time_key: ts
    tag_key: ts
`), "f.yaml")
	if err == nil || !strings.Contains(err.Error(), `sink "a": tag_key: "ts" is time_key too`) {
		t.Errorf("tag_key equal to time_key: %v", err)
	}
	if _, err := Parse([]byte("sinks:\n  - {name: a, type: s3, bucket: my-logs, region: us-east-1, time_key: ts, tag_key: tag}\n"), "f.yaml"); err != nil {
		t.Errorf("tag_key and time_key of their own: %v", err)
	}
}

// An empty file, or one of comments, is the defaults for the wal commands
// as for check: no mapping is needed where there is nothing.
func TestLoadWALTakesAnEmptyFile(t *testing.T) {
	for _, text := range []string{"", "# only a comment\n", "---\n", "~\n"} {
		path := t.TempDir() + "/f.yaml"
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(path); err != nil {
			t.Errorf("%q: Load: %v", text, err)
		}
		if cfg, err := LoadWAL(path); err != nil || cfg.DataDir != Default().DataDir {
			t.Errorf("%q: LoadWAL: %v", text, err)
		}
	}
}

// Names and keys that take a variable's value (a pod's name from the
// downward API) keep the values they took: one that holds the host name
// keeps replicas apart as ${hostname} does. A tag named key, a value
// elsewhere, or $${env.X} (text) does not count.
func TestTemplatesFromEnvKeepTheirValues(t *testing.T) {
	t.Setenv("POD", "forwarder-0")
	t.Setenv("CLUSTER", "prod")
	cfg := load(t, `
sinks:
  - name: a
    type: s3
    bucket: my-logs
    region: us-east-1
    key: "logs/${env.POD}/${seq}.json.gz"
  - name: b
    type: s3
    bucket: my-logs
    region: us-east-1
    key: "other/${seq}.json.gz"
    tags: {key: "${env.POD}"}
  - name: c
    type: cloudwatch
    region: us-east-1
    log_group: g
    log_stream: "${tag}-${env.POD}-${env.CLUSTER}-$${env.CLUSTER}"
  - name: d
    type: cloudwatch
    region: "${env.POD}"
    log_group: g
    log_stream: s
`)
	if s := cfg.Sinks[0].S3; !slices.Equal(s.KeyEnv, []string{"forwarder-0"}) || s.Key != "logs/forwarder-0/${seq}.json.gz" {
		t.Errorf("a: KeyEnv %q, key %q", s.KeyEnv, s.Key)
	}
	if v := cfg.Sinks[1].S3.KeyEnv; v != nil {
		t.Errorf("b: KeyEnv %q from a tag named key", v)
	}
	if v := cfg.Sinks[2].CloudWatch.NamesEnv; !slices.Equal(v, []string{"forwarder-0", "prod"}) {
		t.Errorf("c: NamesEnv %q", v)
	}
	if v := cfg.Sinks[3].CloudWatch.NamesEnv; v != nil {
		t.Errorf("d: NamesEnv %q from the region", v)
	}
}
