package forward

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/wal"
)

// Debian's python3-fluent-logger is an independent client: Message mode
// with EventTime. make deps installs it; without it this test fails.
func TestPythonFluentLogger(t *testing.T) {
	if err := exec.Command("/usr/bin/python3", "-c", "import fluent.sender").Run(); err != nil {
		t.Fatalf("/usr/bin/python3 cannot import fluent.sender (%v): install Debian's python3-fluent-logger (make deps does: apt-get install -y python3-fluent-logger)", err)
	}
	f := start(t, defaultCfg(), wal.Options{})
	host, port, _ := net.SplitHostPort(f.addr())
	script := fmt.Sprintf(`
import sys
from fluent import sender
s = sender.FluentSender('py', host=%q, port=%s, nanosecond_precision=True)
for i in range(30):
    if not s.emit_with_time('app', 1764489600.25, {'i': i, 'text': 'caf\u00e9'}):
        print(s.last_error); sys.exit(1)
s.close()
`, host, port)
	out, err := exec.Command("/usr/bin/python3", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("python client: %v\n%s", err, out)
	}
	recs := f.waitRecords(30)
	for i, r := range recs {
		want := fmt.Sprintf(`{"i":%d,"text":"café"}`, i)
		if r.Tag != "py.app" || string(r.Body) != want || r.Time != 1764489600250000000 {
			t.Fatalf("record %d: %q %d %s, want %s", i, r.Tag, r.Time, r.Body, want)
		}
	}
}

// selfSigned writes a CA-less self-signed certificate and key for
// 127.0.0.1 (usable as server and client certificate) and returns their paths.
func selfSigned(t *testing.T, name string) (certFile, keyFile string, cert *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ = x509.ParseCertificate(der)
	kb, _ := x509.MarshalECPrivateKey(key)
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
	return certFile, keyFile, cert
}

func TestTLS(t *testing.T) {
	srvCert, srvKey, srvX509 := selfSigned(t, "server")
	cliCert, cliKey, _ := selfSigned(t, "client")
	pool := x509.NewCertPool()
	pool.AddCert(srvX509)
	cfg := defaultCfg()
	cfg.TLS = config.TLS{CertFile: srvCert, KeyFile: srvKey, ClientCAFile: cliCert}
	f := start(t, cfg, wal.Options{})

	pair, err := tls.LoadX509KeyPair(cliCert, cliKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := tls.Dial("tcp", f.addr(), &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}})
	if err != nil {
		t.Fatalf("TLS with a client certificate: %v", err)
	}
	defer c.Close()
	c.Write(messageMode("tls", eventTime(time.Now()), record("a", 1), options("t1")))
	if readAck(t, c) != "t1" {
		t.Fatal("no ack over TLS")
	}
	f.waitRecords(1)

	// Without a client certificate the handshake fails and nothing is stored.
	nc, err := tls.Dial("tcp", f.addr(), &tls.Config{RootCAs: pool})
	if err == nil {
		nc.Write(messageMode("tls", eventTime(time.Now()), record("a", 2), options("t2")))
		_, err = readAckErr(nc)
		nc.Close()
	}
	if err == nil {
		t.Fatal("a client without a certificate was served")
	}
	// Plain TCP to a TLS port is not served either.
	p := f.dial()
	p.Write(messageMode("tls", eventTime(time.Now()), record("a", 3), options("t3")))
	expectClosed(t, p)
	if n := len(f.records()); n != 1 {
		t.Fatalf("%d records stored, want 1", n)
	}
	if !strings.Contains(f.logs.String(), "tls=true") {
		t.Fatal("the listening line does not say TLS")
	}
}

// heldConn holds what is written to it, once hold is set, until Close
// writes it all at once: the server then reads a TLS client's last records
// and its close_notify together.
type heldConn struct {
	net.Conn
	hold bool
	held []byte
}

func (c *heldConn) Write(b []byte) (int, error) {
	if c.hold {
		c.held = append(c.held, b...)
		return len(b), nil
	}
	return c.Conn.Write(b)
}

func (c *heldConn) Close() error {
	c.Conn.SetWriteDeadline(time.Time{}) // crypto/tls set one in the past after its close_notify
	_, err := c.Conn.Write(c.held)
	if cerr := c.Conn.Close(); err == nil {
		err = cerr
	}
	return err
}

// TestTLSMessagesBeforeClose: a TLS 1.2 client that writes its last
// messages and closes at once (no acks asked) has them stored, though the
// connection returns the last one's bytes with the end of the stream
// (crypto/tls reads the close_notify behind them).
func TestTLSMessagesBeforeClose(t *testing.T) {
	srvCert, srvKey, srvX509 := selfSigned(t, "server")
	pool := x509.NewCertPool()
	pool.AddCert(srvX509)
	cfg := defaultCfg()
	cfg.TLS = config.TLS{CertFile: srvCert, KeyFile: srvKey}
	f := start(t, cfg, wal.Options{})
	for i := range 5 {
		hc := &heldConn{Conn: f.dial()}
		// TLS 1.2: in 1.3 the close_notify is encrypted, and crypto/tls
		// does not see it behind the data.
		tc := tls.Client(hc, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MaxVersion: tls.VersionTLS12})
		if err := tc.Handshake(); err != nil {
			t.Fatal(err)
		}
		hc.hold = true
		tc.Write(messageMode("tls", eventTime(time.Now()), record("n", 2*i), nil))
		tc.Write(messageMode("tls", eventTime(time.Now()), record("n", 2*i+1), nil))
		if err := tc.Close(); err != nil {
			t.Fatal(err)
		}
		f.waitRecords(2 * (i + 1))
	}
	if n := testutil.ToFloat64(f.metrics.Rejected.WithLabelValues("forward", "truncated")); n != 0 {
		t.Fatalf("%v messages counted as truncated", n)
	}
}

// nodeClient runs npm's @fluent-org/logger (make deps installs it in
// NODE_CLIENT_DIR, by default ~/.cache/forwarder-tests/node): 20 records
// with acks to port, in mode, with shared_key key and the client host name
// host when key is set. It returns what the script printed: OK once every
// record was acknowledged.
func nodeClient(t *testing.T, port, mode, host, key string) string {
	t.Helper()
	dir := os.Getenv("NODE_CLIENT_DIR")
	if dir == "" {
		home, _ := os.UserHomeDir()
		dir = filepath.Join(home, ".cache", "forwarder-tests", "node")
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@fluent-org", "logger", "package.json")); err != nil {
		t.Fatalf("npm's @fluent-org/logger is not in %s (make deps installs it: npm install --prefix %s @fluent-org/logger): %v", dir, dir, err)
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatalf("node is not on PATH (make deps installs Debian's nodejs): %v", err)
	}
	script := `
const FluentLogger = require('@fluent-org/logger');
const [port, mode, host, key] = process.argv.slice(1);
const opts = {socket: {host: '127.0.0.1', port: +port, timeout: 3000}, ack: {}, eventMode: mode, flushInterval: 10};
if (key) opts.security = {clientHostname: host, sharedKey: key};
const c = new FluentLogger.FluentClient('node', opts);
c.socketOn('error', e => { console.log('SOCKERR', e && e.message); process.exit(0); });
setTimeout(() => { console.log('TIMEOUT'); process.exit(0); }, 8000);
(async () => {
  try {
    const ps = [];
    for (let i = 0; i < 20; i++) ps.push(c.emit('app', {i}));
    await Promise.all(ps);
    console.log('OK');
  } catch (e) { console.log('ERR', e && e.message); }
  await c.shutdown().catch(() => {});
  process.exit(0);
})();
`
	cmd := exec.Command("node", "-e", script, port, mode, host, key)
	cmd.Env = append(os.Environ(), "NODE_PATH="+filepath.Join(dir, "node_modules"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node client: %v\n%s", err, out)
	}
	return strings.TrimSpace(string(out))
}

// npm's @fluent-org/logger, every mode, with acks, plain and with the
// handshake. Like Fluentd's out_forward it refuses a PONG that names its
// own host (a sidecar in the same pod): the input says so, and
// inputs.forward.self_hostname names the input otherwise.
func TestNodeFluentLogger(t *testing.T) {
	host, _ := os.Hostname()
	for _, mode := range []string{"Message", "Forward", "PackedForward", "CompressedPackedForward"} {
		for _, key := range []string{"", "s3cret"} {
			t.Run(fmt.Sprintf("%s key %v", mode, key != ""), func(t *testing.T) {
				cfg := defaultCfg()
				cfg.SharedKey = key
				f := start(t, cfg, wal.Options{})
				_, port, _ := net.SplitHostPort(f.addr())
				if out := nodeClient(t, port, mode, "client-host", key); out != "OK" {
					t.Fatalf("node client: %s\nlog:\n%s", out, f.logs.String())
				}
				for i, r := range f.waitRecords(20) {
					if r.Tag != "node.app" || string(r.Body) != fmt.Sprintf(`{"i":%d}`, i) {
						t.Fatalf("record %d: %q %s", i, r.Tag, r.Body)
					}
				}
			})
		}
	}
	t.Run("same host", func(t *testing.T) {
		cfg := defaultCfg()
		cfg.SharedKey = "s3cret"
		f := start(t, cfg, wal.Options{})
		_, port, _ := net.SplitHostPort(f.addr())
		if out := nodeClient(t, port, "Forward", host, "s3cret"); out == "OK" {
			t.Fatalf("the client took a PONG naming its own host: %s", out)
		}
		if n := len(f.records()); n != 0 {
			t.Fatalf("%d records stored", n)
		}
		if !strings.Contains(f.logs.String(), `level=WARN msg="the client's PING names the same host as this input's PONG`) {
			t.Errorf("no warning naming self_hostname:\n%s", f.logs.String())
		}
		cfg.SelfHostname = "forwarder-0"
		f = start(t, cfg, wal.Options{})
		_, port, _ = net.SplitHostPort(f.addr())
		if out := nodeClient(t, port, "Forward", host, "s3cret"); out != "OK" {
			t.Fatalf("node client with self_hostname set: %s\nlog:\n%s", out, f.logs.String())
		}
		f.waitRecords(20)
	})
}
