package main

import (
	"fmt"
	"math/rand"
	"strconv"
	"strings"
	"time"

	"github.com/tinylib/msgp/msgp"
)

// The records are shaped like the container logs a Kubernetes node's
// Fluent Bit forwards: a log line (timestamp, level, request, status,
// latency, request id), the stream, and the pod's namespace and name, plus
// an "id" field unique to the run, the connection and the record, so that
// what a run sent can be accounted for later:
//
//	{"log":"2025-01-02T03:04:05.678901Z INFO GET /api/v1/orders/48213 status=200 latency_ms=23 request_id=6f1c2a9e4b7d3f10",
//	 "stream":"stdout","kubernetes":{"namespace_name":"shop","pod_name":"cart-7d9f8b6c4-x2k9p"},"id":"k3j9x2-3-41"}
//
// Over HTTP the record starts with a "time" field instead, as a container
// runtime writes it, and the log line does not repeat the timestamp.
// Records are padded to the requested size with more of a request log
// line (user agent, bytes, trace id); they are never shorter than their
// fields (about 230 bytes).
//
// Every string is plain ASCII without quotes or backslashes, so a record's
// JSON is its strings written out as they are.

var namespaces = []string{"shop", "payments", "auth", "search", "checkout", "kube-system"}

// apps are the deployments of each namespace; each has a few pods.
var apps = map[string][]string{
	"shop":        {"web", "cart", "catalog"},
	"payments":    {"api", "ledger"},
	"auth":        {"login", "token"},
	"search":      {"query", "indexer"},
	"checkout":    {"api", "worker"},
	"kube-system": {"coredns", "kube-proxy"},
}

var paths = []string{
	"/api/v1/orders", "/api/v1/items", "/api/v1/users", "/api/v2/carts",
	"/login", "/logout", "/healthz", "/metrics", "/search", "/api/v1/payments",
}

var methods = []string{"GET", "GET", "GET", "POST", "POST", "PUT", "DELETE"}

// pods returns the pod names of a namespace: three replicas of each of
// its deployments (39 pods in all).
func pods(r *rand.Rand, ns string) []string {
	var out []string
	for _, app := range apps[ns] {
		rs := randString(r, "0123456789abcdef", 9)
		for range 3 {
			out = append(out, app+"-"+rs+"-"+randString(r, "bcdfghjklmnpqrstvwxz2456789", 5))
		}
	}
	return out
}

func randString(r *rand.Rand, alphabet string, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[r.Intn(len(alphabet))]
	}
	return string(b)
}

// template is one record without its id: the id is appended per record.
type template struct {
	// packed is the msgpack map of four entries up to and including the
	// "id" key: log, stream, kubernetes, then "id".
	packed []byte
	// json is `"log":"...","stream":"...","kubernetes":{...},` — the
	// record's JSON between the opening brace (and, over HTTP, the time
	// field) and the id.
	json []byte
}

// jsonLen is the length of the record's compact JSON with an id of idLen
// bytes, as the forward input stores it: {json"id":"ID"}.
func (t *template) jsonLen(idLen int) int {
	return 1 + len(t.json) + len(`"id":""}`) + idLen
}

// pool is a set of templates to pick from, built once so that sending
// costs little more than copying bytes.
type pool struct {
	tmpl []template
}

// newPool builds n templates of records of about size bytes of JSON,
// counting an id of idLen bytes. With lineTime, each log line starts with
// its timestamp. The pods come from podSeed alone, so that every
// connection of a run sends logs of the same few dozen pods.
func newPool(podSeed, seed int64, n, size, idLen int, lineTime bool) *pool {
	podsOf := map[string][]string{}
	pr := rand.New(rand.NewSource(podSeed))
	for _, ns := range namespaces {
		podsOf[ns] = pods(pr, ns)
	}
	r := rand.New(rand.NewSource(seed))
	p := &pool{tmpl: make([]template, n)}
	now := time.Now().UTC()
	for i := range p.tmpl {
		ns := namespaces[r.Intn(len(namespaces))]
		pod := podsOf[ns][r.Intn(len(podsOf[ns]))]
		stream := "stdout"
		level, status := "INFO", 200
		switch x := r.Intn(100); {
		case x < 3:
			level, status, stream = "ERROR", []int{500, 502, 503}[r.Intn(3)], "stderr"
		case x < 10:
			level, status = "WARN", []int{400, 401, 404, 429}[r.Intn(4)]
		case x < 15:
			level = "DEBUG"
		}
		line := fmt.Sprintf("%s %s %s/%d status=%d latency_ms=%d request_id=%016x",
			level, methods[r.Intn(len(methods))], paths[r.Intn(len(paths))], r.Intn(100000),
			status, latency(r), r.Uint64())
		if lineTime {
			line = now.Add(time.Duration(i)*997*time.Microsecond).Format("2006-01-02T15:04:05.000000Z") + " " + line
		}
		t := build(line, stream, ns, pod)
		if pad := size - t.jsonLen(idLen); pad > 0 {
			t = build(line+padding(r, pad), stream, ns, pod)
		}
		p.tmpl[i] = t
	}
	return p
}

// padding is exactly n bytes of what a request log line also carries.
func padding(r *rand.Rand, n int) string {
	hex := func(n int) string { return randString(r, "0123456789abcdef", n) }
	var b strings.Builder
	if n > 48 {
		s := " ua=okhttp/4.12.0 bytes_out=" + strconv.Itoa(r.Intn(1<<16))
		b.WriteString(s)
		n -= len(s)
	}
	switch {
	case n > 10:
		b.WriteString(" trace_id=" + hex(n-10))
	case n > 1:
		b.WriteString(" " + hex(n-1))
	case n == 1:
		b.WriteString(" ")
	}
	return b.String()
}

// latency is skewed like real request latencies: mostly fast, a long tail.
func latency(r *rand.Rand) int {
	ms := r.ExpFloat64() * 25
	if r.Intn(50) == 0 {
		ms *= 20
	}
	return int(ms) + 1
}

// build encodes one record template. The log line must not contain `"`,
// `\` or control characters: it is written into the JSON as it is.
func build(line, stream, ns, pod string) template {
	b := msgp.AppendMapHeader(nil, 4)
	b = msgp.AppendString(b, "log")
	b = msgp.AppendString(b, line)
	b = msgp.AppendString(b, "stream")
	b = msgp.AppendString(b, stream)
	b = msgp.AppendString(b, "kubernetes")
	b = msgp.AppendMapHeader(b, 2)
	b = msgp.AppendString(b, "namespace_name")
	b = msgp.AppendString(b, ns)
	b = msgp.AppendString(b, "pod_name")
	b = msgp.AppendString(b, pod)
	b = msgp.AppendString(b, "id")
	j := `"log":"` + line + `","stream":"` + stream + `","kubernetes":{"namespace_name":"` + ns +
		`","pod_name":"` + pod + `"},`
	return template{packed: b, json: []byte(j)}
}

// appendID appends "<run>-<conn>-<n>".
func appendID(b []byte, run string, conn int, n uint64) []byte {
	b = append(b, run...)
	b = append(b, '-')
	b = strconv.AppendInt(b, int64(conn), 10)
	b = append(b, '-')
	return strconv.AppendUint(b, n, 10)
}

// appendEventTime appends t as a Fluent EventTime: ext type 0, seconds
// and nanoseconds as two big-endian uint32.
func appendEventTime(b []byte, t time.Time) []byte {
	s, ns := uint32(t.Unix()), uint32(t.Nanosecond())
	return append(b, 0xd7, 0x00,
		byte(s>>24), byte(s>>16), byte(s>>8), byte(s),
		byte(ns>>24), byte(ns>>16), byte(ns>>8), byte(ns))
}
