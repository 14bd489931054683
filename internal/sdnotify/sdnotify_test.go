package sdnotify

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The tests set the environment, so none of them runs in parallel.

// testInterval is the WatchdogSec= the watchdog tests pretend systemd set.
const testInterval = 200 * time.Millisecond

// fakeSystemd is the receiving end of a notification socket, as systemd holds it.
type fakeSystemd struct {
	t    *testing.T
	conn *net.UnixConn
}

// listen creates a notification socket in a temporary directory and points NOTIFY_SOCKET at
// it, with the watchdog off until a test sets WATCHDOG_USEC.
func listen(t *testing.T) *fakeSystemd {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	t.Setenv("WATCHDOG_USEC", "")
	t.Setenv("WATCHDOG_PID", "")
	return &fakeSystemd{t: t, conn: conn}
}

// next returns the next datagram, or false if none arrives within timeout.
func (s *fakeSystemd) next(timeout time.Duration) (string, bool) {
	s.t.Helper()
	if err := s.conn.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		s.t.Fatal(err)
	}
	buf := make([]byte, 4096)
	n, err := s.conn.Read(buf)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return "", false
	}
	if err != nil {
		s.t.Fatal(err)
	}
	return string(buf[:n]), true
}

// want fails the test unless the next datagram, within a second, is want.
func (s *fakeSystemd) want(want string) {
	s.t.Helper()
	got, ok := s.next(time.Second)
	if !ok {
		s.t.Fatalf("no notification within 1s; want %q", want)
	}
	if got != want {
		s.t.Fatalf("notification %q, want %q", got, want)
	}
}

// none fails the test if a datagram arrives within d.
func (s *fakeSystemd) none(d time.Duration) {
	s.t.Helper()
	if got, ok := s.next(d); ok {
		s.t.Fatalf("notification %q, want none for %v", got, d)
	}
}

func TestReadyWithStatus(t *testing.T) {
	s := listen(t)
	if err := Ready("forward on 0.0.0.0:24224, http on 0.0.0.0:8080"); err != nil {
		t.Fatal(err)
	}
	s.want("READY=1\nSTATUS=forward on 0.0.0.0:24224, http on 0.0.0.0:8080")
}

func TestReadyWithoutStatus(t *testing.T) {
	s := listen(t)
	if err := Ready(""); err != nil {
		t.Fatal(err)
	}
	s.want("READY=1")
}

func TestStatus(t *testing.T) {
	s := listen(t)
	if err := Status("sink archive paused"); err != nil {
		t.Fatal(err)
	}
	s.want("STATUS=sink archive paused")
}

// A newline in a status must not start another assignment.
func TestStatusNewline(t *testing.T) {
	s := listen(t)
	if err := Status("sink archive paused\nREADY=1"); err != nil {
		t.Fatal(err)
	}
	s.want("STATUS=sink archive paused READY=1")
}

func TestStopping(t *testing.T) {
	s := listen(t)
	if err := Stopping(0); err != nil {
		t.Fatal(err)
	}
	s.want("STOPPING=1")
	// With the time the stop may take: systemd waits that long before its SIGKILL.
	if err := Stopping(75 * time.Second); err != nil {
		t.Fatal(err)
	}
	s.want("STOPPING=1\nEXTEND_TIMEOUT_USEC=75000000")
}

// The environment stays as it was: a second notification reaches systemd too.
func TestNotifyKeepsEnvironment(t *testing.T) {
	s := listen(t)
	if err := Ready(""); err != nil {
		t.Fatal(err)
	}
	if err := Stopping(0); err != nil {
		t.Fatal(err)
	}
	s.want("READY=1")
	s.want("STOPPING=1")
}

func TestNoSocketIsNoOp(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	t.Setenv("WATCHDOG_USEC", strconv.Itoa(int(testInterval/time.Microsecond)))
	t.Setenv("WATCHDOG_PID", "")
	for name, f := range map[string]func() error{
		"Ready":    func() error { return Ready("started") },
		"Status":   func() error { return Status("running") },
		"Stopping": func() error { return Stopping(time.Minute) },
	} {
		if err := f(); err != nil {
			t.Errorf("%s without NOTIFY_SOCKET: %v, want nil", name, err)
		}
	}
	var calls atomic.Int64
	stop := startWatchdog(t, func() bool { calls.Add(1); return true })
	time.Sleep(testInterval)
	if err := stop(); err != nil {
		t.Errorf("Watchdog without NOTIFY_SOCKET: %v, want nil", err)
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("Watchdog without NOTIFY_SOCKET called healthy %d times, want 0", n)
	}
}

func TestSendError(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "missing"))
	err := Ready("started")
	if err == nil || !strings.Contains(err.Error(), "READY=1") {
		t.Errorf("Ready to a missing socket: %v, want an error naming READY=1", err)
	}
}

// startWatchdog runs Watchdog until the returned function (or the test's end) stops it; the
// function returns what Watchdog returned.
func startWatchdog(t *testing.T, healthy func() bool) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Watchdog(ctx, healthy) }()
	var err error
	stopped := false
	stop = func() error {
		if !stopped {
			cancel()
			err = <-done
			stopped = true
		}
		return err
	}
	t.Cleanup(func() { stop() })
	return stop
}

func setWatchdog(t *testing.T, interval time.Duration) {
	t.Setenv("WATCHDOG_USEC", strconv.Itoa(int(interval/time.Microsecond)))
}

// Keep-alives come at half the interval: each within the interval of the one before, so
// that systemd never sees a gap, and not much faster than half of it.
func TestWatchdogCadence(t *testing.T) {
	s := listen(t)
	setWatchdog(t, testInterval)
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	start := time.Now()
	stop := startWatchdog(t, func() bool { return true })

	const pings = 6
	var at []time.Time
	for range pings {
		s.want("WATCHDOG=1")
		at = append(at, time.Now())
	}
	if first := at[0].Sub(start); first >= testInterval/2 {
		t.Errorf("first keep-alive after %v, want it at once", first)
	}
	for i := 1; i < pings; i++ {
		if gap := at[i].Sub(at[i-1]); gap >= testInterval {
			t.Errorf("keep-alive %d came %v after the one before; want less than the interval %v", i, gap, testInterval)
		}
	}
	// The ticker keeps a steady pace: a late keep-alive makes the next one early, not
	// the whole series faster, so the span of the ticks after the first is checked.
	if span, least := at[pings-1].Sub(at[0]), (pings-1)*testInterval/2*3/4; span < least {
		t.Errorf("%d keep-alives in %v, want them at half the interval (%v)", pings, span, testInterval/2)
	}
	if err := stop(); err != nil {
		t.Errorf("Watchdog: %v, want nil when its context ends", err)
	}
}

// While unhealthy the service sends no keep-alive, so that systemd restarts it; when it is
// healthy again in time, the keep-alives resume.
func TestWatchdogStopsWhileUnhealthy(t *testing.T) {
	s := listen(t)
	setWatchdog(t, testInterval)
	var healthy atomic.Bool
	healthy.Store(true)
	// sawUnhealthy is closed at the first check that finds the service unhealthy. Checks and
	// sends happen one after the other on Watchdog's goroutine, so every keep-alive sent
	// before it is already in the socket by then.
	sawUnhealthy := make(chan struct{})
	var closed atomic.Bool
	startWatchdog(t, func() bool {
		ok := healthy.Load()
		if !ok && closed.CompareAndSwap(false, true) {
			close(sawUnhealthy)
		}
		return ok
	})
	s.want("WATCHDOG=1")

	healthy.Store(false)
	select {
	case <-sawUnhealthy:
	case <-time.After(5 * time.Second):
		t.Fatal("Watchdog did not check health within 5s")
	}
	for {
		if _, ok := s.next(10 * time.Millisecond); !ok {
			break // what was sent while healthy is drained
		}
	}
	s.none(2 * testInterval)

	healthy.Store(true)
	s.want("WATCHDOG=1")
}

func TestWatchdogOff(t *testing.T) {
	for name, env := range map[string][2]string{
		"no WATCHDOG_USEC":            {"", ""},
		"WATCHDOG_PID of another pid": {strconv.Itoa(int(testInterval / time.Microsecond)), strconv.Itoa(os.Getpid() + 1)},
	} {
		t.Run(name, func(t *testing.T) {
			s := listen(t)
			t.Setenv("WATCHDOG_USEC", env[0])
			t.Setenv("WATCHDOG_PID", env[1])
			stop := startWatchdog(t, func() bool { return true })
			s.none(testInterval)
			if err := stop(); err != nil {
				t.Errorf("Watchdog: %v, want nil", err)
			}
		})
	}
}

func TestWatchdogBadEnvironment(t *testing.T) {
	listen(t)
	t.Setenv("WATCHDOG_USEC", "soon")
	err := Watchdog(context.Background(), func() bool { return true })
	if err == nil || !strings.Contains(err.Error(), "WATCHDOG_USEC") {
		t.Errorf("Watchdog with WATCHDOG_USEC=soon: %v, want an error naming WATCHDOG_USEC", err)
	}
}
