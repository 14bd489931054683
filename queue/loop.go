package queue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/logfwd/forwarder/sinks"
)

type sendResult struct {
	p   *partition
	out sinks.Outcome
	err error
	// probe: sent while the sink was paused. Only a probe's success lifts
	// a pause: a send begun before it says nothing of what paused the sink.
	probe bool
}

// loop is the drainer's state, owned by the one goroutine that runs it.
type loop struct {
	d   *Drainer
	lim sinks.Limits

	cursor  uint64 // highest cursor handed to the committer
	readPos uint64 // sequence number of the next record the reader delivers
	parts   map[string]*partition
	due     dueHeap
	pending pendingHeap // the partitions' first pending records (pending.go)
	marks   markSet     // delivered marks committed ahead of the cursor (marks.go)
	old     *oldMarks   // delivered marks of an earlier partitioning (repartition.go); nil: none
	// guard bounds the partitions (guard.go, overflow.go); nil: no bound.
	guard    *guard
	overflow sinks.Overflower // the sink, when guard is set
	families map[string]int   // partitions by family (Overflower.Family), with guard
	ctx      context.Context  // run's: ends waits for a full disk
	over     overflowReport   // what went to the overflow partition since the last report
	// overflowTotal counts the records that went to the overflow partition.
	overflowTotal uint64
	// sendsCanceled: the stop's time ran out and the sends in flight were
	// canceled; their errors are the stop's, not the destination's.
	sendsCanceled bool
	// evictedUnlogged counts the dead letters the committer deleted to
	// keep within MaxDeadLetters that no summary has told yet.
	evictedUnlogged atomic.Int64
	route           []routed     // ingest's scratch
	bufs            readBuffers  // buffers ingest is done with, for the readers
	took            []*partition // ingest's scratch: the partitions the read gives records
	arrays          queueArrays  // queues' arrays no partition uses (arrays.go)
	mem             memAccount   // recordMem of every record held (queued and in batches) and the sink's carries
	open            int          // partitions with queued or carried records
	closing         int          // of which closing: a final batch is due (finalize) or in flight
	// cutHolding's cuts since its last log line, and that line's time.
	holdingCuts   int
	holdingLogged time.Time
	// Partitions by what cutLargest, cutOldest and spill look for (see
	// index.go): gathering, by their queues' and their carries' memory;
	// gathering and open, not closing, by their oldest record; waiting with
	// records queued, by when they may send again.
	largestQueue, largestCarry, oldest, stuck partHeap
	epoch                                     time.Time // what the heaps' times count from
	// idlePending: a cursor move of advanceIdle is queued for commit (at
	// most one, so that the commit queue's room for deliveries holds).
	idlePending bool
	// staleMarks are delivered marks that drop_oldest's cursor move passed
	// (dropForced), taken from marks and not yet deleted from the WAL: the
	// next cursor move's commit deletes them (passMarks), those of
	// partitions that delivered again since excepted.
	staleMarks []string
	inflight   int // partitions sending or committing
	givenUp    int // deliveries whose commit the stop gave up

	flow // retries, throttling, the concurrency limit, pauses (flow.go)

	delivered, deadLettered uint64
	failures                map[string]int // failed sends by class/reason since the last summary
	deadReasons             map[string]int // records dead-lettered by reason since the last summary
	skippedUnlogged         int            // records skipped as delivered before (by a mark) since the last summary
	// Records the head reader read since the last routing check: those
	// for this sink and those its match refused, with a few of their tags.
	matched, unmatched int
	unmatchedTags      []string
	lastRouting        time.Time
	lastSummary        time.Time
	lastErr            string
	lastErrAt          time.Time
	lastRetried        string // the last error of a send that is retried (the retry summary)

	wg   sync.WaitGroup // every goroutine the loop starts
	quit chan struct{}  // closed when the loop returns

	in        chan read
	readErr   chan error
	results   chan sendResult
	commits   chan *commitReq
	committed chan *commitReq

	// The catch-up reader reads the WAL again for the partitions that were
	// spilled, all of them in one pass (see catchup.go).
	backIn   chan read
	backPos  uint64             // the next record it hands over; 0: not running
	backGen  uint64             // reads of an earlier catch-up reader are dropped
	stopBack context.CancelFunc // nil: not running
	joined   map[*partition]struct{}

	// Drain (see drain.go): every batch goes at once, final, until the
	// cursor passes drainTo.
	draining, drainAnswered bool
	drainTo                 uint64

	checks  int    // steps checked (Options.checkInvariants)
	badMove string // the first phase change the diagram does not have (see setPhase)
}

func newLoop(d *Drainer, cursor uint64, g *guard, old *oldMarks) (*loop, error) {
	l := &loop{
		d: d, lim: d.lim, cursor: cursor, readPos: cursor + 1, guard: g, old: old,
		parts: map[string]*partition{}, marks: newMarkSet(),
		flow:     newFlow(d.lim.Concurrency, d.opts.RetryMin, d.opts.RetryMax, d.opts.PauseRetry),
		failures: map[string]int{}, deadReasons: map[string]int{}, lastSummary: time.Now(), lastRouting: time.Now(),
		quit: make(chan struct{}), in: make(chan read), readErr: make(chan error, 1), results: make(chan sendResult),
		// Each busy partition has at most one delivery waiting to commit, at
		// most Concurrency partitions are busy, and advanceIdle queues at most
		// one more: deliver never blocks.
		commits: make(chan *commitReq, d.lim.Concurrency+1), committed: make(chan *commitReq),
		backIn: make(chan read), joined: map[*partition]struct{}{},
	}
	// The arrays kept take at most an eighth of the memory the records
	// may (64 bytes a place: a record and its size).
	l.arrays.max = d.opts.MaxBufferedBytes / 8 / 64
	if g != nil {
		l.overflow, l.families = d.sink.(sinks.Overflower), map[string]int{}
	}
	l.initIndex(time.Now())
	if err := d.w.ScanState(d.name, []byte(prefixMark), func(k, v []byte) error {
		switch {
		case len(v) != 8:
		case be64(v) <= cursor:
			// A mark drop_oldest's cursor move passed, whose deletion the
			// process did not live to commit (dropForced).
			l.staleMarks = append(l.staleMarks, string(k[len(prefixMark):]))
		default:
			l.marks.set(string(k[len(prefixMark):]), be64(v))
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("load delivered marks of %q: %w", d.name, err)
	}

	return l, nil
}

func (l *loop) run(ctx context.Context) error {
	d := l.d
	l.ctx = ctx
	// What failed or was dead-lettered since the last summary is summed
	// up at the end too, whatever the interval.
	defer func() { l.summarizeNow(time.Now()) }()
	// Deferred in this order so that everything is told to stop before
	// the wait for it.
	defer l.wg.Wait()
	defer close(l.quit)
	readCtx, stopReading := context.WithCancel(context.Background())
	defer stopReading()
	sendCtx, cancelSends := context.WithCancel(context.Background())
	defer cancelSends()
	commitCtx, stopCommitter := context.WithCancel(context.Background())
	defer stopCommitter()
	// waitCtx bounds the committer's waits for room on a full disk: ended
	// at the stop's hard deadline, as the sends are.
	waitCtx, giveUpWaits := context.WithCancel(context.Background())
	defer giveUpWaits()
	defer l.stopCatchUp()
	l.wg.Add(2)
	from := l.readPos // read here: the loop moves it on (dropForced) as the reader starts
	go func() { defer l.wg.Done(); l.read(readCtx, from, l.in, 0) }()
	go func() { defer l.wg.Done(); l.commitLoop(commitCtx, waitCtx) }()

	d.setState(func(s *Status) { s.State = StateRunning; s.Cursor = l.cursor })
	l.updateStatus() // lag is right from the start, not after the first tick
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	statusTick := time.NewTicker(time.Second)
	defer statusTick.Stop()
	var hardStop <-chan time.Time // cancels in-flight sends after ShutdownTimeout
	done := ctx.Done()
	drain := d.drain.start
	stopping := false
	for {
		now := time.Now()
		if d.opts.checkInvariants {
			if err := l.check(); err != nil {
				panic(fmt.Sprintf("queue: sink %q: invariant broken: %v", d.name, err))
			}
		}
		l.checkDrain()
		if !stopping {
			l.dispatch(now, sendCtx)
		} else if l.inflight == 0 {
			l.updateStatus()
			return nil
		}
		in := l.in
		if !stopping && l.mem.buffered()-l.mem.batched >= d.opts.MaxBufferedBytes/2 {
			// Half the memory is queued or carried: send the largest
			// partition now, so that the next batch can gather while this
			// one is sent.
			l.cutLargest(now)
		}
		if !stopping && l.lim.MaxOpen > 0 && l.open > l.lim.MaxOpen {
			// More objects are open than the sink may have: close the oldest.
			l.cutOldest(now)
		}
		if !stopping && d.w.Holding(d.name) {
			// Appends wait for what this sink delivers: close the oldest
			// rather than wait for its age (looked at every second at
			// least: the status tick).
			l.cutHolding(now)
		}
		if l.mem.buffered() >= d.opts.MaxBufferedBytes {
			// Free what partitions waiting out a retry have queued, so that
			// the others keep being read.
			l.spill(now)
		}
		// Batches waiting for a retry are not counted here: they are bounded
		// by the partitions that fail, and counting them would let a few
		// failing partitions stop every other one from being read.
		if stopping || l.mem.buffered() >= d.opts.MaxBufferedBytes && l.mem.buffered()-l.mem.waiting >= d.opts.MaxBufferedBytes {
			in = nil      // push back on the reader
			l.bufs.drop() // and keep no buffers for it while it waits
		}
		backIn := l.backIn
		if in == nil {
			backIn = nil // and on the catch-up reader
		}
		if in != nil && l.holdHead() {
			// Only the head reader waits: the catch-up reader brings
			// spilled partitions back when they may send.
			in = nil
		}
		resetTimer(timer, l.nextWake(now, stopping))
		select {
		case rd := <-in:
			err := l.ingest(rd.recs, now, false) // copies what it keeps
			l.bufs.put(rd.buf)
			if err != nil {
				return err
			}
		case rd := <-backIn:
			var err error
			if rd.gen == l.backGen {
				d.reread.Add(float64(len(rd.recs)))
				err = l.ingest(rd.recs, now, true)
			}
			l.bufs.put(rd.buf)
			if err != nil {
				return err
			}
		case r := <-l.results:
			l.onResult(r, time.Now())
		case c := <-l.committed:
			switch {
			case errors.Is(c.err, errCommitGivenUp):
				l.commitGivenUp(c)
			case c.err != nil:
				return fmt.Errorf("commit delivery of sink %q: %w", d.name, c.err)
			default:
				l.onCommitted(c, time.Now())
			}
		case err := <-l.readErr:
			return fmt.Errorf("read wal for sink %q: %w", d.name, err)
		case <-drain:
			drain = nil
			l.startDrain(now)
		case <-timer.C:
		case <-statusTick.C:
			l.advanceIdle()
			l.updateStatus()
			l.summarize(time.Now())
			l.checkRouting(time.Now())
			if err := l.checkGuard(time.Now()); err != nil {
				return err
			}
		case <-done:
			done, stopping = nil, true
			stopReading()
			l.stopCatchUp()
			wait := d.opts.ShutdownTimeout
			if d.opts.StopBy != nil {
				if by := d.opts.StopBy(); !by.IsZero() {
					left := time.Until(by)
					wait = max(min(wait, left-min(time.Second, left/5)), 0)
				}
			}
			hardStop = time.After(wait)
			if l.inflight > 0 {
				d.log.Info("stopping: waiting for in-flight batches", "inflight", l.inflight, "timeout", wait)
			}
		case <-hardStop:
			d.log.Warn("shutdown timeout: cancelling in-flight sends; their records stay in the WAL and are sent again at the next start", "inflight", l.inflight)
			cancelSends()
			l.sendsCanceled = true
			hardStop = nil
			// Deliveries waiting to be recorded on a full disk, now or
			// after a send that ends now: given up, as the sends are
			// (each tried once), rather than holding the stop until the
			// process's own deadline.
			giveUpWaits()
		}
	}
}

func resetTimer(t *time.Timer, d time.Duration) {
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
	t.Reset(max(d, 0))
}

func (l *loop) nextWake(now time.Time, stopping bool) time.Duration {
	wake := time.Hour
	// With every send slot taken (or a paused sink's probe in flight) a
	// due partition waits for a send to end, whose result wakes the loop;
	// while stopping, nothing is sent (the loop waits for what is in
	// flight, whose results wake it).
	if !stopping && len(l.due) > 0 && l.inflight < l.limit && (l.flow.paused == nil || l.inflight == 0) {
		wake = l.due[0].dueAt.Sub(now)
	}
	return max(l.flow.wake(now, wake), time.Millisecond)
}
