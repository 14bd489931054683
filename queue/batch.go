package queue

import (
	"context"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/logfwd/forwarder/sinks"
)

// cutLargest makes the partition holding the most memory due now, when
// much of memory is queued or carried: otherwise reading would wait for
// batches that wait for more records. Until twice as much is carried as
// queued, that is the largest queue: the sink may carry it on, in less
// memory. Then it is the largest carry, whose batch is final.
//
// The largest are on top of the heaps of gathering partitions by their
// queues' and their carries' memory (index.go).
func (l *loop) cutLargest(now time.Time) {
	carries := l.mem.carried > 2*l.mem.queued
	largest, _ := l.largestQueue.top()
	if carries {
		largest, _ = l.largestCarry.top()
	}
	switch {
	case largest == nil:
	case carries && !largest.finalize:
		// Already due or not, its next batch is final.
		largest.finalize = true
		l.schedule(largest, now) // and touched: it is closing
		l.d.earlyCuts.Inc()
	case !carries && largest.dueAt.After(now):
		l.schedule(largest, now)
		l.d.earlyCuts.Inc()
	}
}

// cutOldest makes the open partition whose records waited longest due now,
// with a final batch, while more partitions are open than Limits.MaxOpen
// and than those already closing (a final batch due or being sent). Both
// are kept as partitions change (index.go): loop.closing, and the heap of
// open gathering partitions that are not closing by their oldest record.
func (l *loop) cutOldest(now time.Time) {
	oldest, _ := l.oldest.top()
	if oldest != nil && l.open-l.closing > l.lim.MaxOpen {
		oldest.finalize = true
		l.schedule(oldest, now) // and touched: it is closing
		l.d.earlyCuts.Inc()
	}
}

// cutHolding makes the open partition whose records waited longest due
// now, with a final batch: the WAL is full (max_bytes with when_full:
// block, or its disk) and this sink's cursor is the furthest behind, so
// appends wait for what it delivers. An open object or a batch waiting
// for its age (max_object_age, flush_interval) would hold them until
// then: with a WAL small for the partitions' share of it, for minutes.
// As many partitions close at once as the sink sends at once.
func (l *loop) cutHolding(now time.Time) {
	if l.closing >= max(1, l.lim.Concurrency) {
		return
	}
	if oldest, _ := l.oldest.top(); oldest != nil {
		oldest.finalize = true
		l.schedule(oldest, now) // and touched: it is closing
		l.d.earlyCuts.Inc()
		l.holdingCuts++
		if now.Sub(l.holdingLogged) >= l.d.opts.SummaryInterval {
			l.d.log.Info("the WAL is full and this sink's cursor is the furthest behind: appends wait for what it delivers, so it finishes its oldest batches and objects now rather than at their age (counted in forwarder_sink_early_cuts_total); a larger wal.max_bytes, or room on its disk, lets them fill",
				"cut", l.holdingCuts)
			l.holdingLogged, l.holdingCuts = now, 0
		}
	}
}

// scheduleQueue makes p due when its queue holds a full batch, when the
// oldest record it queues or carries has waited MaxAge, or at once when
// its carry is to be delivered.
func (l *loop) scheduleQueue(p *partition, now time.Time) {
	if len(p.queue) == 0 {
		if p.reading == readSpilled && p.phase == phaseGathering {
			l.join(p)
		}
		if p.carry == nil {
			return
		}
	}
	t := p.objectSince().Add(l.lim.MaxAge)
	if p.finalize || l.draining || len(p.queue) > 0 && l.full(p) {
		t = now
	}
	if p.heapIdx < 0 || t.Before(p.dueAt) {
		l.schedule(p, t)
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
	if len(p.queue) > 0 && l.lim.MaxSpan > 0 {
		p.resetSpan()
	}
	p.size -= size
	mem := 0
	for i := range batch {
		mem += recordMem(&batch[i])
	}
	p.mem -= mem
	p.batchMem = mem // still held, now by the batch
	l.touch(p)
	return batch
}

// dispatch starts sends for due partitions while the sink has room.
func (l *loop) dispatch(now time.Time, ctx context.Context) {
	l.dropForced(now)
	for len(l.due) > 0 && !l.due[0].dueAt.After(now) && l.inflight < l.limit {
		if l.flow.holds(now, l.inflight) {
			return
		}
		p := l.due[0]
		l.due.remove(p)
		if p.phase == phaseGathering {
			if len(p.queue) == 0 && p.carry == nil {
				if p.empty() {
					l.forget(p)
				} else {
					l.scheduleQueue(p, now)
				}
				continue
			}
			aged := !now.Before(p.objectSince().Add(l.lim.MaxAge))
			// While the sink is paused or retrying, a send is a probe of the
			// destination: it must not be one the sink only carries.
			p.final = p.finalize || p.noCarry || aged || l.draining || l.paused != nil || l.retrying()
			p.finalize = false
			if len(p.queue) > 0 {
				p.batch = l.cut(p, p.final)
			}
			// The carry alone (flush): when it is due, or has no room for more.
			p.final = p.final || len(p.batch) == 0
		}
		probe := l.flow.sending(p, now)
		l.startSend(p)
		b := &sinks.Batch{Partition: p.key, Records: p.batch, State: l.d.st, Carry: p.carry, Final: p.final}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			start := time.Now()
			out, err := l.d.send(ctx, b)
			if err != nil || out.Carry == nil {
				// A send to the destination, not a batch only taken into
				// the sink's carry (an S3 member compressed).
				l.d.sendDuration.Observe(time.Since(start).Seconds())
			}
			select {
			case l.results <- sendResult{p: p, out: out, err: err, probe: probe}:
			case <-l.quit:
			}
		}()
	}
}

// send is the sink's Send, with a panic of it (a bug, met by one batch)
// made the batch's failure: the batch stays in the WAL and is sent again
// with backoff, counted as reason "panic", the panic logged with its stack
// (at most once a minute), rather than every input and sink stopping, and
// again at each start while the WAL holds the batch.
func (d *Drainer) send(ctx context.Context, b *sinks.Batch) (out sinks.Outcome, err error) {
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		out, err = sinks.Outcome{}, sinks.NewRetryable("panic", fmt.Errorf("the sink panicked sending a batch of partition %q (a bug): %v", b.Partition, r))
		if now := time.Now().UnixNano(); now >= d.panicLogAt.Load() {
			d.panicLogAt.Store(now + int64(time.Minute))
			d.log.Error("the sink panicked sending a batch (a bug): the batch stays in the WAL and is sent again; the other partitions and sinks go on",
				"partition", b.Partition, "records", len(b.Records), "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
		}
	}()
	return d.sink.Send(ctx, b)
}
