package forward

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/tinylib/msgp/msgp"

	"github.com/logfwd/forwarder/inputs"
)

// Strings of every length around the eight-byte steps, with a byte that needs escaping (or
// is not ASCII) at every position, come back unchanged through encoding/json.
func TestStrRoundTrip(t *testing.T) {
	g := &tightGrower{t: t}
	tc := transcoder{grow: g.grow}
	for n := range 40 {
		for pos := range n {
			for _, c := range []string{"\"", "\\", "\n", "\x01", "\x7f", "é", "€", "\U0001F600"} {
				s := strings.Repeat("x", pos) + c + strings.Repeat("y", n-pos)
				out, err := tc.str(nil, []byte(s))
				if err != nil {
					t.Fatal(err)
				}
				g.check(out)
				var back string
				if err := json.Unmarshal(out, &back); err != nil || back != s {
					t.Fatalf("str(%q) = %s: decoded %q, %v", s, out, back, err)
				}
			}
		}
	}
	if tc.invalidUTF8 {
		t.Fatal("valid UTF-8 flagged as invalid")
	}
	out, _ := tc.str(nil, []byte("abcdefgh\xffabcdefgh"))
	if string(out) != `"abcdefgh\ufffdabcdefgh"` || !tc.invalidUTF8 {
		t.Fatalf("invalid byte: %s, flagged %v", out, tc.invalidUTF8)
	}
}

// tightGrower gives a transcoder exactly the room it asks for, and fails
// the test when the buffer it is handed (or, with check, the transcoder's
// output) is not the one it gave last: an append that grew the buffer by
// itself, past the budget.
type tightGrower struct {
	t    testing.TB
	last []byte
}

func (g *tightGrower) grow(dst []byte, n int) ([]byte, error) {
	g.check(dst)
	g.last = make([]byte, len(dst), len(dst)+n)
	copy(g.last, dst)
	return g.last, nil
}

func (g *tightGrower) check(out []byte) {
	g.t.Helper()
	if cap(out) > 0 && (cap(out) != cap(g.last) || &out[:1][0] != &g.last[:1][0]) {
		g.t.Fatalf("the transcoder grew its buffer by itself (cap %d, last given %d)", cap(out), cap(g.last))
	}
}

// The transcoder asks for room before every append, whatever the record:
// given exactly the room it asks for, it never has to grow a buffer itself.
func TestTranscoderAsksForRoom(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	long := strings.Repeat("x", 3000)
	recs := [][]byte{
		record(),
		record("log", "hello", "n", 1, "f", 1.5, "neg", -12345678901, "b", true, "nil", nil),
		record("esc", "a\"b\\c\nd\re\tf\x01g\x7f", "bad", "x\xff\xfey", "long", long+"\n"+long),
		record("strings", []any{"a", "bc", long}, "maps", []any{map[string]any{}, map[string]any{"k": "v"}}),
		record("bin", []byte(long), "nested", map[string]any{"a": []any{1, "two", 3.0, nil, map[string]any{"k": "v"}}}),
		[]byte("\x82\x01\xa1x\xc3\xa1y"),                                               // {1: "x", true: "y"}
		append([]byte("\x81\xa1t"), eventTime(t0)...),                                  // an EventTime value
		append([]byte("\x81"), append(eventTime(t0), 0xa1, 'v')...),                    // an EventTime key
		append([]byte("\x81\xa1e"), 0xc7, 3, 5, 'a', 'b', 'c'),                         // another extension
		append([]byte("\x81\x91"), append(msgp.AppendString(nil, long), 0xa1, 'v')...), // an array key
	}
	for i, rec := range recs {
		g := &tightGrower{t: t}
		tc := transcoder{grow: g.grow}
		out, rest, err := tc.record(nil, rec)
		if err != nil || len(rest) != 0 {
			t.Fatalf("record %d: %v, %d bytes left", i, err, len(rest))
		}
		g.check(out)
		if !json.Valid(out) {
			t.Fatalf("record %d: %q is not JSON", i, out)
		}
	}
}

// Records decoded into buffers that fill (the JSON outgrows the msgpack:
// binary values, non-string keys whose text crosses a buffer's end) read
// the same as transcoded into one growing slice: a record continued in a
// new buffer (decoder.growJSON) keeps its bytes, and so does a key whose
// text moved with it.
func TestChunkedJSONMatchesOneBuffer(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var entries [][]byte
	for range 3000 {
		bin := make([]byte, rng.IntN(400))
		for i := range bin {
			bin[i] = byte(rng.IntN(256))
		}
		rec := msgp.AppendMapHeader(nil, 3)
		rec = msgp.AppendString(rec, "log")
		rec = msgp.AppendBytes(rec, bin)
		rec = msgp.AppendInt(rec, rng.IntN(1000)) // a key that is not a string
		rec = msgp.AppendBytes(rec, bin[:len(bin)/2])
		rec = msgp.AppendMapHeader(rec, 1) // a map key: its JSON text as the key
		rec = msgp.AppendString(rec, string(bin[:min(len(bin), 40)]))
		rec = msgp.AppendInt(rec, 1)
		rec = msgp.AppendString(rec, "v")
		entries = append(entries, entry(eventTime(t0), rec))
	}
	msg := forwardMode("t", entries, nil)
	hold := inputs.NewBudget(64<<20, nil).Hold("forward")
	d := decoder{maxUnpacked: 1 << 20, maxRecords: 10000, now: time.Now, hold: hold}
	m, err := d.decode(msg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.release()
	if len(m.chunks) == 0 {
		t.Fatal("the JSON never outgrew its first buffer: the test tests nothing")
	}
	var plain transcoder // grows by the runtime, one slice
	for i, e := range entries {
		_, rest, err := msgp.ReadArrayHeaderBytes(e)
		if err != nil {
			t.Fatal(err)
		}
		if rest, err = msgp.Skip(rest); err != nil { // the time
			t.Fatal(err)
		}
		want, _, err := plain.record(nil, rest)
		if err != nil {
			t.Fatal(err)
		}
		if string(m.records[i].Body) != string(want) {
			t.Fatalf("record %d (of %d, %d buffers):\n%q\nwant\n%q", i, len(entries), len(m.chunks)+1, m.records[i].Body, want)
		}
	}
}

// A message of a tiny record, then a large one whose JSON outgrows its
// msgpack, grows the large one by copies, as before there were chunks:
// keeping the first buffer, nearly empty, as a chunk, the message needed
// a third more of the budget.
func TestTinyThenLargeRecordGrowsByCopies(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	bin := make([]byte, 12<<20)
	for i := range bin {
		bin[i] = byte(i)
	}
	tiny := entry(eventTime(t0), record("log", "x"))
	large := entry(eventTime(t0), msgp.AppendBytes(msgp.AppendString(msgp.AppendMapHeader(nil, 1), "b"), bin))
	msg := forwardMode("t", [][]byte{tiny, large}, nil)
	// About 34 MiB: 12 of the first buffer copied into 15, then 15 into
	// 18.75 (base64 of 12 MiB is 16); the chunk path took about 46.
	hold := inputs.NewBudget(40<<20, nil).Hold("forward")
	d := decoder{maxUnpacked: 1 << 20, maxRecords: 10, now: time.Now, hold: hold}
	m, err := d.decode(msg)
	if err != nil {
		t.Fatalf("decode within 40 MiB: %v", err)
	}
	defer m.release()
	if len(m.records) != 2 || len(m.chunks) != 0 {
		t.Fatalf("%d records in %d chunks and a buffer, want 2 in one buffer", len(m.records), len(m.chunks))
	}
}
