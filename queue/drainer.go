package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// Options configure a Drainer. Zero values take the defaults noted.
type Options struct {
	Match           func(tag string) bool // records whose tag it refuses are not for this sink; nil: all
	ShutdownTimeout time.Duration         // in-flight sends get this long at shutdown; default 30s
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
	// that wrote them: when the fingerprint changes, they are dropped.
	Fingerprint string
	Metrics     *Metrics // nil: unregistered metrics
	Logger      *slog.Logger
}

func (o *Options) setDefaults() {
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
	paused, buffered                     prometheus.Gauge
	sendDuration                         prometheus.Observer

	mu     sync.Mutex
	status Status
}

// Status is a drainer's state for /status and /readyz.
type Status struct {
	Sink         string    `json:"sink"`
	State        string    `json:"state"` // starting, running, throttled, paused, stopped, failed
	Cursor       uint64    `json:"cursor"`
	LagRecords   uint64    `json:"lag_records"`
	LagSeconds   float64   `json:"lag_seconds"`
	InFlight     int       `json:"inflight_partitions"`
	Concurrency  int       `json:"concurrency"`            // partitions allowed in flight now (lowered while throttled)
	Partitions   int       `json:"partitions"`             // partitions with records pending
	CatchingUp   int       `json:"catching_up_partitions"` // spilled partitions being read again from the WAL
	Buffered     int       `json:"buffered_bytes"`
	Delivered    uint64    `json:"delivered_records"`
	DeadLettered uint64    `json:"dead_lettered_records"`
	LastError    string    `json:"last_error,omitempty"`
	LastErrorAt  time.Time `json:"last_error_at,omitzero"`
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
		sendDuration: m.SendDuration.WithLabelValues(name),
		status:       Status{Sink: name, State: "starting"},
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
	cursor, err := d.w.RegisterCursor(ctx, d.name)
	if err != nil {
		return fmt.Errorf("register cursor %q: %w", d.name, err)
	}
	if err := d.checkFingerprint(); err != nil {
		return err
	}
	if r, ok := d.sink.(sinks.Recoverer); ok {
		if err := d.recover(ctx, r, cursor); err != nil {
			return err
		}
		if ctx.Err() != nil {
			d.setState(func(s *Status) { s.State = "stopped" })
			return nil
		}
	}
	l, err := newLoop(d, cursor)
	if err != nil {
		return err
	}
	err = l.run(ctx)
	d.setState(func(s *Status) {
		s.State = "stopped"
		if err != nil {
			s.State = "failed"
			s.LastError, s.LastErrorAt = err.Error(), time.Now()
		}
	})
	return err
}

// recover lets the sink finish what a crash left half done before any
// record is read. Failures are retried like sends: a sink-permanent one
// pauses the sink (one error line, /readyz degraded) and is probed every
// PauseRetry; others back off. An error the sink did not classify (its
// state disagrees with the WAL) stops the drainer.
func (d *Drainer) recover(ctx context.Context, r sinks.Recoverer, cursor uint64) error {
	d.setState(func(s *Status) { s.State, s.Cursor = "recovering", cursor })
	if st := d.w.Stats(); st.NextSeq-1 > cursor {
		d.lagRecords.Set(float64(st.NextSeq - 1 - cursor))
		d.setState(func(s *Status) { s.LagRecords = st.NextSeq - 1 - cursor })
	}
	paused := false
	for attempt := 1; ; attempt++ {
		err := r.Recover(ctx, d.st)
		if err == nil || ctx.Err() != nil {
			if paused {
				d.log.Info("sink recovered: interrupted work finished")
				d.paused.Set(0)
			}
			return nil
		}
		var e *sinks.Error
		if !errors.As(err, &e) {
			return fmt.Errorf("recover sink %q: %w", d.name, err)
		}
		wait := d.opts.RetryMin << min(attempt-1, 20)
		wait = min(wait, d.opts.RetryMax)
		state := "recovering"
		if e.Class == sinks.SinkPermanent {
			wait, state = d.opts.PauseRetry, "paused"
			if !paused {
				d.log.Error("sink paused while finishing interrupted work: the destination refuses every request until this is fixed; records stay in the WAL and nothing is dropped; retrying every "+wait.String(),
					"reason", e.Reason, "error", e.Err)
				d.paused.Set(1)
				paused = true
			}
		} else {
			d.opts.Metrics.Retries.WithLabelValues(d.name, e.Class.String(), e.Reason).Inc()
			d.log.Debug("finishing interrupted work failed, will retry", "reason", e.Reason, "wait", wait, "error", e.Err)
		}
		d.setState(func(s *Status) { s.State, s.LastError, s.LastErrorAt = state, e.Error(), time.Now() })
		select {
		case <-time.After(wait):
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

type sendResult struct {
	p   *partition
	out sinks.Outcome
	err error
}

// loop is the drainer's state, owned by the one goroutine that runs it.
type loop struct {
	d   *Drainer
	lim sinks.Limits

	cursor   uint64 // highest cursor handed to the committer
	readPos  uint64 // sequence number of the next record the reader delivers
	parts    map[string]*partition
	due      dueHeap
	marks    map[string]uint64 // delivered marks committed ahead of the cursor
	route    []routed          // ingest's scratch
	probeRec sinks.Record      // ingest's record for Partition (a local would escape: one allocation per record)
	buffered int               // recordMem of every record held (queued and in batches) and the sink's carries
	batched  int               // the part of buffered in batches
	carried  int               // the part of buffered in carries (sinks.Carry.Mem)
	open     int               // partitions with queued or carried records
	// idlePending: a cursor move of advanceIdle is queued for commit (at
	// most one, so that the commit queue's room for deliveries holds).
	idlePending bool
	inflight    int // partitions sending or committing
	limit       int // partitions allowed in flight: lowered on throttling, raised on success

	throttleUntil time.Time
	// failStreak counts retryable failures since the last success. From
	// failingAfter on, the destination is taken to be down rather than one
	// partition unlucky: the sink waits until retryUntil and sends one
	// batch at a time, instead of every partition building and sending its
	// request on its own schedule.
	failStreak   int
	retryUntil   time.Time
	probe        *partition          // the one batch sent while retrying
	probeFails   int                 // failed probes in a row: the sink-wide backoff's exponent
	failParts    map[*partition]bool // the partitions of the streak
	throttles    int
	paused       *sinks.Error // set while a sink-permanent error pauses the sink
	pauseRetryAt time.Time

	delivered, deadLettered uint64
	failures                map[string]int // failed sends by class/reason since the last summary
	lastSummary             time.Time
	lastErr                 string
	lastErrAt               time.Time

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
}

func newLoop(d *Drainer, cursor uint64) (*loop, error) {
	l := &loop{
		d: d, lim: d.lim, cursor: cursor, readPos: cursor + 1,
		parts: map[string]*partition{}, marks: map[string]uint64{}, limit: d.lim.Concurrency,
		failures: map[string]int{}, lastSummary: time.Now(),
		quit: make(chan struct{}), in: make(chan read), readErr: make(chan error, 1), results: make(chan sendResult),
		// Each busy partition has at most one delivery waiting to commit, at
		// most Concurrency partitions are busy, and advanceIdle queues at most
		// one more: deliver never blocks.
		commits: make(chan *commitReq, d.lim.Concurrency+1), committed: make(chan *commitReq),
		backIn: make(chan read), joined: map[*partition]struct{}{},
	}
	if err := d.w.ScanState(d.name, []byte(prefixMark), func(k, v []byte) error {
		if len(v) == 8 {
			l.marks[string(k[len(prefixMark):])] = be64(v)
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("load delivered marks of %q: %w", d.name, err)
	}

	return l, nil
}

func (l *loop) run(ctx context.Context) error {
	d := l.d
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
	defer l.stopCatchUp()
	l.wg.Add(2)
	go func() { defer l.wg.Done(); l.read(readCtx, l.readPos, l.in, 0) }()
	go func() { defer l.wg.Done(); l.commitLoop(commitCtx) }()

	d.setState(func(s *Status) { s.State = "running"; s.Cursor = l.cursor })
	l.updateStatus() // lag is right from the start, not after the first tick
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	statusTick := time.NewTicker(time.Second)
	defer statusTick.Stop()
	var hardStop <-chan time.Time // cancels in-flight sends after ShutdownTimeout
	done := ctx.Done()
	stopping := false
	for {
		now := time.Now()
		if !stopping {
			l.dispatch(now, sendCtx)
		} else if l.inflight == 0 {
			l.updateStatus()
			return nil
		}
		in := l.in
		if !stopping && l.buffered-l.batched >= d.opts.MaxBufferedBytes/2 {
			// Half the memory is queued or carried: send the largest
			// partition now, so that the next batch can gather while this
			// one is sent.
			l.cutLargest(now)
		}
		if !stopping && l.lim.MaxOpen > 0 && l.open > l.lim.MaxOpen {
			// More objects are open than the sink may have: close the oldest.
			l.cutOldest(now)
		}
		if l.buffered >= d.opts.MaxBufferedBytes {
			// Free what partitions waiting out a retry have queued, so that
			// the others keep being read.
			l.spill(now)
		}
		// Batches waiting for a retry are not counted here: they are bounded
		// by the partitions that fail, and counting them would let a few
		// failing partitions stop every other one from being read.
		if stopping || l.buffered >= d.opts.MaxBufferedBytes && l.buffered-l.waitingBatches() >= d.opts.MaxBufferedBytes {
			in = nil // push back on the reader
		}
		backIn := l.backIn
		if in == nil {
			backIn = nil // and on the catch-up reader
		}
		resetTimer(timer, l.nextWake(now))
		select {
		case rd := <-in:
			l.ingest(rd.recs, now, false) // copies what it keeps
			readBuffers.Put(rd.buf)
		case rd := <-backIn:
			if rd.gen == l.backGen {
				d.reread.Add(float64(len(rd.recs)))
				l.ingest(rd.recs, now, true)
			}
			readBuffers.Put(rd.buf)
		case r := <-l.results:
			l.onResult(r, time.Now())
		case c := <-l.committed:
			if c.err != nil {
				return fmt.Errorf("commit delivery of sink %q: %w", d.name, c.err)
			}
			l.onCommitted(c, time.Now())
		case err := <-l.readErr:
			return fmt.Errorf("read wal for sink %q: %w", d.name, err)
		case <-timer.C:
		case <-statusTick.C:
			l.advanceIdle()
			l.updateStatus()
			l.summarize(time.Now())
		case <-done:
			done, stopping = nil, true
			stopReading()
			l.stopCatchUp()
			hardStop = time.After(d.opts.ShutdownTimeout)
			if l.inflight > 0 {
				d.log.Info("stopping: waiting for in-flight batches", "inflight", l.inflight, "timeout", d.opts.ShutdownTimeout)
			}
		case <-hardStop:
			d.log.Warn("shutdown timeout: cancelling in-flight sends; their records stay in the WAL and are sent again at the next start", "inflight", l.inflight)
			cancelSends()
			hardStop = nil
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

func (l *loop) nextWake(now time.Time) time.Duration {
	wake := time.Hour
	if len(l.due) > 0 {
		wake = l.due[0].dueAt.Sub(now)
	}
	if l.throttleUntil.After(now) {
		wake = max(wake, l.throttleUntil.Sub(now))
	}
	if l.retryUntil.After(now) {
		wake = max(wake, l.retryUntil.Sub(now))
	}
	if l.paused != nil {
		wake = max(wake, l.pauseRetryAt.Sub(now))
	}
	return max(wake, time.Millisecond)
}

// read is records a reader hands the loop, and the buffer holding them.
type read struct {
	recs []wal.Record
	buf  *wal.ReadBuffer
	gen  uint64 // the catch-up reader's generation; 0 for the head reader
}

// readBuffers are buffers ingest is done with, for readers to decode into
// again. A pool: what a burst of reads leaves goes with the next
// collections.
var readBuffers = sync.Pool{New: func() any { return new(wal.ReadBuffer) }}

// read feeds the loop from the WAL from record from on, waiting for
// appends when caught up. It decodes into buffers ingest has given back
// (ingest copies the bodies it keeps), so that reading does not allocate
// the records again and again.
func (l *loop) read(ctx context.Context, from uint64, out chan<- read, gen uint64) {
	rd := l.d.w.NewReader(from)
	for {
		buf := readBuffers.Get().(*wal.ReadBuffer)
		recs, err := rd.NextInto(ctx, l.d.opts.ReadBatch, 4<<20, buf)
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, wal.ErrClosed) {
				select {
				case l.readErr <- err:
				case <-ctx.Done():
				}
			}
			return
		}
		select {
		case out <- read{recs, buf, gen}:
		case <-ctx.Done():
			return
		}
	}
}

// ingest routes records to their partitions: records of the head reader
// to partitions that are not spilled, records of the catch-up reader (back)
// to the partitions it serves, up to where the head reader took over.
func (l *loop) ingest(recs []wal.Record, now time.Time, back bool) {
	d := l.d
	// First route every record, counting the bytes each partition takes
	// from this read; then copy each partition's bodies into one buffer of
	// its own. Bodies leave the decoded entries (a record held for a slow
	// partition must not hold the memory of a whole entry), a partition's
	// records sit next to each other for its sink, and a read costs one
	// allocation per partition, not one per record. A partition's records
	// are delivered in order, so its buffer is not held much past them.
	route := l.route[:0]
	caughtUp := false
	for i := range recs {
		r := &recs[i]
		if back {
			if r.Seq >= l.readPos {
				caughtUp = true
				break
			}
			l.backPos = r.Seq + 1
		} else {
			l.readPos = r.Seq + 1
		}
		if r.Seq <= l.cursor || d.opts.Match != nil && !d.opts.Match(r.Tag) {
			continue
		}
		l.probeRec = sinks.Record{Seq: r.Seq, Time: r.Time, Tag: r.Tag, Body: r.Body}
		key := d.sink.Partition(&l.probeRec)
		if m, ok := l.marks[key]; ok && r.Seq <= m {
			if !back {
				d.skipped.Inc()
			}
			continue
		}
		p := l.parts[key]
		switch {
		case back:
			if p == nil || !p.catchingUp || r.Seq < p.spillFrom {
				continue
			}
			p.spillFrom = r.Seq + 1
		case p == nil:
			p = &partition{key: key, heapIdx: -1}
			l.parts[key] = p
		case p.spillFrom != 0:
			continue // the catch-up reader reads it again
		}
		p.need += len(r.Body)
		route = append(route, routed{p: p, i: i})
	}
	for _, rt := range route {
		r, p := &recs[rt.i], rt.p
		if cap(p.arena)-len(p.arena) < len(r.Body) {
			p.arena = make([]byte, 0, p.need)
		}
		start := len(p.arena)
		p.arena = append(p.arena, r.Body...)
		p.need -= len(r.Body)
		l.enqueue(p, sinks.Record{Seq: r.Seq, Time: r.Time, Tag: r.Tag, Body: p.arena[start:len(p.arena):len(p.arena)]}, now)
	}
	for _, rt := range route {
		rt.p.arena = nil // the next read starts buffers of its own
	}
	l.probeRec = sinks.Record{}
	clear(route)
	l.route = route[:0]
	if back {
		l.caughtUp(caughtUp, now)
	}
}

// routed is a record of the read being ingested and its partition.
type routed struct {
	p *partition
	i int
}

func (l *loop) enqueue(p *partition, rec sinks.Record, now time.Time) {
	if len(p.queue) == 0 {
		p.lo, p.hi = rec.Time, rec.Time
	} else {
		p.lo, p.hi = min(p.lo, rec.Time), max(p.hi, rec.Time)
	}
	p.arrived(now)
	p.queue = append(p.queue, rec)
	size := l.d.sink.Size(&p.queue[len(p.queue)-1]) // rec itself would escape
	p.sizes = append(p.sizes, int32(size))
	p.size += size
	mem := recordMem(&rec)
	p.mem += mem
	l.buffered += mem
	if !p.busy && !p.hasBatch() {
		l.scheduleQueue(p, now)
	}
	if !p.counted {
		l.recount(p)
	}
}

// recount keeps p counted in l.open while it has queued or carried records.
func (l *loop) recount(p *partition) {
	open := len(p.queue) > 0 || p.carry != nil
	switch {
	case open && !p.counted:
		l.open++
	case !open && p.counted:
		l.open--
	}
	p.counted = open
}

// recordMem is what holding r costs: its bytes, its place in a queue and
// in a batch (a sinks.Record is 56 bytes; slices grow ahead), and the
// allocator's rounding.
func recordMem(r *sinks.Record) int {
	return len(r.Body) + len(r.Tag) + 128
}

// cutLargest makes the partition holding the most memory due now, when
// much of memory is queued or carried: otherwise reading would wait for
// batches that wait for more records. Until twice as much is carried as
// queued, that is the largest queue: the sink may carry it on, in less
// memory. Then it is the largest carry, whose batch is final.
func (l *loop) cutLargest(now time.Time) {
	carries := l.carried > 2*(l.buffered-l.batched-l.carried)
	var largest *partition
	size := func(p *partition) int {
		if carries {
			return p.carryMem
		}
		return p.mem
	}
	for _, p := range l.parts {
		if !p.busy && !p.hasBatch() && size(p) > 0 && (largest == nil || size(p) > size(largest)) {
			largest = p
		}
	}
	switch {
	case largest == nil:
	case carries && !largest.finalize:
		// Already due or not, its next batch is final.
		largest.finalize = true
		l.due.schedule(largest, now)
		l.d.earlyCuts.Inc()
	case !carries && largest.dueAt.After(now):
		l.due.schedule(largest, now)
		l.d.earlyCuts.Inc()
	}
}

// cutOldest makes the open partition whose records waited longest due now,
// with a final batch, while more partitions are open than Limits.MaxOpen
// and than those already closing (a final batch due or being sent).
func (l *loop) cutOldest(now time.Time) {
	closing := 0
	var oldest *partition
	for _, p := range l.parts {
		switch {
		case !p.counted:
		case p.finalize || p.busy && p.final:
			closing++
		case !p.busy && !p.hasBatch() && (oldest == nil || p.objectSince().Before(oldest.objectSince())):
			oldest = p
		}
	}
	if oldest != nil && l.open-closing > l.lim.MaxOpen {
		oldest.finalize = true
		l.due.schedule(oldest, now)
		l.d.earlyCuts.Inc()
	}
}

// scheduleQueue makes p due when its queue holds a full batch, when the
// oldest record it queues or carries has waited MaxAge, or at once when
// its carry is to be delivered.
func (l *loop) scheduleQueue(p *partition, now time.Time) {
	if len(p.queue) == 0 {
		if p.spillFrom != 0 && !p.catchingUp && !p.hasBatch() && !p.busy {
			l.join(p)
		}
		if p.carry == nil {
			return
		}
	}
	t := p.objectSince().Add(l.lim.MaxAge)
	if p.finalize || len(p.queue) > 0 && l.full(p) {
		t = now
	}
	if p.heapIdx < 0 || t.Before(p.dueAt) {
		l.due.schedule(p, t)
	}
}

func (l *loop) full(p *partition) bool {
	if len(p.queue) >= l.lim.MaxRecords || p.size >= l.maxBytes(p, false) {
		return true
	}
	return l.lim.MaxSpan > 0 && time.Duration(p.hi-p.lo) > l.lim.MaxSpan
}

// maxBytes is the most a batch of p may hold: Limits.MaxBytes, or less
// when it goes with a carry that has less room. A final batch may hold
// what the carry has room for, or Limits.MaxFinalBytes without one: it
// ends what the sink builds, which may as well be as large as it can.
func (l *loop) maxBytes(p *partition, final bool) int {
	switch {
	case final && p.carry != nil:
		return p.carry.Room()
	case final && l.lim.MaxFinalBytes > 0:
		return l.lim.MaxFinalBytes
	case p.carry != nil:
		return min(l.lim.MaxBytes, p.carry.Room())
	}
	return l.lim.MaxBytes
}

// cut takes the next batch from p's queue within the sink's limits; none
// when p's carry has no room for the first queued record.
func (l *loop) cut(p *partition, final bool) []sinks.Record {
	n, size := 0, 0
	lo, hi := p.queue[0].Time, p.queue[0].Time
	limit := l.maxBytes(p, final)
	for n < len(p.queue) && n < l.lim.MaxRecords {
		r := &p.queue[n]
		s := int(p.sizes[n])
		// A batch holds at least one record, however large, unless it
		// goes with a carry that has no room for it.
		if (n > 0 || p.carry != nil) && size+s > limit {
			break
		}
		if l.lim.MaxSpan > 0 && n > 0 && time.Duration(max(hi, r.Time)-min(lo, r.Time)) > l.lim.MaxSpan {
			break
		}
		lo, hi = min(lo, r.Time), max(hi, r.Time)
		size += s
		n++
	}
	if n == 0 {
		return nil
	}
	// The batch keeps its records where they are: the queue goes on after
	// them in the same array, and deliver clears them, so that the bodies go
	// with the batch.
	batch := p.queue[:n:n]
	p.batchSince = p.since()
	p.queue, p.sizes = p.queue[n:], p.sizes[n:]
	p.taken(n)
	if len(p.queue) == 0 {
		l.recount(p)
	} else if l.lim.MaxSpan > 0 {
		p.resetSpan()
	}
	p.size -= size
	mem := 0
	for i := range batch {
		mem += recordMem(&batch[i])
	}
	p.mem -= mem
	p.batchMem = mem
	l.batched += mem // still held, now by the batch
	return batch
}

// dispatch starts sends for due partitions while the sink has room.
func (l *loop) dispatch(now time.Time, ctx context.Context) {
	l.dropForced(now)
	for len(l.due) > 0 && !l.due[0].dueAt.After(now) && l.inflight < l.limit {
		if now.Before(l.throttleUntil) || now.Before(l.retryUntil) {
			return
		}
		if l.paused != nil && (l.inflight > 0 || now.Before(l.pauseRetryAt)) {
			return // one probe at a time, slowly
		}
		p := l.due[0]
		l.due.remove(p)
		if !p.hasBatch() {
			if len(p.queue) == 0 && p.carry == nil {
				if p.idle() {
					delete(l.parts, p.key)
				} else {
					l.scheduleQueue(p, now)
				}
				continue
			}
			aged := !now.Before(p.objectSince().Add(l.lim.MaxAge))
			// While the sink is paused or retrying, a send is a probe of the
			// destination: it must not be one the sink only carries.
			p.final = p.finalize || p.noCarry || aged || l.paused != nil || l.retrying()
			p.finalize = false
			if len(p.queue) > 0 {
				p.batch = l.cut(p, p.final)
			}
			// The carry alone: when it is due, or has no room for more.
			p.flush = len(p.batch) == 0
			p.final = p.final || p.flush
		}
		if l.paused != nil {
			l.pauseRetryAt = now.Add(l.d.opts.PauseRetry)
		}
		p.busy = true
		l.inflight++
		if l.retrying() {
			l.probe = p
		}
		b := &sinks.Batch{Partition: p.key, Records: p.batch, State: l.d.st, Carry: p.carry, Final: p.final}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			start := time.Now()
			out, err := l.d.sink.Send(ctx, b)
			l.d.sendDuration.Observe(time.Since(start).Seconds())
			select {
			case l.results <- sendResult{p: p, out: out, err: err}:
			case <-l.quit:
			}
		}()
	}
}

// failingAfter is how many retryable failures in a row, with no success
// between them and of at least two partitions, make the sink retry one batch
// at a time. One partition failing alone is its own affair.
const failingAfter = 3

func (l *loop) retrying() bool {
	return l.failStreak >= failingAfter && len(l.failParts) >= 2
}

// endStreak: the destination answered.
func (l *loop) endStreak() {
	l.failStreak, l.retryUntil, l.probe, l.probeFails = 0, time.Time{}, nil, 0
	clear(l.failParts)
}

// retryNow makes every partition that waits to send a batch again due now:
// the destination, down or refusing until now, answered a probe. Their
// waits grew while it was down; waiting them out would leave the sink idle.
// The partitions spilled meanwhile join the catch-up at once, batch or not,
// so that one pass over the WAL brings them all back (see catchup.go).
func (l *loop) retryNow(now time.Time) {
	var spilled []*partition
	for _, p := range l.parts {
		if p.hasBatch() && !p.busy && p.dueAt.After(now) {
			l.due.schedule(p, now)
		}
		if p.spillFrom != 0 && !p.catchingUp {
			spilled = append(spilled, p)
		}
	}
	// Lowest first: the catch-up reader starts once, where the first needs it.
	sort.Slice(spilled, func(i, j int) bool { return spilled[i].spillFrom < spilled[j].spillFrom })
	for _, p := range spilled {
		l.join(p)
	}
}

func (l *loop) backoff(attempts int) time.Duration {
	d := l.d.opts.RetryMin << min(attempts-1, 20)
	d = min(d, l.d.opts.RetryMax)
	return d/2 + rand.N(d/2+1) // jitter: between half and all of it
}

// onResult decides what a finished send means for its partition.
func (l *loop) onResult(r sendResult, now time.Time) {
	d, p := l.d, r.p
	if r.err == nil && r.out.Carry != nil {
		// Taken in, not delivered: the destination was not asked anything.
		l.takeCarry(p, r.out.Carry, now)
		return
	}
	if r.err == nil {
		if l.retrying() || l.paused != nil {
			l.retryNow(now)
		}
		l.endStreak()
		if l.paused != nil {
			d.log.Info("sink recovered: deliveries resumed", "was", l.paused.Reason)
			l.paused = nil
			d.paused.Set(0)
		}
		l.deliver(p, r.out.Rejected, r.out.DeleteState, "", now)
		return
	}
	e := sinks.Classify(r.err)
	l.lastErr, l.lastErrAt = e.Error(), now
	l.failures[e.Class.String()+"/"+e.Reason]++
	if e.Class == sinks.RecordPermanent {
		l.endStreak() // the destination answered
		if p.carry != nil {
			l.uncarry(p, now)
			return
		}
		l.deliver(p, nil, nil, e.Reason, now) // the whole batch is dead-lettered
		return
	}
	p.busy = false
	l.inflight--
	l.dropPart(p, l.cursor, now) // what the WAL dropped while it was sent
	switch e.Class {
	case sinks.Throttled:
		d.opts.Metrics.Retries.WithLabelValues(d.name, e.Class.String(), e.Reason).Inc()
		l.throttles++
		wait := max(e.Wait, l.backoff(l.throttles))
		l.throttleUntil = now.Add(wait)
		l.limit = max(1, l.limit/2)
		d.log.Debug("throttled: all partitions wait", "reason", e.Reason, "wait", wait, "concurrency", l.limit)
		l.due.schedule(p, l.throttleUntil)
	case sinks.SinkPermanent:
		if l.paused == nil {
			d.log.Error("sink paused: the destination refuses every request until this is fixed; records stay in the WAL and nothing is dropped; retrying every "+d.opts.PauseRetry.String(),
				"reason", e.Reason, "error", e.Err)
			d.paused.Set(1)
		}
		l.paused = e
		l.pauseRetryAt = now.Add(d.opts.PauseRetry)
		l.due.schedule(p, l.pauseRetryAt)
	default:
		d.opts.Metrics.Retries.WithLabelValues(d.name, e.Class.String(), e.Reason).Inc()
		p.attempts++
		wait := l.backoff(p.attempts)
		d.log.Debug("send failed, will retry", "partition_attempt", p.attempts, "reason", e.Reason, "wait", wait, "error", e.Err)
		l.due.schedule(p, now.Add(wait))
		l.failStreak++
		if l.failParts == nil {
			l.failParts = map[*partition]bool{}
		}
		l.failParts[p] = true
		if l.retrying() {
			// Sends that were in flight together fail together: only a
			// failed probe makes the sink-wide wait longer.
			if p == l.probe {
				l.probe = nil
				l.probeFails++
			}
			l.retryUntil = now.Add(l.backoff(l.probeFails + 1))
			l.limit = 1 // raised again one by one as deliveries succeed
		}
	}
}

// deliver records p's batch as delivered: rejected records (or, with
// deadReason, all of them) become dead letters; the delivered mark, the
// cursor and the sink's state changes are committed together. The
// partition sends again only once that commit is durable.
func (l *loop) deliver(p *partition, rejected []sinks.Rejection, deleteState [][]byte, deadReason string, now time.Time) {
	d := l.d
	batch := p.batch
	carryFirst, last := p.carryFirst, p.carryLast // 0, 0 without a carry
	if len(batch) > 0 {
		last = batch[len(batch)-1].Seq
	}
	req := &commitReq{p: p, records: len(batch) + p.carryRecs}
	l.unhold(p)
	l.throttles = 0
	at := time.Now()
	dead := func(r *sinks.Record, reason string) {
		req.ops.Put(d.name, deadKey(r.Seq), encodeDeadLetter(r, reason, at))
		d.opts.Metrics.DeadLetters.WithLabelValues(d.name, reason).Inc()
		req.dead++
	}
	if deadReason != "" {
		for i := range batch {
			dead(&batch[i], deadReason)
		}
	} else if len(rejected) > 0 {
		bySeq := make(map[uint64]*sinks.Record, len(batch))
		for i := range batch {
			bySeq[batch[i].Seq] = &batch[i]
		}
		for _, rj := range rejected {
			if r, ok := bySeq[rj.Seq]; ok {
				dead(r, rj.Reason)
			} else if r, ok := l.carriedRecord(p, rj.Seq, carryFirst, last); ok {
				dead(&r, rj.Reason)
			}
		}
	}
	for _, k := range deleteState {
		req.ops.Delete(d.name, stateKey(k))
	}
	low := l.lowWatermark()
	if last > low {
		req.ops.Put(d.name, markKey(p.key), u64(last))
		l.marks[p.key] = last
	} else if _, ok := l.marks[p.key]; ok {
		req.ops.Delete(d.name, markKey(p.key))
		delete(l.marks, p.key)
	}
	if low > l.cursor {
		req.ops.SetCursor(d.name, low)
		l.cursor = low
		for k, m := range l.marks {
			if m <= low {
				req.ops.Delete(d.name, markKey(k))
				delete(l.marks, k)
			}
		}
	}
	clear(batch) // its array may hold the partition's queue too: let these bodies go
	l.commits <- req
}

// carriedRecord reads back a record of p's carry, which held the records
// from first (0: no carry) up to the batch, that the sink rejected, to
// dead-letter it: the drainer does not hold carried records. A record the
// WAL no longer has was dropped and counted already.
func (l *loop) carriedRecord(p *partition, seq, first, last uint64) (sinks.Record, bool) {
	if first == 0 || seq < first || seq > last {
		l.d.log.Error("the sink rejected a record that was not in the batch", "seq", seq)
		return sinks.Record{}, false
	}
	recs, err := l.d.w.Read(seq, 1, 0)
	if err != nil || len(recs) == 0 || recs[0].Seq != seq {
		l.d.log.Warn("a rejected record is no longer in the WAL to be dead-lettered", "seq", seq, "error", err)
		return sinks.Record{}, false
	}
	r := recs[0]
	rec := sinks.Record{Seq: r.Seq, Time: r.Time, Tag: r.Tag, Body: r.Body}
	if l.d.sink.Partition(&rec) != p.key {
		l.d.log.Error("the sink rejected a record of another partition", "seq", seq)
		return sinks.Record{}, false
	}
	return rec, true
}

// takeCarry records that the sink took p's batch in without delivering it
// (sinks.Outcome.Carry): the batch's memory goes, the carry's comes, and
// the cursor stays before the carried records until a later batch
// delivers them.
func (l *loop) takeCarry(p *partition, c sinks.Carry, now time.Time) {
	p.busy = false
	l.inflight--
	if p.carry == nil {
		p.carryFirst, p.carrySince = p.batch[0].Seq, p.batchSince
	}
	if n := len(p.batch); n > 0 {
		p.carryLast = p.batch[n-1].Seq
		p.carryRecs += n
	}
	mem := c.Mem()
	l.buffered += mem - p.carryMem - p.batchMem
	l.carried += mem - p.carryMem
	l.batched -= p.batchMem
	clear(p.batch) // its array may hold the partition's queue too: let these bodies go
	p.batch, p.batchMem, p.flush, p.attempts = nil, 0, false, 0
	p.carry, p.carryMem = c, mem
	l.recount(p)
	if p.carryFirst <= l.cursor {
		l.dropPart(p, l.cursor, now) // the WAL dropped some while it was sent
		return
	}
	l.scheduleQueue(p, now)
}

// uncarry gives up what the sink carries for p, with p's batch and queue,
// when the sink refused to deliver them for their content: they are read
// again from the WAL and sent in final batches, never carried, so that the
// refusal dead-letters the records of one batch, which the drainer holds.
func (l *loop) uncarry(p *partition, now time.Time) {
	l.d.log.Warn("the sink refused a batch with records it had carried; reading them again to send them in batches of their own",
		"partition_records", p.carryRecs+len(p.batch)+len(p.queue))
	p.busy = false
	l.inflight--
	p.noCarry = true
	l.release(p, p.carryFirst, now)
}

// release forgets what p carries, its batch and its queue, and reads its
// records from `from` on again from the WAL. p is not busy.
func (l *loop) release(p *partition, from uint64, now time.Time) {
	clear(p.batch)
	l.unhold(p)
	l.dropQueue(p)
	l.unjoin(p)
	p.spillFrom = from
	l.scheduleQueue(p, now)
}

// unhold stops holding p's batch and carry: their memory leaves the loop's
// counts. The caller clears the batch's records when it is done with them.
func (l *loop) unhold(p *partition) {
	l.buffered -= p.batchMem + p.carryMem
	l.batched -= p.batchMem
	l.carried -= p.carryMem
	p.batch, p.batchMem, p.flush, p.attempts = nil, 0, false, 0
	p.carry, p.carryMem, p.carryRecs, p.carryFirst, p.carryLast = nil, 0, 0, 0, 0
	l.recount(p)
}

// dropQueue lets go of p's queued records (read again from the WAL later).
func (l *loop) dropQueue(p *partition) {
	l.buffered -= p.mem
	clear(p.queue)
	p.queue, p.sizes, p.size, p.mem, p.arrivals = nil, nil, 0, 0, nil
	l.recount(p)
}

// dropForced forgets records that the WAL dropped for this sink
// (wal.when_full: drop_oldest moves a lagging cursor past them and counts
// them), so that what is counted as dropped is not delivered after all.
func (l *loop) dropForced(now time.Time) {
	pos, ok := l.d.w.Cursor(l.d.name)
	if !ok || pos <= l.cursor {
		return
	}
	l.cursor = pos
	l.readPos = max(l.readPos, pos+1)
	for _, p := range l.parts {
		l.dropPart(p, pos, now)
	}
}

// dropPart forgets p's records up to pos, which the WAL dropped. A batch
// or carry in flight is the exception: it finishes, and what it leaves is
// looked at again when it fails or is carried. A carry that holds dropped
// records is given up, and the partition's records after them are read
// again.
func (l *loop) dropPart(p *partition, pos uint64, now time.Time) {
	if p.carry != nil && p.carryFirst <= pos && !p.busy {
		l.release(p, pos+1, now)
		return
	}
	if n := len(p.batch); n > 0 && !p.busy && p.batch[0].Seq <= pos {
		p.batch = dropUpTo(p.batch, pos)
		mem := 0
		for i := range p.batch {
			mem += recordMem(&p.batch[i])
		}
		l.buffered += mem - p.batchMem
		l.batched += mem - p.batchMem
		p.batchMem = mem
	}
	if n := len(p.queue); n > 0 && p.queue[0].Seq <= pos {
		p.queue = dropUpTo(p.queue, pos)
		p.sizes = p.sizes[n-len(p.queue):]
		p.taken(n - len(p.queue))
		size, mem := 0, 0
		for i := range p.queue {
			size += int(p.sizes[i])
			mem += recordMem(&p.queue[i])
		}
		l.buffered += mem - p.mem
		p.size, p.mem = size, mem
		if len(p.queue) > 0 {
			p.resetSpan()
		}
		l.recount(p)
	}
	if p.spillFrom != 0 && p.spillFrom <= pos {
		p.spillFrom = pos + 1
	}
}

func dropUpTo(recs []sinks.Record, pos uint64) []sinks.Record {
	i := 0
	for i < len(recs) && recs[i].Seq <= pos {
		i++
	}
	clear(recs[:i]) // the array may live on with the rest: let these bodies go
	return recs[i:]
}

// lowWatermark is the highest sequence number such that every record up
// to it is delivered, dead-lettered, or not for this sink.
func (l *loop) lowWatermark() uint64 {
	low := l.readPos
	for _, p := range l.parts {
		if s := p.firstPending(); s != 0 && s < low {
			low = s
		}
	}
	return low - 1
}

// advanceIdle moves the cursor past records that needed no delivery (not
// for this sink, or delivered before a restart) when no delivery will carry
// it along: a sink that matches nothing must not pin the WAL.
func (l *loop) advanceIdle() {
	low := l.lowWatermark()
	if low <= l.cursor || l.idlePending {
		return
	}
	req := &commitReq{}
	req.ops.SetCursor(l.d.name, low)
	for k, m := range l.marks {
		if m <= low {
			req.ops.Delete(l.d.name, markKey(k))
		}
	}
	select {
	case l.commits <- req:
		l.idlePending = true
		l.cursor = low
		for k, m := range l.marks {
			if m <= low {
				delete(l.marks, k)
			}
		}
	default: // deliveries are queued for commit: they carry the cursor
	}
}

func (l *loop) onCommitted(c *commitReq, now time.Time) {
	d, p := l.d, c.p
	if p == nil {
		l.idlePending = false // a cursor move of advanceIdle
		return
	}
	p.busy = false
	l.inflight--
	if l.limit < l.lim.Concurrency {
		l.limit++ // additive increase after a throttle's decrease
	}
	delivered := c.records - c.dead
	l.delivered += uint64(delivered)
	l.deadLettered += uint64(c.dead)
	d.delivered.Add(float64(delivered))
	d.batches.Inc()
	if p.idle() {
		l.due.remove(p)
		delete(l.parts, p.key)
		return
	}
	l.scheduleQueue(p, now)
}

// waitingBatches is the memory of batches waiting for a retry (not in
// flight), with the carries they are to deliver.
func (l *loop) waitingBatches() int {
	n := 0
	for _, p := range l.parts {
		if !p.busy && p.hasBatch() {
			n += p.batchMem + p.carryMem
		}
	}
	return n
}

// checkFingerprint drops the delivered marks when the sink now partitions
// records differently: a mark says "this partition delivered up to here",
// which means nothing for a partition that now holds other records. It
// runs before Recover, so that marks Recover writes are kept.
func (d *Drainer) checkFingerprint() error {
	if d.opts.Fingerprint == "" {
		return nil
	}
	old, err := d.w.State(d.name, []byte(keyFingerprint))
	if err != nil {
		return fmt.Errorf("read partitioning fingerprint of %q: %w", d.name, err)
	}
	if string(old) == d.opts.Fingerprint {
		return nil
	}
	var b wal.Batch
	if old != nil {
		n := 0
		if err := d.w.ScanState(d.name, []byte(prefixMark), func(k, _ []byte) error {
			b.Delete(d.name, append([]byte(nil), k...))
			n++
			return nil
		}); err != nil {
			return fmt.Errorf("read delivered marks of %q: %w", d.name, err)
		}
		if n > 0 {
			d.log.Info("the sink's partitioning changed: forgetting what partitions delivered ahead of the cursor; those records may be sent again", "marks", n)
		}
	}
	b.Put(d.name, []byte(keyFingerprint), []byte(d.opts.Fingerprint))
	if err := d.w.Commit(context.Background(), &b); err != nil {
		return fmt.Errorf("store partitioning fingerprint of %q: %w", d.name, err)
	}
	return nil
}

// summarize logs, once per SummaryInterval, how many sends failed and
// why. Failed sends are retried and lose nothing: the line is at info
// level when every partition has since delivered, at warning level while
// some are still failing.
func (l *loop) summarize(now time.Time) {
	if len(l.failures) == 0 || now.Sub(l.lastSummary) < l.d.opts.SummaryInterval {
		return
	}
	failing := 0
	for _, p := range l.parts {
		if p.attempts > 0 {
			failing++
		}
	}
	args := []any{"interval", l.d.opts.SummaryInterval, "partitions_still_failing", failing}
	keys := make([]string, 0, len(l.failures))
	for k := range l.failures {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, k, l.failures[k])
	}
	level := slog.LevelInfo
	if failing > 0 || l.paused != nil || now.Before(l.throttleUntil) {
		level = slog.LevelWarn
	}
	l.d.log.Log(context.Background(), level, "sends failed and are retried; nothing is dropped for them (counts by class/reason)", args...)
	l.failures = map[string]int{}
	l.lastSummary = now
}

func (l *loop) updateStatus() {
	d := l.d
	st := d.w.Stats()
	lag := uint64(0)
	if st.NextSeq-1 > l.cursor {
		lag = st.NextSeq - 1 - l.cursor
	}
	lagSec := 0.0
	if lag > 0 {
		if recs, err := d.w.Read(l.cursor+1, 1, 0); err == nil && len(recs) > 0 {
			lagSec = max(0, time.Since(time.Unix(0, recs[0].Time)).Seconds())
		}
	}
	state := "running"
	switch {
	case l.paused != nil:
		state = "paused"
	case time.Now().Before(l.throttleUntil):
		state = "throttled"
	case l.retrying():
		state = "retrying"
	}
	d.lagRecords.Set(float64(lag))
	d.lagSeconds.Set(lagSec)
	d.inflight.Set(float64(l.inflight))
	d.buffered.Set(float64(l.buffered))
	d.setState(func(s *Status) {
		s.State, s.Cursor, s.LagRecords, s.LagSeconds = state, l.cursor, lag, lagSec
		s.InFlight, s.Concurrency, s.Partitions, s.Buffered = l.inflight, l.limit, len(l.parts), l.buffered
		s.CatchingUp = len(l.joined)
		s.Delivered, s.DeadLettered = l.delivered, l.deadLettered
		if l.lastErr != "" {
			s.LastError, s.LastErrorAt = l.lastErr, l.lastErrAt
		}
	})
}
