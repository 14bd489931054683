package forward

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tinylib/msgp/msgp"
	"go.uber.org/goleak"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/inputs"
	"github.com/logfwd/forwarder/internal/syncbuf"
	"github.com/logfwd/forwarder/wal"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		crashChild(dir)
		return
	}
	goleak.VerifyTestMain(m)
}

// syncBuf collects the server's log while the test reads it.
type syncBuf = syncbuf.Buffer

type fixture struct {
	t       testing.TB
	w       *wal.WAL
	srv     *Server
	metrics *inputs.Metrics
	logs    *syncBuf
	cancel  context.CancelFunc
	done    chan error
}

func defaultCfg() config.Forward {
	return config.Forward{Listen: "127.0.0.1:0", MaxMessageBytes: 1 << 20, MaxConnections: 16}
}

// start runs a forward server on a fresh WAL.
func start(t testing.TB, cfg config.Forward, walOpts wal.Options, tweak ...func(*Server)) *fixture {
	t.Helper()
	w, err := wal.Open(t.TempDir(), walOpts)
	if err != nil {
		t.Fatal(err)
	}
	return startOn(t, w, cfg, tweak...)
}

func startOn(t testing.TB, w *wal.WAL, cfg config.Forward, tweak ...func(*Server)) *fixture {
	t.Helper()
	f := &fixture{t: t, w: w, metrics: inputs.NewMetrics(nil), logs: &syncBuf{}, done: make(chan error, 1)}
	log := slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	f.srv = New(cfg, &inputs.Pipeline{WAL: w, Metrics: f.metrics, Routed: func(tag string) bool { return !strings.HasPrefix(tag, "nowhere") }}, log)
	for _, fn := range tweak {
		fn(f.srv)
	}
	if err := f.srv.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	go func() { f.done <- f.srv.Serve(ctx) }()
	t.Cleanup(f.stop)
	return f
}

func (f *fixture) stop() {
	if f.cancel == nil {
		return
	}
	f.cancel()
	f.cancel = nil
	if err := <-f.done; err != nil {
		f.t.Errorf("serve: %v", err)
	}
	f.w.Close()
}

func (f *fixture) addr() string { return f.srv.Addr().String() }

func (f *fixture) dial() net.Conn {
	f.t.Helper()
	c, err := net.Dial("tcp", f.addr())
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { c.Close() })
	return c
}

func (f *fixture) records() []wal.Record {
	f.t.Helper()
	recs, err := f.w.Read(1, 0, 0)
	if err != nil {
		f.t.Fatal(err)
	}
	return recs
}

// waitRecords waits until the WAL holds n records.
func (f *fixture) waitRecords(n int) []wal.Record {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		recs := f.records()
		if len(recs) >= n || time.Now().After(deadline) {
			if len(recs) != n {
				f.t.Fatalf("WAL holds %d records, want %d", len(recs), n)
			}
			return recs
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// readAck reads one {"ack": id} answer.
func readAck(t testing.TB, c net.Conn) string {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	id, err := readAckErr(c)
	if err != nil {
		t.Fatalf("read ack: %v", err)
	}
	return id
}

func readAckErr(c net.Conn) (string, error) {
	// One byte a read: a buffered reader would take the next ack too, and
	// the next call would never see it.
	r := msgp.NewReader(byteReader{c})
	n, err := r.ReadMapHeader()
	if err != nil || n != 1 {
		return "", fmt.Errorf("ack: %v (%d keys)", err, n)
	}
	if k, err := r.ReadString(); err != nil || k != "ack" {
		return "", fmt.Errorf("ack key %q: %v", k, err)
	}
	return r.ReadString()
}

// byteReader reads at most one byte at a time.
type byteReader struct{ r io.Reader }

func (b byteReader) Read(p []byte) (int, error) {
	if len(p) > 1 {
		p = p[:1]
	}
	return b.r.Read(p)
}

// expectClosed checks that the server closes c.
func expectClosed(t testing.TB, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := io.ReadAll(c)
	if err != nil && !strings.Contains(err.Error(), "reset") {
		t.Fatalf("connection not closed by the server: %v", err)
	}
}

// Message builders.

func eventTime(t time.Time) []byte {
	b := []byte{0xd7, 0x00, 0, 0, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[2:], uint32(t.Unix()))
	binary.BigEndian.PutUint32(b[6:], uint32(t.Nanosecond()))
	return b
}

func record(kv ...any) []byte {
	b := msgp.AppendMapHeader(nil, uint32(len(kv)/2))
	for i := 0; i < len(kv); i += 2 {
		b = msgp.AppendString(b, kv[i].(string))
		var err error
		if b, err = msgp.AppendIntf(b, kv[i+1]); err != nil {
			panic(err)
		}
	}
	return b
}

func options(chunk string, extra ...any) []byte {
	n := uint32(len(extra) / 2)
	if chunk != "" {
		n++
	}
	b := msgp.AppendMapHeader(nil, n)
	if chunk != "" {
		b = msgp.AppendString(b, "chunk")
		b = msgp.AppendString(b, chunk)
	}
	for i := 0; i < len(extra); i += 2 {
		b = msgp.AppendString(b, extra[i].(string))
		b, _ = msgp.AppendIntf(b, extra[i+1])
	}
	return b
}

func messageMode(tag string, tm []byte, rec []byte, opt []byte) []byte {
	n := uint32(3)
	if opt != nil {
		n = 4
	}
	b := msgp.AppendArrayHeader(nil, n)
	b = msgp.AppendString(b, tag)
	b = append(b, tm...)
	b = append(b, rec...)
	return append(b, opt...)
}

func entry(tm, rec []byte) []byte {
	b := msgp.AppendArrayHeader(nil, 2)
	b = append(b, tm...)
	return append(b, rec...)
}

func forwardMode(tag string, entries [][]byte, opt []byte) []byte {
	n := uint32(2)
	if opt != nil {
		n = 3
	}
	b := msgp.AppendArrayHeader(nil, n)
	b = msgp.AppendString(b, tag)
	b = msgp.AppendArrayHeader(b, uint32(len(entries)))
	for _, e := range entries {
		b = append(b, e...)
	}
	return append(b, opt...)
}

func packedMode(tag string, packed []byte, asStr bool, opt []byte) []byte {
	n := uint32(2)
	if opt != nil {
		n = 3
	}
	b := msgp.AppendArrayHeader(nil, n)
	b = msgp.AppendString(b, tag)
	if asStr {
		b = msgp.AppendStringFromBytes(b, packed)
	} else {
		b = msgp.AppendBytes(b, packed)
	}
	return append(b, opt...)
}
