package forward

import (
	"crypto/sha512"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/tinylib/msgp/msgp"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/wal"
)

// readHELO reads the server's HELO and returns its nonce.
func readHELO(t *testing.T, c net.Conn) []byte {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	r := msgp.NewReader(byteReader{c})
	if n, err := r.ReadArrayHeader(); err != nil || n != 2 {
		t.Fatalf("HELO: %v (%d elements)", err, n)
	}
	if s, _ := r.ReadString(); s != "HELO" {
		t.Fatalf("got %q, want HELO", s)
	}
	var nonce []byte
	n, _ := r.ReadMapHeader()
	for range n {
		if k, _ := r.ReadString(); k == "nonce" {
			nonce, _ = r.ReadBytes(nil)
		} else {
			r.Skip()
		}
	}
	return nonce
}

// ping is a PING for the nonce and key, without users.
func ping(nonce []byte, key string) []byte {
	salt := "client-salt"
	h := sha512.Sum512([]byte(salt + "client-host" + string(nonce) + key))
	b := msgp.AppendArrayHeader(nil, 6)
	for _, s := range []string{"PING", "client-host", salt, hex.EncodeToString(h[:]), "", ""} {
		b = msgp.AppendString(b, s)
	}
	return b
}

// authenticate passes the handshake on c, or fails the test.
func authenticate(t *testing.T, c net.Conn, key string) {
	t.Helper()
	c.Write(ping(readHELO(t, c), key))
	r := msgp.NewReader(byteReader{c})
	if n, err := r.ReadArrayHeader(); err != nil || n != 5 {
		t.Fatalf("PONG: %v (%d elements)", err, n)
	}
	r.ReadString()
	if ok, _ := r.ReadBool(); !ok {
		reason, _ := r.ReadString()
		t.Fatalf("handshake refused: %s", reason)
	}
	r.Skip()
	r.Skip()
	r.Skip()
}

// sendAndAck sends one message with a chunk id on c and waits for its ack.
func sendAndAck(t *testing.T, c net.Conn, chunk string) {
	t.Helper()
	c.Write(messageMode("t", eventTime(time.Now()), record("chunk", chunk), options(chunk)))
	if id := readAck(t, c); id != chunk {
		t.Fatalf("ack %q, want %q", id, chunk)
	}
}

// waitCount waits for a rejected{reason} count to reach want.
func waitCount(t *testing.T, f *fixture, reason string, want float64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(f.metrics.Rejected.WithLabelValues("forward", reason)) < want && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := testutil.ToFloat64(f.metrics.Rejected.WithLabelValues("forward", reason)); n != want {
		t.Fatalf("rejected{%s} = %v, want %v; log:\n%s", reason, n, want, f.logs.String())
	}
}

// A connection must finish its handshake, the TLS one and HELO/PING/PONG,
// within handshake_timeout of its accept, not hold its slot for as long as it likes:
// a connection that never sends a ClientHello, or stops after HELO, or
// sends its PING a byte at a time, is closed and counted. A connection
// past its handshake is not bound by it.
func TestHandshakeTimeout(t *testing.T) {
	certFile, keyFile, cert := selfSigned(t, "server")
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	tlsCfg := config.TLS{CertFile: certFile, KeyFile: keyFile}
	const timeout = 500 * time.Millisecond
	tests := []struct {
		name   string
		tls    bool
		key    string
		client func(t *testing.T, c net.Conn) net.Conn // returns the connection to watch
	}{
		{"no ClientHello", true, "", func(t *testing.T, c net.Conn) net.Conn { return c }},
		{"half a ClientHello", true, "", func(t *testing.T, c net.Conn) net.Conn {
			c.Write([]byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01}) // a record header and a byte of it
			return c
		}},
		{"no PING after HELO", false, "k", func(t *testing.T, c net.Conn) net.Conn { readHELO(t, c); return c }},
		{"a PING a byte at a time", false, "k", func(t *testing.T, c net.Conn) net.Conn {
			p := ping(readHELO(t, c), "k")
			go func() {
				for _, b := range p {
					if _, err := c.Write([]byte{b}); err != nil {
						return
					}
					time.Sleep(timeout / 10)
				}
			}()
			return c
		}},
		{"no PING after HELO over TLS", true, "k", func(t *testing.T, c net.Conn) net.Conn {
			tc := tls.Client(c, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
			if err := tc.Handshake(); err != nil {
				t.Fatal(err)
			}
			readHELO(t, tc)
			return tc
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel() // each waits out the timeout
			cfg := defaultCfg()
			cfg.SharedKey, cfg.HandshakeTimeout = tt.key, config.Duration(timeout)
			if tt.tls {
				cfg.TLS = tlsCfg
			}
			f := start(t, cfg, wal.Options{})
			began := time.Now()
			c := tt.client(t, f.dial())
			expectClosed(t, c)
			if d := time.Since(began); d > timeout+2*time.Second {
				t.Fatalf("closed after %v, handshake_timeout is %v", d, timeout)
			}
			waitCount(t, f, "handshake_timeout", 1)

			// A client that finishes its handshake in time keeps its
			// connection past handshake_timeout.
			var ok net.Conn = f.dial()
			if tt.tls {
				ok = tls.Client(ok, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
			}
			if tt.key != "" {
				authenticate(t, ok, tt.key)
			}
			sendAndAck(t, ok, "a")
			time.Sleep(timeout + 200*time.Millisecond)
			sendAndAck(t, ok, "b")
		})
	}
}

// A PING is refused once it passes 64 KiB, before the server buffers it
// whole: max_message_bytes is for authenticated clients.
func TestHandshakeMessageLimit(t *testing.T) {
	cfg := defaultCfg()
	cfg.SharedKey, cfg.MaxMessageBytes = "k", 16*config.MiB
	f := start(t, cfg, wal.Options{})
	c := f.dial()
	readHELO(t, c)
	// A PING whose hostname claims 1 MiB, and 100 KiB of it.
	p := msgp.AppendArrayHeader(nil, 6)
	p = msgp.AppendString(p, "PING")
	p = append(p, 0xdb)
	p = binary.BigEndian.AppendUint32(p, 1<<20)
	p = append(p, strings.Repeat("h", 100<<10)...)
	go c.Write(p)
	expectClosed(t, c)
	waitCount(t, f, "handshake", 1)
	if !strings.Contains(f.logs.String(), "exceeds the handshake's limit (65536)") {
		t.Fatalf("the log does not say why:\n%s", f.logs.String())
	}
}

// Connections that never finish their handshake do not lock others out:
// with max_connections taken, a new connection takes the slot of the
// oldest one still in its handshake, which is closed and counted; then
// the one idle the longest.
func TestHandshakesGiveWay(t *testing.T) {
	certFile, keyFile, cert := selfSigned(t, "server")
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	for _, mode := range []string{"shared_key", "tls"} {
		t.Run(mode, func(t *testing.T) {
			cfg := defaultCfg()
			cfg.MaxConnections, cfg.HandshakeTimeout = 4, config.Duration(time.Minute)
			if mode == "tls" {
				cfg.TLS = config.TLS{CertFile: certFile, KeyFile: keyFile}
			} else {
				cfg.SharedKey = "k"
			}
			f := start(t, cfg, wal.Options{})
			connect := func() net.Conn {
				c := f.dial()
				if mode == "tls" {
					return tls.Client(c, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
				}
				authenticate(t, c, "k")
				return c
			}
			// Four connections that stay in their handshake: no ClientHello,
			// or no PING after HELO.
			var idle []net.Conn
			for range 4 {
				c := f.dial()
				if mode == "shared_key" {
					readHELO(t, c)
				}
				idle = append(idle, c)
			}
			waitOpen(t, f, 4)
			// A real client is served all the same, and then three more.
			for i := range 4 {
				sendAndAck(t, connect(), string(rune('a'+i)))
			}
			waitCount(t, f, "evicted", 4)
			for _, c := range idle {
				expectClosed(t, c)
			}
			if !strings.Contains(f.logs.String(), "closed a connection still in its handshake to make room") {
				t.Fatalf("no log line for the evictions:\n%s", f.logs.String())
			}
			// Every slot is held past the handshake, by idle connections: a
			// new one takes the slot of the one idle the longest (refused
			// only when all are at work: TestTooManyConnections).
			sendAndAck(t, connect(), "e")
			waitCount(t, f, "evicted", 5)
			if n := testutil.ToFloat64(f.metrics.Rejected.WithLabelValues("forward", "too_many_connections")); n != 0 {
				t.Fatalf("rejected{too_many_connections} = %v", n)
			}
			if n := len(f.records()); n != 5 {
				t.Fatalf("%d records stored, want 5", n)
			}
		})
	}
}

// waitOpen waits until the server holds n connections.
func waitOpen(t *testing.T, f *fixture, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for f.srv.slots.Open() != n && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := f.srv.slots.Open(); got != n {
		t.Fatalf("%d connections open, want %d", got, n)
	}
}

// A server that stops while a client is in its handshake closes the
// connection quietly: not a bad handshake, not counted as one.
func TestStopInAHandshake(t *testing.T) {
	cfg := defaultCfg()
	cfg.SharedKey = "k"
	f := start(t, cfg, wal.Options{})
	c := f.dial()
	readHELO(t, c) // and no PING
	f.stop()
	expectClosed(t, c)
	for _, reason := range []string{"handshake", "handshake_timeout"} {
		if n := testutil.ToFloat64(f.metrics.Rejected.WithLabelValues("forward", reason)); n != 0 {
			t.Errorf("rejected{%s} = %v, want 0; log:\n%s", reason, n, f.logs.String())
		}
	}
	if !strings.Contains(f.logs.String(), "connection closed in its handshake: the server is stopping") {
		t.Errorf("no debug line for the stop:\n%s", f.logs.String())
	}
}

// A port check (a load balancer's probe, nc -z) connects and closes
// without a byte: at once, or once the HELO has arrived unread (the close
// then resets the connection), or with a reset of its own. None is a
// refused handshake: not counted, not a warning. A client that does send
// a bad handshake still is.
func TestPortChecksAreNotCounted(t *testing.T) {
	certFile, keyFile, cert := selfSigned(t, "server")
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	for _, tt := range []struct {
		name   string
		tls    bool
		key    string
		reason string
		bad    func(t *testing.T, c net.Conn)
	}{
		{"shared_key", false, "k", "handshake", func(t *testing.T, c net.Conn) {
			c.Write(ping(readHELO(t, c), "wrong"))
		}},
		{"tls", true, "", "tls_handshake", func(t *testing.T, c net.Conn) {
			c.Write([]byte("not a ClientHello, not at all\r\n"))
		}},
		{"tls and shared_key", true, "k", "handshake", func(t *testing.T, c net.Conn) {
			tc := tls.Client(c, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
			if err := tc.Handshake(); err != nil {
				t.Fatal(err)
			}
			tc.Write(ping(readHELO(t, tc), "wrong"))
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := defaultCfg()
			cfg.SharedKey = tt.key
			if tt.tls {
				cfg.TLS = config.TLS{CertFile: certFile, KeyFile: keyFile}
			}
			f := start(t, cfg, wal.Options{})
			probes := []func(c *net.TCPConn){
				func(c *net.TCPConn) { c.Close() },
				func(c *net.TCPConn) { time.Sleep(100 * time.Millisecond); c.Close() },
				func(c *net.TCPConn) { c.SetLinger(0); c.Close() },
				func(c *net.TCPConn) { time.Sleep(100 * time.Millisecond); c.SetLinger(0); c.Close() },
			}
			if tt.tls {
				// A TLS check (HAProxy's check-ssl, openssl s_client): its
				// TLS handshake, then a close, the HELO read or not.
				probes = append(probes, func(c *net.TCPConn) {
					tc := tls.Client(c, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
					if err := tc.Handshake(); err != nil {
						t.Error(err)
					}
					tc.Close()
				}, func(c *net.TCPConn) {
					tc := tls.Client(c, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
					if err := tc.Handshake(); err != nil {
						t.Error(err)
					}
					time.Sleep(100 * time.Millisecond)
					tc.Close()
				})
			}
			for _, probe := range probes {
				probe(f.dial().(*net.TCPConn))
			}
			c := f.dial()
			tt.bad(t, c)
			expectClosed(t, c)
			waitCount(t, f, tt.reason, 1) // the bad client alone
			time.Sleep(100 * time.Millisecond)
			for _, reason := range []string{"handshake", "tls_handshake"} {
				want := 0.0
				if reason == tt.reason {
					want = 1
				}
				if n := testutil.ToFloat64(f.metrics.Rejected.WithLabelValues("forward", reason)); n != want {
					t.Fatalf("rejected{%s} = %v after %d port checks and one bad client, want %v; log:\n%s", reason, n, len(probes), want, f.logs.String())
				}
			}
			if strings.Count(f.logs.String(), "level=WARN") != 1 {
				t.Fatalf("want one warning, the bad client's; log:\n%s", f.logs.String())
			}
		})
	}
}

// An HTTP request (a probe pointed at the wrong port) in place of a PING
// is another protocol, counted as malformed, not as a client refused for
// its credentials (which an alert watches).
func TestHTTPOnTheForwardPort(t *testing.T) {
	cfg := defaultCfg()
	cfg.SharedKey = "k"
	f := start(t, cfg, wal.Options{})
	c := f.dial()
	readHELO(t, c)
	c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"))
	expectClosed(t, c)
	waitCount(t, f, "malformed", 1)
	if n := testutil.ToFloat64(f.metrics.Rejected.WithLabelValues("forward", "handshake")); n != 0 {
		t.Fatalf("rejected{handshake} = %v for an HTTP request; log:\n%s", n, f.logs.String())
	}
	// A forward client with the wrong key still is a refused handshake.
	c = f.dial()
	c.Write(ping(readHELO(t, c), "wrong"))
	expectClosed(t, c)
	waitCount(t, f, "handshake", 1)
}
