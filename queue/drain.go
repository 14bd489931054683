package queue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// ErrNotDrained is what Drain returns when the sink stopped before its lag
// reached 0: the sink is paused, or its drainer ended.
var ErrNotDrained = errors.New("queue: not drained")

// drainRequest is the Drain request shared by a Drainer and its loop.
type drainRequest struct {
	once     sync.Once
	answered atomic.Bool   // done has its answer (answer)
	start    chan struct{} // closed by Drain: deliver everything, now
	done     chan error    // the answer, once; buffered
	exit     chan struct{} // closed when Run returns
}

// answer gives Drain its answer, the first time only: the start-up's
// recovery, paused, answers before the loop runs, and the loop must not
// then block on a second answer.
func (r *drainRequest) answer(err error) {
	if r.answered.CompareAndSwap(false, true) {
		r.done <- err
	}
}

func newDrainRequest() drainRequest {
	return drainRequest{start: make(chan struct{}), done: make(chan error, 1), exit: make(chan struct{})}
}

// Drain makes the drainer deliver every record the WAL holds now, without
// waiting for the sink's age limits (S3 objects are finished, CloudWatch
// batches go at once), and returns nil once its cursor has passed them
// all. It returns ctx's error when ctx ends first, and an error wrapping
// ErrNotDrained when the sink is paused (a paused sink delivers nothing
// until its operator fixes it) or Run has returned. The drainer goes on
// running afterwards until Run's context ends; the inputs should be
// stopped first, or what they append after the call is not waited for.
func (d *Drainer) Drain(ctx context.Context) error {
	// With wal.sync: interval, the records acknowledged last may still be
	// in the WAL's open transaction, which the drain's target (Stats)
	// does not count: committed first, they are delivered too.
	if err := d.w.Sync(ctx); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("sink %q: the WAL could not commit what it holds (%v): %w", d.name, err, ErrNotDrained)
	}
	d.drain.once.Do(func() { close(d.drain.start) })
	select {
	case err := <-d.drain.done:
		d.drain.done <- err // for a second caller
		return err
	case <-d.drain.exit:
		return fmt.Errorf("sink %q: the drainer stopped: %w", d.name, ErrNotDrained)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// startDrain begins draining up to the WAL's last record: every partition
// holding records or a carry is due now, with a final batch.
func (l *loop) startDrain(now time.Time) {
	l.draining = true
	l.drainTo = l.d.w.Stats().NextSeq - 1
	l.d.log.Info("draining: delivering every record in the WAL before stopping", "records", l.drainTo-min(l.cursor, l.drainTo))
	for _, p := range l.parts {
		if p.phase == phaseGathering && (len(p.queue) > 0 || p.carry != nil) {
			l.schedule(p, now)
		}
	}
}

// checkDrain answers Drain once the cursor is committed past drainTo, or
// the sink is paused.
func (l *loop) checkDrain() {
	if !l.draining || l.drainAnswered {
		return
	}
	switch {
	case l.paused != nil:
		l.answerDrain(fmt.Errorf("sink %q is paused (%s): %w", l.d.name, l.paused.Error(), ErrNotDrained))
	case l.inflight > 0:
	case l.lowWatermark() < l.drainTo:
	case l.cursor < l.drainTo:
		l.advanceIdle() // the last records were not for this sink
	case !l.idlePending:
		l.answerDrain(nil)
	}
}

func (l *loop) answerDrain(err error) {
	l.drainAnswered = true
	l.d.drain.answer(err)
}
