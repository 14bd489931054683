package queue

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/logfwd/forwarder/wal"
)

// guard bounds a sink's partitions (sinks.Limits.MaxPartitions): a record
// whose partition would be one more than the bound goes to the sink's
// overflow partition (sinks.Overflower) instead.
//
// Which partition a record goes to must come out the same every time it
// is routed: after a restart the drainer reads again from the cursor, and
// a sink rebuilds what a crash interrupted (an S3 intent, a CloudWatch
// call in doubt) by routing the records of a range again. A count of the
// partitions open at the moment would not: it depends on what was read
// before. So the guard keeps, in the sink's state, when each partition was
// admitted and, once it went idle, when it was let go: the intervals of
// sequence numbers for which its records go to it. A record goes to its
// own partition when one of the partition's intervals holds it, or when
// fewer than the bound of intervals hold its sequence number (it is then
// admitted from that record on); else to the overflow partition. Both
// depend only on what the state holds, which is committed before any
// record it decides is sent (loop.commitGuard), so they are the same
// before and after a crash, for the head reader, the catch-up reader and
// the sinks' Recover alike.
//
// Records before the first bound ever stored (those a build without the
// guard wrote) go to their own partitions. A changed bound applies from
// the first record after those the previous run may have routed, and the
// intervals of a changed partitioning (Options.Fingerprint) are closed
// there, kept only for the records before.
//
// The loop changes it; a sink reads it (State.Admitted) in Recover, before
// the loop starts, and in a send that rebuilds an object from the WAL, so
// changes take mu, and so do reads from outside the loop.
type guard struct {
	mu     sync.RWMutex
	keys   map[string]*admission
	froms  []uint64 // every interval's first sequence number, ascending
	tos    []uint64 // every closed interval's end, ascending
	epochs []guardEpoch
	// routedTo: records before it may have been routed by an earlier run;
	// an interval may be closed only at or after it.
	routedTo uint64

	changed       map[string]struct{} // keys whose intervals are to be stored
	epochsChanged bool
}

// guardEpoch: from sequence number from on, the bound is max.
type guardEpoch struct {
	from uint64
	max  int
}

// admission is one partition's intervals, and when it was last seen busy.
type admission struct {
	ivs  []interval // ascending; only the last may be open
	seen time.Time
}

// interval: the partition's records from from up to, not including, to go
// to it; to 0: open. From 0 is the records before the first bound, which
// go to their own partitions without being admitted.
type interval struct{ from, to uint64 }

func (iv interval) holds(seq uint64) bool {
	return iv.from <= seq && (iv.to == 0 || seq < iv.to)
}

// Keys of the guard in the sink's state bucket (see doc.go, State keys).
const (
	prefixAdmitted = "a/"
	keyBounds      = "max_partitions"
)

// loadGuard reads the guard's state, adds an epoch when the bound
// changed, closes the intervals of an old partitioning, and stores what it
// changed. next is the WAL's next sequence number at the start: no record
// from it on was routed by an earlier run.
func loadGuard(w *wal.WAL, sink string, limit int, next uint64, repartitioned bool, now time.Time) (*guard, error) {
	g := &guard{keys: map[string]*admission{}, routedTo: next, changed: map[string]struct{}{}}
	v, err := w.State(sink, []byte(keyBounds))
	if err != nil {
		return nil, fmt.Errorf("read max_partitions of %q: %w", sink, err)
	}
	for ; len(v) >= 16; v = v[16:] {
		g.epochs = append(g.epochs, guardEpoch{be64(v), int(be64(v[8:]))})
	}
	if err := w.ScanState(sink, []byte(prefixAdmitted), func(k, v []byte) error {
		a := &admission{seen: now}
		for ; len(v) >= 16; v = v[16:] {
			a.ivs = append(a.ivs, interval{be64(v), be64(v[8:])})
		}
		if len(a.ivs) > 0 {
			g.keys[string(k[len(prefixAdmitted):])] = a
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read admitted partitions of %q: %w", sink, err)
	}
	if n := len(g.epochs); n == 0 || g.epochs[n-1].max != limit {
		if n > 0 && g.epochs[n-1].from >= next {
			g.epochs = g.epochs[:n-1]
		}
		g.epochs = append(g.epochs, guardEpoch{next, limit})
		g.epochsChanged = true
	}
	for k, a := range g.keys {
		if last := &a.ivs[len(a.ivs)-1]; repartitioned && last.to == 0 {
			last.to = max(next, last.from+1)
			g.changed[k] = struct{}{}
		}
	}
	g.reindex()
	return g, nil
}

// reindex rebuilds froms and tos from the intervals.
func (g *guard) reindex() {
	g.froms, g.tos = g.froms[:0], g.tos[:0]
	for _, a := range g.keys {
		for _, iv := range a.ivs {
			g.froms = append(g.froms, iv.from)
			if iv.to != 0 {
				g.tos = append(g.tos, iv.to)
			}
		}
	}
	slices.Sort(g.froms)
	slices.Sort(g.tos)
}

// bound is the bound for the record seq; -1: none (before the first).
func (g *guard) bound(seq uint64) int {
	i := sort.Search(len(g.epochs), func(i int) bool { return g.epochs[i].from > seq })
	if i == 0 {
		return -1
	}
	return g.epochs[i-1].max
}

// open is how many partitions are admitted now.
func (g *guard) open() int { return len(g.froms) - len(g.tos) }

// holding is how many intervals hold seq.
func (g *guard) holding(seq uint64) int {
	nf, nt := len(g.froms), len(g.tos)
	if (nf == 0 || g.froms[nf-1] <= seq) && (nt == 0 || g.tos[nt-1] <= seq) {
		return nf - nt // the head reader's case: past every bound
	}
	return upper(g.froms, seq) - upper(g.tos, seq)
}

// upper is how many of the ascending s are at most v.
func upper(s []uint64, v uint64) int {
	return sort.Search(len(s), func(i int) bool { return s[i] > v })
}

// decide says whether the record seq of partition key goes to it, and the
// interval that holds it (or would, when admit is set). admit reports
// whether it is to be admitted from seq on.
func (g *guard) decide(key string, seq uint64) (ok, admit bool, iv interval) {
	limit := g.bound(seq)
	if limit < 0 {
		return true, false, interval{0, g.epochs[0].from} // from 0: before the bound, no family's
	}
	a := g.keys[key]
	if a != nil {
		for _, iv := range a.ivs {
			if iv.holds(seq) {
				return true, false, iv
			}
		}
		// Admitted only after its last interval: an earlier gap was
		// decided when it was read, and it was not admitted then.
		if last := a.ivs[len(a.ivs)-1]; last.to == 0 || seq < last.to {
			return false, false, interval{}
		}
	}
	if g.holding(seq) < limit {
		return true, true, interval{seq, 0}
	}
	return false, false, interval{}
}

// admitted is decide without admitting: whether the record seq of
// partition key goes to it, as a sink's Recover asks.
func (g *guard) admitted(key string, seq uint64) bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	ok, _, _ := g.decide(key, seq)
	return ok
}

// route is decide, admitting the partition when there is room: the
// admission must be stored (store) before any record it decides is sent.
func (g *guard) route(key string, seq uint64, now time.Time) (bool, interval) {
	ok, admit, iv := g.decide(key, seq)
	if !admit {
		return ok, iv
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	a := g.keys[key]
	if a == nil {
		a = &admission{}
		g.keys[key] = a
	}
	a.ivs = append(a.ivs, iv)
	a.seen = now
	if n := len(g.froms); n == 0 || g.froms[n-1] <= seq {
		g.froms = append(g.froms, seq)
	} else {
		g.froms = slices.Insert(g.froms, upper(g.froms, seq), seq)
	}
	g.changed[key] = struct{}{}
	return true, iv
}

// seenAt notes that partition key was busy at now (its records were
// delivered and it was let go).
func (g *guard) seenAt(key string, now time.Time) {
	if a := g.keys[key]; a != nil {
		a.seen = now
	}
}

// letGoAtOnce bounds the intervals one letGo closes, and the keys one
// forget changes: each becomes a key written in one WAL commit, which
// the loop waits for.
const letGoAtOnce = 2000

// letGo closes, at next (the next record to be read), the open interval
// of every family idle since before idleSince that busy does not hold
// (up to letGoAtOnce of them): room for new ones. It does nothing until
// the reader is past what an earlier run may have routed, whose routes
// must not change. It returns how many it let go.
func (g *guard) letGo(next uint64, idleSince time.Time, busy func(key string) bool) int {
	if next < g.routedTo {
		return 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for k, a := range g.keys {
		last := &a.ivs[len(a.ivs)-1]
		if last.to != 0 || !a.seen.Before(idleSince) || last.from >= next || busy(k) {
			continue
		}
		last.to = next
		g.tos = append(g.tos, next)
		g.changed[k] = struct{}{}
		if n++; n == letGoAtOnce {
			break
		}
	}
	if n > 0 {
		// next is at least every end closed before in this run (the reader
		// only moves on, but for a drop_oldest that moves it past records
		// the cursor passed, which no interval's count concerns any more);
		// sorting keeps tos ascending all the same.
		slices.Sort(g.tos)
	}
	return n
}

// forget drops the intervals and bounds that no record after cursor can
// be routed by.
func (g *guard) forget(cursor uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	dropped := 0
	for k, a := range g.keys {
		if dropped == letGoAtOnce {
			break // the rest at a later call
		}
		i := 0
		for i < len(a.ivs) && a.ivs[i].to != 0 && a.ivs[i].to <= cursor+1 {
			i++
		}
		if i == 0 {
			continue
		}
		a.ivs = a.ivs[i:]
		if len(a.ivs) == 0 {
			delete(g.keys, k)
		}
		g.changed[k] = struct{}{}
		dropped++
	}
	if dropped > 0 {
		g.reindex()
	}
	for len(g.epochs) > 1 && g.epochs[1].from <= cursor+1 {
		g.epochs = g.epochs[1:]
		g.epochsChanged = true
	}
}

// store puts what changed since the last store in b, in key order: bbolt
// inserts keys in order far faster than scattered.
func (g *guard) store(b *wal.Batch, sink string) {
	keys := make([]string, 0, len(g.changed))
	for k := range g.changed {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		key := []byte(prefixAdmitted + k)
		a := g.keys[k]
		if a == nil {
			b.Delete(sink, key)
			continue
		}
		v := make([]byte, 0, 16*len(a.ivs))
		for _, iv := range a.ivs {
			v = binary.BigEndian.AppendUint64(v, iv.from)
			v = binary.BigEndian.AppendUint64(v, iv.to)
		}
		b.Put(sink, key, v)
	}
	clear(g.changed)
	if g.epochsChanged {
		v := make([]byte, 0, 16*len(g.epochs))
		for _, e := range g.epochs {
			v = binary.BigEndian.AppendUint64(v, e.from)
			v = binary.BigEndian.AppendUint64(v, uint64(e.max))
		}
		b.Put(sink, []byte(keyBounds), v)
		g.epochsChanged = false
	}
}

// dirty: something is to be stored.
func (g *guard) dirty() bool { return len(g.changed) > 0 || g.epochsChanged }

// commitGuard stores what the guard changed, before any record it routed
// can be sent. A full disk is waited out (the WAL keeps wal.min_free_bytes
// for commits like this one, so it is rare): the drainer cannot send the
// records it read until their routes are stored. If ctx ends meanwhile,
// it returns its error and the drainer stops, sending nothing more: the
// records stay in the WAL for the next start.
func (d *Drainer) commitGuard(ctx context.Context, g *guard) error {
	if !g.dirty() {
		return nil
	}
	var b wal.Batch
	g.store(&b, d.name)
	if err := d.commitWaiting(ctx, &b, "cannot store the admitted partitions (max_partitions)"); err != nil {
		return fmt.Errorf("store admitted partitions of %q: %w", d.name, err)
	}
	return nil
}
