package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/logfwd/forwarder/internal/sdnotify"
	"github.com/logfwd/forwarder/wal"
)

// intervalLoss is what an exit before the WAL's last commit loses with wal.sync: interval.
const intervalLoss = "wal.sync is interval: records acknowledged since the last commit (up to about one second of them) are lost"

// signalsActor stops the service on SIGTERM or SIGINT. It subscribes to the signals at once,
// so that a signal that arrives before the group runs is not lost. SIGHUP (a reload, a
// closed terminal) does not stop it: the configuration is read at start only, which the
// log says. Once the stop has begun (for a signal, or an actor's failure), a SIGTERM or
// SIGINT ends the process at once, with a line saying what that leaves (the signals stay
// ours: a SIGINT ignored when the process started, a background job of a script, would
// otherwise be ignored again). interval: wal.sync is interval, so such an exit loses what
// was acknowledged since the last commit. release, called once the service has stopped,
// ends the subscription.
func signalsActor(log *slog.Logger, timeout time.Duration, interval bool) (a actor, release func()) {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	released := make(chan struct{})
	var once sync.Once
	release = func() {
		once.Do(func() {
			signal.Stop(sigs)
			close(released)
		})
	}
	return actor{
		name: "signals",
		run: func(ctx context.Context) error {
			for {
				select {
				case sig := <-sigs:
					if sig == syscall.SIGHUP {
						log.Warn("SIGHUP ignored: the configuration is read at start only; restart the service to apply a change (forwarder check -c FILE checks it first)")
						continue
					}
					log.Info("shutting down", "signal", sig.String(), "shutdown_timeout", timeout)
				case <-ctx.Done():
				}
				return nil
			}
		},
		stop: func(context.Context) error {
			signal.Ignore(syscall.SIGHUP) // not the default, which ends the process, while it stops
			go func() {
				for {
					select {
					case sig := <-sigs:
						if sig == syscall.SIGHUP {
							continue // one that came before Ignore: still not a stop
						}
						says := "signal while stopping: exiting now, without waiting for the stop to end; what the sinks had not delivered stays in the WAL and is sent at the next start on this data_dir"
						if interval {
							says += "; " + intervalLoss
						}
						log.Warn(says, "signal", sig.String())
						os.Exit(exitFail)
					case <-released:
						return
					}
				}
			}()
			return nil
		},
	}, release
}

// durableLog is what walActor needs of the WAL.
type durableLog interface {
	Fatal() <-chan struct{}
	Err() error
	Stalled() bool
	Close() error
}

var _ durableLog = (*wal.WAL)(nil)

// walActor holds the open WAL: it returns the WAL's fatal error when a commit fails in a way
// that leaves durability unknown (a failed fsync: never retried, the process must exit), and
// its stop closes the WAL, last of all. A failure once the stop has begun (stopping: the last
// commit of wal.sync: interval, made as the sinks' report is written) is the stop's to say:
// its line (msg="stop wal") says what was lost.
func walActor(w durableLog, stopping func() bool) actor {
	var reported atomic.Bool // run returned the WAL's failure
	return actor{
		name: "wal",
		run: func(ctx context.Context) error {
			select {
			case <-w.Fatal():
				if stopping() {
					return nil
				}
				reported.Store(true)
				if err := w.Err(); err != nil {
					return err
				}
				return wal.ErrFatal
			case <-ctx.Done():
				return nil
			}
		},
		stop: func(context.Context) error {
			err := w.Close()
			if err == nil && !reported.Load() {
				// Failed after run returned, before Close: no one said so yet.
				err = w.Err()
			}
			if err != nil {
				if errors.Is(err, wal.ErrFatal) {
					return fmt.Errorf("close wal: its last commit failed, so records acknowledged since the one before (wal.sync: interval) are lost; check the disk: %w", err)
				}
				return fmt.Errorf("close wal: %w", err)
			}
			return nil
		},
	}
}

// reportFailure logs the failure of an actor that stops the service.
func reportFailure(log *slog.Logger) func(name string, err error) {
	return func(name string, err error) {
		if errors.Is(err, wal.ErrFatal) {
			log.Error("the WAL can no longer guarantee durability, so the service is stopping and acknowledges nothing more; check the disk (kernel log, file system, free space), then restart the service", "error", err)
			return
		}
		log.Error(name+" failed; shutting down", "error", err)
	}
}

// systemdActor feeds systemd's watchdog while the WAL can still promise durability and its
// commits return (not while a sink is paused or the WAL is full: a restart fixes neither;
// a commit stalled for wal.StallAfter lets the watchdog's SIGABRT write every goroutine's
// stack to the journal, and the restart that follows), and tells systemd
// when the service begins to stop, and how long the stop may take (stopWithin). Added
// last, it is the first actor stopped, so STOPPING=1 goes out as the shutdown begins.
func systemdActor(w durableLog, log *slog.Logger, stopWithin time.Duration) actor {
	return actor{
		name: "systemd watchdog",
		run: func(ctx context.Context) error {
			return sdnotify.Watchdog(ctx, func() bool { return w.Err() == nil && !w.Stalled() })
		},
		stop: func(context.Context) error {
			if err := sdnotify.Stopping(stopWithin); err != nil {
				log.Warn("cannot tell systemd that the service is stopping", "error", err)
			}
			return nil
		},
	}
}
