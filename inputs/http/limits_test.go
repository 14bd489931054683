package httpin

import (
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/logfwd/forwarder/config"
)

// faultListener fails its first accepts with errs, then accepts for real.
type faultListener struct {
	net.Listener
	mu   sync.Mutex
	errs []error
}

func (f *faultListener) Accept() (net.Conn, error) {
	f.mu.Lock()
	if len(f.errs) > 0 {
		err := f.errs[0]
		f.errs = f.errs[1:]
		f.mu.Unlock()
		return nil, err
	}
	f.mu.Unlock()
	return f.Listener.Accept()
}

func acceptError(errno syscall.Errno) error {
	return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", errno)}
}

// Accept errors that pass by themselves (no file descriptor left, no
// buffer space, a connection aborted) are waited out and counted: the
// server goes on serving.
func TestAcceptErrorsAreRetried(t *testing.T) {
	errs := []error{acceptError(syscall.EMFILE), acceptError(syscall.ENFILE), acceptError(syscall.ENOBUFS), acceptError(syscall.ECONNABORTED)}
	e := newEnv(t, withListener(func(ln net.Listener) net.Listener { return &faultListener{Listener: ln, errs: errs} }))
	if r := e.post("/v1/logs/app", []byte(`{"a":1}`)); r.status != 200 {
		t.Fatalf("status %d %s", r.status, r.body)
	}
	if n := testutil.ToFloat64(e.m.AcceptErrors.WithLabelValues(input)); n != 4 {
		t.Fatalf("accept errors counted %v, want 4", n)
	}
	e.shutdown() // and Serve returned nil
}

// Connections beyond max_connections are closed at once and counted; once
// one closes, a new one is served.
func TestMaxConnections(t *testing.T) {
	e := newEnv(t, withConfig(func(c *config.HTTP) { c.MaxConnections = 2 }))
	open := func() float64 { return testutil.ToFloat64(e.m.Connections.WithLabelValues(input)) }
	waitOpen := func(n float64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for open() != n {
			if time.Now().After(deadline) {
				t.Fatalf("%v connections open, want %v", open(), n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", e.s.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	a, _ := dial(), dial()
	waitOpen(2)
	c := dial()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if b, err := io.ReadAll(c); err != nil && !strings.Contains(err.Error(), "reset") || len(b) > 0 {
		t.Fatalf("the third connection was not closed at once: %q, %v", b, err)
	}
	if n := e.rejected("too_many_connections"); n != 1 {
		t.Fatalf("rejected{too_many_connections} = %v, want 1", n)
	}
	a.Close()
	waitOpen(1)
	if r := e.post("/v1/logs/app", []byte(`{"a":1}`)); r.status != 200 {
		t.Fatalf("after a connection closed: status %d %s", r.status, r.body)
	}
	if n := e.rejected("too_many_connections"); n != 1 {
		t.Fatalf("rejected{too_many_connections} = %v after a slot was free, want 1", n)
	}
}

// A client that does not send its request's headers within
// read_header_timeout is disconnected, and its slot freed.
func TestReadHeaderTimeout(t *testing.T) {
	e := newEnv(t, withConfig(func(c *config.HTTP) {
		c.MaxConnections = 1
		c.ReadHeaderTimeout = config.Duration(200 * time.Millisecond)
	}))
	c, err := net.Dial("tcp", e.s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("POST /v1/logs/app HTTP/1.1\r\nHost: x\r\n")) // and then nothing
	start := time.Now()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	io.ReadAll(c)
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("closed after %v", d)
	}
	deadline := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(e.m.Connections.WithLabelValues(input)) != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if r := e.post("/v1/logs/app", []byte(`{"a":1}`)); r.status != 200 {
		t.Fatalf("status %d %s", r.status, r.body)
	}
}
