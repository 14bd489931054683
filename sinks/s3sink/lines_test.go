package s3sink

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/logfwd/forwarder/sinks"
)

func TestLines(t *testing.T) {
	at := time.Date(2025, 6, 15, 15, 6, 40, 120_000_000, time.UTC).UnixNano()
	const ts = `"@timestamp":"2025-06-15T15:06:40.120000000Z"`
	tests := []struct {
		name, timeKey, tagKey, tag, body, want string
	}{
		{"time added first", "@timestamp", "", "app", `{"a":1}`, `{` + ts + `,"a":1}`},
		{"present time kept", "@timestamp", "", "app", `{"a":1,"@timestamp":"mine"}`, `{"a":1,"@timestamp":"mine"}`},
		{"null time kept", "@timestamp", "", "app", `{"@timestamp":null}`, `{"@timestamp":null}`},
		{"nested key is not top level", "@timestamp", "", "app", `{"b":{"@timestamp":1}}`, `{` + ts + `,"b":{"@timestamp":1}}`},
		{"key in a string value", "@timestamp", "", "app", `{"m":"\"@timestamp\":1"}`, `{` + ts + `,"m":"\"@timestamp\":1"}`},
		{"escaped key is the key", "@timestamp", "", "app", `{"\u0040timestamp":1}`, `{"\u0040timestamp":1}`},
		{"other escapes", "@timestamp", "", "app", `{"m":"\u00e9"}`, `{` + ts + `,"m":"\u00e9"}`},
		{"empty object", "@timestamp", "", "app", `{}`, `{` + ts + `}`},
		{"tag after time", "@timestamp", "tag", "a.b", `{"x":true}`, `{` + ts + `,"tag":"a.b","x":true}`},
		{"tag only", "", "tag", "a.b", `{"x":true}`, `{"tag":"a.b","x":true}`},
		{"tag present", "", "tag", "a.b", `{"tag":"t"}`, `{"tag":"t"}`},
		{"tag into empty", "", "tag", "a", `{}`, `{"tag":"a"}`},
		// The bytes this sink always wrote for such a tag (which records
		// stored before the inputs checked tags can have): Recover must
		// rebuild them as they were.
		{"tag escaped", "", "tag", "q\"\\\n\x01\xff", `{}`, `{"tag":"q\"\\\n\u0001\ufffd"}`},
		{"no keys", "", "", "a", `{"x":1}`, `{"x":1}`},
		{"key with slash", "a/b", "", "a", `{"a\/b":1}`, `{"a\/b":1}`},
		{"not an object", "@timestamp", "tag", "a", `[1,2]`, `[1,2]`},
		{"arrays and nesting skipped", "@timestamp", "", "a", `{"a":[{"@timestamp":1},"}"],"b":{"c":[]},"@timestamp":2}`, `{"a":[{"@timestamp":1},"}"],"b":{"c":[]},"@timestamp":2}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := newLiner(tc.timeKey, tc.tagKey)
			r := &sinks.Record{Time: at, Tag: tc.tag, Body: []byte(tc.body)}
			got := string(l.appendLine(nil, r, new(timestamps)))
			if got != tc.want {
				t.Errorf("line = %s\nwant   %s", got, tc.want)
			}
			if n := l.lineLen(r); n != len(got) {
				t.Errorf("lineLen = %d, line is %d bytes", n, len(got))
			}
			if !json.Valid([]byte(got)) {
				t.Errorf("line %s is not JSON", got)
			}
		})
	}
}

func TestTimestampFormat(t *testing.T) {
	for _, tc := range []struct {
		at   time.Time
		want string
	}{
		{time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC), "2025-01-02T03:04:05.000000006Z"},
		{time.Date(2025, 12, 31, 23, 59, 59, 999_999_999, time.FixedZone("x", 3600)), "2025-12-31T22:59:59.999999999Z"},
		{time.Unix(0, 0), "1970-01-01T00:00:00.000000000Z"},
		{time.Unix(0, -1), "1969-12-31T23:59:59.999999999Z"},
	} {
		got := string(appendTimestamp(nil, tc.at.UnixNano()))
		if got != tc.want || len(got) != timestampLen {
			t.Errorf("%v: %s, want %s", tc.at, got, tc.want)
		}
		if p, err := time.Parse(time.RFC3339Nano, got); err != nil || !p.Equal(tc.at) {
			t.Errorf("%s parses as %v, %v", got, p, err)
		}
	}
}

// TestTimestampsCache: the cached formatter writes what appendTimestamp
// writes, for times in order (the same second again and again), out of
// order, far apart and before 1970.
func TestTimestampsCache(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var ts timestamps
	at := time.Date(2025, 6, 15, 15, 6, 40, 0, time.UTC).UnixNano()
	check := func(ns int64) {
		t.Helper()
		if got, want := string(ts.append(nil, ns)), string(appendTimestamp(nil, ns)); got != want {
			t.Fatalf("%d: %s, want %s", ns, got, want)
		}
	}
	for range 100_000 {
		switch rng.IntN(10) {
		case 0:
			at = rng.Int64N(1<<62) - 1<<61 // anywhere from 1823 to 2116
		case 1:
			at -= rng.Int64N(3e9)
		default:
			at += rng.Int64N(2e6)
		}
		check(at)
	}
	for _, ns := range []int64{-1, 0, -1e9, -1e9 - 1, 1e9 - 1, 1e9, -1e9 + 1, math.MinInt64, math.MaxInt64, 1, -1} {
		check(ns)
	}
}

func TestMemberFinder(t *testing.T) {
	f := newMemberFinder("@timestamp")
	if f.rare != '@' || f.rareOff != 1 || !f.plain {
		t.Errorf("finder %+v", f)
	}
	for body, want := range map[string]bool{
		`{"@timestamp":1}`:           true,
		`{"a":1,"@timestamp":1}`:     true,
		`{"a":"@timestamp"}`:         false,
		`{"a":"\"@timestamp\":"}`:    false,
		`{"a":{"@timestamp":1}}`:     false,
		`{"\u0040timestamp":1}`:      true,
		`{"a":"\\u0040","b":"@"}`:    false,
		`{"@timestamp`:               false,
		`@timestamp"`:                false,
		`{"x":"a@b","@timestamp":2}`: true,
	} {
		if got := f.in([]byte(body)); got != want {
			t.Errorf("%s: %v, want %v", body, got, want)
		}
	}
	if hasUnicodeEscape([]byte(`"\\u"`)) || !hasUnicodeEscape([]byte(`"\\\u0041"`)) {
		t.Error("hasUnicodeEscape misreads escaped backslashes")
	}
}
