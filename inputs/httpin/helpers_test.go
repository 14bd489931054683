package httpin

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/inputs"
	"github.com/logfwd/forwarder/wal"
)

func TestMain(m *testing.M) {
	// net/http lingers 500 ms on a connection it answered and closes (its
	// client may still be sending): not a leak, if a test ends within it.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("net/http.(*conn).closeWriteAndWait"))
}

// env is a running HTTP input on loopback, backed by a real WAL.
type env struct {
	t      testing.TB
	w      *wal.WAL
	m      *inputs.Metrics
	s      *Server
	url    string // http(s)://host:port
	client *http.Client

	stop     context.CancelFunc // ends Serve
	served   chan error         // Serve's result
	stopOnce sync.Once
}

// shutdown ends Serve and waits for it to return nil.
func (e *env) shutdown() {
	e.stopOnce.Do(func() {
		e.stop()
		if err := <-e.served; err != nil {
			e.t.Errorf("serve: %v", err)
		}
	})
}

type setup struct {
	cfg          config.HTTP
	walOpts      wal.Options
	routed       func(tag string) bool
	appender     func(w *wal.WAL) inputs.Appender // wraps the WAL; nil: the WAL itself
	storeTimeout time.Duration
	memoryWait   time.Duration
	budget       int64         // the inputs' budget; 0: the default
	stopTimeout  time.Duration // Serve's grace for requests in flight
	readTimeout  time.Duration // the server's ReadTimeout (0: its own)
	bodyIdle     time.Duration // 0: the server's own
	bodyMax      time.Duration
	bodyRate     float64
	writeTimeout time.Duration  // the server's WriteTimeout (0: its own)
	certPool     *x509.CertPool // the client trusts it; set with TLS
	log          *slog.Logger
	listen       func(net.Listener) net.Listener // wraps the bound listener; nil: none
}

type option func(*setup)

func withConfig(f func(*config.HTTP)) option     { return func(s *setup) { f(&s.cfg) } }
func withWAL(o wal.Options) option               { return func(s *setup) { s.walOpts = o } }
func withRouted(f func(string) bool) option      { return func(s *setup) { s.routed = f } }
func withStoreTimeout(d time.Duration) option    { return func(s *setup) { s.storeTimeout = d } }
func withMemoryWait(d time.Duration) option      { return func(s *setup) { s.memoryWait = d } }
func withBudget(n int64) option                  { return func(s *setup) { s.budget = n } }
func withShutdownTimeout(d time.Duration) option { return func(s *setup) { s.stopTimeout = d } }
func withReadTimeout(d time.Duration) option     { return func(s *setup) { s.readTimeout = d } }
func withBodyTimes(idle, max time.Duration, rate float64) option {
	return func(s *setup) { s.bodyIdle, s.bodyMax, s.bodyRate = idle, max, rate }
}
func withWriteTimeout(d time.Duration) option { return func(s *setup) { s.writeTimeout = d } }
func withCertPool(p *x509.CertPool) option    { return func(s *setup) { s.certPool = p } }
func withLogger(l *slog.Logger) option        { return func(s *setup) { s.log = l } }
func withListener(f func(net.Listener) net.Listener) option {
	return func(s *setup) { s.listen = f }
}
func withAppender(f func(*wal.WAL) inputs.Appender) option {
	return func(s *setup) { s.appender = f }
}

func newEnv(t testing.TB, opts ...option) *env {
	t.Helper()
	st := setup{cfg: config.HTTP{Listen: "127.0.0.1:0", MaxBodyBytes: config.MiB, TimeField: "time"}}
	for _, o := range opts {
		o(&st)
	}
	w, err := wal.Open(t.TempDir(), st.walOpts)
	if err != nil {
		t.Fatalf("open WAL: %v", err)
	}
	var app inputs.Appender = w
	if st.appender != nil {
		app = st.appender(w)
	}
	m := inputs.NewMetrics(prometheus.NewRegistry())
	p := &inputs.Pipeline{WAL: app, Routed: st.routed, Metrics: m}
	if st.budget > 0 {
		p.Budget = inputs.NewBudget(st.budget, m)
	}
	s := New(st.cfg, p, st.log)
	if st.storeTimeout > 0 {
		s.storeTimeout = st.storeTimeout
	}
	if st.memoryWait > 0 {
		s.memoryWait = st.memoryWait
	}
	if st.stopTimeout > 0 {
		s.shutdownTimeout = st.stopTimeout
	}
	if st.readTimeout > 0 {
		s.srv.ReadTimeout = st.readTimeout
	}
	if st.bodyIdle > 0 {
		s.bodyIdle, s.bodyMax, s.bodyRate = st.bodyIdle, st.bodyMax, st.bodyRate
	}
	if st.writeTimeout > 0 {
		s.srv.WriteTimeout = st.writeTimeout
	}
	if st.listen != nil {
		s.listen = func(network, address string) (net.Listener, error) {
			ln, err := net.Listen(network, address)
			if err != nil {
				return nil, err
			}
			return st.listen(ln), nil
		}
	}
	if err := s.Start(); err != nil {
		w.Close()
		t.Fatalf("start: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()

	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	scheme := "http"
	if st.certPool != nil {
		tr.TLSClientConfig = &tls.Config{RootCAs: st.certPool}
		tr.ForceAttemptHTTP2 = true
		scheme = "https"
	}
	e := &env{t: t, w: w, m: m, s: s, url: scheme + "://" + s.Addr().String(), client: &http.Client{Transport: tr},
		stop: cancel, served: served}
	t.Cleanup(func() {
		e.shutdown()
		tr.CloseIdleConnections()
		if err := w.Close(); err != nil {
			t.Errorf("close WAL: %v", err)
		}
	})
	return e
}

type response struct {
	status int
	header http.Header
	body   string
}

// post sends body to path with headers given as name, value pairs.
func (e *env) post(path string, body []byte, headers ...string) response {
	e.t.Helper()
	return e.do(http.MethodPost, path, body, headers...)
}

func (e *env) do(method, path string, body []byte, headers ...string) response {
	e.t.Helper()
	req, err := http.NewRequest(method, e.url+path, bytes.NewReader(body))
	if err != nil {
		e.t.Fatalf("new request: %v", err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return e.send(req)
}

func (e *env) send(req *http.Request) response {
	e.t.Helper()
	resp, err := e.client.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatalf("read response: %v", err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		e.t.Errorf("%s %s: Content-Type %q, want application/json", req.Method, req.URL.Path, ct)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: strings.TrimSpace(string(b))}
}

// records returns every record in the WAL.
func (e *env) records() []wal.Record {
	e.t.Helper()
	recs, err := e.w.Read(1, 0, 0)
	if err != nil {
		e.t.Fatalf("read WAL: %v", err)
	}
	return recs
}

func (e *env) bodies() []string {
	var out []string
	for _, r := range e.records() {
		out = append(out, string(r.Body))
	}
	return out
}

func (e *env) rejected(reason string) float64 {
	return testutil.ToFloat64(e.m.Rejected.WithLabelValues(input, reason))
}

func gzipped(parts ...string) []byte {
	var buf bytes.Buffer
	for _, p := range parts { // one gzip member each
		zw := gzip.NewWriter(&buf)
		zw.Write([]byte(p))
		zw.Close()
	}
	return buf.Bytes()
}

// zstdCompressed compresses each part as a zstd frame of its own.
func zstdCompressed(parts ...string) []byte {
	var buf bytes.Buffer
	for _, p := range parts {
		zw, _ := zstd.NewWriter(&buf)
		zw.Write([]byte(p))
		zw.Close()
	}
	return buf.Bytes()
}

// zlibCompressed is s in zlib (HTTP's deflate).
func zlibCompressed(s string) []byte {
	var buf bytes.Buffer
	zw := zlib.NewWriter(&buf)
	zw.Write([]byte(s))
	zw.Close()
	return buf.Bytes()
}

// selfSigned writes a certificate for 127.0.0.1 and its key to dir and
// returns their paths and a pool that trusts the certificate.
func selfSigned(t testing.TB, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "forwarder test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}
