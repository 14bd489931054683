package inputs

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"
)

// Backoff between failed accepts: net/http's Server.Serve waits the same.
const (
	firstAcceptDelay = 5 * time.Millisecond
	maxAcceptDelay   = time.Second
	// acceptLogEvery is how often a run of failed accepts is logged.
	acceptLogEvery = time.Minute
)

// RetryAccept wraps a listener so that its Accept rides out the errors a
// busy machine gives and that pass by themselves: no file descriptor left
// for the process (EMFILE) or the system (ENFILE), no buffer or kernel
// memory, a connection aborted or reset before it was accepted, and the
// network errors Linux passes on from a pending connection. It waits 5ms
// after the first, doubling up to 1s while they go on, and tries again,
// as net/http's Server.Serve does; the connection waits in the listen
// backlog meanwhile. Each one is counted in
// forwarder_input_accept_errors_total{input}; the first of a run is
// logged, then at most one line a minute, saying how many were not. Other
// errors, the closed listener's among them, are returned. Closing the
// listener ends a wait at once.
//
// log should name the input; m must not be nil.
func RetryAccept(ln net.Listener, input string, m *Metrics, log *slog.Logger) net.Listener {
	return &retryListener{Listener: ln, input: input, m: m, log: log, closed: make(chan struct{}),
		sleep: sleepUnless}
}

type retryListener struct {
	net.Listener
	input string
	m     *Metrics
	log   *slog.Logger

	closed    chan struct{}
	closeOnce sync.Once
	// sleep waits d or until stop is closed (a variable so that tests
	// need not wait).
	sleep func(d time.Duration, stop <-chan struct{})

	mu       sync.Mutex
	logged   time.Time // when the last line was logged
	unlogged int       // failures since then that were not logged
}

func (l *retryListener) Accept() (net.Conn, error) {
	var delay time.Duration
	for {
		c, err := l.Listener.Accept()
		if err == nil || !temporaryAccept(err) {
			return c, err
		}
		delay = min(max(2*delay, firstAcceptDelay), maxAcceptDelay)
		l.m.AcceptErrors.WithLabelValues(l.input).Inc()
		l.report(err, delay, time.Now())
		select {
		case <-l.closed:
			// The next Accept returns the closed listener's error.
		default:
			l.sleep(delay, l.closed)
		}
	}
}

func (l *retryListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// report logs a failed accept, unless one was logged less than a minute ago.
func (l *retryListener) report(err error, delay time.Duration, now time.Time) {
	l.mu.Lock()
	if !l.logged.IsZero() && now.Sub(l.logged) < acceptLogEvery {
		l.unlogged++
		l.mu.Unlock()
		return
	}
	n := l.unlogged
	l.logged, l.unlogged = now, 0
	l.mu.Unlock()
	msg := "cannot accept a connection; it waits in the listen backlog and accepting is retried"
	switch {
	case errors.Is(err, syscall.EMFILE):
		msg = "cannot accept a connection: the process has no file descriptor left; raise its limit (LimitNOFILE) or lower the inputs' max_connections; the connection waits in the listen backlog and accepting is retried"
	case errors.Is(err, syscall.ENFILE):
		msg = "cannot accept a connection: the system has no file descriptor left (fs.file-max); the connection waits in the listen backlog and accepting is retried"
	}
	l.log.Warn(msg, "error", err, "retry_in", delay, "same_error_not_logged_in_last_minute", n)
}

func sleepUnless(d time.Duration, stop <-chan struct{}) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-stop:
	}
}

// temporaryAcceptErrors are the errors of accept(2) that pass by themselves:
// resources that run short, a connection that went away before it was
// accepted, and the network errors Linux passes on from a pending
// connection ("should be treated like EAGAIN", accept(2)).
var temporaryAcceptErrors = []syscall.Errno{
	syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM,
	syscall.ECONNABORTED, syscall.ECONNRESET, syscall.EINTR, syscall.EAGAIN, syscall.ETIMEDOUT,
	syscall.EPROTO, syscall.ENOPROTOOPT, syscall.ENETDOWN, syscall.ENETUNREACH,
	syscall.EHOSTDOWN, syscall.EHOSTUNREACH, syscall.ENONET, syscall.EOPNOTSUPP, syscall.EPERM,
}

// temporaryAccept reports whether an error of Accept passes by itself, so
// that accepting should be retried after a pause.
func temporaryAccept(err error) bool {
	for _, errno := range temporaryAcceptErrors {
		if errors.Is(err, errno) {
			return true
		}
	}
	return false
}
