package s3sink

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/logfwd/forwarder/inputs"
	"github.com/logfwd/forwarder/sinks"
)

// FuzzPartition: whatever a record holds that an input stores (a tag
// CheckTag takes, any body, any time), its object key is one S3 takes (at
// most 1,024 bytes, no control character, valid UTF-8 when the body is),
// whose path the values do not change, and the same each time, from the
// sink's caches as rendered anew.
func FuzzPartition(f *testing.F) {
	const key = "logs/${tag[0]}/${record.kubernetes.namespace_name}/%Y/%m/%d/%H/${record.a.b|none}-${tag}-${hostname}-${seq}.json.gz"
	s := keySink(f, key, prometheus.NewRegistry())
	f.Add("kube.shop.web", `{"kubernetes":{"namespace_name":"shop"},"a":{"b":2}}`, int64(1_700_000_000_000_000_000))
	f.Add("a", `{}`, int64(0))
	f.Add("a..b", `{"kubernetes":{"namespace_name":"../x/\u0000\u007f"},"a":{"b":"\ud800"}}`, int64(-1))
	f.Add("x", `{"kubernetes":{"namespace_name":"`+strings.Repeat("n", 1500)+`"},"a":{"b":"`+strings.Repeat("\u00e9", 600)+`"}}`, int64(1<<62))
	f.Add("t", `{"kubernetes":"not an object","a":[1,{"b":3}]`, int64(-1<<63))
	f.Fuzz(func(t *testing.T, tag, body string, at int64) {
		if inputs.CheckTag(tag) != "" {
			return // refused by the inputs: never stored
		}
		r := &sinks.Record{Seq: 1, Time: at, Tag: tag, Body: []byte(body)}
		p := s.Partition(r)
		if strings.HasPrefix(p, tooLong) {
			t.Fatalf("key of tag %q, body %q too long for S3 though the template leaves room", tag, body)
		}
		k := objectKey(p, 12345, "")
		if len(k) > maxKeyLen {
			t.Fatalf("key of %d bytes: %q", len(k), k)
		}
		for _, c := range []byte(k) {
			if c < 0x20 || c == 0x7f {
				t.Fatalf("key %q holds a control character", k)
			}
		}
		if utf8.ValidString(body) && !utf8.ValidString(k) {
			t.Fatalf("key %q is no valid UTF-8 (body %q)", k, body)
		}
		if n := strings.Count(k, "/"); n != strings.Count(key, "/") {
			t.Fatalf("key %q has %d slashes, the template %d", k, n, strings.Count(key, "/"))
		}
		if again := s.Partition(r); again != p {
			t.Fatalf("rendered %q, then %q", p, again)
		}
		if fresh, _ := s.keys.render(r); fresh != p {
			t.Fatalf("rendered %q, then anew %q", p, fresh)
		}
	})
}
