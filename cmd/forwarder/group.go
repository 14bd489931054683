package main

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/logfwd/forwarder/wal"
)

// actor is one component of the running service.
type actor struct {
	name string
	// run does the actor's work until its context ends (then it returns nil) or it fails.
	// Returning nil before that asks the service to stop: the actor logs why (the signal
	// handler logs "shutting down").
	run func(ctx context.Context) error
	// stop, if set, releases what the actor holds, once run has returned. Its context ends
	// at the shutdown deadline.
	stop func(ctx context.Context) error
	// team, if set, names actors added one after another that stop together: each gets
	// the time the stop has left, not what the one before left it (the sinks, the inputs).
	team string
}

// group runs the service's actors together. The first actor to return stops them all, one
// at a time in the reverse of the order they were added (a team at once), so that what was
// started first (the WAL) is closed last, after everything that writes to it has stopped.
//
// Every error is reported where it happens, through log or failed; run's result is only the
// exit status.
type group struct {
	log    *slog.Logger
	actors []actor
	// failed reports the error of the actor whose return started the shutdown, at once,
	// before the others are stopped. Nil: log it as an error.
	failed func(name string, err error)
	// stopBy is when the stop must be over, once it has begun.
	stopBy atomic.Pointer[time.Time]
	// timeoutLoses, when set, is what a stop that outlasts its timeout loses, said with
	// it (wal.sync: interval: what the WAL's last commit would have made durable).
	timeoutLoses string
}

func (g *group) add(a actor) { g.actors = append(g.actors, a) }

// deadline is when the stop must be over; zero before it begins.
func (g *group) deadline() time.Time {
	if t := g.stopBy.Load(); t != nil {
		return *t
	}
	return time.Time{}
}

// run starts every actor and waits for one to return or for ctx to end; then it stops the
// others and calls the stop functions, newest first, within timeout. It reports whether
// anything failed: an actor, a stop function, or the shutdown outlasting timeout. Actors
// still running after timeout are abandoned: the process is about to exit.
func (g *group) run(ctx context.Context, timeout time.Duration) (failed bool) {
	type result struct {
		i   int
		err error
	}
	results := make(chan result, len(g.actors))
	cancels := make([]context.CancelFunc, len(g.actors))
	defer func() {
		for _, cancel := range cancels {
			cancel()
		}
	}()
	// Each actor has its own context, so that they can be stopped one by one.
	base := context.WithoutCancel(ctx)
	for i, a := range g.actors {
		actx, cancel := context.WithCancel(base)
		cancels[i] = cancel
		go func() { results <- result{i, a.run(actx)} }()
	}

	returned := make([]bool, len(g.actors))
	if len(g.actors) > 0 {
		select {
		case r := <-results:
			returned[r.i] = true
			if r.err != nil {
				failed = true
				g.reportFailure(g.actors[r.i].name, r.err)
			}
		case <-ctx.Done():
		}
	}

	by := time.Now().Add(timeout)
	g.stopBy.Store(&by)
	sctx, cancel := context.WithDeadline(base, by)
	defer cancel()
	for i := len(g.actors) - 1; i >= 0; {
		// The team of actor i: actors j..i.
		j := i
		for team := g.actors[i].team; team != "" && j > 0 && g.actors[j-1].team == team; j-- {
		}
		for k := j; k <= i; k++ {
			cancels[k]()
		}
		for k := i; k >= j; k-- {
			for !returned[k] {
				select {
				case r := <-results:
					returned[r.i] = true
					switch {
					case r.err == nil || errors.Is(r.err, context.Canceled):
					case failed && errors.Is(r.err, wal.ErrFatal):
						// The WAL's failure, reported once already, ended it too.
						g.log.Warn(g.actors[r.i].name+" stopped by the WAL's failure", "error", r.err)
					default:
						failed = true
						g.log.Error(g.actors[r.i].name+" failed while stopping", "error", r.err)
					}
				case <-sctx.Done():
					var pending []string
					for m := i; m >= j; m-- {
						if !returned[m] {
							pending = append(pending, g.actors[m].name)
						}
					}
					g.timedOut(timeout, pending, j)
					return true
				}
			}
		}
		type stopResult struct {
			name string
			err  error
		}
		stopped := make(chan stopResult, i-j+1)
		stopping := map[string]bool{}
		for k := i; k >= j; k-- {
			if a := g.actors[k]; a.stop != nil {
				stopping[a.name] = true
				go func() { stopped <- stopResult{a.name, a.stop(sctx)} }()
			}
		}
		for len(stopping) > 0 {
			select {
			case r := <-stopped:
				delete(stopping, r.name)
				if r.err != nil {
					failed = true
					g.log.Error("stop "+r.name, "error", r.err)
				}
			case <-sctx.Done():
				var pending []string
				for m := i; m >= j; m-- {
					if stopping[g.actors[m].name] {
						pending = append(pending, g.actors[m].name)
					}
				}
				g.timedOut(timeout, pending, j)
				return true
			}
		}
		i = j - 1
	}
	return failed
}

func (g *group) reportFailure(name string, err error) {
	if g.failed != nil {
		g.failed(name, err)
		return
	}
	g.log.Error(name+" failed; shutting down", "error", err)
}

// timedOut logs the actors that had not stopped when the deadline came: those of the team
// being stopped that had not (pending), and every actor before the team (below j).
func (g *group) timedOut(timeout time.Duration, pending []string, j int) {
	waiting := pending
	for k := j - 1; k >= 0; k-- {
		waiting = append(waiting, g.actors[k].name)
	}
	msg := "shutdown did not finish within shutdown_timeout; exiting without waiting for the rest"
	if g.timeoutLoses != "" {
		msg += "; " + g.timeoutLoses
	}
	g.log.Error(msg, "shutdown_timeout", timeout, "waiting_for", waiting)
}
