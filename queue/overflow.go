package queue

import (
	"bytes"
	"strings"
	"time"

	"github.com/logfwd/forwarder/sinks"
)

// overflowReport is what went to the overflow partition since the last
// report: the count, and a few of the records for Overflower.Explain.
type overflowReport struct {
	records     int
	samples     []sinks.Record // copies: read buffers are reused
	lastReport  time.Time
	lastLetGo   time.Time
	letGoNeeded bool // the guard was full: let idle partitions go at the next tick
}

// Samples kept per report: enough for Explain to tell which placeholder
// takes a new value with every record, bounded in memory.
const (
	overflowSamples       = 64
	overflowSampleMaxBody = 4 << 10
)

// overflowed counts r, read by the head reader, going to the overflow
// partition.
func (l *loop) overflowed(r *sinks.Record) {
	l.d.overflowed.Inc()
	l.overflowTotal++
	l.over.records++
	l.over.letGoNeeded = true
	if len(l.over.samples) < overflowSamples && len(r.Body) <= overflowSampleMaxBody {
		l.over.samples = append(l.over.samples, sinks.Record{Seq: r.Seq, Time: r.Time, Tag: strings.Clone(r.Tag), Body: bytes.Clone(r.Body)})
	}
}

// adopt files p under family fam, which iv admits.
func (l *loop) adopt(p *partition, fam string, iv interval) {
	p.adm = iv
	if iv.from == 0 {
		l.unadopt(p) // before the bound: no family's, never let go
		return
	}
	if p.fam == fam {
		return
	}
	l.unadopt(p)
	p.fam = fam
	l.families[fam]++
}

// unadopt takes p out of its family's count.
func (l *loop) unadopt(p *partition) {
	if p.fam == "" {
		return
	}
	if l.families[p.fam]--; l.families[p.fam] <= 0 {
		delete(l.families, p.fam)
	}
	p.fam = ""
}

// checkGuard, at most once per SummaryInterval: lets the families idle
// for Options.PartitionIdle go, forgets what no record after the cursor
// can be routed by, stores that, and reports what went to the overflow
// partition with one warning. When the guard is full it lets idle
// partitions go at once (at most once a second), so that new ones get
// room as soon as old ones are done.
func (l *loop) checkGuard(now time.Time) error {
	g := l.guard
	if g == nil {
		return nil
	}
	d := l.d
	if now.Sub(l.over.lastLetGo) >= d.opts.SummaryInterval || l.over.letGoNeeded {
		l.over.lastLetGo, l.over.letGoNeeded = now, false
		g.letGo(l.readPos, now.Add(-d.opts.PartitionIdle), func(fam string) bool { return l.families[fam] > 0 })
		// Only what the committed cursor passed: a restart reads again
		// from it, and the cursor handed to the committer may not be
		// durable yet.
		if cursor, ok := d.w.Cursor(d.name); ok {
			g.forget(min(cursor, l.cursor))
		}
		if err := d.commitGuard(l.ctx, g); err != nil {
			return err
		}
	}
	d.admitted.Set(float64(g.open()))
	if l.over.records == 0 || now.Sub(l.over.lastReport) < d.opts.SummaryInterval {
		return nil
	}
	d.log.Warn("more partitions than max_partitions: records that would open new ones went to the overflow partition (nothing is dropped); a template likely renders a value per record: fix it, or raise max_partitions",
		"interval", d.opts.SummaryInterval, "records", l.over.records, "max_partitions", d.lim.MaxPartitions,
		"admitted", g.open(), "cause", l.overflow.Explain(l.over.samples))
	clear(l.over.samples)
	l.over.records, l.over.samples, l.over.lastReport = 0, l.over.samples[:0], now
	return nil
}
