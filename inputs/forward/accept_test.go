package forward

import (
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/logfwd/forwarder/internal/nettest"
	"github.com/logfwd/forwarder/wal"
)

// Accept errors that pass by themselves (no file descriptor left, no
// buffer space, a connection aborted) are waited out, counted and logged
// once: the input goes on serving and its Serve does not fail.
func TestAcceptErrorsAreRetried(t *testing.T) {
	errs := []error{nettest.AcceptError(syscall.EMFILE), nettest.AcceptError(syscall.EMFILE), nettest.AcceptError(syscall.ENFILE),
		nettest.AcceptError(syscall.ENOBUFS), nettest.AcceptError(syscall.ECONNABORTED)}
	f := start(t, defaultCfg(), wal.Options{}, func(s *Server) {
		s.listen = func(network, address string) (net.Listener, error) {
			ln, err := net.Listen(network, address)
			return &nettest.FaultListener{Listener: ln, Errs: errs}, err
		}
	})
	c := f.dial()
	c.Write(messageMode("t", eventTime(time.Now()), record("a", 1), options("after-emfile")))
	if id := readAck(t, c); id != "after-emfile" {
		t.Fatalf("ack %q", id)
	}
	if n := testutil.ToFloat64(f.metrics.AcceptErrors.WithLabelValues("forward")); n != 5 {
		t.Fatalf("accept errors counted %v, want 5", n)
	}
	if n := strings.Count(f.logs.String(), "cannot accept a connection: the process has no file descriptor left"); n != 1 {
		t.Fatalf("logged %d times, want once:\n%s", n, f.logs.String())
	}
	f.stop() // fails the test if Serve returned an error
}
