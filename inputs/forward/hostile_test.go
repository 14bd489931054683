package forward

import (
	"bytes"
	"compress/gzip"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/tinylib/msgp/msgp"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/inputs"
	"github.com/logfwd/forwarder/internal/heaptest"
	"github.com/logfwd/forwarder/wal"
)

// The bounds of the probes, with the runtime's memory limit at the default
// memory_limit, 128 MiB, as run sets it:
//   - Hold: what the server may hold (the live heap once the probe has
//     taken what it will, above the heap before it): the inputs' budget at
//     the default memory_limit and its reserve for small messages (48 and
//     3 MiB: messages, decompressed entries and records), and 8 MiB for the
//     rest: connection and TLS state, the WAL;
//   - Heap: what the whole heap, garbage included, may reach meanwhile:
//     the memory limit, and a quarter for the collector to catch up (it
//     reached 137 MiB once, without -race).
var bounds = heaptest.Bounds{
	Limit: 128 << 20,
	Hold:  51<<20 + 8<<20,
	Heap:  128<<20 + 32<<20,
	Gauge: 51 << 20, // the budget and its reserve
}

// probe is a hostile client, run on many connections at once.
type probe struct {
	name  string
	conns int
	// handshake: the server has TLS and a shared key, and the client sends
	// its message in place of the PING, after the TLS handshake and HELO.
	handshake bool
	msg       func(t testing.TB) []byte
	whole     bool   // msg is sent whole (else all but its last byte, and the connection kept open)
	reason    string // with whole: why the server closes each connection
}

// The hostile clients of the forward input. None of them may take the
// server's memory beyond its budget, stop a well-behaved client from being
// acknowledged meanwhile, or get anything stored.
func TestHostileClients(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: hostile clients, some of them slow on purpose; make test runs it")
	}
	probes := []probe{
		{name: "unfinished 16 MB messages", conns: 20, msg: unfinishedMessage},
		{name: "a 16 MB PING after the TLS handshake", conns: 30, handshake: true, msg: hugePing, whole: true, reason: "handshake"},
		{name: "gzip bomb of 20M tiny records", conns: 1, msg: gzipBomb, whole: true, reason: "too_many_records"},
		{name: "100,001 records in a Forward message", conns: 4, msg: manyRecords, whole: true, reason: "too_many_records"},
	}
	certFile, keyFile, cert := selfSigned(t, "server")
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	for _, p := range probes {
		t.Run(p.name, func(t *testing.T) {
			cfg := defaultCfg()
			cfg.MaxMessageBytes, cfg.MaxConnections = 16*config.MiB, 64
			if p.handshake {
				cfg.TLS = config.TLS{CertFile: certFile, KeyFile: keyFile}
				cfg.SharedKey = "k"
			}
			f := start(t, cfg, wal.Options{})
			connect := func() net.Conn {
				c := f.dial()
				if !p.handshake {
					return c
				}
				tc := tls.Client(c, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
				t.Cleanup(func() { tc.Close() })
				return tc
			}
			msg := p.msg(t)
			if !p.whole {
				msg = msg[:len(msg)-1]
			}
			var wg sync.WaitGroup
			var hostile []net.Conn
			// A well-behaved client is served meanwhile.
			good := func() net.Conn {
				c := connect()
				if p.handshake {
					authenticate(t, c, "k")
				}
				return c
			}
			heaptest.Probe(t, bounds, p.conns, func() {
				for range p.conns {
					c := connect()
					hostile = append(hostile, c)
					wg.Go(func() {
						if p.handshake {
							c.SetReadDeadline(time.Now().Add(10 * time.Second))
							readHELO(t, c)
						}
						c.SetWriteDeadline(time.Now().Add(30 * time.Second))
						c.Write(msg) // fails once the server closes the connection
					})
				}
			}, func() { sendAndAck(t, good(), "good-1") },
				func() float64 { return testutil.ToFloat64(f.metrics.MemoryHeld.WithLabelValues("forward")) })

			if p.whole {
				waitCount(t, f, p.reason, float64(p.conns))
			}
			for _, c := range hostile {
				c.Close()
			}
			wg.Wait()
			// The server is up and serves a new client; nothing of the
			// hostile ones was stored.
			sendAndAck(t, good(), "good-2")
			for _, r := range f.records() {
				if r.Tag != "t" {
					t.Fatalf("a record of a hostile client was stored: tag %q, %d bytes", r.Tag, len(r.Body))
				}
			}
			if n := len(f.records()); n != 2 {
				t.Fatalf("%d records stored, want the well-behaved client's 2", n)
			}
			runtime.KeepAlive(msg) // in the heap before the probe, and to its end
		})
	}
}

// unfinishedMessage is a Message-mode message of 16 MB (all of it is sent
// but its last byte).
func unfinishedMessage(t testing.TB) []byte { return sizedMessage(t, 16<<20, "big") }

// hugePing is a PING whose hostname claims 16 MiB, and brings all of it.
func hugePing(testing.TB) []byte {
	p := msgp.AppendArrayHeader(nil, 6)
	p = msgp.AppendString(p, "PING")
	p = append(p, 0xdb)
	p = binary.BigEndian.AppendUint32(p, 16<<20)
	return append(p, bytes.Repeat([]byte{'h'}, 16<<20)...)
}

var (
	bombOnce sync.Once
	bomb     []byte
)

// gzipBomb is a CompressedPackedForward message of about 60 KB whose
// entries, [1, {}] each, take 60 MB once decompressed: 20M records, within
// four times max_message_bytes. It is 20 gzip members of 1M entries each
// (one compressed, repeated).
func gzipBomb(t testing.TB) []byte {
	bombOnce.Do(func() {
		var z bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&z, gzip.BestCompression)
		zw.Write(bytes.Repeat([]byte{0x92, 0x01, 0x80}, 1_000_000))
		zw.Close()
		bomb = packedMode("bomb", bytes.Repeat(z.Bytes(), 20), false, options("bomb", "compressed", "gzip"))
	})
	if len(bomb) > 64<<10 {
		t.Fatalf("the gzip bomb takes %d bytes", len(bomb))
	}
	return bomb
}

// manyRecords is a Forward message of 100,001 records, one over
// max_records_per_message.
func manyRecords(testing.TB) []byte {
	e := entry(msgp.AppendInt(nil, 1), []byte{0x80})
	entries := make([][]byte, 100_001)
	for i := range entries {
		entries[i] = e
	}
	return forwardMode("many", entries, options("many"))
}

// Messages of legitimate clients that together need more than the budget
// are all stored in the end: those that wait get room as others are
// stored, and when every one of them holds part of the budget and waits
// for more, one gives way (its connection closed, counted as memory_full)
// and its client sends it again, as forward clients do when a connection
// breaks before the ack.
func TestLargeMessagesShareTheBudget(t *testing.T) {
	cfg := defaultCfg()
	cfg.MaxMessageBytes = 8 * config.MiB
	budget := inputs.NewBudget(6<<20, nil) // one hold: at most 5.25 MiB
	f := start(t, cfg, wal.Options{}, func(s *Server) { s.p.Budget = budget })
	const clients = 4
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i := range clients {
		msg := sizedMessage(t, 3<<19, fmt.Sprint("large-", i)) // about 3.5 MiB to decode: one at a time
		wg.Go(func() {
			deadline := time.Now().Add(60 * time.Second)
			for tries := 1; ; tries++ {
				c, err := net.Dial("tcp", f.addr())
				if err != nil {
					errs <- err
					return
				}
				c.SetDeadline(deadline)
				c.Write(msg)
				id, err := readAckErr(c)
				c.Close()
				if err == nil && id == fmt.Sprint("large-", i) {
					return
				}
				if time.Now().After(deadline) {
					errs <- fmt.Errorf("client %d: no ack after %d tries: %v", i, tries, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	f.waitRecords(clients)
	if budget.Used() != 0 {
		t.Fatalf("the budget holds %d bytes with every message stored", budget.Used())
	}
	t.Logf("waits %v, connections given up %v", testutil.ToFloat64(f.metrics.MemoryWaits.WithLabelValues("forward")),
		testutil.ToFloat64(f.metrics.Rejected.WithLabelValues("forward", "memory_full")))
}

// A message larger than the budget can ever hold for one is refused at
// once, as oversize, with a log line that says what to change; it never
// waits for room that cannot come, and other clients go on.
func TestMessageOverBudget(t *testing.T) {
	cfg := defaultCfg()
	cfg.MaxMessageBytes = 16 * config.MiB
	f := start(t, cfg, wal.Options{}, func(s *Server) { s.p.Budget = inputs.NewBudget(8<<20, s.p.Metrics) })
	c := f.dial()
	start := time.Now()
	go c.Write(sizedMessage(t, 6<<20, "over"))
	expectClosed(t, c)
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("refused after %v", d)
	}
	waitCount(t, f, "over_memory_budget", 1)
	if !strings.Contains(f.logs.String(), "needs more memory than the inputs' budget gives one message") {
		t.Fatalf("the log does not say why:\n%s", f.logs.String())
	}
	sendAndAck(t, f.dial(), "after")
	if n := len(f.records()); n != 1 {
		t.Fatalf("%d records stored, want 1", n)
	}
	if !strings.Contains(f.logs.String(), "a message of max_message_bytes needs more memory than the inputs' budget gives one message") {
		t.Fatalf("no warning at start that max_message_bytes does not fit the budget:\n%s", f.logs.String())
	}
}

// The largest message the default limits allow, 16 MiB of 100,000 records,
// fits the default budget: it is stored, not refused as over the budget.
func TestLargestMessageFits(t *testing.T) {
	cfg := defaultCfg()
	cfg.MaxMessageBytes = 16 * config.MiB
	f := start(t, cfg, wal.Options{})
	log := strings.Repeat("x", 149)
	e := entry(eventTime(time.Unix(1764489601, 0)), record("log", log))
	entries := make([][]byte, 100_000)
	for i := range entries {
		entries[i] = e
	}
	msg := forwardMode("largest", entries, options("largest"))
	if len(msg) > 16<<20 || len(msg) < 16<<20-100<<10 {
		t.Fatalf("the message takes %d bytes", len(msg))
	}
	c := f.dial()
	go c.Write(msg)
	c.SetReadDeadline(time.Now().Add(60 * time.Second))
	if id, err := readAckErr(c); err != nil || id != "largest" {
		t.Fatalf("no ack: %v\n%s", err, f.logs.String())
	}
	if n := f.w.Stats().NextSeq - 1; n != 100_000 {
		t.Fatalf("%d records stored", n)
	}
}
