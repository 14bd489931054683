package httpin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/inputs"
	"github.com/logfwd/forwarder/internal/syncbuf"
	"github.com/logfwd/forwarder/wal"
)

// TestResponses sends one request per case to a fresh server and WAL and
// checks the answer, the reason counted, and what the WAL holds after.
func TestResponses(t *testing.T) {
	bomb := gzipped(strings.Repeat(" ", 8<<20)) // 8 MiB of white space, a few KiB sent
	withToken := func(c *config.HTTP) { c.Token = "s3cret" }
	smallBody := func(c *config.HTTP) { c.MaxBodyBytes = 1 << 10 }
	tests := []struct {
		name    string
		cfg     func(*config.HTTP)
		method  string // default POST
		path    string // default /v1/logs/app
		headers []string
		body    []byte
		chunked bool // hide the length: Transfer-Encoding: chunked

		status  int
		resp    string            // the whole answer, when set
		respHas string            // a part of the answer, when set
		header  map[string]string // answer headers
		reason  string            // counted once, when set
		stored  []string          // record bodies in the WAL after
		tag     string            // of every stored record; default app
	}{
		// Bodies that are stored.
		{name: "ndjson", body: []byte("{\"a\": 1, \"b\" : \"x\"}\n\n{ \"z\":true,\"a\":[1, 2] }\n"),
			status: 200, resp: `{"stored":2}`, stored: []string{`{"a":1,"b":"x"}`, `{"z":true,"a":[1,2]}`}},
		{name: "ndjson crlf blank lines no final newline", body: []byte("\r\n\n{\"b\":2,\"a\":1}\r\n\r\n  \t\r\n{\"c\":3}"),
			status: 200, resp: `{"stored":2}`, stored: []string{`{"b":2,"a":1}`, `{"c":3}`}},
		{name: "array", body: []byte(` [ {"b":1,"a":2} ,
			{"c":{"d": null, "e": [ ]}} ] `),
			status: 200, resp: `{"stored":2}`, stored: []string{`{"b":1,"a":2}`, `{"c":{"d":null,"e":[]}}`}},
		{name: "single pretty object", body: []byte("{\n  \"msg\": \"hi there\",\n  \"n\": -1.5e3,\n  \"o\": { \"x\" : false }\n}\n"),
			status: 200, resp: `{"stored":1}`, stored: []string{`{"msg":"hi there","n":-1.5e3,"o":{"x":false}}`}},
		{name: "escapes kept as sent", body: []byte(`{"k\u00e9y" : "a\"b\n\ud800 \/"}`),
			status: 200, resp: `{"stored":1}`, stored: []string{`{"k\u00e9y":"a\"b\n\ud800 \/"}`}},
		{name: "utf-8 kept", body: []byte(`{"msg":"héllo 世界 🙂"}`),
			status: 200, resp: `{"stored":1}`, stored: []string{`{"msg":"héllo 世界 🙂"}`}},
		{name: "invalid utf-8 replaced", body: []byte("{\"m\":\"a\xffb\xc3\"}\n{\"ok\":1}"),
			status: 200, resp: `{"stored":2}`, stored: []string{"{\"m\":\"a\uFFFDb\uFFFD\"}", `{"ok":1}`}},
		{name: "byte order mark", body: []byte("\xef\xbb\xbf{\"a\":1}"),
			status: 200, resp: `{"stored":1}`, stored: []string{`{"a":1}`}},
		{name: "gzip", headers: []string{"Content-Encoding", "gzip"}, body: gzipped("{\"a\": 1}\n{\"b\": 2}\n"),
			status: 200, resp: `{"stored":2}`, stored: []string{`{"a":1}`, `{"b":2}`}},
		{name: "gzip several members", headers: []string{"Content-Encoding", "GZIP"}, body: gzipped("{\"a\":1}\n", "{\"a\":2}\n", "{\"a\":3}"),
			status: 200, resp: `{"stored":3}`, stored: []string{`{"a":1}`, `{"a":2}`, `{"a":3}`}},
		// Vector's http sink sends zstd, and zlib as deflate.
		{name: "zstd", headers: []string{"Content-Encoding", "zstd"}, body: zstdCompressed("{\"a\": 1}\n{\"b\": 2}\n"),
			status: 200, resp: `{"stored":2}`, stored: []string{`{"a":1}`, `{"b":2}`}},
		{name: "zstd several frames", headers: []string{"Content-Encoding", "ZSTD"}, body: zstdCompressed("{\"a\":1}\n", "{\"a\":2}\n"),
			status: 200, resp: `{"stored":2}`, stored: []string{`{"a":1}`, `{"a":2}`}},
		{name: "zstd over the limit decompressed", cfg: smallBody, headers: []string{"Content-Encoding", "zstd"},
			body:   zstdCompressed(`{"a":"` + strings.Repeat("x", 2000) + `"}`),
			status: 413, resp: `{"error":"body larger than 1024 bytes"}`, reason: "too_large"},
		{name: "zstd cut short", headers: []string{"Content-Encoding", "zstd"}, body: zstdCompressed(`{"a":1}`)[:12],
			status: 400, reason: "malformed"},
		{name: "deflate (zlib)", headers: []string{"Content-Encoding", "deflate"}, body: zlibCompressed("{\"a\": 1}\n{\"b\": 2}"),
			status: 200, resp: `{"stored":2}`, stored: []string{`{"a":1}`, `{"b":2}`}},
		{name: "identity encoding", headers: []string{"Content-Encoding", "identity"}, body: []byte(`{"a":1}`),
			status: 200, resp: `{"stored":1}`, stored: []string{`{"a":1}`}},
		{name: "chunked body", chunked: true, body: []byte(`[{"a":1},{"a":2}]`),
			status: 200, resp: `{"stored":2}`, stored: []string{`{"a":1}`, `{"a":2}`}},
		{name: "tag in the query", path: "/v1/logs?tag=pod.web", body: []byte(`{"a":1}`),
			status: 200, resp: `{"stored":1}`, stored: []string{`{"a":1}`}, tag: "pod.web"},
		{name: "escaped tag in the path", path: "/v1/logs/pod%2Fweb%20x", body: []byte(`{"a":1}`),
			status: 200, resp: `{"stored":1}`, stored: []string{`{"a":1}`}, tag: "pod/web x"},
		{name: "tag of 1024 bytes", path: "/v1/logs/" + strings.Repeat("t", 1024), body: []byte(`{"a":1}`),
			status: 200, resp: `{"stored":1}`, stored: []string{`{"a":1}`}, tag: strings.Repeat("t", 1024)},
		{name: "empty array", body: []byte(" [ ] "), status: 200, resp: `{"stored":0}`},
		{name: "empty body", body: nil, status: 200, resp: `{"stored":0}`},
		{name: "blank lines only", body: []byte("\n\n \n"), status: 200, resp: `{"stored":0}`},
		{name: "right token", cfg: withToken, headers: []string{"Authorization", "Bearer s3cret"}, body: []byte(`{"a":1}`),
			status: 200, resp: `{"stored":1}`, stored: []string{`{"a":1}`}},
		{name: "right token any case scheme", cfg: withToken, headers: []string{"Authorization", "bearer s3cret"}, body: []byte(`{"a":1}`),
			status: 200, resp: `{"stored":1}`, stored: []string{`{"a":1}`}},

		// 400: nothing of the request is stored.
		{name: "invalid json line 3", body: []byte("{\"a\":1}\n{\"a\":2}\n{\"a\":}\n{\"a\":4}\n"),
			status: 400, resp: `{"error":"line 3: invalid JSON: invalid character '}' looking for beginning of value"}`, reason: "malformed"},
		{name: "line numbers count blank lines", body: []byte("{\"a\":1}\n\n\n{\"a\" 2}\n"),
			status: 400, resp: `{"error":"line 4: invalid JSON: invalid character '2' after object key"}`, reason: "malformed"},
		{name: "pretty-printed record: the error's line", body: []byte("{\"a\":1}\n{\n \"a\": 1,\n \"b\": x\n}\n"),
			status: 400, resp: `{"error":"line 4 (in the record from line 2): invalid JSON: invalid character 'x' looking for beginning of value"}`, reason: "malformed"},
		{name: "truncated object", body: []byte("{\"a\":1}\n{\"a\":\"x"),
			status: 400, resp: `{"error":"line 2: invalid JSON: unexpected end of JSON input"}`, reason: "malformed"},
		{name: "ndjson line not an object", body: []byte("{\"a\":1}\n[1]\n"),
			status: 400, resp: `{"error":"line 2: not a JSON object"}`, reason: "malformed"},
		{name: "array element not an object", body: []byte(`[{"a":1}, 5, {"a":3}]`),
			status: 400, resp: `{"error":"element 2: not a JSON object"}`, reason: "malformed"},
		{name: "array element a string", body: []byte(`["x"]`),
			status: 400, resp: `{"error":"element 1: not a JSON object"}`, reason: "malformed"},
		{name: "array of arrays", body: []byte(`[[{"a":1}]]`),
			status: 400, resp: `{"error":"element 1: not a JSON object"}`, reason: "malformed"},
		{name: "array trailing comma", body: []byte(`[{"a":1},]`),
			status: 400, respHas: `element 2: invalid JSON`, reason: "malformed"},
		{name: "array unterminated", body: []byte(`[{"a":1}`),
			status: 400, resp: `{"error":"element 1: invalid JSON: unexpected end of JSON input"}`, reason: "malformed"},
		{name: "data after the array", body: []byte(`[{"a":1}] {"b":2}`),
			status: 400, respHas: `after the array: invalid JSON`, reason: "malformed"},
		{name: "not json", body: []byte("hello\n"),
			status: 400, resp: `{"error":"line 1: invalid JSON: invalid character 'h' looking for beginning of value"}`, reason: "malformed"},
		{name: "control character in a string", body: []byte("{\"a\":\"x\ty\"}"),
			status: 400, respHas: `line 1: invalid JSON: invalid character byte 0x09 in string literal`, reason: "malformed"},
		{name: "too deep", body: []byte(`{"a":` + strings.Repeat("[", 1000) + strings.Repeat("]", 1000) + `}`),
			status: 400, resp: `{"error":"line 1: invalid JSON: nesting deeper than 1000 levels"}`, reason: "malformed"},
		{name: "broken gzip", headers: []string{"Content-Encoding", "gzip"}, body: gzipped(`{"a":1}`)[:15],
			status: 400, respHas: `invalid gzip data`, reason: "malformed"},
		{name: "not gzip", headers: []string{"Content-Encoding", "gzip"}, body: []byte(`{"a":1}`),
			status: 400, respHas: `invalid gzip data`, reason: "malformed"},
		{name: "no tag", path: "/v1/logs", body: []byte(`{"a":1}`),
			status: 400, respHas: "missing tag", reason: "bad_tag"},
		{name: "no tag trailing slash", path: "/v1/logs/", body: []byte(`{"a":1}`),
			status: 400, respHas: "missing tag", reason: "bad_tag"},
		{name: "empty query tag", path: "/v1/logs?tag=", body: []byte(`{"a":1}`),
			status: 400, respHas: "missing tag", reason: "bad_tag"},
		{name: "tag with a control character", path: "/v1/logs/a%01b", body: []byte(`{"a":1}`),
			status: 400, resp: `{"error":"tag contains a control character (U+0001)"}`, reason: "bad_tag"},
		{name: "tag with a newline", path: "/v1/logs?tag=a%0Ab", body: []byte(`{"a":1}`),
			status: 400, resp: `{"error":"tag contains a control character (U+000A)"}`, reason: "bad_tag"},
		{name: "tag not utf-8", path: "/v1/logs/a%FF", body: []byte(`{"a":1}`),
			status: 400, resp: `{"error":"tag is not valid UTF-8"}`, reason: "bad_tag"},
		{name: "tag too long", path: "/v1/logs?tag=" + strings.Repeat("t", 1025), body: []byte(`{"a":1}`),
			status: 400, resp: `{"error":"tag of 1025 bytes, at most 1024"}`, reason: "bad_tag"},
		{name: "idempotency key too long", headers: []string{"Idempotency-Key", strings.Repeat("k", 1025)}, body: []byte(`{"a":1}`),
			status: 400, respHas: "Idempotency-Key longer than 1024 bytes", reason: "malformed"},

		// 413
		{name: "body over the limit", cfg: smallBody, body: []byte(`{"a":"` + strings.Repeat("x", 2000) + `"}`),
			status: 413, resp: `{"error":"body larger than 1024 bytes"}`, reason: "too_large"},
		{name: "chunked body over the limit", cfg: smallBody, chunked: true, body: []byte(`{"a":"` + strings.Repeat("x", 2000) + `"}`),
			status: 413, resp: `{"error":"body larger than 1024 bytes"}`, reason: "too_large"},
		{name: "body of exactly the limit", cfg: smallBody, body: []byte(`{"a":"` + strings.Repeat("x", 1024-len(`{"a":""}`)) + `"}`),
			status: 200, resp: `{"stored":1}`, stored: []string{`{"a":"` + strings.Repeat("x", 1024-len(`{"a":""}`)) + `"}`}},
		{name: "gzip over the limit decompressed", cfg: smallBody, headers: []string{"Content-Encoding", "gzip"},
			body:   gzipped(`{"a":"` + strings.Repeat("x", 2000) + `"}`),
			status: 413, resp: `{"error":"body larger than 1024 bytes"}`, reason: "too_large"},
		{name: "gzip bomb", cfg: func(c *config.HTTP) { c.MaxBodyBytes = 64 << 10 }, headers: []string{"Content-Encoding", "gzip"},
			body: bomb, status: 413, resp: `{"error":"body larger than 65536 bytes"}`, reason: "too_large"},
		{name: "records over the limit", cfg: func(c *config.HTTP) { c.MaxRecordsPerRequest = 2 }, body: []byte("{\"a\":1}\n{\"a\":2}\n{\"a\":3}\n"),
			status: 413, resp: `{"error":"more than 2 records in one request (max_records_per_request): nothing was stored; send them in several requests"}`, reason: "too_many_records"},
		{name: "array elements over the limit", cfg: func(c *config.HTTP) { c.MaxRecordsPerRequest = 2 }, body: []byte(`[{"a":1},{"a":2},{"a":3}]`),
			status: 413, respHas: "more than 2 records in one request", reason: "too_many_records"},
		{name: "records at the limit", cfg: func(c *config.HTTP) { c.MaxRecordsPerRequest = 2 }, body: []byte(`[{"a":1},{"a":2}]`),
			status: 200, resp: `{"stored":2}`, stored: []string{`{"a":1}`, `{"a":2}`}},

		// 401
		{name: "no token", cfg: withToken, body: []byte(`{"a":1}`),
			status: 401, resp: `{"error":"missing or wrong bearer token"}`, header: map[string]string{"WWW-Authenticate": "Bearer"}, reason: "unauthorized"},
		{name: "wrong token", cfg: withToken, headers: []string{"Authorization", "Bearer s3creT"}, body: []byte(`{"a":1}`),
			status: 401, header: map[string]string{"WWW-Authenticate": "Bearer"}, reason: "unauthorized"},
		{name: "token prefix", cfg: withToken, headers: []string{"Authorization", "Bearer s3cre"}, body: []byte(`{"a":1}`),
			status: 401, reason: "unauthorized"},
		{name: "other scheme", cfg: withToken, headers: []string{"Authorization", "Basic s3cret"}, body: []byte(`{"a":1}`),
			status: 401, reason: "unauthorized"},
		{name: "scheme only", cfg: withToken, headers: []string{"Authorization", "Bearer"}, body: []byte(`{"a":1}`),
			status: 401, reason: "unauthorized"},
		{name: "auth before the tag", cfg: withToken, path: "/v1/logs", body: []byte(`{"a":1}`),
			status: 401, reason: "unauthorized"},

		// 415
		{name: "brotli", headers: []string{"Content-Encoding", "br"}, body: []byte(`{"a":1}`),
			status: 415, resp: `{"error":"Content-Encoding \"br\" not supported: send one of identity, gzip, zstd or deflate"}`, reason: "unsupported_encoding"},
		{name: "snappy", headers: []string{"Content-Encoding", "snappy"}, body: []byte(`{"a":1}`),
			status: 415, reason: "unsupported_encoding"},
		// The OpenTelemetry Collector's otlphttp exporter: its default path,
		// protobuf; or JSON, which would be stored as one record.
		{name: "otlp protobuf", path: "/v1/logs", headers: []string{"Content-Type", "application/x-protobuf"}, body: []byte("\x0a\x02\x08\x01"),
			status: 415, respHas: "OTLP (OpenTelemetry) exports are not taken here", reason: "otlp"},
		{name: "otlp json", headers: []string{"Content-Type", "application/json"}, body: []byte(` {"resourceLogs":[{"scopeLogs":[]}]}`),
			status: 415, respHas: "OTLP (OpenTelemetry) exports are not taken here", reason: "otlp"},
		{name: "deflate not zlib", headers: []string{"Content-Encoding", "deflate"}, body: []byte(`{"a":1}`),
			status: 400, reason: "malformed"},
		{name: "zstd not zstd", headers: []string{"Content-Encoding", "zstd"}, body: []byte(`{"a":1}`),
			status: 400, reason: "malformed"},
		{name: "gzip twice", headers: []string{"Content-Encoding", "gzip, gzip"}, body: gzipped(`{"a":1}`),
			status: 415, reason: "unsupported_encoding"},

		// 404, 405
		{name: "get", method: http.MethodGet, status: 405, header: map[string]string{"Allow": "POST"}, reason: "bad_method"},
		{name: "put", method: http.MethodPut, body: []byte(`{"a":1}`), status: 405, reason: "bad_method"},
		{name: "other path", path: "/v2/logs/app", body: []byte(`{"a":1}`), status: 404, reason: "not_found"},
		{name: "tag with a slash", path: "/v1/logs/a/b", body: []byte(`{"a":1}`), status: 404, reason: "not_found"},
		{name: "root", method: http.MethodGet, path: "/", status: 404, reason: "not_found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var opts []option
			if tc.cfg != nil {
				opts = append(opts, withConfig(tc.cfg))
			}
			e := newEnv(t, opts...)
			method, path := cmpOr(tc.method, http.MethodPost), cmpOr(tc.path, "/v1/logs/app")
			var body io.Reader = bytes.NewReader(tc.body)
			if tc.chunked {
				body = io.MultiReader(body)
			}
			req, err := http.NewRequest(method, e.url+path, body)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i+1 < len(tc.headers); i += 2 {
				req.Header.Set(tc.headers[i], tc.headers[i+1])
			}
			got := e.send(req)
			if got.status != tc.status {
				t.Errorf("status %d, want %d (%s)", got.status, tc.status, got.body)
			}
			if tc.resp != "" && got.body != tc.resp {
				t.Errorf("answer\n%s\nwant\n%s", got.body, tc.resp)
			}
			if tc.respHas != "" && !strings.Contains(got.body, tc.respHas) {
				t.Errorf("answer %s, want it to contain %s", got.body, tc.respHas)
			}
			if tc.status != 200 && !strings.HasPrefix(got.body, `{"error":"`) {
				t.Errorf("answer %s, want {\"error\": ...}", got.body)
			}
			for k, v := range tc.header {
				if h := got.header.Get(k); h != v {
					t.Errorf("header %s: %q, want %q", k, h, v)
				}
			}
			if tc.reason != "" {
				if n := e.rejected(tc.reason); n != 1 {
					t.Errorf("rejected{reason=%q} = %v, want 1", tc.reason, n)
				}
			}
			recs := e.records()
			var bodies []string
			for _, r := range recs {
				bodies = append(bodies, string(r.Body))
				if want := cmpOr(tc.tag, "app"); r.Tag != want {
					t.Errorf("record %d: tag %q, want %q", r.Seq, r.Tag, want)
				}
			}
			if !slices.Equal(bodies, tc.stored) {
				t.Errorf("WAL holds\n%q\nwant\n%q", bodies, tc.stored)
			}
			if n := testutil.ToFloat64(e.m.Records.WithLabelValues(input)); n != float64(len(tc.stored)) {
				t.Errorf("records counted %v, want %d", n, len(tc.stored))
			}
		})
	}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func TestGzipBombIsSmall(t *testing.T) {
	if n := len(gzipped(strings.Repeat(" ", 8<<20))); n > 64<<10 {
		t.Fatalf("the gzip bomb is %d bytes compressed: not a bomb", n)
	}
}

// TestEventTime checks every time format end to end: the record's time,
// and the field kept in its body.
func TestEventTime(t *testing.T) {
	ts := func(s string) int64 {
		tm, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return tm.UnixNano()
	}
	const received = -1 // the receive time
	const badTime = -3  // the receive time, for a field that is no time (counted)
	tests := []struct {
		name      string
		timeField string
		body      string
		want      int64
	}{
		{"rfc 3339", "time", `{"time":"2024-05-01T12:00:00Z","m":1}`, ts("2024-05-01T12:00:00Z")},
		{"rfc 3339 nano with offset", "time", `{"time":"2024-05-01T14:00:00.123456789+02:00"}`, ts("2024-05-01T12:00:00.123456789Z")},
		{"rfc 3339 millis", "time", `{"time":"2024-05-01T12:00:00.5Z"}`, ts("2024-05-01T12:00:00.5Z")},
		{"escaped string", "time", `{"time":"2024-05-01T12:00:00\u005a"}`, ts("2024-05-01T12:00:00Z")},
		{"epoch seconds", "time", `{"time":1714564800}`, 1714564800 * 1e9},
		{"epoch seconds fractional", "time", `{"time":1714564800.123456789}`, 1714564800123456789},
		{"epoch seconds past nanoseconds", "time", `{"time":1714564800.1234567891234}`, 1714564800123456789},
		{"epoch seconds exponent", "time", `{"time":1.7145648e9}`, 1714564800 * 1e9},
		{"epoch milliseconds", "time", `{"time":1714564800123}`, 1714564800123 * 1e6},
		{"epoch milliseconds fractional", "time", `{"time":1714564800123.5}`, 1714564800123500000},
		{"epoch microseconds", "time", `{"time":1714564800123456}`, 1714564800123456 * 1e3},
		{"epoch microseconds fractional", "time", `{"time":1714564800123456.7}`, 1714564800123456700},
		{"epoch nanoseconds", "time", `{"time":1714564800123456789}`, 1714564800123456789},
		{"epoch microseconds exponent", "time", `{"time":1.714564800123456e15}`, 1714564800123456 * 1e3},
		{"epoch 1e11 is seconds", "time", `{"time":100000000000}`, badTime}, // out of range as seconds
		// What clients write besides strict RFC 3339.
		{"space for the T", "time", `{"time":"2024-05-01 12:00:00+00:00"}`, ts("2024-05-01T12:00:00Z")},
		{"lower case", "time", `{"time":"2024-05-01t12:00:00.5z"}`, ts("2024-05-01T12:00:00.5Z")},
		{"offset without a colon", "time", `{"time":"2024-05-01T14:00:00+0200"}`, ts("2024-05-01T12:00:00Z")},
		{"no offset is UTC", "time", `{"time":"2024-05-01T12:00:00.123456"}`, ts("2024-05-01T12:00:00.123456Z")},
		{"space and no offset", "time", `{"time":"2024-05-01 12:00:00"}`, ts("2024-05-01T12:00:00Z")},
		// No time the input reads: the time of arrival (counted, below).
		{"not a time", "time", `{"time":"yesterday"}`, badTime},
		{"empty string", "time", `{"time":""}`, badTime},
		{"a boolean", "time", `{"time":true}`, badTime},
		{"float out of range", "time", `{"time":1e300}`, badTime},
		{"past 2262", "time", `{"time":"9999-01-01T00:00:00Z"}`, badTime},
		{"more digits than nanoseconds hold", "time", `{"time":12345678901234567890}`, badTime},
		{"negative epoch", "time", `{"time":-1.5}`, -1500000000},
		{"zero", "time", `{"time":0}`, 0},
		{"null is no time", "time", `{"time":null}`, received},
		{"missing field", "time", `{"when":"2024-05-01T12:00:00Z"}`, received},
		{"nested field does not count", "time", `{"a":{"time":"2024-05-01T12:00:00Z"}}`, received},
		{"last of duplicate keys", "time", `{"time":1,"time":2}`, 2e9},
		{"escaped key", "time", `{"ti\u006de":3}`, 3e9},
		{"other field name", "ts", `{"time":"bad","ts":"2024-05-01T12:00:00Z"}`, ts("2024-05-01T12:00:00Z")},
		{"no time field configured", "", `{"time":"not a time"}`, received},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, withConfig(func(c *config.HTTP) { c.TimeField = tc.timeField }))
			before := time.Now().UnixNano()
			got := e.post("/v1/logs/app", []byte(tc.body))
			after := time.Now().UnixNano()
			if got.status != 200 {
				t.Fatalf("answer %d %s", got.status, got.body)
			}
			recs := e.records()
			if len(recs) != 1 {
				t.Fatalf("%d records, want 1", len(recs))
			}
			if string(recs[0].Body) != tc.body {
				t.Errorf("body %s, want %s (the time field kept)", recs[0].Body, tc.body)
			}
			bad := testutil.ToFloat64(e.m.BadTime.WithLabelValues(input))
			switch {
			case tc.want == received || tc.want == badTime:
				if recs[0].Time < before || recs[0].Time > after {
					t.Errorf("time %d, want the receive time in [%d, %d]", recs[0].Time, before, after)
				}
				if wantBad := map[bool]float64{true: 1}[tc.want == badTime]; bad != wantBad {
					t.Errorf("bad times counted %v, want %v", bad, wantBad)
				}
			case bad != 0:
				t.Errorf("bad times counted %v, want 0", bad)
			case recs[0].Time != tc.want:
				t.Errorf("time %d (%s), want %d (%s)", recs[0].Time, time.Unix(0, recs[0].Time).UTC(), tc.want, time.Unix(0, tc.want).UTC())
			}
		})
	}
}

// TestBadTimeKeepsTheBatch: a record whose time field is no time the input
// reads (an application's own "time" in another form) does not cost the
// other records of the request, which clients drop when refused with a
// 4xx: every record is stored, that one with the time of arrival and its
// field as sent, counted, and one warning a minute names the field and
// an example.
func TestBadTimeKeepsTheBatch(t *testing.T) {
	var logs syncbuf.Buffer
	e := newEnv(t, withLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	body := []byte(`[{"log":"a"},{"time":"10 May 2024","log":"b"},{"log":"c","time":"2024-05-01T12:00:00Z"}]`)
	for range 2 {
		if r := e.post("/v1/logs/app", body); r.status != 200 || r.body != `{"stored":3}` {
			t.Fatalf("answer %d %s, want 200 and 3 stored", r.status, r.body)
		}
	}
	if n := len(e.records()); n != 6 {
		t.Fatalf("%d records stored, want 6", n)
	}
	if n := testutil.ToFloat64(e.m.BadTime.WithLabelValues(input)); n != 2 {
		t.Errorf("bad times counted %v, want 2", n)
	}
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 || !strings.Contains(logs.String(), `example="record 2: field \"time\": \"10 May 2024\" is not an RFC 3339 time"`) {
		t.Errorf("%d warnings, want one naming the field and an example:\n%s", n, logs.String())
	}
}

func TestIdempotencyKey(t *testing.T) {
	e := newEnv(t)
	body := []byte("{\"a\":1}\n{\"a\":2}\n{\"a\":3}\n")
	first := e.post("/v1/logs/app", body, "Idempotency-Key", "req-1")
	if first.status != 200 || first.body != `{"stored":3}` || first.header.Get("X-Duplicate") != "" {
		t.Fatalf("first: %d %s X-Duplicate=%q", first.status, first.body, first.header.Get("X-Duplicate"))
	}
	again := e.post("/v1/logs/app", body, "Idempotency-Key", "req-1")
	if again.status != 200 || again.body != `{"stored":3}` || again.header.Get("X-Duplicate") != "true" {
		t.Fatalf("re-send: %d %s X-Duplicate=%q, want 200 {\"stored\":3} true", again.status, again.body, again.header.Get("X-Duplicate"))
	}
	if n := len(e.records()); n != 3 {
		t.Fatalf("WAL holds %d records after a re-send, want 3", n)
	}
	other := e.post("/v1/logs/app", body, "Idempotency-Key", "req-2")
	if other.status != 200 || other.header.Get("X-Duplicate") != "" {
		t.Fatalf("another key: %d %s", other.status, other.body)
	}
	none := e.post("/v1/logs/app", body)
	if none.status != 200 {
		t.Fatalf("no key: %d %s", none.status, none.body)
	}
	if n := len(e.records()); n != 9 {
		t.Fatalf("WAL holds %d records, want 9", n)
	}
	if n := testutil.ToFloat64(e.m.Deduplicated.WithLabelValues(input)); n != 3 {
		t.Errorf("deduplicated %v, want 3", n)
	}
}

// An Idempotency-Key names one request, its tag and body: sent again with
// them it is a duplicate (200), with another tag or body it is refused
// (422) and nothing is stored, as idempotent HTTP APIs answer.
func TestIdempotencyKeyReused(t *testing.T) {
	e := newEnv(t)
	body := "{\"a\":1}\n{\"a\":2}\n"
	if r := e.post("/v1/logs/app", []byte(body), "Idempotency-Key", "k"); r.status != 200 || r.body != `{"stored":2}` {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	// The same request, gzipped: the same body once decompressed.
	if r := e.post("/v1/logs/app", gzipped(body), "Idempotency-Key", "k", "Content-Encoding", "gzip"); r.status != 200 || r.header.Get("X-Duplicate") != "true" {
		t.Fatalf("same request again: %d %s X-Duplicate=%q", r.status, r.body, r.header.Get("X-Duplicate"))
	}
	for _, c := range []struct{ name, path, body string }{
		{"another body", "/v1/logs/app", "{\"a\":1}\n{\"a\":3}\n"},
		{"another tag", "/v1/logs/other", body},
		{"one more record", "/v1/logs/app", body + "{\"a\":3}\n"},
	} {
		r := e.post(c.path, []byte(c.body), "Idempotency-Key", "k")
		if r.status != 422 || !strings.Contains(r.body, "Idempotency-Key already used") || r.header.Get("X-Duplicate") != "" {
			t.Errorf("%s: %d %s, want 422", c.name, r.status, r.body)
		}
	}
	if n := len(e.records()); n != 2 {
		t.Fatalf("WAL holds %d records, want the first request's 2", n)
	}
	if n := e.rejected("idempotency_conflict"); n != 3 {
		t.Errorf("rejected{idempotency_conflict} = %v, want 3", n)
	}
}

// Keys of up to 1,024 bytes are taken, whatever the WAL puts before them to
// keep them apart from forward chunk ids; a longer one is refused with 400,
// which a client does not retry, never with a 5xx, which it would retry
// for ever.
func TestIdempotencyKeyLength(t *testing.T) {
	e := newEnv(t)
	for n := 1019; n <= 1024; n++ {
		key := strings.Repeat("k", n)
		r := e.post("/v1/logs/app", []byte(fmt.Sprintf(`{"n":%d}`, n)), "Idempotency-Key", key)
		if r.status != 200 {
			t.Fatalf("a key of %d bytes: %d %s", n, r.status, r.body)
		}
		if r := e.post("/v1/logs/app", []byte(fmt.Sprintf(`{"n":%d}`, n)), "Idempotency-Key", key); r.status != 200 || r.header.Get("X-Duplicate") != "true" {
			t.Fatalf("a key of %d bytes again: %d %s", n, r.status, r.body)
		}
	}
	r := e.post("/v1/logs/app", []byte(`{"n":1025}`), "Idempotency-Key", strings.Repeat("k", 1025))
	if r.status != 400 || !strings.Contains(r.body, "Idempotency-Key longer than 1024 bytes") {
		t.Fatalf("a key of 1025 bytes: %d %s", r.status, r.body)
	}
	if n := len(e.records()); n != 6 {
		t.Fatalf("WAL holds %d records, want 6", n)
	}
}

func TestUnrouted(t *testing.T) {
	e := newEnv(t, withRouted(func(tag string) bool { return tag != "nobody.wants" }))
	got := e.post("/v1/logs/nobody.wants", []byte("{\"a\":1}\n{\"a\":\"\xff\"}\n"))
	if got.status != 200 || got.body != `{"stored":2,"unrouted":2}` {
		t.Fatalf("unrouted: %d %s, want 200 {\"stored\":2,\"unrouted\":2}", got.status, got.body)
	}
	if n := len(e.records()); n != 0 {
		t.Fatalf("WAL holds %d unrouted records", n)
	}
	if n := testutil.ToFloat64(e.m.Unrouted.WithLabelValues(input)); n != 2 {
		t.Errorf("unrouted counted %v, want 2", n)
	}
	if n := testutil.ToFloat64(e.m.InvalidUTF8.WithLabelValues(input)); n != 0 {
		t.Errorf("invalid UTF-8 counted %v for records not stored", n)
	}
	routed := e.post("/v1/logs/app", []byte(`{"a":1}`))
	if routed.status != 200 || routed.body != `{"stored":1}` {
		t.Fatalf("routed: %d %s", routed.status, routed.body)
	}
	if n := len(e.records()); n != 1 {
		t.Fatalf("WAL holds %d records, want 1", n)
	}
}

func TestInvalidUTF8Counted(t *testing.T) {
	e := newEnv(t)
	got := e.post("/v1/logs/app", []byte("[{\"m\":\"\xff\xfe\"},{\"m\":\"fine\"},{\"m\":\"\xed\xa0\x80\"}]"))
	if got.status != 200 || got.body != `{"stored":3}` {
		t.Fatalf("%d %s", got.status, got.body)
	}
	want := []string{"{\"m\":\"\uFFFD\"}", `{"m":"fine"}`, "{\"m\":\"\uFFFD\"}"}
	if b := e.bodies(); !slices.Equal(b, want) {
		t.Errorf("WAL holds %q, want %q", b, want)
	}
	if n := testutil.ToFloat64(e.m.InvalidUTF8.WithLabelValues(input)); n != 2 {
		t.Errorf("invalid UTF-8 counted %v, want 2", n)
	}
	// Refused requests count nothing.
	e.post("/v1/logs/app", []byte("{\"m\":\"\xff\"}\nbad"))
	if n := testutil.ToFloat64(e.m.InvalidUTF8.WithLabelValues(input)); n != 2 {
		t.Errorf("invalid UTF-8 counted %v after a refused request, want 2", n)
	}
}

// failingWAL fails every append with err.
type failingWAL struct{ err error }

func (f failingWAL) Append(context.Context, []wal.Record, wal.AppendOptions) (wal.Result, error) {
	return wal.Result{}, f.err
}
func (f failingWAL) Full() bool     { return false }
func (f failingWAL) DiskFull() bool { return false }

func TestAppendErrors(t *testing.T) {
	tests := []struct {
		err    error
		status int
		reason string
	}{
		{fmt.Errorf("commit: %w", wal.ErrFatal), 503, "wal_error"},
		{errors.New("something else"), 503, "wal_error"},
		{fmt.Errorf("%w: disk", wal.ErrNoSpace), 503, "wal_full"},
		{fmt.Errorf("%w: 9 bytes", wal.ErrTooLarge), 413, "too_large"},
		{wal.ErrClosed, 503, "shutting_down"},
		// The store's deadline passed, the WAL not full: a slow commit, not a full WAL.
		{fmt.Errorf("append: %w", context.DeadlineExceeded), 503, "store_timeout"},
	}
	for _, tc := range tests {
		t.Run(tc.err.Error(), func(t *testing.T) {
			e := newEnv(t, withAppender(func(*wal.WAL) inputs.Appender { return failingWAL{tc.err} }))
			got := e.post("/v1/logs/app", []byte(`{"a":1}`))
			if got.status != tc.status {
				t.Errorf("status %d %s, want %d", got.status, got.body, tc.status)
			}
			if strings.Contains(got.body, "something else") {
				t.Errorf("answer %s shows the internal error", got.body)
			}
			if tc.status == 503 && got.header.Get("Retry-After") != "1" {
				t.Errorf("Retry-After %q, want 1", got.header.Get("Retry-After"))
			}
			if n := e.rejected(tc.reason); n != 1 {
				t.Errorf("rejected{reason=%q} = %v, want 1", tc.reason, n)
			}
		})
	}
}

// diskFullWAL is a WAL whose appends wait for room on the disk.
type diskFullWAL struct{ failingWAL }

func (diskFullWAL) Full() bool     { return true }
func (diskFullWAL) DiskFull() bool { return true }

// A WAL holding appends for room on its disk is answered at once with a
// 503 that names the disk, before the body is read.
func TestDiskFullPushesBack(t *testing.T) {
	e := newEnv(t, withAppender(func(*wal.WAL) inputs.Appender { return diskFullWAL{failingWAL{errors.New("not called")}} }))
	got := e.post("/v1/logs/app", []byte(`{"a":1}`))
	if got.status != 503 || !strings.Contains(got.body, "no space left on the WAL's disk") || got.header.Get("Retry-After") != "1" {
		t.Errorf("answer %d %s (Retry-After %q), want 503 naming the disk, Retry-After 1", got.status, got.body, got.header.Get("Retry-After"))
	}
	if n := e.rejected("wal_full"); n != 1 {
		t.Errorf("rejected{reason=wal_full} = %v, want 1", n)
	}
}

// A zstd body's frame window is held from the inputs' budget while it is
// decoded: one asking for more than a request may hold is refused as over
// the budget, not decoded outside it; one over 8 MiB is refused outright.
func TestZstdWindowIsHeld(t *testing.T) {
	frame := func(window int) []byte {
		var buf bytes.Buffer
		zw, err := zstd.NewWriter(&buf, zstd.WithWindowSize(window), zstd.WithSingleSegment(false), zstd.WithEncoderConcurrency(1))
		if err != nil {
			t.Fatal(err)
		}
		zw.Write([]byte(`{"a":1}`))
		zw.Flush() // a streamed frame: its header names the window, not the content's size
		zw.Close()
		var h zstd.Header
		if err := h.Decode(buf.Bytes()); err != nil || h.WindowSize != uint64(window) {
			t.Fatalf("a frame of window %d: %d (%v)", window, h.WindowSize, err)
		}
		return buf.Bytes()
	}
	e := newEnv(t, withBudget(4<<20))
	if r := e.post("/v1/logs/app", frame(1<<20), "Content-Encoding", "zstd"); r.status != 200 {
		t.Errorf("a window of 1 MiB: %d %s", r.status, r.body)
	}
	if r := e.post("/v1/logs/app", frame(8<<20), "Content-Encoding", "zstd"); r.status != 413 || !strings.Contains(r.body, "memory") {
		t.Errorf("a window of 8 MiB in a budget of 4 MiB: %d %s, want 413 over the budget", r.status, r.body)
	}
	e = newEnv(t)
	if r := e.post("/v1/logs/app", frame(16<<20), "Content-Encoding", "zstd"); r.status != 400 || !strings.Contains(r.body, "at most 8388608") {
		t.Errorf("a window of 16 MiB: %d %s, want 400", r.status, r.body)
	}
}
