package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/queue"
	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// sinkBuilders make a sink's destination from its configuration, by sink type.
var sinkBuilders = map[string]func(s config.Sink, log *slog.Logger) (sinks.Sink, error){}

// drainerActors returns one actor per configured sink, each draining the WAL into its
// destination from the sink's own cursor. A sink whose type this build cannot deliver to
// still gets its cursor, so that the WAL keeps its records until it can.
func drainerActors(w *wal.WAL, cfg *config.Config, reg prometheus.Registerer, log *slog.Logger) ([]actor, error) {
	metrics := queue.NewMetrics(reg)
	// In-flight sends get most of shutdown_timeout; the rest is for committing and closing.
	sendTimeout := time.Duration(cfg.ShutdownTimeout) * 4 / 5
	var actors []actor
	for _, s := range cfg.Sinks {
		build, ok := sinkBuilders[s.Type]
		if !ok {
			if _, err := w.RegisterCursor(context.Background(), s.Name); err != nil {
				return nil, fmt.Errorf("register cursor of sink %q: %w", s.Name, err)
			}
			log.Warn("this build cannot deliver to this sink type; the sink's records are kept in the WAL until a build that can runs", "sink", s.Name, "type", s.Type)
			continue
		}
		dest, err := build(s, log.With("sink", s.Name))
		if err != nil {
			return nil, fmt.Errorf("sink %q (line %d): %w", s.Name, s.Line, err)
		}
		globs := s.Match
		d := queue.New(w, s.Name, dest, queue.Options{
			Match:           func(tag string) bool { return config.MatchTag(globs, tag) },
			ShutdownTimeout: sendTimeout,
			Metrics:         metrics,
			Logger:          log,
		})
		actors = append(actors, actor{name: "sink " + s.Name, run: d.Run})
	}
	return actors, nil
}
