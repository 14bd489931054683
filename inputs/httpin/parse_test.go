package httpin

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/logfwd/forwarder/inputs"
)

func TestEpochNanos(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		err  bool
	}{
		{"0", 0, false},
		{"-0", 0, false},
		{"1714564800", 1714564800e9, false},
		{"1714564800.5", 1714564800500000000, false},
		{"1714564800.000000001", 1714564800000000001, false},
		{"1714564800.0000000019", 1714564800000000001, false}, // past the nanosecond: dropped
		{"-1.25", -1250000000, false},
		{"99999999999", 0, true},                      // seconds, past 2262
		{"100000000000", 0, true},                     // 1e11 itself is seconds: past 2262
		{"100000000000.5", 100000000000500000, false}, // above 1e11: milliseconds
		{"1714564800123", 1714564800123e6, false},
		{"1714564800123.456789", 1714564800123456789, false},
		{"9223372036", 9223372036e9, false},
		{"9223372037", 0, true},
		{"9223372036854", 9223372036854e6, false},
		{"9223372036854.775807", math.MaxInt64, false},
		{"9223372036854.775808", 0, true},
		{"92233720368547", 0, true},
		{"123456789012345678901234567890", 0, true},
		{"1e3", 1000e9, false},
		{"1.7145648E+9", 1714564800e9, false},
		{"1.5e12", 1.5e18, false}, // milliseconds
		{"1e400", 0, true},
		{"-1e300", 0, true},
		{"1e-400", 0, false},
	}
	for _, tc := range tests {
		got, err := epochNanos([]byte(tc.in))
		if tc.err {
			if err == nil || !errors.Is(err, errTimeRange) {
				t.Errorf("%s: %d, %v; want out of range", tc.in, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

// TestBodiesDoNotAlias: a record's body has no room to grow into the next.
func TestBodiesDoNotAlias(t *testing.T) {
	recs, _, err := parseBody([]byte("{\"a\":1}\n{\"b\":2}\n"), "t", "time", time.Now())
	if err != nil || len(recs) != 2 {
		t.Fatal(recs, err)
	}
	_ = append(recs[0].Body, "xxxxxxxx"...)
	if string(recs[1].Body) != `{"b":2}` {
		t.Fatalf("appending to one body changed the next: %s", recs[1].Body)
	}
}

// TestParseErrorsReturnNothing: a body with an error anywhere gives no
// records, whatever came before it.
func TestParseErrorsReturnNothing(t *testing.T) {
	good := strings.Repeat("{\"a\":1}\n", 100)
	for _, body := range []string{good + "{", good + `{"time":"x"`, "[" + strings.Repeat(`{"a":1},`, 100) + "1]", good + "\"s\""} {
		recs, stats, err := parseBody([]byte(body), "t", "time", time.Now())
		if err == nil || recs != nil || stats != (parseStats{}) {
			t.Errorf("body ending %q: %d records, %v; want an error and nothing", body[len(body)-10:], len(recs), err)
		}
	}
}

func TestParseReceiveTime(t *testing.T) {
	now := time.Unix(1700000000, 5)
	recs, _, err := parseBody([]byte(`[{"a":1},{"time":null},{"time":2}]`), "t", "time", now)
	if err != nil {
		t.Fatal(err)
	}
	want := []int64{now.UnixNano(), now.UnixNano(), 2e9}
	for i, r := range recs {
		if r.Time != want[i] {
			t.Errorf("record %d: time %d, want %d", i, r.Time, want[i])
		}
	}
}

// slowReader gives first at once, then waits pause, then gives rest.
type slowReader struct {
	first, rest []byte
	pause       time.Duration
	waited      bool
}

func (r *slowReader) Read(p []byte) (int, error) {
	if len(r.first) > 0 {
		n := copy(p, r.first)
		r.first = r.first[n:]
		return n, nil
	}
	if !r.waited {
		time.Sleep(r.pause)
		r.waited = true
	}
	if len(r.rest) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.rest)
	r.rest = r.rest[n:]
	return n, nil
}

// TestBodyWaitsForMemoryWhenItGrows: a body that arrives slowly may wait
// for room in the inputs' memory budget when its buffer grows, however
// long ago it began: the wait's bound counts time spent waiting, not the
// time its bytes took to arrive.
func TestBodyWaitsForMemoryWhenItGrows(t *testing.T) {
	budget := inputs.NewBudget(64<<10, nil)
	other := budget.Hold(input)
	if err := other.Grow(context.Background(), 40<<10); err != nil {
		t.Fatal(err)
	}
	hold := budget.Hold(input)
	defer hold.ReleaseAll()
	r := &slowReader{first: bytes.Repeat([]byte("a"), 10<<10), rest: bytes.Repeat([]byte("b"), 14<<10), pause: 400 * time.Millisecond}
	go func() { // the other hold gives its room back once the body has waited a moment for it
		time.Sleep(500 * time.Millisecond)
		other.ReleaseAll()
	}()
	b, err := readAll(context.Background(), r, 1<<20, -1, hold, &waitBudget{left: 300 * time.Millisecond})
	if err != nil || len(b) != 24<<10 {
		t.Fatalf("read %d bytes, error %v: want the body whole, the buffer grown after a wait", len(b), err)
	}
	releaseBuf(hold, b)
}

// Numbers that are not finite, as Fluent Bit (nan, -nan, inf, -inf) and
// Python's json (NaN, Infinity, -Infinity) write them, are stored as null
// and counted, not the whole request refused; such words anywhere else
// (unfinished, or as a record) are still bad input.
func TestParseNonFiniteNumbers(t *testing.T) {
	body := "{\"a\":nan,\"b\":-nan}\n{\"c\":[inf,-inf, NaN ,Infinity,-Infinity],\"d\":{\"e\":-NaN}}\n{\"ok\":1.5,\"n\":null}\n"
	recs, stats, err := parseBody([]byte(body), "t", "time", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`{"a":null,"b":null}`, `{"c":[null,null,null,null,null],"d":{"e":null}}`, `{"ok":1.5,"n":null}`}
	for i, r := range recs {
		if string(r.Body) != want[i] {
			t.Errorf("record %d: %s, want %s", i, r.Body, want[i])
		}
	}
	if len(recs) != 3 || stats.nonFinite != 8 {
		t.Errorf("%d records, %d non-finite counted; want 3 and 8", len(recs), stats.nonFinite)
	}
	// A time field of nan is no time: the record takes the time of
	// arrival, and is counted as such.
	now := time.Unix(1700000000, 0)
	recs, stats, err = parseBody([]byte(`{"time":nan,"a":1}`+"\n"+`{"time":null}`), "t", "time", now)
	if err != nil || len(recs) != 2 || recs[0].Time != now.UnixNano() || stats.badTime != 1 || !strings.Contains(stats.badTimeWhy, "not a finite number") {
		t.Errorf("a time of nan: %d records, time %d, bad_time %d (%q), %v", len(recs), recs[0].Time, stats.badTime, stats.badTimeWhy, err)
	}
	for _, bad := range []string{`{"a":nanx}`, `{"a":infinity}`, `{"a":-na}`, `{"a":Nan}`, "nan\n", `{"a":+inf}`} {
		if _, _, err := parseBody([]byte(bad), "t", "time", time.Now()); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}

// "null" is longer than "nan" and "inf": a body of them grows past its own
// length, and what it grows to is reserved from the budget like the rest.
func TestParseNonFiniteGrowsWithinTheBudget(t *testing.T) {
	const n = 16381 // a body of 64 KiB: a buffer class of its own length, no room to spare
	body := []byte(`{"a":[inf` + strings.Repeat(",inf", n) + `] }`)
	if inputs.BufClass(len(body)) != len(body) {
		t.Fatalf("a body of %d bytes gets a buffer of %d: the test needs one of its length", len(body), inputs.BufClass(len(body)))
	}
	budget := inputs.NewBudget(1<<20, nil)
	hold := budget.Hold(input)
	defer hold.ReleaseAll()
	var buf []byte
	recs, stats, err := parseInto(&buf, body, "t", "time", time.Now(), limits{hold: hold})
	if err != nil || len(recs) != 1 || stats.nonFinite != n+1 {
		t.Fatalf("%d records, %d non-finite, %v", len(recs), stats.nonFinite, err)
	}
	if want := len(body) - 1 + n + 1; len(recs[0].Body) != want { // the space compacted away
		t.Fatalf("record of %d bytes, want %d", len(recs[0].Body), want)
	}
	if held := hold.Held(); int64(cap(buf)) > held {
		t.Errorf("a buffer of %d bytes, %d held from the budget", cap(buf), held)
	}
	releaseRecords(hold, recs)
	releaseBuf(hold, buf)
}
