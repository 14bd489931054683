// Package sdnotify tells systemd how the service is doing, through the notification socket
// that a Type=notify unit gives its main process (NOTIFY_SOCKET): READY=1 once the service
// accepts work, STATUS= lines for `systemctl status`, STOPPING=1 when it begins to shut down,
// and WATCHDOG=1 keep-alives while it is healthy, so that a service that hangs is restarted.
//
// Outside systemd (no NOTIFY_SOCKET) every function does nothing and returns nil, so the
// service runs the same from a shell, a container or a test.
//
// The environment is left as it is (go-systemd can unset it): Watchdog reads WATCHDOG_USEC
// when it starts, which may be after Ready, and the forwarder starts no child process that
// could take the socket for its own.
package sdnotify

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// Ready tells systemd that the service has started: its listeners accept connections.
// status, if not empty, is shown by `systemctl status` until the next Status.
func Ready(status string) error {
	state := daemon.SdNotifyReady
	if status != "" {
		state += "\n" + statusLine(status)
	}
	return notify(state)
}

// Stopping tells systemd that the service is shutting down, so that it shows the unit as
// deactivating rather than as a service that stopped answering. With within > 0 it also
// asks for that long to stop (EXTEND_TIMEOUT_USEC, systemd 236 and later): a
// shutdown_timeout above the unit's TimeoutStopSec= is then not cut short by its SIGKILL.
func Stopping(within time.Duration) error {
	state := daemon.SdNotifyStopping
	if within > 0 {
		state += fmt.Sprintf("\nEXTEND_TIMEOUT_USEC=%d", within.Microseconds())
	}
	return notify(state)
}

// Status sets the one-line status that `systemctl status` shows.
func Status(s string) error { return notify(statusLine(s)) }

// Watchdog sends WATCHDOG=1 at half the interval systemd asked for (WatchdogSec=, passed to
// the process as WATCHDOG_USEC), as long as healthy returns true: the first at once, then on
// every tick. While healthy returns false it sends nothing, so that systemd, once the
// interval has passed without a keep-alive, restarts the service; if healthy turns true again
// before that, the keep-alives resume.
//
// healthy runs on Watchdog's goroutine and should be quick. One that blocks sends no
// keep-alive, which is what a hung service should get, but also keeps Watchdog from
// returning.
//
// Watchdog runs until ctx ends and then returns nil, as an actor of the service does. When
// the watchdog is off (no NOTIFY_SOCKET, no WATCHDOG_USEC, or a WATCHDOG_PID that is not this
// process) it only waits for ctx. It returns an error only for a WATCHDOG_USEC or a
// WATCHDOG_PID it cannot read. A keep-alive that cannot be sent is not an error: the next tick
// sends another, and judging missed keep-alives is systemd's job.
func Watchdog(ctx context.Context, healthy func() bool) error {
	interval, err := watchdogInterval()
	if err != nil {
		return err
	}
	if interval == 0 {
		<-ctx.Done()
		return nil
	}
	tick := time.NewTicker(interval / 2)
	defer tick.Stop()
	for {
		if healthy() {
			_ = notify(daemon.SdNotifyWatchdog) // see the doc comment: a lost keep-alive is retried at the next tick
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return nil
		}
	}
}

// watchdogInterval is the watchdog interval systemd set for this process, or 0 when the
// watchdog is off.
func watchdogInterval() (time.Duration, error) {
	if !enabled() {
		return 0, nil
	}
	interval, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		return 0, fmt.Errorf("sdnotify: read the watchdog interval (WATCHDOG_USEC, WATCHDOG_PID): %w", err)
	}
	return interval, nil
}

// enabled reports whether systemd gave this process a notification socket.
func enabled() bool { return os.Getenv("NOTIFY_SOCKET") != "" }

// notify sends one datagram of newline-separated assignments to NOTIFY_SOCKET.
func notify(state string) error {
	if _, err := daemon.SdNotify(false, state); err != nil {
		first, _, _ := strings.Cut(state, "\n")
		return fmt.Errorf("sdnotify: send %s to systemd: %w", first, err)
	}
	return nil
}

// statusLine is a STATUS= assignment for s. A newline in s would end the assignment and
// start another (a status could otherwise say READY=1), so each becomes a space.
func statusLine(s string) string {
	return "STATUS=" + strings.ReplaceAll(s, "\n", " ")
}
