package queue

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/logfwd/forwarder/wal"
)

// commitReq is one delivery to record in the WAL.
type commitReq struct {
	p       *partition
	records int // records in the batch
	dead    int // of which dead-lettered
	// deadSeqs are the dead letters' records, for the bound
	// (evictNewDeadLetters).
	deadSeqs []uint64
	ops      wal.Batch
	err      error
}

// commitLoop commits deliveries in the order the loop made them (a later
// one may delete a mark an earlier one wrote), gathering whatever is
// waiting into one WAL commit. It also keeps the dead letters within their
// bound, removing the oldest.
func (l *loop) commitLoop(ctx, waitCtx context.Context) {
	d := l.d
	dead := d.countDeadLetters()
	stored := d.opts.Metrics.DeadStored.WithLabelValues(d.name)
	stored.Set(float64(dead))
	for {
		var reqs []*commitReq
		select {
		case r := <-l.commits:
			reqs = append(reqs, r)
		case <-ctx.Done():
			return
		}
	gather:
		for {
			select {
			case r := <-l.commits:
				reqs = append(reqs, r)
			default:
				break gather
			}
		}
		var b wal.Batch
		added := 0
		for _, r := range reqs {
			b.Append(&r.ops)
			added += r.dead
		}
		dead += added
		evicted := 0
		if over := dead - d.opts.MaxDeadLetters; over > 0 {
			evicted = l.evictDeadLetters(&b, over)
			if evicted < over { // more new ones than the bound: the oldest of them go too
				evicted += l.evictNewDeadLetters(&b, reqs, over-evicted)
			}
			dead -= evicted
		}
		// A full disk is waited out: these deliveries happened and must be
		// recorded; their partitions stay busy until they are.
		err := d.commitWaiting(waitCtx, &b, "cannot record deliveries")
		if err != nil && ctx.Err() != nil {
			return
		}
		if err != nil && waitCtx.Err() != nil && errors.Is(err, context.Canceled) {
			err = errCommitGivenUp
		}
		if err == nil {
			stored.Set(float64(dead))
			d.evicted.Add(float64(evicted))
			l.evictedUnlogged.Add(int64(evicted)) // logged by the summary
		}
		for _, r := range reqs {
			r.err = err
			select {
			case l.committed <- r:
			case <-ctx.Done():
				return
			}
		}
	}
}

// evictDeadLetters adds to b the deletion of up to n of the oldest stored
// dead letters and returns how many.
func (l *loop) evictDeadLetters(b *wal.Batch, n int) int {
	d := l.d
	stop := errors.New("enough")
	found := 0
	_ = d.w.ScanState(d.name, []byte(prefixDead), func(k, _ []byte) error {
		b.Delete(d.name, k)
		if found++; found == n {
			return stop
		}
		return nil
	})
	return found
}

// evictNewDeadLetters adds to b the deletion of the n oldest dead letters
// reqs put (after their puts: none of them is stored) and returns how
// many.
func (l *loop) evictNewDeadLetters(b *wal.Batch, reqs []*commitReq, n int) int {
	var seqs []uint64
	for _, r := range reqs {
		seqs = append(seqs, r.deadSeqs...)
	}
	slices.Sort(seqs)
	n = min(n, len(seqs))
	for _, seq := range seqs[:n] {
		b.Delete(l.d.name, deadKey(seq))
	}
	return n
}

// countDeadLetters counts the dead letters the WAL keeps for the sink.
func (d *Drainer) countDeadLetters() int {
	dead := 0
	if err := d.w.ScanState(d.name, []byte(prefixDead), func(k, v []byte) error { dead++; return nil }); err != nil {
		d.log.Warn("count dead letters", "error", err)
	}
	return dead
}

func be64(b []byte) uint64 { return binary.BigEndian.Uint64(b) }

// errCommitGivenUp is the result of a delivery whose commit waited for
// room on a full disk when the stop's hard deadline passed.
var errCommitGivenUp = errors.New("the delivery's commit was given up at the stop's deadline")

// commitGivenUp ends a delivery whose commit the stop gave up: not
// recorded, its records are sent again at the next start (as a cancelled
// send's are). Only the loop's stop follows.
func (l *loop) commitGivenUp(c *commitReq) {
	if c.p == nil {
		l.idlePending = false
		return
	}
	if l.givenUp == 0 {
		l.d.log.Warn("shutdown timeout: giving up deliveries that wait to be recorded (the WAL's disk is full); their records are sent again at the next start")
	}
	l.givenUp++
	l.deliveryCommitted(c.p)
}

func (l *loop) onCommitted(c *commitReq, now time.Time) {
	d, p := l.d, c.p
	if p == nil {
		l.idlePending = false // a cursor move of advanceIdle
		return
	}
	l.deliveryCommitted(p)
	l.flow.committed()
	delivered := c.records - c.dead
	l.delivered += uint64(delivered)
	l.deadLettered += uint64(c.dead)
	d.delivered.Add(float64(delivered))
	if delivered > 0 {
		d.batches.Inc() // not a batch the destination refused whole (dead-lettered)
	}
	if p.empty() {
		l.forget(p)
		return
	}
	l.scheduleQueue(p, now)
}

// registerWaiting registers the cursor name with register
// (wal.RegisterCursor), waiting out a full disk as waitFullDisk does (a new
// cursor is a commit), the first wait first long.
func registerWaiting(ctx context.Context, register func(context.Context, string) (uint64, error), name string, log *slog.Logger, first time.Duration) (uint64, error) {
	var cursor uint64
	err := waitFullDisk(ctx, log, "cannot register the sink's cursor", first, func() (err error) {
		cursor, err = register(ctx, name)
		return err
	})
	return cursor, err
}

// commitWaiting commits b, waiting out a full disk as waitFullDisk does.
func (d *Drainer) commitWaiting(ctx context.Context, b *wal.Batch, what string) error {
	return waitFullDisk(ctx, d.log, what, time.Second, func() error { return walCommit(d.w, b) })
}

// walCommit is commitWaiting's commit (a variable so that tests can make
// the disk full).
var walCommit = func(w *wal.WAL, b *wal.Batch) error { return w.Commit(context.Background(), b) }

// waitFullDisk runs op until it does not fail for a full disk
// (wal.ErrNoSpace), with a warning (what, then why) and a wait from first,
// doubling to 30 s, between tries, until ctx ends: then it returns ctx's
// error.
func waitFullDisk(ctx context.Context, log *slog.Logger, what string, first time.Duration, op func() error) error {
	err := op()
	for wait := first; errors.Is(err, wal.ErrNoSpace); wait = min(2*wait, 30*time.Second) {
		log.Warn(what+": the WAL's disk is full; retrying", "retry_in", wait, "error", err)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
		err = op()
	}
	return err
}
