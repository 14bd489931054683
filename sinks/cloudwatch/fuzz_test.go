package cloudwatch

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/logfwd/forwarder/sinks"
)

// FuzzPartition: whatever a record holds (its tag, its body, JSON or not,
// its time), its log group and stream are names CloudWatch Logs takes (1
// to 512 bytes of valid UTF-8; a group of its characters alone, not under
// "aws/"; a stream without ':' or '*'), a record gets the same names each
// time, and Recover's rendering (nothing counted) gives the drainer's.
func FuzzPartition(f *testing.F) {
	cfg := baseCfg("http://127.0.0.1:1")
	cfg.LogGroup = "/eks/${record.kubernetes.namespace_name}/${tag[1]}/%Y-%m-%d"
	cfg.LogStream = "${record.kubernetes.pod_name|unknown}.${record.a.b}:${tag}-${hostname}-%H%M%S"
	s, err := New(context.Background(), "cw", cfg, Options{Hostname: "host-0", AWS: staticAWS(), Registerer: prometheus.NewRegistry()})
	if err != nil {
		f.Fatal(err)
	}
	f.Add("kube.shop.web", `{"kubernetes":{"namespace_name":"shop","pod_name":"web-1"},"a":{"b":2}}`, int64(1_700_000_000_000_000_000))
	f.Add("", `{}`, int64(0))
	f.Add("a..b", `{"kubernetes":{"namespace_name":"aws/x*:y","pod_name":"\u00e9\ud800"}}`, int64(-1))
	f.Add("x", `{"kubernetes":{"namespace_name":"`+strings.Repeat("n", 700)+`","pod_name":"`+strings.Repeat("\u00e9", 400)+`"}}`, int64(1<<62))
	f.Add("t", `{"kubernetes":"not an object","a":[1,{"b":3}]`, int64(-1<<63))
	f.Add("\xff\xfe.\x00", "\xc3", int64(1))
	f.Fuzz(func(t *testing.T, tag, body string, at int64) {
		r := &sinks.Record{Seq: 1, Time: at, Tag: tag, Body: []byte(body)}
		p := s.Partition(r)
		group, stream := splitPartition(p)
		for what, name := range map[string]string{"group": group, "stream": stream} {
			if name == "" || len(name) > maxNameLen || !utf8.ValidString(name) {
				t.Fatalf("%s %q (%d bytes) of tag %q, body %q", what, name, len(name), tag, body)
			}
		}
		for _, c := range []byte(group) {
			if !(c == '.' || c == '-' || c == '_' || c == '/' || c == '#' ||
				c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
				t.Fatalf("group %q holds %q", group, c)
			}
		}
		if strings.HasPrefix(group, "aws/") {
			t.Fatalf("group %q is under aws/", group)
		}
		if strings.ContainsAny(stream, ":*") {
			t.Fatalf("stream %q holds ':' or '*'", stream)
		}
		if again := s.Partition(r); again != p {
			t.Fatalf("rendered %q, then %q", p, again)
		}
		if quiet := s.partition(r, false); quiet != p {
			t.Fatalf("Partition %q, Recover's rendering %q", p, quiet)
		}
	})
}
