package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
	"github.com/prometheus/client_golang/prometheus"
)

// Options configure a Drainer. Zero values take the defaults noted.
type Options struct {
	Match func(tag string) bool // records whose tag it refuses are not for this sink; nil: all
	// MatchGlobs are the globs Match applies (config.MatchTag), stored
	// with Fingerprint: when they change between runs, the delivered
	// marks ahead of the cursor are read through the earlier match (a
	// wider match takes records of tags the marks did not cover). Match
	// nil: config.NewTagMatcher(MatchGlobs).Match.
	MatchGlobs      []string
	ShutdownTimeout time.Duration // in-flight sends get this long at shutdown; default 30s
	// StopBy, if set, is when the whole service's stop must be over (zero
	// until it begins): in-flight sends get no longer than until a second
	// before it (a fifth of what is left, when that is less), whatever
	// ShutdownTimeout says, so that what stopped before the drainer cannot
	// make the stop outlast it.
	StopBy func() time.Time
	// MaxBufferedBytes bounds the memory of the records the drainer holds
	// in partitions and in batches being sent; batches waiting to be sent
	// again after a failure come on top (one per failing partition).
	// Default 64 MiB.
	MaxBufferedBytes int
	ReadBatch        int           // records per WAL read; default 10,000
	RetryMin         time.Duration // first retry delay; default 200ms
	RetryMax         time.Duration // longest retry delay; default 30s
	PauseRetry       time.Duration // probe interval of a paused sink; default 30s
	MaxDeadLetters   int           // dead letters kept per sink; default 10,000
	SummaryInterval  time.Duration // how often failed sends are summed up in the log; default 1m
	// Fingerprint identifies how the sink partitions records (its name
	// templates, say). Delivered marks are only valid for the partitioning
	// that wrote them: when the fingerprint changes, they are read through
	// the earlier partitioning (a sinks.Repartitioner), else dropped.
	Fingerprint string
	// PartitionIdle is how long a partition admitted under the sink's
	// max_partitions (sinks.Limits.MaxPartitions) must have been idle to
	// be let go, making room for another. Default 10m.
	PartitionIdle time.Duration
	Metrics       *Metrics // nil: unregistered metrics
	Logger        *slog.Logger

	// checkInvariants makes the loop verify its invariants (loop.check)
	// after every step and panic when one is broken: for the tests.
	checkInvariants bool
}

func (o *Options) setDefaults() {
	if o.Match == nil && o.MatchGlobs != nil {
		o.Match = config.NewTagMatcher(o.MatchGlobs).Match
	}
	if o.ShutdownTimeout <= 0 {
		o.ShutdownTimeout = 30 * time.Second
	}
	if o.MaxBufferedBytes <= 0 {
		o.MaxBufferedBytes = 64 << 20
	}
	if o.ReadBatch <= 0 {
		o.ReadBatch = 10000
	}
	if o.RetryMin <= 0 {
		o.RetryMin = 200 * time.Millisecond
	}
	if o.RetryMax <= 0 {
		o.RetryMax = 30 * time.Second
	}
	if o.PauseRetry <= 0 {
		o.PauseRetry = 30 * time.Second
	}
	if o.MaxDeadLetters <= 0 {
		o.MaxDeadLetters = 10000
	}
	if o.SummaryInterval <= 0 {
		o.SummaryInterval = time.Minute
	}
	if o.PartitionIdle <= 0 {
		o.PartitionIdle = 10 * time.Minute
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nil)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Drainer delivers one sink's records from the WAL. It reads from the
// sink's cursor, routes records to partitions, cuts batches within the
// sink's limits, keeps at most one batch in flight per partition, and
// moves the cursor to the low watermark: never past a record that is
// neither delivered nor dead-lettered.
type Drainer struct {
	w    *wal.WAL
	name string
	sink sinks.Sink
	lim  sinks.Limits
	opts Options
	log  *slog.Logger
	st   *sinkState

	delivered, batches, skipped, evicted prometheus.Counter
	earlyCuts, spills, reread            prometheus.Counter
	lagRecords, lagSeconds, inflight     prometheus.Gauge
	paused, buffered, admitted           prometheus.Gauge
	overflowed                           prometheus.Counter
	sendDuration                         prometheus.Observer

	drain drainRequest // Drain's request to the loop

	mu     sync.Mutex
	status Status

	steps atomic.Int64 // the loop's steps, counted with Options.checkInvariants

	panicLogAt atomic.Int64 // Unix nanoseconds when a sink's panic is logged again (send)
}

// New returns a Drainer for sink, whose cursor in w is named name.
func New(w *wal.WAL, name string, sink sinks.Sink, opts Options) *Drainer {
	opts.setDefaults()
	lim := sink.Limits()
	if lim.MaxRecords <= 0 {
		lim.MaxRecords = 1000
	}
	if lim.MaxBytes <= 0 {
		lim.MaxBytes = 1 << 20
	}
	if lim.MaxAge <= 0 {
		lim.MaxAge = time.Second
	}
	if lim.Concurrency <= 0 {
		lim.Concurrency = 1
	}
	m := opts.Metrics
	return &Drainer{
		w: w, name: name, sink: sink, lim: lim, opts: opts,
		log: opts.Logger.With("sink", name),
		st:  &sinkState{w: w, name: name, match: opts.Match},

		delivered:    m.Delivered.WithLabelValues(name),
		batches:      m.Batches.WithLabelValues(name),
		skipped:      m.Skipped.WithLabelValues(name),
		evicted:      m.Evicted.WithLabelValues(name),
		earlyCuts:    m.EarlyCuts.WithLabelValues(name),
		spills:       m.Spills.WithLabelValues(name),
		reread:       m.Reread.WithLabelValues(name),
		lagRecords:   m.LagRecords.WithLabelValues(name),
		lagSeconds:   m.LagSeconds.WithLabelValues(name),
		inflight:     m.InFlight.WithLabelValues(name),
		paused:       m.Paused.WithLabelValues(name),
		buffered:     m.Buffered.WithLabelValues(name),
		admitted:     m.Admitted.WithLabelValues(name),
		overflowed:   m.Overflowed.WithLabelValues(name),
		sendDuration: m.SendDuration.WithLabelValues(name),
		status:       Status{Sink: name, State: StateStarting},
		drain:        newDrainRequest(),
	}
}

// Name is the sink's name, which is also its cursor's.
func (d *Drainer) Name() string { return d.name }

// Status returns the drainer's current state.
func (d *Drainer) Status() Status {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.status
}

// Run drains until ctx ends, then lets in-flight batches finish (for at
// most ShutdownTimeout), commits their delivery, and returns nil. It
// returns an error only when it cannot go on: the WAL failed or holds a
// damaged entry.
func (d *Drainer) Run(ctx context.Context) error {
	defer close(d.drain.exit)
	defer d.setState(func(s *Status) {
		// Stopped before the loop ran (a wait for room on a full disk, or
		// for the destination, that the stop ended).
		if ctx.Err() != nil && (s.State == StateStarting || s.State == StateRecovering) {
			s.State = StateStopped
		}
	})
	cursor, err := registerWaiting(ctx, d.w.RegisterCursor, d.name, d.log, time.Second)
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return nil // stopped before it started: nothing to finish
		}
		return fmt.Errorf("register cursor %q: %w", d.name, err)
	}
	prior, err := d.partitioningChanged()
	if err != nil {
		return err
	}
	d.st.partitioning = prior.desc
	// No record from next on was routed before: the bound applies from
	// there, or from the start for a sink that never ran.
	next := d.w.Stats().NextSeq
	if prior.fresh {
		next = cursor + 1
	}
	var g *guard
	if _, ok := d.sink.(sinks.Overflower); ok && d.lim.MaxPartitions > 0 {
		if g, err = loadGuard(d.w, d.name, d.lim.MaxPartitions, next, prior.changed, time.Now()); err != nil {
			return err
		}
		if err := d.commitGuard(ctx, g); err != nil {
			if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
				return nil // stopped while the disk was full: nothing to finish
			}
			return err
		}
		d.st.guard = g // read only, by Recover, until the loop starts
	}
	// From the start, not only once the loop runs (finishInterrupted may
	// wait long for the destination).
	d.opts.Metrics.DeadStored.WithLabelValues(d.name).Set(float64(d.countDeadLetters()))
	if r, ok := d.sink.(sinks.Recoverer); ok {
		// Interrupted work's batches were cut without the records that
		// partitions of earlier configurations had delivered: the sink's
		// reads of them leave those out too (sinkState.readRange). The
		// generations stored now are those in force when they were cut:
		// storePartitioning adds this start's after Recover.
		if d.st.old, err = d.loadOldMarks(ctx, next, false); err != nil {
			return err
		}
		if err := d.finishInterrupted(ctx, r, cursor); err != nil {
			return err
		}
		if ctx.Err() != nil {
			d.setState(func(s *Status) { s.State = StateStopped })
			return nil
		}
	}
	if err := d.storePartitioning(ctx, prior, cursor); err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return nil // stopped while the disk was full: nothing to finish
		}
		return err
	}
	old, err := d.loadOldMarks(ctx, next, true)
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return nil
		}
		return err
	}
	d.st.old = old // the loop's, for a sink's reads while it runs (an S3 object rebuilt)
	l, err := newLoop(d, cursor, g, old)
	if err != nil {
		return err
	}
	err = l.run(ctx)
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		// The stop ended a wait for room on a full disk (the admitted
		// partitions' commit, max_partitions): a stop, not a failure.
		// The loop returned at once: what was sent and not recorded is
		// sent again at the next start.
		d.log.Warn("stopped while waiting for room on the WAL's disk; deliveries not recorded yet are sent again at the next start", "error", err)
		err = nil
	}
	d.setState(func(s *Status) {
		s.State = StateStopped
		if err != nil {
			s.State = StateFailed
			s.LastError, s.LastErrorAt = err.Error(), time.Now()
		}
	})
	return err
}

// finishInterrupted lets the sink finish what a crash left half done before any
// record is read. Failures are retried like sends: a sink-permanent one
// pauses the sink (one error line, shown in /status and /readyz) and is probed every
// PauseRetry; others back off. An error the sink did not classify (its
// state disagrees with the WAL) stops the drainer.
func (d *Drainer) finishInterrupted(ctx context.Context, r sinks.Recoverer, cursor uint64) error {
	d.setState(func(s *Status) { s.State, s.Cursor = StateRecovering, cursor })
	// The lag goes on growing while the work waits for the destination:
	// the lag alerts must see it (the loop updates it once it runs).
	d.updateLag(cursor)
	lagDone := make(chan struct{})
	defer close(lagDone)
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				d.updateLag(cursor)
			case <-lagDone:
				return
			}
		}
	}()
	paused := false
	refused := 0           // refusals in a row while paused: pauseWait's exponent
	var lastWarn time.Time // the last warning of a failure that is retried
	full := time.Second    // the next wait after a commit found the disk full
	for attempt := 1; ; attempt++ {
		err := r.Recover(ctx, d.st)
		if err == nil || ctx.Err() != nil {
			if paused {
				d.log.Info("sink recovered: interrupted work finished")
				d.setPaused(false)
			}
			return nil
		}
		if errors.Is(err, wal.ErrNoSpace) {
			// A state commit found the disk full: as the loop's commits
			// (commitWaiting), wait for room; what was done is done again.
			d.log.Warn("finishing interrupted work: the WAL's disk is full; retrying", "retry_in", full, "error", err)
			if paused { // the destination took what it refused before
				d.setPaused(false)
				paused = false
			}
			d.setState(func(s *Status) { s.State, s.LastError, s.LastErrorAt = StateRecovering, err.Error(), time.Now() })
			select {
			case <-time.After(full):
			case <-ctx.Done():
				return nil
			}
			full = min(2*full, 30*time.Second)
			continue
		}
		full = time.Second
		var e *sinks.Error
		if !errors.As(err, &e) {
			return fmt.Errorf("recover sink %q: %w", d.name, err)
		}
		wait := d.opts.RetryMin << min(attempt-1, 20)
		wait = min(wait, d.opts.RetryMax)
		state := StateRecovering
		d.opts.Metrics.Retries.WithLabelValues(d.name, e.Class.String(), e.Reason).Inc()
		if e.Class == sinks.SinkPermanent {
			if !paused {
				refused = 0
			}
			wait, state = pauseWait(d.opts.PauseRetry, refused), StatePaused
			refused++
			if !paused {
				d.log.Error("sink paused while finishing interrupted work: the destination refuses every request until this is fixed; "+d.keptSays()+"; "+pauseSays(d.opts.PauseRetry),
					"reason", e.Reason, "error", e.Err)
				d.setPaused(true)
				paused = true
			}
		} else {
			if paused { // the destination no longer refuses: it fails otherwise
				d.log.Info("sink no longer refused while finishing interrupted work; retrying", "reason", e.Reason, "error", e.Err)
				d.setPaused(false)
				paused = false
			}
			if now := time.Now(); now.Sub(lastWarn) >= d.opts.SummaryInterval {
				// The loop's once-a-minute summary of failures does not
				// run yet: a warning at the first failure and then once
				// an interval says why the sink delivers nothing.
				d.log.Warn("finishing interrupted work failed; retrying (the sink delivers nothing new until it is done)",
					"reason", e.Reason, "attempts", attempt, "retry_in", wait, "error", e.Err)
				lastWarn = now
			} else {
				d.log.Debug("finishing interrupted work failed, will retry", "reason", e.Reason, "wait", wait, "error", e.Err)
			}
		}
		d.setState(func(s *Status) { s.State, s.LastError, s.LastErrorAt = state, e.Error(), time.Now() })
		var drain <-chan struct{} // a stop's Drain does not wait for a paused sink
		if paused && !d.drain.answered.Load() {
			drain = d.drain.start
		}
		select {
		case <-time.After(wait):
		case <-drain:
			d.drain.answer(fmt.Errorf("sink %q is paused while finishing interrupted work (%s): %w", d.name, e.Error(), ErrNotDrained))
			select { // the probe keeps its pace
			case <-time.After(wait):
			case <-ctx.Done():
				return nil
			}
		case <-ctx.Done():
			return nil
		}
	}
}

func (d *Drainer) setState(f func(*Status)) {
	d.mu.Lock()
	f(&d.status)
	d.mu.Unlock()
}

// setPaused sets forwarder_sink_paused and tells the WAL, whose full
// state its level cursors then leave alone (wal.WAL.Holding).
func (d *Drainer) setPaused(on bool) {
	if on {
		d.paused.Set(1)
	} else {
		d.paused.Set(0)
	}
	d.w.SetPaused(d.name, on)
}

// keptSays is what becomes of the records a sink cannot deliver: kept in
// the WAL, or, with wal.when_full: drop_oldest, kept until a full WAL drops
// them.
func (d *Drainer) keptSays() string {
	if d.w.DropsOldest() {
		return "records stay in the WAL, but with wal.when_full: drop_oldest a full WAL drops the oldest of them (counted per sink)"
	}
	return "records stay in the WAL and nothing is dropped"
}
