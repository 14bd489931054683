package queue

import (
	"context"
	"errors"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/logfwd/forwarder/sinks"
)

// failingAfter is how many retryable failures in a row, with no success
// between them and of at least two partitions, make the sink retry one batch
// at a time. One partition failing alone is its own affair.
const failingAfter = 3

// flow is how much the loop may send, and when: the backoff of failed
// sends, throttling and the concurrency limit it lowers (additive increase,
// multiplicative decrease), the sink-wide retry while the destination
// seems down, and the pause of a sink-permanent error. It decides; the
// loop schedules partitions by what it says. Its time is the caller's now.
type flow struct {
	retryMin, retryMax time.Duration // Options.RetryMin, RetryMax
	pauseRetry         time.Duration // Options.PauseRetry
	concurrency        int           // Limits.Concurrency: the most in flight

	limit int // partitions allowed in flight: halved on throttling, raised by one per delivery

	throttleUntil time.Time
	throttles     int // throttled sends since the last delivery: the throttle backoff's exponent
	// failStreak counts retryable failures since the last success. From
	// failingAfter on, the destination is taken to be down rather than one
	// partition unlucky: the sink waits until retryUntil and sends one
	// batch at a time, instead of every partition building and sending its
	// request on its own schedule.
	failStreak    int
	retryUntil    time.Time
	probe         *partition          // the one batch sent while retrying
	probeFails    int                 // failed probes in a row: the sink-wide backoff's exponent
	failParts     map[*partition]bool // partitions of the streak, two at most
	paused        *sinks.Error        // set while a sink-permanent error pauses the sink
	pauseRetryAt  time.Time
	pauseProbes   int             // pauseWait's exponent: probes refused since the pause began, and re-pauses before it
	liftedAt      time.Time       // when a probe's success last lifted a pause
	liftedReasons map[string]bool // the reasons of the pause it lifted
	pauseReasons  map[string]bool // the reasons of the refusals of this pause
	repauses      int             // pauses in a row that began soon after a lift, for one of its reasons

	// unreached counts the failed sends in a row that could not connect to
	// the destination (sinks.Error.Unreachable); spilled: partitions were
	// spilled since the destination last answered. Together they hold the
	// head reader (unreachable).
	unreached int
	spilled   bool
}

func newFlow(concurrency int, retryMin, retryMax, pauseRetry time.Duration) flow {
	return flow{retryMin: retryMin, retryMax: retryMax, pauseRetry: pauseRetry, concurrency: concurrency, limit: concurrency}
}

func (f *flow) retrying() bool {
	return f.failStreak >= failingAfter && len(f.failParts) >= 2
}

// endStreak: the destination answered.
func (f *flow) endStreak() {
	f.failStreak, f.retryUntil, f.probe, f.probeFails = 0, time.Time{}, nil, 0
	f.unreached, f.spilled = 0, false
	clear(f.failParts)
}

// unreachable: failingAfter sends in a row could not connect to the
// destination, and memory ran short since it last answered. No partition
// can deliver then, and what the head reader would read is mostly records
// of spilled partitions, read only to be passed by: it waits until a send
// ends otherwise (see catchup.go).
func (f *flow) unreachable() bool {
	return f.unreached >= failingAfter && f.spilled
}

// backoff is the wait after the attempts-th failure in a row: RetryMin
// doubled for each failure before it, at most RetryMax, and of that between
// half and all (jitter).
func (f *flow) backoff(attempts int) time.Duration {
	d := f.retryMin << min(attempts-1, 20)
	d = min(d, f.retryMax)
	return d/2 + rand.N(d/2+1)
}

// holds: nothing may be sent now, with inflight sends in flight: the sink
// is throttled or retrying, or paused with a probe in flight or not yet
// due (one probe at a time, slowly).
func (f *flow) holds(now time.Time, inflight int) bool {
	if now.Before(f.throttleUntil) || now.Before(f.retryUntil) {
		return true
	}
	return f.paused != nil && (inflight > 0 || now.Before(f.pauseRetryAt))
}

// sending notes that p's batch is sent now. While the sink is paused it
// is a probe (the result says so), and no other goes while it is out; while
// it retries, it is the one batch whose failure lengthens the wait.
func (f *flow) sending(p *partition, now time.Time) (probe bool) {
	if f.paused != nil {
		f.pauseRetryAt = now.Add(pauseWait(f.pauseRetry, f.pauseProbes))
	}
	if f.retrying() {
		f.probe = p
	}
	return f.paused != nil
}

// delivered: a send was answered with a delivery; throttling starts over.
func (f *flow) delivered() { f.throttles = 0 }

// committed: a delivery is durable; one more partition may be in flight,
// up to Limits.Concurrency (the additive increase after a throttle's
// decrease).
func (f *flow) committed() {
	if f.limit < f.concurrency {
		f.limit++
	}
}

// throttled: the destination asked to slow down, for at least wait.
// Every partition waits until the time returned; the limit halves.
func (f *flow) throttled(wait time.Duration, now time.Time) time.Time {
	f.throttles++
	f.throttleUntil = now.Add(max(wait, f.backoff(f.throttles)))
	f.limit = max(1, f.limit/2)
	return f.throttleUntil
}

// failed: p's send failed and is retried after its own backoff, for the
// attempts-th time in a row; the time returned is when. Failures of
// several partitions in a row make the sink retry one batch at a time
// (retrying): only the failure of that batch, the probe, makes the
// sink-wide wait longer.
func (f *flow) failed(p *partition, attempts int, now time.Time) time.Time {
	at := now.Add(f.backoff(attempts))
	f.failStreak++
	if f.failParts == nil {
		f.failParts = map[*partition]bool{}
	}
	if len(f.failParts) < 2 { // all retrying asks: a streak of partitions is not held past its end
		f.failParts[p] = true
	}
	if f.retrying() {
		// Sends that were in flight together fail together: only a
		// failed probe makes the sink-wide wait longer.
		if p == f.probe {
			f.probe = nil
			f.probeFails++
		}
		f.retryUntil = now.Add(f.backoff(f.probeFails + 1))
		f.limit = 1 // raised again one by one as deliveries succeed
	}
	return at
}

// pause: the destination refuses every request (a sink-permanent error),
// answering a probe when probe is true. It says whether the sink was not
// paused before, and returns when the next probe may go: pauseWait after
// the refusals so far.
func (f *flow) pause(e *sinks.Error, probe bool, now time.Time) (first bool, probeAt time.Time) {
	first = f.paused == nil
	switch {
	case first && !f.liftedAt.IsZero() && now.Sub(f.liftedAt) < f.pauseRetry && f.liftedReasons[e.Reason]:
		// Paused again soon after a lift, for a reason of the pause
		// before: a refusal of some partitions only (a key another writer
		// holds, a log group the role may not write), lifted by the
		// others' probes. The first wait grows with each such pause, or
		// each lift and pause would cost a request a second; not from the
		// waits the pause before reached (a policy that takes a moment to
		// apply everywhere after a long outage is tried again within
		// seconds).
		f.repauses++
		f.pauseProbes = f.repauses
	case first:
		f.repauses, f.pauseProbes = 0, 0
	case probe:
		f.pauseProbes++
	}
	if first {
		f.pauseReasons = map[string]bool{}
	}
	f.pauseReasons[e.Reason] = true
	f.paused = e
	f.pauseRetryAt = now.Add(pauseWait(f.pauseRetry, f.pauseProbes))
	return first, f.pauseRetryAt
}

// pauseFirst is the wait before a paused sink's first probe. A refusal
// often ends within seconds (a role's policy attached a moment after the
// pod started, a bucket created by the same rollout): the probes start
// soon and slow down, each wait twice the one before, to the pause's
// interval (Options.PauseRetry).
const pauseFirst = time.Second

// pauseWait is the wait before a paused sink's next probe after n
// refusals: pauseFirst doubled n times, at most retry.
func pauseWait(retry time.Duration, n int) time.Duration {
	return min(retry, pauseFirst<<min(n, 20))
}

// pauseSays describes a paused sink's probes, for its log lines.
func pauseSays(retry time.Duration) string {
	if retry <= pauseFirst {
		return "retrying every " + retry.String()
	}
	return "retrying after " + pauseFirst.String() + ", then twice as long after each refusal up to every " + retry.String()
}

// succeeded: a send was delivered (or its records refused for their
// content: the destination answered). It says whether that ends a pause
// (only a probe's success does: a send begun before the pause says nothing
// of what paused the sink) and whether the partitions waiting out the
// outage should be retried now. The streak of failures ends.
func (f *flow) succeeded(probe bool, now time.Time) (lifted *sinks.Error, retryNow bool) {
	if f.paused != nil && probe {
		lifted = f.paused
		f.liftedAt, f.liftedReasons = now, f.pauseReasons
	}
	retryNow = f.retrying() || lifted != nil
	f.endStreak()
	if lifted != nil {
		f.paused = nil
	}
	return lifted, retryNow
}

// wake is when the loop should look again, given that the next partition
// is due in due: not before the sink may send.
func (f *flow) wake(now time.Time, due time.Duration) time.Duration {
	if f.throttleUntil.After(now) {
		due = max(due, f.throttleUntil.Sub(now))
	}
	if f.retryUntil.After(now) {
		due = max(due, f.retryUntil.Sub(now))
	}
	if f.paused != nil {
		due = max(due, f.pauseRetryAt.Sub(now))
	}
	return due
}

// retryNow makes every partition that waits to send a batch again due now:
// the destination, down or refusing until now, answered a probe. Their
// waits grew while it was down; waiting them out would leave the sink idle.
// The partitions spilled meanwhile join the catch-up at once, batch or not,
// so that one pass over the WAL brings them all back (see catchup.go).
func (l *loop) retryNow(now time.Time) {
	var spilled []*partition
	for _, p := range l.parts {
		if p.phase == phaseWaiting && p.dueAt.After(now) {
			l.schedule(p, now)
		}
		if p.reading == readSpilled {
			spilled = append(spilled, p)
		}
	}
	// Lowest first: the catch-up reader starts once, where the first needs it.
	sort.Slice(spilled, func(i, j int) bool { return spilled[i].spillFrom < spilled[j].spillFrom })
	for _, p := range spilled {
		l.join(p)
	}
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
		lifted, retry := l.flow.succeeded(r.probe, now)
		if retry {
			l.retryNow(now)
		}
		if lifted != nil {
			d.log.Info("sink recovered: deliveries resumed", "was", lifted.Reason)
			d.setPaused(false)
		}
		l.deliver(p, r.out.Rejected, r.out.DeleteState, "", now)
		return
	}
	e := sinks.Classify(r.err)
	if !l.sendsCanceled || !errors.Is(r.err, context.Canceled) {
		// (A send the stop canceled says nothing of the destination: the
		// status keeps the last error it did say.)
		l.lastErr, l.lastErrAt = e.Error(), now
	}
	if p.carry != nil && e.Class == sinks.Retryable && errors.Is(r.err, sinks.ErrCarryLost) {
		d.log.Warn("the sink gave up what it carried for a partition; reading the records the WAL still holds again",
			"partition_records", p.carryRecs+len(p.batch)+len(p.queue), "first_seq", p.carryFirst, "error", e.Err)
		l.sendCarried(p)
		l.release(p, p.carryFirst, now)
		return
	}
	if e.Class != sinks.RecordPermanent {
		l.lastRetried = e.Error() // what the retry summary quotes
	}
	if e.Class == sinks.RecordPermanent {
		// Not a failed send that is retried: summed up as dead letters.
		l.flow.endStreak() // the destination answered
		if p.carry != nil {
			l.uncarry(p, now)
			return
		}
		l.deliver(p, nil, nil, e.Reason, now) // the whole batch is dead-lettered
		return
	}
	if l.sendsCanceled && errors.Is(r.err, context.Canceled) {
		// The stop canceled it: no failure of the destination's, neither
		// counted nor summed up as one; its records stay in the WAL.
		l.sendFailed(p)
		l.dropPart(p, l.cursor, now) // what the WAL dropped while it was sent
		return
	}
	l.failures[e.Class.String()+"/"+e.Reason]++
	if e.Unreachable() {
		l.flow.unreached++
	} else {
		l.flow.unreached = 0 // an answer, or a failure that may be this request's own
	}
	l.sendFailed(p)
	l.dropPart(p, l.cursor, now) // what the WAL dropped while it was sent
	// Every failure counted here is sent again: a paused sink's at its
	// next probe.
	d.opts.Metrics.Retries.WithLabelValues(d.name, e.Class.String(), e.Reason).Inc()
	switch e.Class {
	case sinks.Throttled:
		until := l.flow.throttled(e.Wait, now)
		d.log.Debug("throttled: all partitions wait", "reason", e.Reason, "wait", until.Sub(now), "concurrency", l.limit)
		l.schedule(p, until)
	case sinks.SinkPermanent:
		first, probeAt := l.flow.pause(e, r.probe, now)
		if first {
			d.log.Error("sink paused: the destination refuses every request until this is fixed; "+d.keptSays()+"; "+pauseSays(d.opts.PauseRetry),
				"reason", e.Reason, "error", e.Err)
			d.setPaused(true)
		}
		l.schedule(p, probeAt)
	default:
		p.attempts++
		at := l.flow.failed(p, p.attempts, now)
		d.log.Debug("send failed, will retry", "partition_attempt", p.attempts, "reason", e.Reason, "wait", at.Sub(now), "error", e.Err)
		l.schedule(p, at)
	}
}
