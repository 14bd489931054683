package queue

import (
	"math/rand/v2"
	"sort"
	"time"

	"github.com/logfwd/forwarder/sinks"
)

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
		lift := l.paused != nil && r.probe
		if l.retrying() || lift {
			l.retryNow(now)
		}
		l.endStreak()
		if lift {
			d.log.Info("sink recovered: deliveries resumed", "was", l.paused.Reason)
			l.paused = nil
			d.paused.Set(0)
		}
		l.deliver(p, r.out.Rejected, r.out.DeleteState, "", now)
		return
	}
	e := sinks.Classify(r.err)
	l.lastErr, l.lastErrAt = e.Error(), now
	if e.Class == sinks.RecordPermanent {
		// Not a failed send that is retried: summed up as dead letters.
		l.endStreak() // the destination answered
		if p.carry != nil {
			l.uncarry(p, now)
			return
		}
		l.deliver(p, nil, nil, e.Reason, now) // the whole batch is dead-lettered
		return
	}
	l.failures[e.Class.String()+"/"+e.Reason]++
	l.sendFailed(p)
	l.dropPart(p, l.cursor, now) // what the WAL dropped while it was sent
	switch e.Class {
	case sinks.Throttled:
		d.opts.Metrics.Retries.WithLabelValues(d.name, e.Class.String(), e.Reason).Inc()
		l.throttles++
		wait := max(e.Wait, l.backoff(l.throttles))
		l.throttleUntil = now.Add(wait)
		l.limit = max(1, l.limit/2)
		d.log.Debug("throttled: all partitions wait", "reason", e.Reason, "wait", wait, "concurrency", l.limit)
		l.schedule(p, l.throttleUntil)
	case sinks.SinkPermanent:
		if l.paused == nil {
			d.log.Error("sink paused: the destination refuses every request until this is fixed; records stay in the WAL and nothing is dropped; retrying every "+d.opts.PauseRetry.String(),
				"reason", e.Reason, "error", e.Err)
			d.paused.Set(1)
		}
		l.paused = e
		l.pauseRetryAt = now.Add(d.opts.PauseRetry)
		l.schedule(p, l.pauseRetryAt)
	default:
		d.opts.Metrics.Retries.WithLabelValues(d.name, e.Class.String(), e.Reason).Inc()
		p.attempts++
		wait := l.backoff(p.attempts)
		d.log.Debug("send failed, will retry", "partition_attempt", p.attempts, "reason", e.Reason, "wait", wait, "error", e.Err)
		l.schedule(p, now.Add(wait))
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
