package main

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/inputs"
	"github.com/logfwd/forwarder/inputs/forward"
	httpin "github.com/logfwd/forwarder/inputs/httpin"
	"github.com/logfwd/forwarder/wal"
)

// inputActors binds the configured inputs' listeners (so that a port in use stops the
// start at once) and returns an actor for each. Records whose tag no sink matches are
// acknowledged and counted, not stored. Both inputs share one memory budget, their share
// of memory_limit.
func inputActors(w *wal.WAL, cfg *config.Config, reg prometheus.Registerer, log *slog.Logger) ([]actor, *inputs.Pipeline, error) {
	m := inputs.NewMetrics(reg)
	p := &inputs.Pipeline{WAL: w, Metrics: m, Routed: routed(cfg.Sinks), Budget: inputs.NewBudget(cfg.InputMemory(), m),
		Unrouted: &inputs.UnroutedLog{Log: log}}
	var actors []actor
	// Series that alerts take the increase of, there at 0 before their first count.
	for _, in := range []struct {
		name string
		on   bool
	}{{"forward", cfg.Inputs.Forward != nil}, {"http", cfg.Inputs.HTTP != nil}} {
		if in.on {
			m.Init(in.name)
		}
	}
	if c := cfg.Inputs.Forward; c != nil {
		s := forward.New(*c, p, log)
		s.StopWithin(time.Duration(cfg.ShutdownTimeout))
		if err := s.Start(); err != nil {
			return nil, nil, err
		}
		actors = append(actors, actor{name: "forward input", run: s.Serve, team: "inputs"})
	}
	if c := cfg.Inputs.HTTP; c != nil {
		s := httpin.New(*c, p, log)
		s.StopWithin(time.Duration(cfg.ShutdownTimeout))
		if err := s.Start(); err != nil {
			return nil, nil, err
		}
		actors = append(actors, actor{name: "http input", run: s.Serve, team: "inputs"})
	}
	return actors, p, nil
}

// routed reports whether some sink's match takes a tag.
func routed(sinks []config.Sink) func(tag string) bool {
	var globs []string
	for _, s := range sinks {
		globs = append(globs, s.Match...)
	}
	return config.NewTagMatcher(globs).Match
}
