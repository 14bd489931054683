package forward

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha512"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluent/fluent-logger-golang/fluent"
	"github.com/klauspost/compress/zstd"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/tinylib/msgp/msgp"

	"github.com/logfwd/forwarder/inputs"
	"github.com/logfwd/forwarder/wal"
)

func gz(parts ...[]byte) []byte {
	var out bytes.Buffer
	for _, p := range parts { // one gzip member each
		zw := gzip.NewWriter(&out)
		zw.Write(p)
		zw.Close()
	}
	return out.Bytes()
}

// zst compresses each of parts into a zstd frame of its own, as one
// payload: a frame of one segment (EncodeAll, the whole content known).
func zst(parts ...[]byte) []byte {
	enc, _ := zstd.NewWriter(nil)
	defer enc.Close()
	var out []byte
	for _, p := range parts {
		out = enc.EncodeAll(p, out)
	}
	return out
}

// zstStream compresses p as a stream (a window, no content size), as a
// streaming writer such as Fluentd's does.
func zstStream(p []byte, window int) []byte {
	var out bytes.Buffer
	zw, _ := zstd.NewWriter(&out, zstd.WithWindowSize(window))
	for len(p) > 0 { // in small writes: no single segment
		n := min(len(p), 1000)
		zw.Write(p[:n])
		zw.Flush()
		p = p[n:]
	}
	zw.Close()
	return out.Bytes()
}

func TestModes(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 8, 0, 1, 123456789, time.UTC)
	e1 := entry(eventTime(t0), record("log", "one", "n", 1))
	e2 := entry(msgp.AppendInt64(nil, t0.Unix()), record("log", "two", "n", 2))
	e3 := entry(msgp.AppendFloat64(nil, 1764489601.5), record("log", "three"))
	want3 := []struct {
		time int64
		body string
	}{
		{t0.UnixNano(), `{"log":"one","n":1}`},
		{t0.Unix() * 1e9, `{"log":"two","n":2}`},
		{1764489601500000000, `{"log":"three"}`},
	}
	packed := append(append(append([]byte(nil), e1...), e2...), e3...)
	tests := []struct {
		name string
		msg  []byte
		n    int // records expected; the first len(want3) of them are want3
	}{
		{"message, EventTime", messageMode("app.x", eventTime(t0), record("log", "one", "n", 1), nil), 1},
		{"message, integer time, chunk", messageMode("app.x", msgp.AppendInt64(nil, t0.Unix()), record("log", "two", "n", 2), options("c-msg")), 1},
		{"forward", forwardMode("app.x", [][]byte{e1, e2, e3}, nil), 3},
		{"forward, chunk and size", forwardMode("app.x", [][]byte{e1, e2, e3}, options("c-fwd", "size", 3)), 3},
		{"packed forward, bin", packedMode("app.x", packed, false, nil), 3},
		{"packed forward, str", packedMode("app.x", packed, true, options("c-pk")), 3},
		{"compressed packed forward, one member", packedMode("app.x", gz(packed), false, options("c-gz1", "compressed", "gzip")), 3},
		{"compressed packed forward, two members", packedMode("app.x", gz(append(append([]byte(nil), e1...), e2...), e3), false, options("c-gz2", "compressed", "gzip", "size", 3)), 3},
		// Fluentd's out_forward with compress zstd.
		{"compressed packed forward, zstd", packedMode("app.x", zst(packed), false, options("c-zs1", "compressed", "zstd")), 3},
		{"compressed packed forward, zstd, two frames", packedMode("app.x", zst(append(append([]byte(nil), e1...), e2...), e3), false, options("c-zs2", "compressed", "zstd")), 3},
		{"compressed packed forward, zstd stream", packedMode("app.x", zstStream(packed, 1<<20), false, options("c-zs3", "compressed", "zstd")), 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := start(t, defaultCfg(), wal.Options{})
			c := f.dial()
			if _, err := c.Write(tt.msg); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(tt.name, "chunk") || strings.Contains(string(tt.msg), "c-") {
				if id := readAck(t, c); !strings.HasPrefix(id, "c-") {
					t.Fatalf("ack %q", id)
				}
			}
			recs := f.waitRecords(tt.n)
			for i, r := range recs {
				w := want3[i]
				if tt.n == 1 && strings.Contains(tt.name, "integer") {
					w = want3[1]
				}
				if r.Tag != "app.x" || r.Time != w.time || string(r.Body) != w.body {
					t.Errorf("record %d: %d %q %s, want %d %s", i, r.Time, r.Tag, r.Body, w.time, w.body)
				}
			}
		})
	}
}

// The ack comes only once the records are in a committed transaction.
func TestAckAfterDurable(t *testing.T) {
	f := start(t, defaultCfg(), wal.Options{})
	c := f.dial()
	for i := 0; i < 20; i++ {
		c.Write(messageMode("a", eventTime(time.Now()), record("i", i), options(fmt.Sprint("k", i))))
		if id := readAck(t, c); id != fmt.Sprint("k", i) {
			t.Fatalf("ack %q", id)
		}
		// Acknowledged means committed: visible to a reader right now.
		if n := f.w.Stats().NextSeq - 1; n != uint64(i+1) {
			t.Fatalf("after ack %d the WAL has %d records", i, n)
		}
	}
}

func TestTranscoding(t *testing.T) {
	nested := msgp.AppendMapHeader(nil, 1)
	nested = msgp.AppendString(nested, "pod")
	nested = msgp.AppendString(nested, "web-1")
	rec := msgp.AppendMapHeader(nil, 11)
	rec = msgp.AppendString(rec, "z")
	rec = msgp.AppendString(rec, "first key\t\"quoted\"\n")
	rec = msgp.AppendString(rec, "a")
	rec = msgp.AppendBytes(rec, []byte{0, 1, 2, 255})
	rec = msgp.AppendInt64(rec, 42) // an integer key
	rec = msgp.AppendBool(rec, true)
	rec = msgp.AppendString(rec, "nan")
	rec = msgp.AppendFloat64(rec, math.NaN())
	rec = msgp.AppendString(rec, "inf")
	rec = msgp.AppendFloat64(rec, math.Inf(-1))
	rec = msgp.AppendString(rec, "f")
	rec = msgp.AppendFloat64(rec, 1.5)
	rec = msgp.AppendString(rec, "bad")
	rec = msgp.AppendStringFromBytes(rec, []byte("a\xffb\xc3"))
	rec = msgp.AppendString(rec, "k8s")
	rec = append(rec, nested...)
	rec = msgp.AppendString(rec, "list")
	rec = msgp.AppendArrayHeader(rec, 3)
	rec = msgp.AppendNil(rec)
	rec = msgp.AppendUint64(rec, math.MaxUint64)
	rec = msgp.AppendInt64(rec, -7)
	rec = msgp.AppendString(rec, "when")
	rec = append(rec, eventTime(time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC))...)
	rec = msgp.AppendString(rec, "ctl")
	rec = msgp.AppendString(rec, "\x01<>&\u2028")

	f := start(t, defaultCfg(), wal.Options{})
	c := f.dial()
	msg := messageMode("t", eventTime(time.Now()), rec, options("x"))
	c.Write(msg)
	readAck(t, c)
	got := string(f.waitRecords(1)[0].Body)
	want := `{"z":"first key\t\"quoted\"\n","a":"AAEC/w==","42":true,"nan":null,"inf":null,"f":1.5,"bad":"a\ufffdb\ufffd","k8s":{"pod":"web-1"},"list":[null,18446744073709551615,-7],"when":"2026-01-02T03:04:05.000000006Z","ctl":"\u0001<>&` + "\u2028" + `"}`
	if got != want {
		t.Fatalf("body\n got %s\nwant %s", got, want)
	}
	if n := testutil.ToFloat64(f.metrics.InvalidUTF8.WithLabelValues("forward")); n != 1 {
		t.Fatalf("invalid UTF-8 records counted %v, want 1", n)
	}
	// The chunk sent again (a lost ack) is not stored again, nor counted again: as HTTP counts.
	c.Write(msg)
	readAck(t, c)
	if n := testutil.ToFloat64(f.metrics.Deduplicated.WithLabelValues("forward")); n != 1 {
		t.Fatalf("deduplicated %v, want 1: the chunk was not sent again as it was", n)
	}
	if n := testutil.ToFloat64(f.metrics.InvalidUTF8.WithLabelValues("forward")); n != 1 {
		t.Fatalf("invalid UTF-8 records counted %v after a re-sent chunk, want 1", n)
	}
}

func TestChunkDedup(t *testing.T) {
	f := start(t, defaultCfg(), wal.Options{})
	msg := forwardMode("a", [][]byte{entry(eventTime(time.Now()), record("x", 1)), entry(eventTime(time.Now()), record("x", 2))}, options("same-chunk"))
	for i := 0; i < 3; i++ { // the client resends after a lost ack, on new connections
		c := f.dial()
		c.Write(msg)
		if id := readAck(t, c); id != "same-chunk" {
			t.Fatalf("ack %q", id)
		}
		c.Close()
	}
	f.waitRecords(2)
	if n := testutil.ToFloat64(f.metrics.Deduplicated.WithLabelValues("forward")); n != 4 {
		t.Fatalf("deduplicated records %v, want 4", n)
	}
}

// A client that reuses a chunk id for another message (a counter started
// again after a restart, say) has that message stored and acknowledged,
// without deduplication, counted and warned about: not acknowledged and
// dropped as a re-sent one. The first message sent again is still
// deduplicated.
func TestChunkIDReused(t *testing.T) {
	f := start(t, defaultCfg(), wal.Options{})
	at := eventTime(time.Now())
	first := forwardMode("a", [][]byte{entry(at, record("x", 1)), entry(at, record("x", 2))}, options("1"))
	other := forwardMode("a", [][]byte{entry(at, record("x", 3)), entry(at, record("x", 4))}, options("1"))
	c := f.dial()
	for _, msg := range [][]byte{first, other, first} {
		c.Write(msg)
		if id := readAck(t, c); id != "1" {
			t.Fatalf("ack %q", id)
		}
	}
	recs := f.waitRecords(4)
	if string(recs[2].Body) != `{"x":3}` || string(recs[3].Body) != `{"x":4}` {
		t.Fatalf("stored %q and %q, want the second message's records", recs[2].Body, recs[3].Body)
	}
	if n := testutil.ToFloat64(f.metrics.ChunkReused.WithLabelValues("forward")); n != 1 {
		t.Fatalf("chunk ids reused: %v, want 1", n)
	}
	if n := testutil.ToFloat64(f.metrics.Deduplicated.WithLabelValues("forward")); n != 2 {
		t.Fatalf("deduplicated records %v, want 2 (the first message sent again)", n)
	}
	if !strings.Contains(f.logs.String(), "the client reuses chunk ids") {
		t.Fatalf("no warning:\n%s", f.logs.String())
	}
	// A message whose time is 0 (stored as the time of arrival) sent again
	// is the same message.
	zero := messageMode("a", msgp.AppendInt(nil, 0), record("x", 5), options("z"))
	for range 2 {
		c.Write(zero)
		if id := readAck(t, c); id != "z" {
			t.Fatalf("ack %q", id)
		}
	}
	f.waitRecords(5)
	if n := testutil.ToFloat64(f.metrics.ChunkReused.WithLabelValues("forward")); n != 1 {
		t.Fatalf("chunk ids reused: %v after a message of time 0 sent again, want 1", n)
	}
}

// TestFluentBitMessageModeChunk: Fluent Bit's Message mode (a Tag built
// from the records) sends every message with one chunk id, the SHA-512 of
// no bytes. Each message is stored and acknowledged, two alike as well,
// and no chunk id is counted as reused.
func TestFluentBitMessageModeChunk(t *testing.T) {
	f := start(t, defaultCfg(), wal.Options{})
	sum := sha512.Sum512(nil)
	id := hex.EncodeToString(sum[:16])
	at := eventTime(time.Now())
	c := f.dial()
	for _, msg := range [][]byte{
		messageMode("app.a", at, record("log", "same"), options(id)),
		messageMode("app.a", at, record("log", "same"), options(id)),
		messageMode("app.b", at, record("log", "other"), options(id)),
	} {
		c.Write(msg)
		if got := readAck(t, c); got != id {
			t.Fatalf("ack %q, want %q", got, id)
		}
	}
	recs := f.waitRecords(3)
	if string(recs[1].Body) != `{"log":"same"}` || recs[2].Tag != "app.b" {
		t.Fatalf("stored %+v", recs)
	}
	if n := testutil.ToFloat64(f.metrics.ChunkReused.WithLabelValues("forward")); n != 0 {
		t.Errorf("chunk ids reused: %v, want 0", n)
	}
	if n := testutil.ToFloat64(f.metrics.Deduplicated.WithLabelValues("forward")); n != 0 {
		t.Errorf("deduplicated records %v, want 0", n)
	}
}

// A forward chunk id is never taken for an HTTP Idempotency-Key, though
// both share the WAL's table of ids: the chunk "http:zz" is stored even
// after an HTTP request with the key "zz". Ids a version before the
// prefixes stored (forward ones as they are) still dedup after an upgrade,
// but for ids starting "http:" or "forward:", which are stored once more.
func TestChunkIDsApartFromIdempotencyKeys(t *testing.T) {
	f := start(t, defaultCfg(), wal.Options{})
	stored := func(tag, id string) { // as the HTTP input, or an earlier version, stored it
		t.Helper()
		if _, err := f.w.Append(t.Context(), []wal.Record{{Tag: tag, Body: []byte(`{}`)}}, wal.AppendOptions{ChunkID: id}); err != nil {
			t.Fatal(err)
		}
	}
	stored("http", inputs.HTTPChunkID("zz"))
	stored("before", "chunk-from-before")
	stored("before", "forward:x")
	c := f.dial()
	at := eventTime(time.Now()) // a message sent again is the same message
	for _, chunk := range []string{"http:zz", "chunk-from-before", "forward:x", "forward:x", "http:zz"} {
		c.Write(messageMode("fwd", at, record("chunk", chunk), options(chunk)))
		if id := readAck(t, c); id != chunk {
			t.Fatalf("ack %q, want %q", id, chunk)
		}
	}
	recs := f.waitRecords(5)
	var got []string
	for _, r := range recs[3:] {
		got = append(got, string(r.Body))
	}
	if want := []string{`{"chunk":"http:zz"}`, `{"chunk":"forward:x"}`}; !slices.Equal(got, want) {
		t.Fatalf("stored %q, want %q: the first copy of each chunk the WAL did not hold", got, want)
	}
}

func TestUnroutedAcknowledgedNotStored(t *testing.T) {
	f := start(t, defaultCfg(), wal.Options{})
	c := f.dial()
	c.Write(messageMode("nowhere.x", eventTime(time.Now()), record("a", 1), options("u1")))
	if readAck(t, c) != "u1" {
		t.Fatal("no ack")
	}
	c.Write(messageMode("app", eventTime(time.Now()), record("a", 2), options("u2")))
	readAck(t, c)
	if recs := f.waitRecords(1); recs[0].Tag != "app" {
		t.Fatalf("stored %+v", recs)
	}
	if n := testutil.ToFloat64(f.metrics.Unrouted.WithLabelValues("forward")); n != 1 {
		t.Fatalf("unrouted %v", n)
	}
}

// fluent-logger-golang is an independent client: Message mode, acks and
// EventTime.
func TestFluentLoggerGolang(t *testing.T) {
	f := start(t, defaultCfg(), wal.Options{})
	host, port, _ := net.SplitHostPort(f.addr())
	var p int
	fmt.Sscan(port, &p)
	logger, err := fluent.New(fluent.Config{FluentHost: host, FluentPort: p, RequestAck: true, SubSecondPrecision: true, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer logger.Close()
	t0 := time.Date(2026, 11, 30, 9, 0, 0, 987654321, time.UTC)
	for i := 0; i < 50; i++ {
		if err := logger.PostWithTime("pod.web", t0, map[string]any{"i": i, "msg": "hello"}); err != nil {
			t.Fatalf("post %d: %v", i, err)
		}
	}
	recs := f.waitRecords(50)
	for i, r := range recs {
		if r.Tag != "pod.web" || r.Time != t0.UnixNano() || !strings.Contains(string(r.Body), fmt.Sprintf(`"i":%d`, i)) {
			t.Fatalf("record %d: %+v %s", i, r, r.Body)
		}
	}
}

// Integer seconds are taken as far as their nanoseconds fit in an int64,
// and refused beyond, never wrapped around into another century.
func TestIntegerTimeRange(t *testing.T) {
	maxS, minS := int64(math.MaxInt64/int64(time.Second)), int64(math.MinInt64/int64(time.Second))
	tests := []struct {
		time []byte
		want int64 // 0: refused
	}{
		{msgp.AppendInt64(nil, -1), -1e9},
		{msgp.AppendInt64(nil, 1764489601), 1764489601e9},
		{msgp.AppendInt64(nil, maxS), maxS * 1e9},
		{msgp.AppendInt64(nil, minS), minS * 1e9},
		{msgp.AppendUint64(nil, uint64(maxS)), maxS * 1e9},
		{msgp.AppendInt64(nil, maxS+1), 0},
		{msgp.AppendInt64(nil, minS-1), 0},
		{msgp.AppendInt64(nil, 1e11), 0},
		{msgp.AppendInt64(nil, -1e11), 0},
		{msgp.AppendInt64(nil, math.MaxInt64), 0},
		{msgp.AppendInt64(nil, math.MinInt64), 0},
		{msgp.AppendUint64(nil, uint64(maxS)+1), 0},
		// Floats: the largest below 2^63 ns is kept; the next ones would wrap to 1677.
		{msgp.AppendFloat64(nil, 9223372036.0), 9223372036e9},
		{msgp.AppendFloat64(nil, 9223372036.854776), 0},
		{msgp.AppendFloat64(nil, -9223372036.8548), 0},
		{msgp.AppendFloat64(nil, math.Inf(1)), 0},
	}
	for _, tt := range tests {
		d := decoder{maxUnpacked: 1 << 20, now: time.Now}
		m, err := d.decode(messageMode("t", tt.time, record("a", 1), nil))
		switch {
		case tt.want == 0 && err == nil:
			t.Errorf("time % x: stored as %v, want refused", tt.time, time.Unix(0, m.records[0].Time).UTC())
		case tt.want == 0:
			if !strings.Contains(err.Error(), "out of range") {
				t.Errorf("time % x: %v, want out of range", tt.time, err)
			}
		case err != nil:
			t.Errorf("time % x: %v", tt.time, err)
		case m.records[0].Time != tt.want:
			t.Errorf("time % x: %d, want %d", tt.time, m.records[0].Time, tt.want)
		}
	}
}

// A stopping server reads what its clients had already sent, stores it and
// then closes: a client without acks that wrote messages just before the
// stop loses none of them (it used to lose those still in the socket).
func TestStopReadsWhatWasSent(t *testing.T) {
	w, err := wal.Open(t.TempDir(), wal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	srv := New(defaultCfg(), &inputs.Pipeline{WAL: w, Metrics: inputs.NewMetrics(nil)}, slog.New(slog.DiscardHandler))
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	c, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const n = 300
	var all []byte
	for i := range n {
		all = append(all, messageMode("app", eventTime(time.Now()), record("i", i), nil)...)
	}
	if _, err := c.Write(all); err != nil {
		t.Fatal(err)
	}
	cancel() // the stop, with most of the messages still in the socket
	if err := <-done; err != nil {
		t.Fatalf("serve: %v", err)
	}
	recs, err := w.Read(1, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != n {
		t.Fatalf("%d of %d messages written before the stop were stored", len(recs), n)
	}
}

// A stopping server stops reading a while after the stop even from clients
// that keep sending, so that what it has read is stored and acknowledged
// before it closes: nothing is stored without its ack. A message stored but
// not acknowledged is sent again by the client, to another replica when it
// fails over: a duplicate downstream.
//
// The reading and the storing each take at most a sixth of the service's
// shutdown_timeout (StopWithin), here 1 s of 6 s, not the default 5 s.
func TestStopWithClientsSending(t *testing.T) {
	var srv *Server
	f := start(t, defaultCfg(), wal.Options{}, func(s *Server) { s.StopWithin(6 * time.Second); srv = s })
	readFor, storeFor := srv.stopTimes()
	if readFor != time.Second || storeFor != time.Second {
		t.Fatalf("stop times %v and %v of 6 s, want a sixth each", readFor, storeFor)
	}
	const clients = 4
	var mu sync.Mutex
	acked := map[string]bool{}
	var wg sync.WaitGroup
	for i := range clients {
		c := f.dial()
		wg.Go(func() {
			for n := 0; ; n++ {
				id := fmt.Sprintf("c%d-%d", i, n)
				c.SetWriteDeadline(time.Now().Add(10 * time.Second))
				if _, err := c.Write(messageMode("app", eventTime(time.Now()), record("id", id), options(id))); err != nil {
					return
				}
				c.SetReadDeadline(time.Now().Add(10 * time.Second))
				got, err := readAckErr(c)
				if err != nil {
					return
				}
				if got != id {
					t.Errorf("ack %q for chunk %q", got, id)
					return
				}
				mu.Lock()
				acked[id] = true
				mu.Unlock()
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	f.cancel()
	if err := <-f.done; err != nil {
		t.Fatalf("serve: %v", err)
	}
	f.cancel = nil
	took := time.Since(start)
	wg.Wait()
	stored := map[string]bool{}
	for _, r := range f.records() {
		var v struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(r.Body, &v); err != nil {
			t.Fatal(err)
		}
		stored[v.ID] = true
	}
	f.w.Close()
	var unacked, lost []string
	for id := range stored {
		if !acked[id] {
			unacked = append(unacked, id)
		}
	}
	for id := range acked {
		if !stored[id] {
			lost = append(lost, id)
		}
	}
	t.Logf("the stop took %v; %d messages stored, %d acknowledged", took.Round(time.Millisecond), len(stored), len(acked))
	if len(lost) > 0 {
		t.Errorf("acknowledged but not stored: %v", lost)
	}
	if len(unacked) > 0 {
		t.Errorf("stored but never acknowledged (a failing-over client sends them again): %v", unacked)
	}
	if took >= readFor+storeFor {
		t.Errorf("the stop took %v: connections were closed with their stores cancelled", took)
	}
	if took < readFor {
		t.Errorf("the stop took %v: the clients keep sending, and are read for %v", took, readFor)
	}
}

// What Fluentd's out_forward sends by default, byte for byte in kind: a
// PackedForward of str32 entries with {size, compressed: "text", chunk}
// (its chunk ids end in the newline of Base64.encode64), and no acks
// asked unless require_ack_response; Fluent Bit 5's entries carry their
// metadata ([[time, metadata], record]); a chunk key with an empty id is
// acknowledged, as Fluentd does; an option of nil is no option.
func TestFluentdAndFluentBitShapes(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 8, 0, 1, 123456789, time.UTC)
	str32 := func(b []byte) []byte {
		out := []byte{0xdb, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(out[1:], uint32(len(b)))
		return append(out, b...)
	}
	plain := append(entry(eventTime(t0), record("log", "a")), entry(eventTime(t0), record("log", "b"))...)
	fluentd := func(chunk string) []byte {
		b := msgp.AppendArrayHeader(nil, 3)
		b = msgp.AppendString(b, "app.x")
		b = append(b, str32(plain)...)
		n := uint32(2)
		if chunk != "" {
			n = 3
		}
		b = msgp.AppendMapHeader(b, n)
		b = msgp.AppendString(b, "size")
		b = msgp.AppendInt(b, 2)
		b = msgp.AppendString(b, "compressed")
		b = msgp.AppendString(b, "text")
		if chunk != "" {
			b = msgp.AppendString(b, "chunk")
			b = msgp.AppendString(b, chunk)
		}
		return b
	}
	withMeta := func(tm []byte) []byte {
		b := msgp.AppendArrayHeader(nil, 2)
		b = append(b, tm...)
		return append(b, record("otlp", map[string]any{"severity_number": 9})...)
	}
	metaEntries := append(entry(withMeta(eventTime(t0)), record("log", "a")), entry(withMeta(eventTime(t0)), record("log", "b"))...)
	emptyChunk := msgp.AppendMapHeader(nil, 1)
	emptyChunk = msgp.AppendString(emptyChunk, "chunk")
	emptyChunk = msgp.AppendString(emptyChunk, "")
	for _, tt := range []struct {
		name string
		msg  []byte
		ack  string // "-": none asked
	}{
		{"fluentd, no ack", fluentd(""), "-"},
		{"fluentd, ack", fluentd("ZmQtY2h1bmstaWQtMDAwMDAw\n"), "ZmQtY2h1bmstaWQtMDAwMDAw\n"},
		{"fluent bit 5, forward", forwardMode("app.x", [][]byte{entry(withMeta(eventTime(t0)), record("log", "a")), entry(withMeta(eventTime(t0)), record("log", "b"))}, options("fb-1")), "fb-1"},
		{"fluent bit 5, packed", packedMode("app.x", metaEntries, false, options("fb-2")), "fb-2"},
		{"fluent bit 5, compressed", packedMode("app.x", gz(metaEntries), false, options("fb-3", "compressed", "gzip")), "fb-3"},
		{"nil option", msgp.AppendNil(msgp.AppendBytes(msgp.AppendString(msgp.AppendArrayHeader(nil, 3), "app.x"), plain)), "-"},
		{"empty chunk id", packedMode("app.x", plain, false, emptyChunk), ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := start(t, defaultCfg(), wal.Options{})
			c := f.dial()
			if _, err := c.Write(tt.msg); err != nil {
				t.Fatal(err)
			}
			if tt.ack != "-" {
				if id := readAck(t, c); id != tt.ack {
					t.Fatalf("ack %q, want %q", id, tt.ack)
				}
			}
			recs := f.waitRecords(2)
			for i, want := range []string{`{"log":"a"}`, `{"log":"b"}`} {
				if r := recs[i]; r.Tag != "app.x" || r.Time != t0.UnixNano() || string(r.Body) != want {
					t.Errorf("record %d: %d %q %s, want %d %s", i, r.Time, r.Tag, r.Body, t0.UnixNano(), want)
				}
			}
		})
	}

	// A zstd payload is bounded as a gzip one: four times
	// max_message_bytes once decompressed (maxUnpacked), and a window of
	// 8 MiB.
	big := slices.Repeat([][]byte{entry(eventTime(t0), record("log", strings.Repeat("z", 100_000)))}, 12)
	for _, payload := range [][]byte{zst(slices.Concat(big...)), zstStream(slices.Concat(big...), 1<<20)} {
		d := decoder{maxUnpacked: 1 << 20, now: time.Now}
		if _, err := d.decode(packedMode("app.x", payload, false, options("", "compressed", "zstd"))); err == nil || !strings.Contains(err.Error(), "too large once decompressed") {
			t.Errorf("zstd of 1.2 MB, 1 MiB allowed: %v", err)
		}
	}

	// A stream longer than its window (64 KiB here, 3 MB of entries):
	// the window bounds what the decoder holds, not what it decodes.
	long := slices.Repeat([][]byte{entry(eventTime(t0), record("log", strings.Repeat("w", 100_000)))}, 30)
	d := decoder{maxUnpacked: 64 << 20, now: time.Now}
	if m, err := d.decode(packedMode("app.x", zstStream(slices.Concat(long...), 64<<10), false, options("", "compressed", "zstd"))); err != nil || len(m.records) != 30 {
		t.Errorf("zstd stream of 3 MB in a 64 KiB window: %v", err)
	}

	// What stays refused: other compressions, and metadata that is not a map.
	for _, msg := range [][]byte{
		packedMode("app.x", plain, false, options("", "compressed", "lz4")),
		forwardMode("app.x", [][]byte{entry(append(append(msgp.AppendArrayHeader(nil, 2), eventTime(t0)...), msgp.AppendString(nil, "meta")...), record("log", "a"))}, nil),
		forwardMode("app.x", [][]byte{entry(append(msgp.AppendArrayHeader(nil, 1), eventTime(t0)...), record("log", "a"))}, nil),
	} {
		d := decoder{maxUnpacked: 1 << 20, now: time.Now}
		if _, err := d.decode(msg); err == nil {
			t.Errorf("% x: accepted", msg)
		}
	}
}

// stallingWAL is a WAL whose commits stop returning once stall is closed:
// an append taken into a transaction answers with its commit, whatever its
// context (a disk that stalls in an fsync).
type stallingWAL struct {
	*wal.WAL
	stall, release chan struct{}
	stalled        chan struct{} // closed when an append waits for release
	once           sync.Once
}

func (s *stallingWAL) Append(ctx context.Context, recs []wal.Record, opts wal.AppendOptions) (wal.Result, error) {
	select {
	case <-s.stall:
		s.once.Do(func() { close(s.stalled) })
		<-s.release
	default:
	}
	return s.WAL.Append(ctx, recs, opts)
}

// A store held in a commit that does not return (a stalled disk) does not
// hold the stop past the reading, the storing and one more store window:
// its client is disconnected without an ack, and the stop says so.
func TestStopLeavesAStalledCommit(t *testing.T) {
	t.Parallel()
	w, err := wal.Open(t.TempDir(), wal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	sw := &stallingWAL{WAL: w, stall: make(chan struct{}), release: make(chan struct{}), stalled: make(chan struct{})}
	defer close(sw.release)
	logs := &syncBuf{}
	srv := New(defaultCfg(), &inputs.Pipeline{WAL: sw, Metrics: inputs.NewMetrics(nil)}, slog.New(slog.NewTextHandler(logs, nil)))
	srv.StopWithin(6 * time.Second)
	readFor, storeFor := srv.stopTimes()
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	c, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// One message stored and acknowledged before the disk stalls.
	if _, err := c.Write(messageMode("app", eventTime(time.Now()), record("id", "before"), options("before"))); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if got, err := readAckErr(c); err != nil || got != "before" {
		t.Fatalf("ack before the stall: %q, %v", got, err)
	}
	close(sw.stall)
	if _, err := c.Write(messageMode("app", eventTime(time.Now()), record("id", "stalled"), options("stalled"))); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sw.stalled:
	case <-time.After(10 * time.Second):
		t.Fatal("the message never reached the store")
	}
	start := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
	case <-time.After(readFor + 2*storeFor + 5*time.Second):
		t.Fatalf("the stop waited for a commit that does not return (more than %v)", readFor+2*storeFor+5*time.Second)
	}
	took := time.Since(start)
	if took < readFor+storeFor {
		t.Errorf("the stop took %v: it gave the store less than its window", took)
	}
	if got, err := readAckErr(c); err == nil {
		t.Errorf("the stalled message was acknowledged (%q)", got)
	}
	if want := `level=WARN msg="stopping: stores in a commit that has not returned are left behind`; !strings.Contains(logs.String(), want) {
		t.Errorf("log lacks %q:\n%s", want, logs.String())
	}
	t.Logf("the stop took %v (read %v, store %v)", took.Round(time.Millisecond), readFor, storeFor)
}

// TestFluentBitGroupMarkers: Fluent Bit frames the records of a group (its
// OpenTelemetry input's resource and scope) with markers, entries with
// metadata whose time is -1 (start) or -2 (end) seconds, written as an
// EventTime's unsigned seconds. They are not records: left out in every
// mode that has entries, the records between them stored, the message acknowledged.
func TestFluentBitGroupMarkers(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 8, 0, 1, 123456789, time.UTC)
	withMeta := func(tm []byte) []byte {
		b := msgp.AppendArrayHeader(nil, 2)
		b = append(b, tm...)
		return append(b, record("otlp", map[string]any{"severity_number": 9})...)
	}
	marker := func(sec int32) []byte {
		tm := []byte{0xd7, 0x00, 0, 0, 0, 0, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(tm[2:], uint32(sec))
		return entry(withMeta(tm), record("resource", map[string]any{"attributes": map[string]any{"host.name": "h"}}))
	}
	intMarker := entry(withMeta(msgp.AppendInt64(nil, -1)), record("resource", map[string]any{}))
	entries := [][]byte{marker(-1), entry(withMeta(eventTime(t0)), record("log", "a")), intMarker,
		entry(withMeta(eventTime(t0)), record("log", "b")), marker(-2)}
	packed := bytes.Join(entries, nil)
	for _, tt := range []struct {
		name string
		msg  []byte
		n    int
	}{
		{"forward", forwardMode("app.x", entries, options("g-1")), 2},
		{"packed", packedMode("app.x", packed, false, options("g-2")), 2},
		{"compressed", packedMode("app.x", gz(packed), false, options("g-3", "compressed", "gzip")), 2},
		{"only markers", packedMode("app.x", bytes.Join([][]byte{marker(-1), marker(-2)}, nil), false, options("g-4")), 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := start(t, defaultCfg(), wal.Options{})
			c := f.dial()
			if _, err := c.Write(tt.msg); err != nil {
				t.Fatal(err)
			}
			readAck(t, c)
			recs := f.records()
			if len(recs) != tt.n {
				t.Fatalf("%d records stored, want %d: %v", len(recs), tt.n, recs)
			}
			for i, want := range []string{`{"log":"a"}`, `{"log":"b"}`}[:tt.n] {
				if r := recs[i]; r.Time != t0.UnixNano() || string(r.Body) != want {
					t.Errorf("record %d: %d %s, want %d %s", i, r.Time, r.Body, t0.UnixNano(), want)
				}
			}
		})
	}
	// A record of 2106 (seconds 0xFFFFFFFD) is a record; a marker whose
	// attributes are cut short is refused.
	d := decoder{maxUnpacked: 1 << 20, now: time.Now}
	m, err := d.decode(forwardMode("app.x", [][]byte{entry(withMeta(eventTimeRaw(1<<32-3, 0)), record("log", "late"))}, nil))
	if err != nil || len(m.records) != 1 {
		t.Fatalf("a record at seconds 0xFFFFFFFD: %v, %v", m, err)
	}
	cut := marker(-1)
	if _, err := d.decode(forwardMode("app.x", [][]byte{cut[:len(cut)-3]}, nil)); err == nil {
		t.Error("a marker cut short: accepted")
	}
}

// eventTimeRaw is an EventTime of these seconds and nanoseconds.
func eventTimeRaw(sec, nsec uint32) []byte {
	b := []byte{0xd7, 0x00, 0, 0, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[2:], sec)
	binary.BigEndian.PutUint32(b[6:], nsec)
	return b
}

// A record that is not a map is skipped, counted and said, as Fluentd's
// in_forward skips invalid events: the other records of its message are
// stored and the message acknowledged, where refusing it would have its
// client send it again for ever.
func TestRecordsThatAreNotMaps(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 8, 0, 1, 0, time.UTC)
	f := start(t, defaultCfg(), wal.Options{})
	c := f.dial()
	c.Write(forwardMode("app.x", [][]byte{
		entry(eventTime(t0), record("log", "a")),
		entry(eventTime(t0), msgp.AppendString(nil, "a plain string")),
		entry(eventTime(t0), msgp.AppendInt(nil, 42)),
		entry(eventTime(t0), msgp.AppendString(msgp.AppendArrayHeader(nil, 1), "in an array")),
		entry(eventTime(t0), record("log", "b")),
	}, options("m-1")))
	if id := readAck(t, c); id != "m-1" {
		t.Fatalf("ack %q", id)
	}
	c.Write(packedMode("app.y", append(entry(eventTime(t0), msgp.AppendFloat64(nil, 1.5)), entry(eventTime(t0), record("log", "c"))...), false, options("m-2")))
	readAck(t, c)
	c.Write(messageMode("app.z", eventTime(t0), msgp.AppendString(nil, "alone"), options("m-3")))
	readAck(t, c)
	var bodies []string
	for _, r := range f.records() {
		bodies = append(bodies, string(r.Body))
	}
	if strings.Join(bodies, " ") != `{"log":"a"} {"log":"b"} {"log":"c"}` {
		t.Fatalf("stored %q", bodies)
	}
	if n := testutil.ToFloat64(f.metrics.NotMaps.WithLabelValues("forward")); n != 5 {
		t.Errorf("records that are not maps counted %v, want 5", n)
	}
	if n := testutil.ToFloat64(f.metrics.Rejected.WithLabelValues("forward", "malformed")); n != 0 {
		t.Errorf("rejected{malformed} = %v", n)
	}
	logs := f.logs.String()
	if strings.Count(logs, "entries whose record is not a map skipped") != 1 || !strings.Contains(logs, "first_type=str") || !strings.Contains(logs, "tag=app.x") {
		t.Errorf("want one warning naming the tag and the type:\n%s", logs)
	}
}

// TestNilTimeAndRecord: as Fluentd's in_forward reads them, a nil time is
// the time of arrival (as 0 is) and a nil record is skipped: the others of
// the message are stored and the message acknowledged.
func TestNilTimeAndRecord(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 8, 0, 1, 0, time.UTC)
	f := start(t, defaultCfg(), wal.Options{})
	c := f.dial()
	before := time.Now().UnixNano()
	c.Write(forwardMode("app.x", [][]byte{
		entry(eventTime(t0), msgp.AppendNil(nil)),
		entry(msgp.AppendNil(nil), record("log", "no time")),
		entry(eventTime(t0), record("log", "b")),
	}, options("n-1")))
	readAck(t, c)
	c.Write(messageMode("app.y", eventTime(t0), msgp.AppendNil(nil), options("n-2")))
	readAck(t, c)
	recs := f.records()
	if len(recs) != 2 || string(recs[0].Body) != `{"log":"no time"}` || recs[0].Time < before || string(recs[1].Body) != `{"log":"b"}` || recs[1].Time != t0.UnixNano() {
		t.Fatalf("stored %+v", recs)
	}
	// The nil records are counted, and said once a minute.
	if n := testutil.ToFloat64(f.metrics.NilRecords.WithLabelValues("forward")); n != 2 {
		t.Errorf("nil records counted %v, want 2", n)
	}
	if n := strings.Count(f.logs.String(), "entries with a nil record skipped (nothing to store)"); n != 1 {
		t.Errorf("%d warnings of nil records, want 1:\n%s", n, f.logs.String())
	}
}
