package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/logfwd/forwarder/wal"
)

// events records what the actors of a test did, in order.
type events struct {
	mu   sync.Mutex
	list []string
}

func (e *events) add(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.list = append(e.list, fmt.Sprintf(format, args...))
}

func (e *events) get() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.list)
}

// waiter is an actor that runs until its context ends and records when it returns and stops.
func waiter(name string, ev *events) actor {
	return actor{
		name: name,
		run: func(ctx context.Context) error {
			<-ctx.Done()
			ev.add("%s returned", name)
			return nil
		},
		stop: func(context.Context) error {
			ev.add("%s stopped", name)
			return nil
		},
	}
}

func testLogger() (*slog.Logger, *syncBuffer) {
	var buf syncBuffer
	return slog.New(slog.NewTextHandler(&buf, nil)), &buf
}

func TestGroupStopsInReverseOrder(t *testing.T) {
	log, logs := testLogger()
	var ev events
	trigger := make(chan struct{})
	g := &group{log: log}
	g.add(waiter("first", &ev))
	g.add(waiter("second", &ev))
	g.add(actor{name: "trigger", run: func(context.Context) error {
		<-trigger
		ev.add("trigger returned")
		return nil
	}})
	g.add(waiter("last", &ev))
	close(trigger)
	if failed := g.run(context.Background(), 5*time.Second); failed {
		t.Errorf("run reported a failure; log:\n%s", logs)
	}
	want := []string{"trigger returned", "last returned", "last stopped", "second returned", "second stopped", "first returned", "first stopped"}
	if got := ev.get(); !slices.Equal(got, want) {
		t.Errorf("events:\n%q\nwant:\n%q", got, want)
	}
	if logs.String() != "" {
		t.Errorf("a clean stop logged:\n%s", logs)
	}
}

// TestGroupStopsATeamTogether: actors of a team (the sinks, the inputs) are stopped at
// once, each with the time the stop has left: two that take 400 ms each fit a 700 ms
// timeout; stopped one after the other they would not. What comes before the team stops
// once the whole team has.
func TestGroupStopsATeamTogether(t *testing.T) {
	log, logs := testLogger()
	var ev events
	member := func(name string) actor {
		return actor{name: name, team: "sinks", run: func(ctx context.Context) error {
			<-ctx.Done()
			ev.add("%s cancelled", name)
			time.Sleep(400 * time.Millisecond)
			ev.add("%s returned", name)
			return nil
		}}
	}
	g := &group{log: log}
	g.add(waiter("first", &ev))
	g.add(member("a"))
	g.add(member("b"))
	g.add(waiter("last", &ev))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if failed := g.run(ctx, 700*time.Millisecond); failed {
		t.Errorf("run reported a failure; log:\n%s", logs)
	}
	got := ev.get()
	if len(got) != 8 || !slices.Equal(got[:2], []string{"last returned", "last stopped"}) ||
		!slices.Equal(got[6:], []string{"first returned", "first stopped"}) {
		t.Fatalf("events %q", got)
	}
	team := got[2:6]
	slices.Sort(team[:2])
	if !slices.Equal(team[:2], []string{"a cancelled", "b cancelled"}) {
		t.Errorf("events %q: the team's actors were not cancelled together", got)
	}
}

// TestGroupTimeoutNamesWhatDidNotStop: at the deadline, the log names the team's actors
// that had not stopped and every actor before the team, whose stop had not run (the WAL's
// close, which a returned run does not make done), not those that had stopped.
func TestGroupTimeoutNamesWhatDidNotStop(t *testing.T) {
	log, logs := testLogger()
	release := make(chan struct{})
	defer close(release)
	var ev events
	g := &group{log: log}
	g.add(actor{name: "wal", run: func(context.Context) error { return nil }, stop: func(context.Context) error { return nil }})
	g.add(actor{name: "sink a", team: "sinks", run: func(ctx context.Context) error { <-release; return nil }})
	g.add(actor{name: "sink b", team: "sinks", run: func(ctx context.Context) error { <-ctx.Done(); return nil }})
	g.add(waiter("inputs", &ev))
	if failed := g.run(context.Background(), 200*time.Millisecond); !failed {
		t.Error("a stop that timed out was not reported as failed")
	}
	want := `waiting_for="[sink a wal]"`
	if !strings.Contains(logs.String(), want) {
		t.Errorf("log lacks %s:\n%s", want, logs)
	}
}

func TestGroupStopsWhenContextEnds(t *testing.T) {
	log, _ := testLogger()
	var ev events
	g := &group{log: log}
	g.add(waiter("a", &ev))
	g.add(waiter("b", &ev))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if failed := g.run(ctx, 5*time.Second); failed {
		t.Error("run reported a failure")
	}
	want := []string{"b returned", "b stopped", "a returned", "a stopped"}
	if got := ev.get(); !slices.Equal(got, want) {
		t.Errorf("events %q, want %q", got, want)
	}
}

func TestGroupShutdownTimeout(t *testing.T) {
	log, logs := testLogger()
	release := make(chan struct{})
	defer close(release)
	g := &group{log: log}
	g.add(actor{name: "stuck", run: func(context.Context) error {
		<-release // ignores its context
		return nil
	}})
	g.add(actor{name: "quits", run: func(context.Context) error { return nil }})
	start := time.Now()
	if failed := g.run(context.Background(), 50*time.Millisecond); !failed {
		t.Error("a shutdown that timed out was not reported as failed")
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("run took %v with a 50ms shutdown timeout", took)
	}
	want := `level=ERROR msg="shutdown did not finish within shutdown_timeout; exiting without waiting for the rest" shutdown_timeout=50ms waiting_for=[stuck]`
	if !strings.Contains(logs.String(), want) {
		t.Errorf("log lacks %q:\n%s", want, logs)
	}

	// With wal.sync: interval the line says what the exit loses.
	log, logs = testLogger()
	g = &group{log: log, timeoutLoses: intervalLoss}
	g.add(actor{name: "stuck", run: func(context.Context) error {
		<-release
		return nil
	}})
	g.add(actor{name: "quits", run: func(context.Context) error { return nil }})
	g.run(context.Background(), 50*time.Millisecond)
	want = `level=ERROR msg="shutdown did not finish within shutdown_timeout; exiting without waiting for the rest; wal.sync is interval: records acknowledged since the last commit (up to about one second of them) are lost" shutdown_timeout=50ms waiting_for=[stuck]`
	if !strings.Contains(logs.String(), want) {
		t.Errorf("log lacks %q:\n%s", want, logs)
	}
}

func TestGroupStopTimeout(t *testing.T) {
	log, logs := testLogger()
	release := make(chan struct{})
	defer close(release)
	g := &group{log: log}
	g.add(actor{
		name: "slow",
		run:  func(ctx context.Context) error { <-ctx.Done(); return nil },
		stop: func(context.Context) error { <-release; return nil },
	})
	g.add(actor{name: "quits", run: func(context.Context) error { return nil }})
	if failed := g.run(context.Background(), 50*time.Millisecond); !failed {
		t.Error("a stop that outlasted the timeout was not reported as failed")
	}
	if !strings.Contains(logs.String(), "waiting_for=[slow]") {
		t.Errorf("log does not name the slow actor:\n%s", logs)
	}
}

func TestGroupStopError(t *testing.T) {
	log, logs := testLogger()
	g := &group{log: log}
	g.add(actor{
		name: "closer",
		run:  func(ctx context.Context) error { <-ctx.Done(); return nil },
		stop: func(context.Context) error { return errors.New("close file: disk gone") },
	})
	g.add(actor{name: "quits", run: func(context.Context) error { return nil }})
	if failed := g.run(context.Background(), 5*time.Second); !failed {
		t.Error("a failed stop was not reported as failed")
	}
	if want := `level=ERROR msg="stop closer" error="close file: disk gone"`; !strings.Contains(logs.String(), want) {
		t.Errorf("log lacks %q:\n%s", want, logs)
	}
}

// fakeWAL fails like a WAL whose fsync failed.
type fakeWAL struct {
	fatal    chan struct{}
	err      error
	closed   chan struct{}
	closeErr error
}

func (f *fakeWAL) Fatal() <-chan struct{} { return f.fatal }
func (f *fakeWAL) Err() error             { return f.err }
func (f *fakeWAL) Stalled() bool          { return false }
func (f *fakeWAL) Close() error           { close(f.closed); return f.closeErr }

// TestWALLastCommitFailsAtStop: a WAL whose last commit, at its Close, fails (with
// sync: interval it held acknowledged records) makes the stop fail, with a line that says
// what was lost.
func TestWALLastCommitFailsAtStop(t *testing.T) {
	log, logs := testLogger()
	fw := &fakeWAL{
		fatal:    make(chan struct{}),
		closed:   make(chan struct{}),
		closeErr: fmt.Errorf("%w: commit: sync wal.db: input/output error", wal.ErrFatal),
	}
	g := &group{log: log, failed: reportFailure(log)}
	g.add(walActor(fw, func() bool { return !g.deadline().IsZero() }))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if failed := g.run(ctx, 5*time.Second); !failed {
		t.Error("a failed last commit was not reported as failed")
	}
	want := `level=ERROR msg="stop wal" error="close wal: its last commit failed, so records acknowledged since the one before (wal.sync: interval) are lost; check the disk: wal: fatal write error, not accepting appends: commit: sync wal.db: input/output error"`
	if !strings.Contains(logs.String(), want) {
		t.Errorf("log:\n%s\nlacks %q", logs, want)
	}

	// A commit that failed after run returned and before Close: Close does not report
	// it (the WAL had failed before), and the stop must.
	log, logs = testLogger()
	fw = &fakeWAL{fatal: make(chan struct{}), closed: make(chan struct{}),
		err: fmt.Errorf("%w: commit: sync wal.db: input/output error", wal.ErrFatal)}
	a := walActor(fw, func() bool { return false })
	if err := a.run(ctx); err != nil {
		t.Fatalf("run: %v", err)
	}
	close(fw.fatal)
	if err := a.stop(context.Background()); err == nil || !strings.Contains(err.Error(), "records acknowledged since the one before (wal.sync: interval) are lost") {
		t.Errorf("stop after a failure run did not see: %v", err)
	}
}

// TestWALLastCommitFailsInTheLeftoverReport: with wal.sync: interval the last commit is
// the leftover report's, made in its stop while the WAL actor still runs: its failure is
// said by the WAL's stop (msg="stop wal", what was lost), every time, not as the WAL actor
// failing while stopping.
func TestWALLastCommitFailsInTheLeftoverReport(t *testing.T) {
	for range 50 {
		log, logs := testLogger()
		fw := &fakeWAL{fatal: make(chan struct{}), closed: make(chan struct{}),
			err: fmt.Errorf("%w: commit: sync wal.db: input/output error", wal.ErrFatal)}
		g := &group{log: log, failed: reportFailure(log)}
		g.add(walActor(fw, func() bool { return !g.deadline().IsZero() }))
		// The leftover report's stop makes the last commit, which fails (Close then
		// returns nil: the WAL had failed before it).
		g.add(actor{name: "leftover report", run: func(ctx context.Context) error { <-ctx.Done(); return nil },
			stop: func(context.Context) error { close(fw.fatal); return nil }})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if !g.run(ctx, 5*time.Second) {
			t.Fatal("a failed last commit was not reported as failed")
		}
		s := logs.String()
		if !strings.Contains(s, `msg="stop wal" error="close wal: its last commit failed, so records acknowledged since the one before (wal.sync: interval) are lost`) || strings.Contains(s, "failed while stopping") {
			t.Fatalf("log:\n%s", s)
		}
	}
}

func TestWALFatalStopsTheService(t *testing.T) {
	log, logs := testLogger()
	var ev events
	fw := &fakeWAL{
		fatal:  make(chan struct{}),
		err:    fmt.Errorf("%w: fsync: input/output error", wal.ErrFatal),
		closed: make(chan struct{}),
	}
	g := &group{log: log, failed: reportFailure(log)}
	g.add(walActor(fw, func() bool { return !g.deadline().IsZero() }))
	// A sink whose last commit the failed WAL refused: it fails as it
	// stops, of the failure already reported.
	g.add(actor{name: "sink cloudwatch", run: func(ctx context.Context) error {
		<-ctx.Done()
		return fmt.Errorf("commit delivery of sink %q: %w", "cloudwatch", fw.err)
	}})
	g.add(waiter("inputs", &ev))
	close(fw.fatal)
	if failed := g.run(context.Background(), 5*time.Second); !failed {
		t.Error("a fatal WAL error was not reported as failed")
	}
	select {
	case <-fw.closed:
	default:
		t.Error("the WAL was not closed")
	}
	if got := ev.get(); !slices.Equal(got, []string{"inputs returned", "inputs stopped"}) {
		t.Errorf("events %q: the other actors were not stopped", got)
	}
	want := `level=ERROR msg="the WAL can no longer guarantee durability, so the service is stopping and acknowledges nothing more; check the disk (kernel log, file system, free space), then restart the service" error="wal: fatal write error, not accepting appends: fsync: input/output error"` + "\n"
	if n := strings.Count(logs.String(), "level=ERROR"); n != 1 || !strings.Contains(logs.String(), want) {
		t.Errorf("log:\n%s\nwant exactly one error line, ending %q", logs, want)
	}
	if !strings.Contains(logs.String(), `level=WARN msg="sink cloudwatch stopped by the WAL's failure"`) {
		t.Errorf("log:\n%s\nlacks the sink's line", logs)
	}
}

func TestSignalsActorStopsOnContext(t *testing.T) {
	log, logs := testLogger()
	a, release := signalsActor(log, time.Second, false)
	defer release()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := a.run(ctx); err != nil {
		t.Errorf("run = %v", err)
	}
	if err := a.stop(context.Background()); err != nil {
		t.Errorf("stop = %v", err)
	}
	if logs.String() != "" {
		t.Errorf("logged without a signal:\n%s", logs)
	}
}

// A SIGHUP (ignored) that arrives after the first SIGTERM, before the stop
// reaches the signals actor, is not taken for a second signal: the process
// is not ended at once. Run in a child process, which signals itself.
func TestSignalsActorSIGHUPWhileStopping(t *testing.T) {
	if os.Getenv("FORWARDER_TEST_SIGNALS_CHILD") == "1" {
		log := slog.New(slog.NewTextHandler(os.Stderr, nil))
		a, release := signalsActor(log, time.Second, false)
		done := make(chan struct{})
		go func() { _ = a.run(context.Background()); close(done) }()
		_ = syscall.Kill(os.Getpid(), syscall.SIGTERM)
		<-done                                        // the first signal: the stop begins
		_ = syscall.Kill(os.Getpid(), syscall.SIGHUP) // a terminal closed while other actors stop
		time.Sleep(200 * time.Millisecond)
		_ = a.stop(context.Background()) // the group reaches the signals actor
		time.Sleep(500 * time.Millisecond)
		release()
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSignalsActorSIGHUPWhileStopping$")
	cmd.Env = append(os.Environ(), "FORWARDER_TEST_SIGNALS_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil || strings.Contains(string(out), "signal while stopping") {
		t.Fatalf("a SIGHUP during the stop ended the process (%v):\n%s", err, out)
	}
}
