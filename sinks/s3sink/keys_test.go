package s3sink

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/internal/syncbuf"
	"github.com/logfwd/forwarder/sinks"
)

func keySink(t testing.TB, key string, reg prometheus.Registerer) *Sink {
	t.Helper()
	cfg := testConfig("http://127.0.0.1:1")
	cfg.Key = key
	s, err := New(context.Background(), "archive", cfg, Options{Hostname: "host1", AWS: &aws.Config{Credentials: testCreds}, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func TestKeys(t *testing.T) {
	at := time.Date(2025, 6, 15, 15, 6, 40, 0, time.UTC)
	tests := []struct {
		key, tag, body string
		at             time.Time
		first          uint64
		want           string
		fallback       bool
	}{
		{"logs/${tag}/%Y/%m/%d/%H/${hostname}-${seq}.json.gz", "app.web", `{}`, at, 42,
			"logs/app.web/2025/06/15/15/host1-00000000000000000042.json.gz", false},
		{"${tag[1]}/%H%M%S/${seq}", "app.web", `{}`, at, 18446744073709551615,
			"web/150640/18446744073709551615", false},
		{"${tag[2]}/${seq}", "app.web", `{}`, at, 1, "unknown/00000000000000000001", true},
		{"${record.k8s.ns}/${seq}", "a", `{"k8s":{"ns":"prod"}}`, at, 7, "prod/00000000000000000007", false},
		{"${record.k8s.ns}/${seq}", "a", `{"k8s":{}}`, at, 7, "unknown/00000000000000000007", true},
		{"${record.k8s.ns|none}/${seq}", "a", `{}`, at, 7, "none/00000000000000000007", false},
		{"a/${seq}/b/${seq}", "a", `{}`, at, 3, "a/00000000000000000003/b/00000000000000000003", false},
		// Control characters from a field or the tag become "_", even one
		// that spells a marker.
		{"${record.m}/${tag}/${seq}", "t\x01", `{"m":"x\u0000seq\u0000y\n"}`, at, 5, "x_seq_y_/t_/00000000000000000005", false},
	}
	for _, tc := range tests {
		reg := prometheus.NewRegistry()
		s := keySink(t, tc.key, reg)
		r := &sinks.Record{Tag: tc.tag, Body: []byte(tc.body), Time: tc.at.UnixNano()}
		p := s.Partition(r)
		if got := objectKey(p, tc.first, ""); got != tc.want {
			t.Errorf("%s with tag %q, body %s: key %q, want %q", tc.key, tc.tag, tc.body, got, tc.want)
		}
		want := 0.0
		if tc.fallback {
			want = 1
		}
		if n := testutil.ToFloat64(s.m.fallbacks); n != want {
			t.Errorf("%s: fallbacks counted %v, want %v", tc.key, n, want)
		}
	}
}

// A tag or a field never gives a key a ".." or an empty segment, nor a
// segment of its own: HTTP ?tag=../../etc/passwd and the tag pod.a/../../b
// stay inside logs/ as one segment each. Each record sanitised is counted.
func TestKeysKeepTheirPath(t *testing.T) {
	at := time.Date(2025, 6, 15, 15, 6, 40, 0, time.UTC)
	tests := []struct {
		key, tag, body, want string
		sanitised            bool
	}{
		{"logs/${tag}/%Y/${seq}", "pod.a/../../b", `{}`, "logs/pod.a_.._.._b/2025/00000000000000000042", true},
		{"logs/${tag}/%Y/${seq}", "../../etc/passwd", `{}`, "logs/.._.._etc_passwd/2025/00000000000000000042", true},
		{"logs/${tag}/%Y/${seq}", "..", `{}`, "logs/__/2025/00000000000000000042", true},
		{"logs/${record.ns}/${seq}", "t", `{"ns":"../.."}`, "logs/.._../00000000000000000042", true},
		{"logs/${record.ns|}/${seq}", "t", `{}`, "logs/_/00000000000000000042", true},
		{"logs/${record.ns}/${seq}", "t", `{"ns":"."}`, "logs/_/00000000000000000042", true},
		{"logs/${tag}/%Y/${seq}", "pod.shop", `{}`, "logs/pod.shop/2025/00000000000000000042", false},
	}
	for _, tc := range tests {
		s := keySink(t, tc.key, prometheus.NewRegistry())
		r := &sinks.Record{Tag: tc.tag, Body: []byte(tc.body), Time: at.UnixNano()}
		key := objectKey(s.Partition(r), 42, "")
		if key != tc.want {
			t.Errorf("%s with tag %q, body %s: key %q, want %q", tc.key, tc.tag, tc.body, key, tc.want)
		}
		for _, seg := range strings.Split(key, "/") {
			if seg == "" || seg == "." || seg == ".." {
				t.Errorf("%s with tag %q: key %q has the segment %q", tc.key, tc.tag, key, seg)
			}
		}
		s.Partition(r) // cached or not, counted again
		want := 0.0
		if tc.sanitised {
			want = 2
		}
		if n := testutil.ToFloat64(s.m.sanitised); n != want {
			t.Errorf("%s with tag %q: sanitised counted %v, want %v", tc.key, tc.tag, n, want)
		}
	}
}

func TestPartitionsByTimeBucket(t *testing.T) {
	s := keySink(t, "logs/${tag}/%Y/%m/%d/%H/${seq}", nil)
	at := time.Date(2025, 6, 15, 15, 0, 0, 0, time.UTC)
	p := func(tag string, d time.Duration) string {
		return s.Partition(&sinks.Record{Tag: tag, Body: []byte(`{}`), Time: at.Add(d).UnixNano()})
	}
	if p("a", 0) != p("a", 59*time.Minute) {
		t.Error("records of one hour are in different partitions")
	}
	if p("a", 0) == p("a", time.Hour) || p("a", 0) == p("b", 0) {
		t.Error("records of other hours or tags share a partition")
	}
}

func TestUUIDKeys(t *testing.T) {
	s := keySink(t, "logs/${tag}/${uuid}.json.gz", nil)
	st := newMemState(nil)
	b := &sinks.Batch{Records: sinkRecs(rec("a", "1", time.Now(), 1)), State: st}
	b.Partition = s.Partition(&b.Records[0])
	intentFor := func() *intent { return s.intentFor(t.Context(), st, b.Partition, b.First(), b.Last(), len(b.Records)) }
	in1 := intentFor()
	in2 := intentFor() // the same batch again: the same key
	if in1.Key != in2.Key || !regexp.MustCompile(`^logs/a/[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\.json\.gz$`).MatchString(in1.Key) {
		t.Errorf("keys %q, %q", in1.Key, in2.Key)
	}
	if in1.UUID == "" || !strings.Contains(in1.Key, in1.UUID) {
		t.Errorf("intent uuid %q, key %q", in1.UUID, in1.Key)
	}
	s.forget(b.Partition)
	if in3 := intentFor(); in3.Key == in1.Key {
		t.Error("a new intent reused the uuid")
	}
}

func TestNewRefusesBadSettings(t *testing.T) {
	for _, mod := range []func(*config.S3){
		func(c *config.S3) { c.Key = "logs/${tag}.json" },
		func(c *config.S3) { c.Key = "logs/${nope}/${seq}" },
		func(c *config.S3) { c.Compression = "lz4" },
		func(c *config.S3) { c.CompressionLevel = 12 },
		func(c *config.S3) { c.Compression, c.CompressionLevel = config.CompressionZstd, 5 },
		func(c *config.S3) { c.Bucket = "" },
		func(c *config.S3) { c.Region = "" },
	} {
		cfg := testConfig("http://127.0.0.1:1")
		mod(&cfg)
		t.Setenv("AWS_REGION", "")
		t.Setenv("AWS_DEFAULT_REGION", "")
		if s, err := New(context.Background(), "archive", cfg, Options{Hostname: "h", AWS: &aws.Config{Credentials: testCreds}}); err == nil {
			s.Close()
			t.Errorf("New accepted %+v", cfg)
		}
	}
}

// TestPartitionCache: templates without record fields remember partitions
// by tag and time bucket; what they answer is what rendering would.
func TestPartitionCache(t *testing.T) {
	at := time.Date(2025, 6, 15, 15, 6, 40, 0, time.UTC)
	for _, key := range []string{
		"logs/${tag}/%Y/%m/%d/%H/${seq}",
		"logs/${tag[1]}/%Y%m%d%H%M%S-${seq}",
		"logs/${tag}/%Y/%m/${seq}", // months are not fixed durations: rendered
		"logs/${tag}/${seq}",
		"logs/${record.a}/%H/${seq}", // fields: rendered
	} {
		reg := prometheus.NewRegistry()
		s := keySink(t, key, reg)
		if cached := s.keys.bucket > 0; cached == (strings.Contains(key, "record") || strings.Contains(key, "%m/${")) {
			t.Errorf("%s: cached %v", key, cached)
		}
		for _, d := range []time.Duration{0, time.Second, -time.Second, time.Minute, time.Hour, 24 * time.Hour, 40 * 24 * time.Hour, -60 * 365 * 24 * time.Hour} {
			for _, tag := range []string{"a.b", "a", "c.d"} {
				r := &sinks.Record{Tag: tag, Body: []byte(`{"a":"x"}`), Time: at.Add(d).UnixNano()}
				want, wantMissing := s.keys.render(r)
				for range 2 {
					if got, missing := s.keys.partition(r); got != want || missing != wantMissing {
						t.Errorf("%s, %s at %v: %q %v, rendered %q %v", key, tag, at.Add(d), got, missing, want, wantMissing)
					}
				}
			}
		}
		// A missing tag part or field is counted for every record, cached
		// or not.
		s.Partition(&sinks.Record{Tag: "a", Body: []byte(`{}`), Time: at.UnixNano()})
		s.Partition(&sinks.Record{Tag: "a", Body: []byte(`{}`), Time: at.UnixNano()})
		want := 0.0
		if strings.Contains(key, "tag[1]") || strings.Contains(key, "record") {
			want = 2
		}
		if testutil.ToFloat64(s.m.fallbacks) != want {
			t.Errorf("%s: %v fallbacks, want %v", key, testutil.ToFloat64(s.m.fallbacks), want)
		}
	}
}

func TestFingerprint(t *testing.T) {
	fp := func(key, host, compression string) string {
		cfg := testConfig("http://127.0.0.1:1")
		cfg.Key, cfg.Compression = key, compression
		s, err := New(context.Background(), "archive", cfg, Options{Hostname: host, AWS: &aws.Config{Credentials: testCreds}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		return s.Fingerprint()
	}
	a := fp("k/${tag}/${seq}", "h1", "gzip")
	if a != fp("k/${tag}/${seq}", "h1", "zstd") {
		t.Error("the fingerprint depends on the compression")
	}
	if a == fp("k/${tag}/x-${seq}", "h1", "gzip") || a == fp("k/${tag}/${seq}", "h2", "gzip") {
		t.Error("the fingerprint misses a change of key template or host name")
	}
}

// A field the records lack, without a default, puts them under "unknown":
// said in a warning naming the template and the field, not only counted.
func TestKeyFallbackWarns(t *testing.T) {
	_, url := startEmu(t)
	var logs syncbuf.Buffer
	cfg := testConfig(url)
	cfg.Key = "logs/${record.kubernetes.namespace}/${seq}.json.gz"
	s, err := New(context.Background(), "archive", cfg, Options{Hostname: "host1", AWS: &aws.Config{Credentials: testCreds}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	for _, r := range sinkRecs(rec("pod.shop", "1", time.Now(), 3), rec("pod.shop", "2", time.Now(), 3)) {
		if p := s.Partition(&r); !strings.HasPrefix(p, "logs/unknown/") {
			t.Fatalf("partition %q", p)
		}
	}
	if out := logs.String(); strings.Count(out, `level=WARN msg="records lack what the key template names and go under the fallback \"unknown\"`) != 1 ||
		!strings.Contains(out, `sink=archive template=logs/${record.kubernetes.namespace}/${seq}.json.gz missing=${record.kubernetes.namespace} tag=pod.shop records=1`) {
		t.Fatalf("want one warning naming the template and the field:\n%s", out)
	}
}

// TestPartitionCacheEdges: the partitions remembered without the lock
// answer for their bucket only, at its edges, at the ends of int64 and for
// tags that share a set.
func TestPartitionCacheEdges(t *testing.T) {
	for _, key := range []string{"logs/${tag}/%Y/%m/%d/%H/${seq}", "logs/${tag}/%Y%m%d%H%M%S-${seq}", "logs/${tag}/${seq}"} {
		s := keySink(t, key, prometheus.NewRegistry())
		d := int64(s.keys.bucket)
		if d <= 0 {
			t.Fatalf("%s: not cached", key)
		}
		var times []int64
		for _, at := range []int64{0, 1_750_000_000 * 1e9, -1_000_000_000 * 1e9} {
			edge := at / d * d
			times = append(times, edge-1, edge, edge+1, edge+d-1, edge+d)
		}
		times = append(times, math.MinInt64, math.MinInt64+1, math.MaxInt64-1, math.MaxInt64)
		var tags []string
		for i := range 3 * recentSets {
			tags = append(tags, fmt.Sprintf("t%d", i)) // some share a set
		}
		for round := range 2 {
			for _, tm := range times {
				for i, tag := range tags {
					if round == 1 && i%3 == 0 {
						continue // other neighbours this round
					}
					r := &sinks.Record{Tag: tag, Body: []byte(`{}`), Time: tm}
					want, wantNotes := s.keys.render(r)
					if got, notes := s.keys.partition(r); got != want || notes != wantNotes {
						t.Fatalf("%s, %s at %d: %q %v, rendered %q %v", key, tag, tm, got, notes, want, wantNotes)
					}
				}
			}
		}
	}
	const h = int64(time.Hour)
	for _, c := range []struct{ b, size, lo, hi int64 }{
		{0, 10, 0, 10},
		{-1, 10, -10, 0},
		{0, math.MaxInt64, 0, math.MaxInt64},
		{1, math.MaxInt64, math.MaxInt64, math.MaxInt64},
		{-1, math.MaxInt64, -math.MaxInt64, 0},
		{-2, math.MaxInt64, math.MinInt64, -math.MaxInt64},
		{math.MinInt64 / h, h, math.MinInt64 / h * h, math.MinInt64/h*h + h},
		{math.MinInt64/h - 1, h, math.MinInt64, math.MinInt64 / h * h}, // the bucket of math.MinInt64
		{math.MaxInt64 / h, h, math.MaxInt64 / h * h, math.MaxInt64},
	} {
		if lo, hi := bucketSpan(c.b, c.size); lo != c.lo || hi != c.hi {
			t.Errorf("bucketSpan(%d, %d) = [%d, %d), want [%d, %d)", c.b, c.size, lo, hi, c.lo, c.hi)
		}
	}
}
