package inputs

import (
	"bytes"
	"errors"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/logfwd/forwarder/internal/nettest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type syncLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncLog) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncLog) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newRetry(t *testing.T, f *nettest.FaultListener) (*retryListener, *Metrics, *syncLog, *[]time.Duration) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.Listener = ln
	m := NewMetrics(nil)
	logs := &syncLog{}
	l := RetryAccept(f, "test", m, slog.New(slog.NewTextHandler(logs, nil))).(*retryListener)
	var mu sync.Mutex
	var slept []time.Duration
	l.sleep = func(d time.Duration, stop <-chan struct{}) {
		mu.Lock()
		slept = append(slept, d)
		mu.Unlock()
	}
	t.Cleanup(func() { l.Close() })
	return l, m, logs, &slept
}

// A run of temporary errors is waited out with a growing pause, counted,
// and logged once; the connection behind them is accepted.
func TestRetryAcceptRidesOutTemporaryErrors(t *testing.T) {
	var errs []error
	for range 9 {
		errs = append(errs, nettest.AcceptError(syscall.EMFILE))
	}
	errs = append(errs, nettest.AcceptError(syscall.ECONNABORTED), nettest.AcceptError(syscall.ENOBUFS), nettest.AcceptError(syscall.ENFILE))
	l, m, logs, slept := newRetry(t, &nettest.FaultListener{Errs: errs})
	client, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	c, err := l.Accept()
	if err != nil {
		t.Fatalf("accept: %v", err)
	}
	c.Close()
	if n := testutil.ToFloat64(m.AcceptErrors.WithLabelValues("test")); n != 12 {
		t.Errorf("accept errors counted %v, want 12", n)
	}
	want := []time.Duration{5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000, 1000}
	for i := range want {
		want[i] *= time.Millisecond
	}
	if !slices.Equal(*slept, want) {
		t.Errorf("pauses %v, want %v", *slept, want)
	}
	out := logs.String()
	if n := strings.Count(out, "level=WARN"); n != 1 {
		t.Errorf("%d lines logged for one run of errors, want 1:\n%s", n, out)
	}
	if !strings.Contains(out, "the process has no file descriptor left") || !strings.Contains(out, "too many open files") {
		t.Errorf("the line does not say what ran short:\n%s", out)
	}
}

// Errors that do not pass by themselves are returned at once, uncounted.
func TestRetryAcceptReturnsOtherErrors(t *testing.T) {
	boom := errors.New("boom")
	l, m, _, slept := newRetry(t, &nettest.FaultListener{Errs: []error{boom}})
	if _, err := l.Accept(); !errors.Is(err, boom) {
		t.Fatalf("accept: %v, want boom", err)
	}
	l.Close()
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("accept after close: %v, want net.ErrClosed", err)
	}
	if n := testutil.ToFloat64(m.AcceptErrors.WithLabelValues("test")); n != 0 || len(*slept) != 0 {
		t.Fatalf("counted %v, paused %v", n, *slept)
	}
}

// Closing the listener ends a pause at once, and Accept returns.
func TestRetryAcceptStopsOnClose(t *testing.T) {
	l, _, _, _ := newRetry(t, &nettest.FaultListener{})
	l.Listener.(*nettest.FaultListener).SetAlways(nettest.AcceptError(syscall.EMFILE))
	l.sleep = sleepUnless
	done := make(chan error, 1)
	go func() {
		_, err := l.Accept()
		done <- err
	}()
	time.Sleep(1500 * time.Millisecond) // into the pauses of a second
	start := time.Now()
	l.Listener.(*nettest.FaultListener).SetAlways(nil)
	l.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("accept: %v, want net.ErrClosed", err)
		}
		if d := time.Since(start); d > 500*time.Millisecond {
			t.Fatalf("accept returned %v after the close", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("accept did not return after the close")
	}
}

// A run of errors is logged once a minute, with how many were not.
func TestRetryAcceptLogsOnceAMinute(t *testing.T) {
	l, _, logs, _ := newRetry(t, &nettest.FaultListener{})
	t0 := time.Now()
	err := nettest.AcceptError(syscall.ENOBUFS)
	for i := range 10 {
		l.report(err, time.Second, t0.Add(time.Duration(i)*time.Second))
	}
	l.report(err, time.Second, t0.Add(61*time.Second))
	out := logs.String()
	if n := strings.Count(out, "level=WARN"); n != 2 {
		t.Fatalf("%d lines, want 2:\n%s", n, out)
	}
	if !strings.Contains(out, "same_error_not_logged_in_last_minute=0") || !strings.Contains(out, "same_error_not_logged_in_last_minute=9") {
		t.Fatalf("the lines do not count what was not logged:\n%s", out)
	}
}
