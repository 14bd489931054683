package main

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/queue"
	"github.com/logfwd/forwarder/wal"
)

// sendTimeout is how long in-flight sends get once a drainer is told to stop.
// With drain_on_shutdown most of shutdown_timeout goes to the drain before it
// (drainShare), and the sends get a quarter.
func sendTimeout(cfg *config.Config) time.Duration {
	t := time.Duration(cfg.ShutdownTimeout)
	if cfg.DrainOnShutdown {
		return t / 4
	}
	return t * 4 / 5
}

// drainShare is the part of shutdown_timeout the drain may take: the rest is
// for the sends it leaves in flight, the commits and closing the WAL.
func drainShare(t time.Duration) time.Duration { return t * 3 / 5 }

// drainActor, with drain_on_shutdown, delivers every record in the WAL when
// the service stops. It is added after the sinks and before the inputs, so
// that its stop runs once the inputs no longer take records, while every
// sink still runs: all of them drain at once.
//
// The drain gets drainShare of shutdown_timeout, or less when what stopped
// before it (the inputs, finishing the messages in flight) took so long
// that the sends it leaves in flight (sends) would not fit before the
// stop's deadline (its context's).
func drainActor(drainers []*queue.Drainer, timeout, sends time.Duration, log *slog.Logger) actor {
	return actor{
		name: "drain",
		run: func(ctx context.Context) error {
			<-ctx.Done()
			return nil
		},
		stop: func(ctx context.Context) error {
			began := time.Now()
			share := drainShare(timeout)
			if by, ok := ctx.Deadline(); ok {
				left := time.Until(by)
				share = max(min(share, left-sends-min(time.Second, left/5)), 0)
			}
			dctx, cancel := context.WithTimeout(ctx, share)
			defer cancel()
			log.Info("draining: delivering every record in the WAL before exiting (drain_on_shutdown)", "sinks", len(drainers), "within", share.Round(time.Millisecond))
			var wg sync.WaitGroup
			for _, d := range drainers {
				wg.Go(func() {
					err := d.Drain(dctx)
					switch {
					case err == nil:
						log.Info("sink drained: every record delivered", "sink", d.Name(), "took", time.Since(began).Round(time.Millisecond))
					case errors.Is(err, queue.ErrNotDrained):
						log.Warn("sink not drained: its records stay in the WAL", "sink", d.Name(), "reason", err)
					default:
						log.Warn("sink not drained within its part of shutdown_timeout: what it has not delivered stays in the WAL", "sink", d.Name(), "waited", time.Since(began).Round(time.Millisecond))
					}
				})
			}
			wg.Wait()
			return nil // what is left is reported by leftoverActor, and the exit is clean
		},
	}
}

// leftoverActor logs, once every sink has stopped and before the WAL closes,
// what each sink leaves in the WAL: the records after its cursor (which may
// include records of other sinks' tags: the cursor passes them with its next
// delivery), about how many bytes they take, and the oldest one's age. Added
// right after the WAL, it is stopped right before it.
func leftoverActor(w *wal.WAL, cfg *config.Config, log *slog.Logger) actor {
	return actor{
		name: "leftover report",
		run: func(ctx context.Context) error {
			<-ctx.Done()
			return nil
		},
		stop: func(ctx context.Context) error {
			if w.Err() != nil {
				return nil
			}
			// With wal.sync: interval, what the open transaction holds is
			// committed first, so that its records are counted. Should
			// that fail for good, the WAL's own stop says what is lost.
			if err := w.Sync(ctx); err != nil && w.Err() != nil {
				return nil
			}
			st := w.Stats()
			for _, s := range cfg.Sinks {
				pos, ok := st.Cursors[s.Name]
				if !ok {
					continue
				}
				n := lag(st, pos)
				if n == 0 {
					log.Info("stopping: the sink has delivered everything in the WAL", "sink", s.Name)
					continue
				}
				args := []any{"sink", s.Name, "records", n}
				if st.Records > 0 {
					args = append(args, "bytes_about", st.Bytes/int64(st.Records)*int64(n))
				}
				if age := w.Age(max(pos+1, st.FirstSeq)); age > 0 {
					args = append(args, "oldest_age", age.Round(time.Second))
				}
				log.Info("stopping: records left in the WAL for the sink; they are delivered when the service starts again on this data_dir", args...)
			}
			return nil
		},
	}
}
