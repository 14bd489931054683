package queue

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// A change of partitioning (Options.Fingerprint: a key or name template,
// the host name) makes the delivered marks name partitions the sink no
// longer has; a change of match (Options.MatchGlobs) makes them cover
// records of tags the sink did not take, which a wider match takes now. A
// sink that can route records as its earlier configuration did
// (sinks.Repartitioner) keeps them: they move, with the description of that
// partitioning and that match, to a generation of their own (generation),
// and a record one of them says was delivered is not sent again under the
// new names (oldMarks.delivered). They go as the cursor passes them.
// Another change while they are kept makes another generation when the
// configuration in between has marks of its own; at most maxGenerations
// are kept, the oldest forgotten beyond that.
//
// Recover runs before the change is stored: a sink finishes what the
// earlier configuration began, routed as it was (sinks.State.Partitioning),
// and the marks it writes are moved with the others. A crash in between
// finds the change again at the next start.

// StoredFingerprint is the fingerprint (Options.Fingerprint) the drainer
// of cursor name stored in w; nil: none.
func StoredFingerprint(w *wal.WAL, name string) ([]byte, error) {
	return w.State(name, []byte(keyFingerprint))
}

// ForgetSinkState deletes the keys of sink name's own state (what its
// sinks.State holds) that begin with prefix, and returns how many there
// were: what a sink of another type left under the same name.
func ForgetSinkState(ctx context.Context, w *wal.WAL, name string, prefix []byte) (int, error) {
	var b wal.Batch
	if err := w.ScanState(name, stateKey(prefix), func(k, _ []byte) error {
		b.Delete(name, append([]byte(nil), k...))
		return nil
	}); err != nil || b.Len() == 0 {
		return 0, err
	}
	return b.Len(), w.Commit(ctx, &b)
}

// prior is what the state says of the run before this start.
type prior struct {
	// changed: the partitioning changed (the fingerprint or the
	// description differ); fresh: the sink never ran.
	changed, fresh bool
	// matchChanged: the sink's match (Options.MatchGlobs) differs from
	// the one stored: marks ahead of the cursor then cover only the tags
	// the earlier match took.
	matchChanged bool
	desc         []byte // the stored description of the partitioning (nil: unknown)
	match        []byte // the stored match (nil: unknown)
}

// moved reports whether the marks stored are not today's.
func (p prior) moved() bool { return p.changed || p.matchChanged }

// partitioningChanged compares the stored fingerprint, description and
// match with the sink's.
func (d *Drainer) partitioningChanged() (p prior, err error) {
	if d.opts.Fingerprint == "" {
		return p, nil
	}
	old, err := d.w.State(d.name, []byte(keyFingerprint))
	if err != nil {
		return p, fmt.Errorf("read partitioning fingerprint of %q: %w", d.name, err)
	}
	if p.desc, err = d.w.State(d.name, []byte(keyPartitioning)); err != nil {
		return p, fmt.Errorf("read partitioning of %q: %w", d.name, err)
	}
	if p.match, err = d.w.State(d.name, []byte(keyMatch)); err != nil {
		return p, fmt.Errorf("read the match of %q: %w", d.name, err)
	}
	if old == nil {
		p.fresh = true
		return p, nil
	}
	// The description may hold what the fingerprint does not (an S3
	// key's rules): either differing is a change.
	p.changed = string(old) != d.opts.Fingerprint
	if rp, ok := d.sink.(sinks.Repartitioner); ok && p.desc != nil && !bytes.Equal(p.desc, rp.Partitioning()) {
		p.changed = true
	}
	if m := d.matchDesc(); m != nil && p.match != nil && !bytes.Equal(m, p.match) {
		p.matchChanged = true
	}
	return p, nil
}

// matchDesc is how the sink's match is stored: its globs, sorted, as
// JSON; nil when Options.MatchGlobs is not set.
func (d *Drainer) matchDesc() []byte {
	if d.opts.MatchGlobs == nil {
		return nil
	}
	globs := slices.Clone(d.opts.MatchGlobs)
	slices.Sort(globs)
	b, _ := json.Marshal(slices.Compact(globs))
	return b
}

// matcherOf is the match stored as desc (matchDesc).
func matcherOf(desc []byte) (func(tag string) bool, error) {
	var globs []string
	if err := json.Unmarshal(desc, &globs); err != nil {
		return nil, fmt.Errorf("read the match of an earlier configuration: %w", err)
	}
	return config.NewTagMatcher(globs).Match, nil
}

// routes reports whether rp reads the partitioning desc (not another
// sink type's, after a type change under the same name).
func (d *Drainer) routes(rp sinks.Repartitioner, desc []byte) bool {
	_, err := rp.Router(desc, &sinkState{w: d.w, name: d.name, partitioning: desc})
	return err == nil
}

// storePartitioning stores the sink's fingerprint, partitioning and
// match, and, when one of them changed, keeps the delivered marks as the
// earlier configuration's, or (a sink that cannot route as it did, or a
// partitioning not described: stored by an older build) drops them.
func (d *Drainer) storePartitioning(ctx context.Context, p prior, cursor uint64) error {
	if d.opts.Fingerprint == "" {
		return nil
	}
	rp, _ := d.sink.(sinks.Repartitioner)
	var desc []byte
	if rp != nil {
		desc = rp.Partitioning()
	}
	var b wal.Batch
	if p.moved() {
		var marks [][2][]byte
		if err := d.w.ScanState(d.name, []byte(prefixMark), func(k, v []byte) error {
			marks = append(marks, [2][]byte{append([]byte(nil), k...), append([]byte(nil), v...)})
			return nil
		}); err != nil {
			return fmt.Errorf("read delivered marks of %q: %w", d.name, err)
		}
		if !slices.ContainsFunc(marks, func(m [2][]byte) bool { return len(m[1]) == 8 && be64(m[1]) > cursor }) {
			for _, m := range marks { // the cursor passed them: they cover nothing
				b.Delete(d.name, m[0])
			}
			marks = nil
		}
		switch {
		case len(marks) == 0:
		case rp != nil && p.desc != nil && d.routes(rp, p.desc):
			gens, err := d.scanGenerations()
			if err != nil {
				return err
			}
			// Marks the cursor passed (drop_oldest moves it without them)
			// cover nothing: a generation left with none is forgotten, and
			// does not count against maxGenerations.
			live := gens[:0]
			for _, g := range gens {
				if slices.ContainsFunc(g.vals, func(m uint64) bool { return m > cursor }) {
					live = append(live, g)
				} else {
					g.forget(&b, d.name)
				}
			}
			gens = live
			n := 1
			for _, g := range gens {
				n = max(n, g.n+1)
			}
			if len(gens) >= maxGenerations {
				// The oldest goes: what it delivered may be sent again.
				oldest := gens[0]
				oldest.forget(&b, d.name)
				d.log.Warn("the sink's partitioning or match changed again before the cursor passed what partitions delivered under earlier ones: forgetting the marks of the oldest; those records may be sent again",
					"marks", len(oldest.keys), "configurations_kept", maxGenerations)
			}
			g := generation{n: n}
			for _, m := range marks {
				b.Delete(d.name, m[0])
				b.Put(d.name, g.markKey(string(m[0][len(prefixMark):])), m[1])
			}
			b.Put(d.name, g.descKey(), p.desc)
			if p.match != nil {
				b.Put(d.name, g.matchKey(), p.match)
			} else {
				b.Delete(d.name, g.matchKey())
			}
			d.log.Info("the sink's partitioning or match changed: what its partitions delivered ahead of the cursor is read through the earlier configuration and not sent again", "marks", len(marks))
		default:
			for _, m := range marks {
				b.Delete(d.name, m[0])
			}
			d.log.Info("the sink's partitioning or match changed: forgetting what partitions delivered ahead of the cursor (the earlier partitioning is not known, or is not one this sink reads: another type's); those records may be sent again", "marks", len(marks))
		}
	}
	if p.changed || p.fresh {
		b.Put(d.name, []byte(keyFingerprint), []byte(d.opts.Fingerprint))
	}
	if desc != nil && !bytes.Equal(desc, p.desc) {
		b.Put(d.name, []byte(keyPartitioning), desc)
	}
	if m := d.matchDesc(); m != nil && !bytes.Equal(m, p.match) {
		b.Put(d.name, []byte(keyMatch), m)
	}
	if b.Len() == 0 {
		return nil
	}
	// A full disk waits (a changed configuration must not end the service).
	if err := d.commitWaiting(ctx, &b, "cannot store the sink's partitioning"); err != nil {
		return fmt.Errorf("store partitioning fingerprint of %q: %w", d.name, err)
	}
	if desc != nil {
		d.st.partitioning = desc
	}
	return nil
}

// maxGenerations bounds the earlier configurations whose marks are kept
// at once: each changed while partitions had delivered ahead of the
// cursor under the one before.
const maxGenerations = 8

// A generation is the marks of one earlier configuration, with its
// partitioning and match. Generation 0 has the keys a build with one
// generation wrote (prefixOldMark, keyOldPartitioning, keyOldMatch); n > 0,
// "o<n>/<partition>", "old_partitioning/<n>" and "old_match/<n>".
type generation struct {
	n    int
	keys [][]byte // its mark keys, as scanned
	vals []uint64 // their marks (0: a value not 8 bytes long)
}

func (g *generation) prefix() string {
	if g.n == 0 {
		return prefixOldMark
	}
	return "o" + strconv.Itoa(g.n) + "/"
}

func (g *generation) markKey(partition string) []byte { return []byte(g.prefix() + partition) }

func (g *generation) descKey() []byte {
	if g.n == 0 {
		return []byte(keyOldPartitioning)
	}
	return []byte(keyOldPartitioning + "/" + strconv.Itoa(g.n))
}

func (g *generation) matchKey() []byte {
	if g.n == 0 {
		return []byte(keyOldMatch)
	}
	return []byte(keyOldMatch + "/" + strconv.Itoa(g.n))
}

// forget deletes the generation's keys in b.
func (g *generation) forget(b *wal.Batch, sink string) {
	for _, k := range g.keys {
		b.Delete(sink, k)
	}
	b.Delete(sink, g.descKey())
	b.Delete(sink, g.matchKey())
}

// scanGenerations reads the marks of every earlier configuration, oldest
// first.
func (d *Drainer) scanGenerations() ([]*generation, error) {
	byN := map[int]*generation{}
	if err := d.w.ScanState(d.name, []byte("o"), func(k, v []byte) error {
		slash := bytes.IndexByte(k, '/')
		if slash < 1 {
			return nil
		}
		n := 0
		if slash > 1 {
			var err error
			if n, err = strconv.Atoi(string(k[1:slash])); err != nil || n < 1 || strconv.Itoa(n) != string(k[1:slash]) {
				return nil // old_partitioning/<n>, old_match/<n>, or not a key of ours
			}
		}
		g := byN[n]
		if g == nil {
			g = &generation{n: n}
			byN[n] = g
		}
		var m uint64
		if len(v) == 8 {
			m = be64(v)
		}
		g.keys, g.vals = append(g.keys, bytes.Clone(k)), append(g.vals, m)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read delivered marks of %q: %w", d.name, err)
	}
	gens := make([]*generation, 0, len(byN))
	for _, g := range byN {
		gens = append(gens, g)
	}
	slices.SortFunc(gens, func(a, b *generation) int { return a.n - b.n })
	return gens, nil
}

// oldMarks are the delivered marks of earlier configurations.
type oldMarks struct {
	// mu guards gens against the loop's changes (passMarks) for readers
	// other than the loop: a sink's State.ReadRange. The loop reads
	// without it.
	mu   sync.RWMutex
	gens []*oldGen
}

// oldGen is one generation's marks, read through its configuration.
type oldGen struct {
	generation
	marks markSet
	route func(*sinks.Record) string // as the earlier partitioning routed
	match func(tag string) bool      // the earlier match; nil: not known
	max   uint64                     // the highest mark
}

// delivered reports whether a partition of an earlier configuration
// delivered r: a record of a tag its match refused was not, even under a
// mark of its partition.
func (o *oldMarks) delivered(r *sinks.Record) bool {
	for _, g := range o.gens {
		if r.Seq > g.max || g.match != nil && !g.match(r.Tag) {
			continue
		}
		if m, ok := g.marks.get(g.route(r)); ok && r.Seq <= m {
			return true
		}
	}
	return false
}

// deliveredLocked is delivered for a reader other than the loop.
func (o *oldMarks) deliveredLocked(r *sinks.Record) bool {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return o.delivered(r)
}

// loadOldMarks reads the marks of earlier configurations, and the router
// of each, its bound's decisions as they were before this start (next: the
// first record no earlier run routed). With forget, marks it cannot read
// through their partitioning are dropped, with a warning: their records
// may be sent again; without, they are only left out (a read for Recover,
// before the loop's own).
func (d *Drainer) loadOldMarks(ctx context.Context, next uint64, forget bool) (*oldMarks, error) {
	gens, err := d.scanGenerations()
	if err != nil || len(gens) == 0 {
		return nil, err
	}
	rp, _ := d.sink.(sinks.Repartitioner)
	o := &oldMarks{}
	var b wal.Batch
	// The bound's decisions for the records earlier partitionings routed,
	// as they were (the loop admits partitions of the new one): one copy,
	// read only, for every generation.
	var gd *guard
	for _, g := range gens {
		og := &oldGen{generation: *g, marks: newMarkSet()}
		for i, k := range g.keys {
			if m := g.vals[i]; m != 0 {
				og.marks.set(string(k[len(g.prefix()):]), m)
				og.max = max(og.max, m)
			}
		}
		desc, err := d.w.State(d.name, g.descKey())
		if err != nil {
			return nil, fmt.Errorf("read an earlier partitioning of %q: %w", d.name, err)
		}
		switch {
		case rp == nil || desc == nil:
			err = fmt.Errorf("the sink cannot route records as it did")
		case og.marks.len() == 0:
			err = fmt.Errorf("no mark holds a sequence number")
		default:
			if gd == nil {
				gd, err = loadGuard(d.w, d.name, max(d.lim.MaxPartitions, 0), next, true, time.Now())
			}
			if err == nil {
				st := &sinkState{w: d.w, name: d.name, match: d.st.match, guard: gd, partitioning: desc}
				og.route, err = rp.Router(desc, st)
			}
		}
		if err == nil {
			var m []byte
			if m, err = d.w.State(d.name, g.matchKey()); err != nil {
				return nil, fmt.Errorf("read an earlier match of %q: %w", d.name, err)
			}
			if m != nil {
				og.match, err = matcherOf(m)
			}
		}
		if err != nil {
			if forget {
				d.log.Warn("cannot read what partitions delivered before the sink's partitioning changed: forgetting it; those records may be sent again", "marks", len(g.keys), "error", err)
				g.forget(&b, d.name)
			}
			continue
		}
		o.gens = append(o.gens, og)
	}
	if b.Len() > 0 {
		if err := d.commitWaiting(ctx, &b, "cannot forget the marks of an earlier partitioning"); err != nil {
			return nil, fmt.Errorf("forget the marks of an earlier partitioning of %q: %w", d.name, err)
		}
	}
	if len(o.gens) == 0 {
		return nil, nil
	}
	return o, nil
}

// passMarks forgets the marks at or below low, the cursor's new position,
// in ops.
func (l *loop) passMarks(low uint64, ops *wal.Batch) {
	name := l.d.name
	l.deleteStaleMarks(ops)
	l.marks.takeUpTo(low, func(k string) { ops.Delete(name, markKey(k)) })
	if l.old == nil {
		return
	}
	l.old.mu.Lock()
	defer l.old.mu.Unlock()
	kept := l.old.gens[:0]
	for _, g := range l.old.gens {
		g.marks.takeUpTo(low, func(k string) { ops.Delete(name, g.markKey(k)) })
		if g.marks.len() > 0 {
			kept = append(kept, g)
			continue
		}
		g.forget(ops, name) // a mark not 8 bytes long too, which the set does not hold
	}
	l.old.gens = kept
	if len(kept) == 0 {
		l.old = nil
	}
}
