package queue

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// A change of partitioning (Options.Fingerprint: a key or name template,
// the host name) makes the delivered marks name partitions the sink no
// longer has; a change of match (Options.MatchGlobs) makes them cover
// records of tags the sink did not take, which a wider match takes now. A sink that can route records as its earlier configuration
// did (sinks.Repartitioner) keeps them: they move, with the description of
// that partitioning, under prefixOldMark, and a record they say was
// delivered is not sent again under the new names (oldMarks.delivered).
// They go as the cursor passes them. Another change while they are kept
// replaces them, when there are marks of the partitioning in between.
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

// storePartitioning stores the sink's fingerprint, partitioning and
// match, and, when one of them changed, keeps the delivered marks as the
// earlier configuration's, or (a sink that cannot route as it did, or a
// partitioning not described: stored by an older build) drops them.
func (d *Drainer) storePartitioning(ctx context.Context, p prior) error {
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
		switch {
		case len(marks) == 0:
		case rp != nil && p.desc != nil:
			older := 0
			if err := d.w.ScanState(d.name, []byte(prefixOldMark), func(k, _ []byte) error {
				b.Delete(d.name, append([]byte(nil), k...))
				older++
				return nil
			}); err != nil {
				return fmt.Errorf("read delivered marks of %q: %w", d.name, err)
			}
			if older > 0 {
				d.log.Info("the sink's partitioning or match changed twice before the cursor passed what partitions delivered ahead of it: forgetting the marks of the first; those records may be sent again", "marks", older)
			}
			for _, m := range marks {
				b.Delete(d.name, m[0])
				b.Put(d.name, oldMarkKey(string(m[0][len(prefixMark):])), m[1])
			}
			b.Put(d.name, []byte(keyOldPartitioning), p.desc)
			if p.match != nil {
				b.Put(d.name, []byte(keyOldMatch), p.match)
			} else {
				b.Delete(d.name, []byte(keyOldMatch))
			}
			d.log.Info("the sink's partitioning or match changed: what its partitions delivered ahead of the cursor is read through the earlier configuration and not sent again", "marks", len(marks))
		default:
			for _, m := range marks {
				b.Delete(d.name, m[0])
			}
			d.log.Info("the sink's partitioning or match changed: forgetting what partitions delivered ahead of the cursor (the earlier partitioning is not known); those records may be sent again", "marks", len(marks))
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

// oldMarks are the delivered marks of an earlier partitioning.
type oldMarks struct {
	marks markSet
	route func(*sinks.Record) string // as the earlier partitioning routed
	match func(tag string) bool      // the earlier match; nil: not known
	max   uint64                     // the highest mark
}

// delivered reports whether a partition of the earlier partitioning
// delivered r: a record of a tag the earlier match refused was not, even
// under a mark of its partition.
func (o *oldMarks) delivered(r *sinks.Record) bool {
	if r.Seq > o.max || o.match != nil && !o.match(r.Tag) {
		return false
	}
	m, ok := o.marks.get(o.route(r))
	return ok && r.Seq <= m
}

// loadOldMarks reads the marks of an earlier partitioning, and the router
// of that partitioning, its bound's decisions as they were before this
// start (next: the first record no earlier run routed). Marks it cannot
// read through their partitioning are dropped, with a warning: their
// records may be sent again.
func (d *Drainer) loadOldMarks(ctx context.Context, next uint64) (*oldMarks, error) {
	o := &oldMarks{marks: newMarkSet()}
	var keys [][]byte
	if err := d.w.ScanState(d.name, []byte(prefixOldMark), func(k, v []byte) error {
		keys = append(keys, append([]byte(nil), k...))
		if len(v) == 8 {
			o.marks.set(string(k[len(prefixOldMark):]), be64(v))
			o.max = max(o.max, be64(v))
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("load delivered marks of %q: %w", d.name, err)
	}
	if len(keys) == 0 {
		return nil, nil
	}
	desc, err := d.w.State(d.name, []byte(keyOldPartitioning))
	if err != nil {
		return nil, fmt.Errorf("read the earlier partitioning of %q: %w", d.name, err)
	}
	rp, _ := d.sink.(sinks.Repartitioner)
	if rp == nil || desc == nil {
		err = fmt.Errorf("the sink cannot route records as it did")
	} else {
		// The bound's decisions for the records the earlier partitioning
		// routed, as they were: the loop admits partitions of the new one.
		var g *guard
		if g, err = loadGuard(d.w, d.name, max(d.lim.MaxPartitions, 0), next, true, time.Now()); err == nil {
			st := &sinkState{w: d.w, name: d.name, match: d.st.match, guard: g, partitioning: desc}
			o.route, err = rp.Router(desc, st)
		}
	}
	if err == nil {
		var m []byte
		if m, err = d.w.State(d.name, []byte(keyOldMatch)); err != nil {
			return nil, fmt.Errorf("read the earlier match of %q: %w", d.name, err)
		}
		if m != nil {
			o.match, err = matcherOf(m)
		}
	}
	if err == nil {
		return o, nil
	}
	d.log.Warn("cannot read what partitions delivered before the sink's partitioning changed: forgetting it; those records may be sent again", "marks", len(keys), "error", err)
	var b wal.Batch
	for _, k := range keys {
		b.Delete(d.name, k)
	}
	b.Delete(d.name, []byte(keyOldPartitioning))
	b.Delete(d.name, []byte(keyOldMatch))
	if err := d.commitWaiting(ctx, &b, "cannot forget the marks of an earlier partitioning"); err != nil {
		return nil, fmt.Errorf("forget the marks of an earlier partitioning of %q: %w", d.name, err)
	}
	return nil, nil
}

// passMarks forgets the marks at or below low, the cursor's new position,
// in ops.
func (l *loop) passMarks(low uint64, ops *wal.Batch) {
	name := l.d.name
	l.marks.takeUpTo(low, func(k string) { ops.Delete(name, markKey(k)) })
	if l.old == nil {
		return
	}
	l.old.marks.takeUpTo(low, func(k string) { ops.Delete(name, oldMarkKey(k)) })
	if l.old.marks.len() == 0 {
		ops.Delete(name, []byte(keyOldPartitioning))
		ops.Delete(name, []byte(keyOldMatch))
		l.old = nil
	}
}
