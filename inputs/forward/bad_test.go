package forward

import (
	"crypto/sha512"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"math/rand"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/tinylib/msgp/msgp"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/wal"
)

func TestBadInput(t *testing.T) {
	good := messageMode("t", eventTime(time.Now()), record("a", 1), nil)
	deep := messageMode("t", eventTime(time.Now()), []byte(strings.Repeat("\x81\xa1k", 600)+"\xc0"), nil)
	tests := []struct {
		name   string
		msg    []byte
		reason string
		close  bool // the client closes after sending (truncated)
	}{
		{"not an array", msgp.AppendString(nil, "hello"), "malformed", false},
		{"tag is a number", append(msgp.AppendArrayHeader(nil, 3), append(msgp.AppendInt(nil, 5), good[3:]...)...), "malformed", false},
		{"record is byte 0xc1", messageMode("t", eventTime(time.Now()), []byte{0xc1}, nil), "malformed", false},
		{"entry is not a pair", forwardMode("t", [][]byte{msgp.AppendArrayHeader(msgp.AppendArrayHeader(nil, 1), 0)}, nil), "malformed", false},
		{"time is an unknown extension", messageMode("t", []byte{0xd7, 0x05, 0, 0, 0, 0, 0, 0, 0, 0}, record("a", 1), nil), "malformed", false},
		{"time is a string", messageMode("t", msgp.AppendString(nil, "now"), record("a", 1), nil), "malformed", false},
		// Seconds whose nanoseconds do not fit in an int64 (beyond the years 1677 to 2262).
		{"integer time too large", messageMode("t", msgp.AppendInt64(nil, 1e11), record("a", 1), nil), "malformed", false},
		{"integer time too small", messageMode("t", msgp.AppendInt64(nil, -1e11), record("a", 1), nil), "malformed", false},
		{"integer time just too large", messageMode("t", msgp.AppendInt64(nil, math.MaxInt64/int64(time.Second)+1), record("a", 1), nil), "malformed", false},
		{"integer time just too small", messageMode("t", msgp.AppendInt64(nil, math.MinInt64/int64(time.Second)-1), record("a", 1), nil), "malformed", false},
		{"unsigned time too large", messageMode("t", msgp.AppendUint64(nil, 1e11), record("a", 1), nil), "malformed", false},
		{"byte 0xc1", []byte{0x93, 0xa1, 't', 0xc1}, "malformed", false},
		{"bad gzip", packedMode("t", []byte("not gzip at all"), false, options("", "compressed", "gzip")), "bad_gzip", false},
		{"bad zstd", packedMode("t", []byte("not zstd at all"), false, options("", "compressed", "zstd")), "bad_zstd", false},
		{"zstd frame cut short", packedMode("t", zst(entry(eventTime(time.Now()), record("a", strings.Repeat("x", 5000))))[:40], false, options("", "compressed", "zstd")), "bad_zstd", false},
		{"zstd window over 8 MiB", packedMode("t", zstStream(entry(eventTime(time.Now()), record("a", 1)), 16<<20), false, options("", "compressed", "zstd")), "bad_zstd", false},
		{"unsupported compression", packedMode("t", []byte("x"), false, options("", "compressed", "lz4")), "malformed", false},
		{"too deep", deep, "malformed", false},
		{"oversize", messageMode("t", eventTime(time.Now()), record("big", strings.Repeat("x", 2<<20)), nil), "too_large", false},
		{"truncated", good[:len(good)-3], "truncated", true},
		{"chunk id too long", messageMode("t", eventTime(time.Now()), record("a", 1), options(strings.Repeat("k", 2000))), "malformed", false},
		// One tag rule for both inputs (inputs.CheckTag).
		{"empty tag", messageMode("", eventTime(time.Now()), record("a", 1), options("c")), "bad_tag", false},
		{"tag of 1 MB", messageMode(strings.Repeat("t", 1_000_000), eventTime(time.Now()), record("a", 1), options("c")), "bad_tag", false},
		{"tag over 1024 bytes", forwardMode(strings.Repeat("t", 1025), [][]byte{entry(eventTime(time.Now()), record("a", 1))}, options("c")), "bad_tag", false},
		{"tag with a control character", messageMode("pod.a\nb", eventTime(time.Now()), record("a", 1), options("c")), "bad_tag", false},
		{"tag with a NUL", packedMode("a\x00b", entry(eventTime(time.Now()), record("a", 1)), false, options("c")), "bad_tag", false},
		{"tag not UTF-8", messageMode("t.\xff\xfe_x", eventTime(time.Now()), record("a", 1), options("c")), "bad_tag", false},
		{"trailing garbage in packed entries", packedMode("t", append(entry(eventTime(time.Now()), record("a", 1)), 0x91), false, nil), "malformed", false},
		// Fluent Bit's metrics and traces (a cmetrics or ctraces payload).
		{"metrics", packedMode("t", record("meta", map[string]any{"cmetrics": map[string]any{}}, "metrics", []any{}), false, options("c", "fluent_signal", 1)), "unsupported_signal", false},
		{"traces, gzip", packedMode("t", gz(record("resourceSpans", []any{})), false, options("c", "compressed", "gzip", "fluent_signal", 2)), "unsupported_signal", false},
		{"traces as records", forwardMode("t", [][]byte{entry(eventTime(time.Now()), record("span", "x"))}, options("c", "fluent_signal", "2")), "unsupported_signal", false},
		{"JSON", []byte(`["t",1700000000,{"k":"v"}]`), "malformed", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := start(t, defaultCfg(), wal.Options{})
			other := f.dial() // a well-behaved client on another connection
			other.Write(messageMode("ok", eventTime(time.Now()), record("before", 1), options("o1")))
			readAck(t, other)

			c := f.dial()
			c.Write(tt.msg)
			if tt.close {
				c.(interface{ CloseWrite() error }).CloseWrite()
			}
			expectClosed(t, c)
			if n := testutil.ToFloat64(f.metrics.Rejected.WithLabelValues("forward", tt.reason)); n != 1 {
				t.Fatalf("rejected{%s} = %v; log:\n%s", tt.reason, n, f.logs.String())
			}
			if !strings.Contains(f.logs.String(), "closing connection: bad input") || !strings.Contains(f.logs.String(), "remote=127.0.0.1:") {
				t.Fatalf("no log line naming the remote address:\n%s", f.logs.String())
			}
			// The other client goes on; nothing of the bad message was stored.
			other.Write(messageMode("ok", eventTime(time.Now()), record("after", 1), options("o2")))
			readAck(t, other)
			recs := f.waitRecords(2)
			if recs[0].Tag != "ok" || recs[1].Tag != "ok" {
				t.Fatalf("stored %+v", recs)
			}
		})
	}
}

// TestResetInAMessage: a client whose connection is reset (RST) in the
// middle of a message has it counted and logged as truncated, as one that
// closes there.
func TestResetInAMessage(t *testing.T) {
	f := start(t, defaultCfg(), wal.Options{})
	good := messageMode("t", eventTime(time.Now()), record("a", 1), nil)
	c := f.dial().(*net.TCPConn)
	c.Write(good[:len(good)-3])
	// The server reads the bytes before the reset, which would otherwise
	// throw them away unread.
	time.Sleep(200 * time.Millisecond)
	c.SetLinger(0)
	c.Close()
	// The count comes a moment before the log line.
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(f.metrics.Rejected.WithLabelValues("forward", "truncated")) != 1 || !strings.Contains(f.logs.String(), "connection reset") {
		if time.Now().After(deadline) {
			t.Fatalf("a reset in a message is not counted as truncated (%v), or the log does not say the connection was reset:\n%s",
				testutil.ToFloat64(f.metrics.Rejected.WithLabelValues("forward", "truncated")), f.logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestSlowClientTimesOut(t *testing.T) {
	old := messageTimeout
	messageTimeout = 200 * time.Millisecond
	defer func() { messageTimeout = old }()
	f := start(t, defaultCfg(), wal.Options{})
	good := messageMode("t", eventTime(time.Now()), record("a", 1), nil)
	c := f.dial()
	c.Write(good[:5]) // and then nothing
	start := time.Now()
	expectClosed(t, c)
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("closed after %v", d)
	}
	if n := testutil.ToFloat64(f.metrics.Rejected.WithLabelValues("forward", "timeout")); n != 1 {
		t.Fatalf("rejected{timeout} = %v", n)
	}
}

// A client that never reads its acks is disconnected once its acks stop
// fitting; the others are not held up.
func TestClientThatNeverReadsAcks(t *testing.T) {
	old := writeTimeout
	writeTimeout = 200 * time.Millisecond
	defer func() { writeTimeout = old }()
	// A slow network: small socket buffers on both ends.
	f := start(t, defaultCfg(), wal.Options{}, func(s *Server) {
		s.tune = func(nc net.Conn) { nc.(*net.TCPConn).SetWriteBuffer(4096) }
	})
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	c, err := d.Dial("tcp", f.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	big := strings.Repeat("k", 1000) // each ack carries this chunk id back
	sent := 0
	c.SetWriteDeadline(time.Now().Add(20 * time.Second))
	for i := 0; i < 20000; i++ {
		if _, err := c.Write(messageMode("t", eventTime(time.Now()), record("i", i), options(fmt.Sprint(big, i)))); err != nil {
			break
		}
		sent++
		if i%100 == 0 && strings.Contains(f.logs.String(), "ack not delivered") {
			break
		}
	}
	other := f.dial()
	other.Write(messageMode("ok", eventTime(time.Now()), record("a", 1), options("o")))
	other.SetReadDeadline(time.Now().Add(10 * time.Second))
	if id, err := readAckErr(other); err != nil || id != "o" {
		t.Fatalf("a well-behaved client was held up: %q %v\n%s", id, err, f.logs.String())
	}
	if !strings.Contains(f.logs.String(), "ack not delivered") {
		deadline := time.Now().Add(5 * time.Second)
		for !strings.Contains(f.logs.String(), "ack not delivered") && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if !strings.Contains(f.logs.String(), "ack not delivered") {
			t.Fatalf("the server did not give up on the client (%d messages sent):\n%s", sent, f.logs.String())
		}
	}
}

// Connections beyond max_connections are refused when every open one is at
// work (here: in the middle of a message).
func TestTooManyConnections(t *testing.T) {
	cfg := defaultCfg()
	cfg.MaxConnections = 2
	f := start(t, cfg, wal.Options{})
	a, b := f.dial(), f.dial()
	for i, c := range []net.Conn{a, b} {
		msg := messageMode("t", eventTime(time.Now()), record("a", i), options(fmt.Sprint(i)))
		c.Write(msg[:len(msg)/2]) // at work: a message has begun
	}
	time.Sleep(100 * time.Millisecond) // both begun, as the server sees it
	c := f.dial()
	expectClosed(t, c)
	if n := testutil.ToFloat64(f.metrics.Rejected.WithLabelValues("forward", "too_many_connections")); n != 1 {
		t.Fatalf("rejected{too_many_connections} = %v", n)
	}
	// Said at warn, once a minute: the second refusal only at debug.
	expectClosed(t, f.dial())
	waitCount(t, f, "too_many_connections", 2)
	if n := strings.Count(f.logs.String(), "level=WARN msg=\"connection refused: max_connections reached"); n != 1 {
		t.Fatalf("%d warnings for two refused connections, want 1:\n%s", n, f.logs.String())
	}
}

// twoIdleThenOneMore opens a server of max_connections 2, two connections
// that each send a message and wait, a idle longer than b, then a third
// that sends a message and gets its ack: a gave way to it.
func twoIdleThenOneMore(t *testing.T) (f *fixture, a, b net.Conn) {
	t.Helper()
	cfg := defaultCfg()
	cfg.MaxConnections = 2
	f = start(t, cfg, wal.Options{})
	a, b = f.dial(), f.dial()
	for i, c := range []net.Conn{a, b} {
		c.Write(messageMode("t", eventTime(time.Now()), record("a", i), options(fmt.Sprint(i))))
		readAck(t, c)
		time.Sleep(50 * time.Millisecond) // a idle longer than b
	}
	c := f.dial()
	c.Write(messageMode("t", eventTime(time.Now()), record("c", 2), options("2")))
	readAck(t, c)
	return f, a, b
}

// An idle connection (past its messages, waiting for the next) gives its
// slot to a new connection when max_connections are open: the one idle the
// longest is closed, counted as evicted and said; the others go on.
func TestIdleConnectionGivesWay(t *testing.T) {
	f, a, b := twoIdleThenOneMore(t)
	expectClosed(t, a)
	b.Write(messageMode("t", eventTime(time.Now()), record("b", 3), options("3")))
	readAck(t, b)
	f.waitRecords(4)
	waitCount(t, f, "evicted", 1)
	if n := testutil.ToFloat64(f.metrics.Rejected.WithLabelValues("forward", "too_many_connections")); n != 0 {
		t.Fatalf("rejected{too_many_connections} = %v", n)
	}
	if !strings.Contains(f.logs.String(), "level=WARN msg=\"closed an idle connection to make room for a new one: max_connections is reached") {
		t.Errorf("log:\n%s", f.logs.String())
	}
}

// An idle connection that gives way is not closed under its client: the
// message the client writes within shutdownLinger of the eviction (or the
// socket held as the new connection came) is read, stored and
// acknowledged, and the connection then ends with the client's read seeing
// its end, not a reset; what the client sends after that message is not
// served.
func TestIdleConnectionEvictedFinishesAMessage(t *testing.T) {
	old := shutdownLinger
	shutdownLinger = 3 * time.Second
	t.Cleanup(func() { shutdownLinger = old })
	f, a, _ := twoIdleThenOneMore(t) // a was told to give way before the third was served
	// Three messages at once: the first is finished, the others are not
	// served above max_connections (never acknowledged: sent again).
	var three []byte
	for i := 3; i <= 5; i++ {
		three = append(three, messageMode("t", eventTime(time.Now()), record("a", i), options(fmt.Sprint(i)))...)
	}
	a.Write(three)
	if id := readAck(t, a); id != "3" {
		t.Fatalf("ack %q", id)
	}
	a.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := a.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("the evicted connection's end: %d bytes, %v; want EOF", n, err)
	}
	f.waitRecords(4)
	waitCount(t, f, "evicted", 1)
}

// deadlineConn records the read deadlines the server sets.
type deadlineConn struct {
	net.Conn
	mu   sync.Mutex
	last time.Time
	set  int
}

func (c *deadlineConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.last, c.set = t, c.set+1
	c.mu.Unlock()
	return c.Conn.SetReadDeadline(t)
}

type deadlineListener struct {
	net.Listener
	conns chan *deadlineConn
}

func (l *deadlineListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	dc := &deadlineConn{Conn: nc}
	l.conns <- dc
	return dc, nil
}

// A connection between messages waits with no deadline: a client that
// writes without waiting for acks (fluent-logger-golang without
// RequestAck) would lose the first message it writes after a quiet spell
// into a connection the server closed on a timer. Dead peers are TCP
// keepalive's; idle connections give way at max_connections (above).
func TestIdleConnectionHasNoDeadline(t *testing.T) {
	conns := make(chan *deadlineConn, 1)
	f := start(t, defaultCfg(), wal.Options{}, func(s *Server) {
		listen := s.listen
		s.listen = func(network, address string) (net.Listener, error) {
			ln, err := listen(network, address)
			return &deadlineListener{Listener: ln, conns: conns}, err
		}
	})
	c := f.dial()
	c.Write(messageMode("t", eventTime(time.Now()), record("a", 1), options("a")))
	readAck(t, c)
	sc := <-conns
	deadline := time.Now().Add(5 * time.Second)
	for {
		sc.mu.Lock()
		last, set := sc.last, sc.set
		sc.mu.Unlock()
		if set >= 2 && last.IsZero() {
			break // the wait for the next message
		}
		if time.Now().After(deadline) {
			t.Fatalf("the read deadline between messages is %v (%d set)", last, set)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	c.Write(messageMode("t", eventTime(time.Now()), record("a", 2), options("b")))
	readAck(t, c)
	f.waitRecords(2)
}

func TestHandshake(t *testing.T) {
	cfg := defaultCfg()
	cfg.SharedKey = "s3cret"
	cfg.Users = []config.User{{Username: "fluent", Password: "pw"}}
	f := start(t, cfg, wal.Options{})
	try := func(key, user, pass string) (ok bool, reason string) {
		c := f.dial()
		r := msgp.NewReader(c)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		// HELO
		if n, err := r.ReadArrayHeader(); err != nil || n != 2 {
			t.Fatalf("HELO: %v", err)
		}
		if s, _ := r.ReadString(); s != "HELO" {
			t.Fatalf("got %q, want HELO", s)
		}
		var nonce, auth []byte
		n, _ := r.ReadMapHeader()
		for i := uint32(0); i < n; i++ {
			k, _ := r.ReadString()
			switch k {
			case "nonce":
				nonce, _ = r.ReadBytes(nil)
			case "auth":
				auth, _ = r.ReadBytes(nil)
			default:
				r.Skip()
			}
		}
		salt := []byte("client-salt")
		h := sha512.Sum512([]byte(string(salt) + "client-host" + string(nonce) + key))
		p := sha512.Sum512([]byte(string(auth) + user + pass))
		ping := msgp.AppendArrayHeader(nil, 6)
		for _, s := range []string{"PING", "client-host", string(salt), hex.EncodeToString(h[:]), user, hex.EncodeToString(p[:])} {
			ping = msgp.AppendString(ping, s)
		}
		c.Write(ping)
		if n, err := r.ReadArrayHeader(); err != nil || n != 5 {
			t.Fatalf("PONG: %v %d", err, n)
		}
		r.ReadString()
		ok, _ = r.ReadBool()
		reason, _ = r.ReadString()
		r.ReadString()
		digest, _ := r.ReadString()
		if ok {
			want := sha512.Sum512([]byte(string(salt) + f.srv.hostname + string(nonce) + key))
			if digest != hex.EncodeToString(want[:]) {
				t.Fatal("PONG digest does not prove the server knows the key")
			}
			c.Write(messageMode("t", eventTime(time.Now()), record("a", 1), options("h")))
			if readAck(t, c) != "h" {
				t.Fatal("no ack after the handshake")
			}
		} else {
			expectClosed(t, c)
		}
		return ok, reason
	}
	if ok, reason := try("s3cret", "fluent", "pw"); !ok {
		t.Fatalf("right key refused: %s", reason)
	}
	if ok, reason := try("wrong", "fluent", "pw"); ok || reason != "shared_key mismatch" {
		t.Fatalf("wrong key: %v %q", ok, reason)
	}
	if ok, reason := try("s3cret", "fluent", "nope"); ok || reason != "username/password mismatch" {
		t.Fatalf("wrong password: %v %q", ok, reason)
	}
	if n := testutil.ToFloat64(f.metrics.Rejected.WithLabelValues("forward", "handshake")); n != 2 {
		t.Fatalf("rejected{handshake} = %v", n)
	}
	// A client that skips the handshake and sends records is refused too.
	c := f.dial()
	c.Write(messageMode("t", eventTime(time.Now()), record("a", 1), options("x")))
	expectClosed(t, c)
	if n := len(f.records()); n != 1 {
		t.Fatalf("%d records stored, want only the authenticated one", n)
	}
}

// A client without the shared key sends a message where the handshake's
// PING should be: the log says to set the key on the client.
func TestHandshakeSkippedSaysWhy(t *testing.T) {
	cfg := defaultCfg()
	cfg.SharedKey = "s3cret"
	f := start(t, cfg, wal.Options{})
	c := f.dial()
	c.Write(messageMode("t", eventTime(time.Now()), record("a", 1), options("x")))
	expectClosed(t, c)
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(f.logs.String(), "got a message (an array of 4): shared_key is set here, so the client must have it set too"); {
		if time.Now().After(deadline) {
			t.Fatalf("the log does not say the client skipped the handshake:\n%s", f.logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestWALFullPushesBack(t *testing.T) {
	dir := t.TempDir()
	w, err := wal.Open(dir, wal.Options{MaxBytes: 8 << 10})
	if err != nil {
		t.Fatal(err)
	}
	f := startOn(t, w, defaultCfg())
	if _, err := w.RegisterCursor(t.Context(), "sink"); err != nil {
		t.Fatal(err)
	}
	c := f.dial()
	rng := rand.New(rand.NewSource(1))
	acked := 0
	for i := 0; ; i++ {
		pad := make([]byte, 3000) // random: it must not compress away
		for j := range pad {
			pad[j] = byte('a' + rng.Intn(26))
		}
		c.Write(messageMode("t", eventTime(time.Now()), record("i", i, "pad", string(pad)), options(string(rune('A'+i)))))
		c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		r := msgp.NewReader(c)
		if _, err := r.ReadMapHeader(); err != nil {
			break // no ack: the WAL is full and the client is held
		}
		r.ReadString()
		r.ReadString()
		acked++
		if i > 20 {
			t.Fatal("the WAL never filled")
		}
	}
	if !w.Full() {
		t.Fatal("the WAL does not report full")
	}
	var b wal.Batch
	b.SetCursor("sink", w.Stats().NextSeq-1)
	if err := w.Commit(t.Context(), &b); err != nil {
		t.Fatal(err)
	}
	readAck(t, c) // released once the sink passes the records
	if n := w.Stats().NextSeq - 1; n != uint64(acked+1) {
		t.Fatalf("%d records appended, want %d", n, acked+1)
	}
}

// A client that keeps sending bad input is counted every time and logged
// once a minute, not once a connection.
func TestBadInputLoggedOncePerMinute(t *testing.T) {
	f := start(t, defaultCfg(), wal.Options{})
	for i := 0; i < 5; i++ {
		c := f.dial()
		c.Write(msgp.AppendString(nil, "not a message"))
		expectClosed(t, c)
	}
	if n := testutil.ToFloat64(f.metrics.Rejected.WithLabelValues("forward", "malformed")); n != 5 {
		t.Fatalf("rejected{malformed} = %v, want 5", n)
	}
	if n := strings.Count(f.logs.String(), "closing connection: bad input"); n != 1 {
		t.Fatalf("%d log lines for 5 bad connections within a minute:\n%s", n, f.logs.String())
	}
}

// TestBadInputSaysWhat: the log line of a refusal says what was wrong in
// terms the client's operator can act on.
func TestBadInputSaysWhat(t *testing.T) {
	for _, tt := range []struct {
		msg  []byte
		want string
	}{
		{packedMode("fluentbit.metrics", record("meta", map[string]any{}), false, options("c", "fluent_signal", 1)),
			`fluent_signal 1 (metrics) for tag \"fluentbit.metrics\": this forwarder takes logs only`},
		{forwardMode("envoy", [][]byte{entry(eventTime(time.Now()), record("span", "x"))}, options("", "fluent_signal", "2")),
			`fluent_signal 2 (traces) for tag \"envoy\"`},
		{[]byte(`{"tag":"t"}`), "the message is JSON, not msgpack"},
	} {
		f := start(t, defaultCfg(), wal.Options{})
		c := f.dial()
		c.Write(tt.msg)
		expectClosed(t, c)
		if !strings.Contains(f.logs.String(), tt.want) {
			t.Errorf("the log does not say %s:\n%s", tt.want, f.logs.String())
		}
	}
	// A signal of logs, said or not, is taken.
	for _, opt := range [][]byte{options("c", "fluent_signal", 0), options("c", "fluent_signal", "0"), options("c")} {
		f := start(t, defaultCfg(), wal.Options{})
		c := f.dial()
		c.Write(packedMode("t", entry(eventTime(time.Now()), record("a", 1)), false, opt))
		readAck(t, c)
		f.waitRecords(1)
	}
}

// A message the WAL can never hold (larger than wal.max_bytes stored) is
// not acknowledged, counted as too_large, and the warning says what to
// change; a message that fits is still taken.
func TestMessageLargerThanTheWAL(t *testing.T) {
	dir := t.TempDir()
	w, err := wal.Open(dir, wal.Options{MaxBytes: 8 << 10})
	if err != nil {
		t.Fatal(err)
	}
	f := startOn(t, w, defaultCfg())
	rng := rand.New(rand.NewSource(1))
	pad := make([]byte, 16<<10) // random: it must not compress away
	for j := range pad {
		pad[j] = byte('a' + rng.Intn(26))
	}
	c := f.dial()
	c.Write(messageMode("t", eventTime(time.Now()), record("pad", string(pad)), options("big")))
	expectClosed(t, c)
	if n := testutil.ToFloat64(f.metrics.Rejected.WithLabelValues("forward", "too_large")); n != 1 {
		t.Errorf("rejected{too_large} = %v, want 1", n)
	}
	if n := testutil.ToFloat64(f.metrics.Rejected.WithLabelValues("forward", "wal_error")); n != 0 {
		t.Errorf("rejected{wal_error} = %v, want 0", n)
	}
	if !strings.Contains(f.logs.String(), "message larger than the WAL can ever hold (wal.max_bytes)") {
		t.Errorf("no warning naming wal.max_bytes:\n%s", f.logs.String())
	}
	c = f.dial()
	c.Write(messageMode("t", eventTime(time.Now()), record("small", 1), options("small")))
	readAck(t, c)
}

// The refusals of a client's credentials have series (at 0) from the
// start: an alert's increase() sees the first refusal after a restart.
func TestCredentialRefusalSeriesFromTheStart(t *testing.T) {
	f := start(t, defaultCfg(), wal.Options{})
	if n := testutil.CollectAndCount(f.metrics.Rejected, "forwarder_input_rejected_total"); n != 3 {
		t.Fatalf("%d series of forwarder_input_rejected_total at the start, want the 3 of the credentials", n)
	}
	for _, r := range []string{"handshake", "handshake_timeout", "tls_handshake"} {
		if v := testutil.ToFloat64(f.metrics.Rejected.WithLabelValues("forward", r)); v != 0 {
			t.Errorf("rejected{%s} = %v at the start", r, v)
		}
	}
	if n := testutil.CollectAndCount(f.metrics.Rejected, "forwarder_input_rejected_total"); n != 3 {
		t.Fatalf("%d series: not those of the credentials", n)
	}
}

// A message of nearly max_message_bytes whose JSON outgrows its msgpack
// (binary values become base64) is taken within the default budget: its
// JSON grows by chunks, not by copies of itself, which needed more than
// the whole budget and refused it for good (over_memory_budget), the
// client sending it again forever.
func TestLargeMessageWhoseJSONOutgrowsIt(t *testing.T) {
	cfg := defaultCfg()
	cfg.MaxMessageBytes = 16 << 20
	cfg.MaxRecordsPerMessage = 100000
	f := start(t, cfg, wal.Options{})
	bin := make([]byte, 300)
	for i := range bin {
		bin[i] = byte(i * 7)
	}
	rec := msgp.AppendBytes(msgp.AppendString(msgp.AppendMapHeader(nil, 1), "b"), bin)
	var entries [][]byte
	size := 0
	for size < 15<<20 {
		e := entry(eventTime(time.Now()), rec)
		entries = append(entries, e)
		size += len(e)
	}
	msg := forwardMode("big", entries, options("big-1"))
	if len(msg) > int(cfg.MaxMessageBytes) {
		t.Fatalf("the message is %d bytes, over max_message_bytes", len(msg))
	}
	c := f.dial()
	go c.Write(msg)
	readAck(t, c)
	if n := len(f.records()); n != len(entries) {
		t.Fatalf("%d records stored, want %d", n, len(entries))
	}
	if n := testutil.ToFloat64(f.metrics.Rejected.WithLabelValues("forward", "over_memory_budget")); n != 0 {
		t.Errorf("over_memory_budget %v", n)
	}
	// The chunks were released with the message: the budget is empty.
	if held := testutil.ToFloat64(f.metrics.MemoryHeld.WithLabelValues("forward")); held > 1<<20 {
		t.Errorf("%v bytes still held of the budget after the message", held)
	}
}
