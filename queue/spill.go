package queue

import (
	"time"

	"github.com/logfwd/forwarder/sinks"
)

// spill frees memory held by partitions that are waiting out a retry: the
// records they hold are read again from the WAL when they can send. They
// come from the heap of waiting partitions with records queued, the one
// that may send last first (index.go); spilled, a partition leaves it.
// Not one that may send within spillMinWait (a throttle's wait, a short
// retry's): reading it back would read again all the WAL read meanwhile,
// for a moment's memory; the reader waits for it instead.
func (l *loop) spill(now time.Time) {
	if l.paused != nil {
		return
	}
	for l.mem.buffered() >= l.d.opts.MaxBufferedBytes {
		p, _ := l.stuck.top()
		if p == nil || p.dueAt.Sub(now) < l.spillMinWait() {
			return
		}
		l.unjoin(p)
		p.spillFrom, p.reading = p.queue[0].Seq, readSpilled
		l.d.spills.Inc()
		l.flow.spilled = true
		p.batch = detach(p.batch)
		l.dropQueue(p)
	}
}

// spillMinWait is the least wait before its next send for which a
// partition's queue is spilled: a second, or a quarter of RetryMax when
// retries are that short.
func (l *loop) spillMinWait() time.Duration {
	return min(time.Second, l.d.opts.RetryMax/4)
}

// detach gives a batch records and bodies of its own, so that the queue's
// array and the read buffers it shared can go.
func detach(batch []sinks.Record) []sinks.Record {
	size := 0
	for i := range batch {
		size += len(batch[i].Body)
	}
	out := make([]sinks.Record, len(batch))
	buf := make([]byte, 0, size)
	for i, r := range batch {
		start := len(buf)
		buf = append(buf, r.Body...)
		r.Body = buf[start:len(buf):len(buf)]
		out[i] = r
	}
	clear(batch)
	return out
}

// dropQueue lets go of p's queued records (read again from the WAL later).
func (l *loop) dropQueue(p *partition) {
	clear(p.queue)
	p.queue, p.sizes, p.size, p.mem, p.arrivals = nil, nil, 0, 0, nil
	p.qbuf, p.sbuf, p.prev = nil, nil, queueArray{}
	l.touch(p)
}
