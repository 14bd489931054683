package admin

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/logfwd/forwarder/wal"
)

// WALCollector exports the WAL's state as metrics, read at scrape time.
type WALCollector struct {
	w        *wal.WAL
	maxBytes int64

	bytes, maxB, file, records, full, failed, commits, dropped *prometheus.Desc
	diskFull, diskFree, fileFree, minFree, reads               *prometheus.Desc
	commitSeconds, commitPending, orphaned, damaged            *prometheus.Desc

	configured map[string]bool // the configured sinks' names (nil: not told)
}

// Configured tells the collector which sinks the configuration has: the
// cursors of others (sinks removed from it) are exported with their lag,
// since they keep records from being deleted.
func (c *WALCollector) Configured(sinks ...string) *WALCollector {
	c.configured = map[string]bool{}
	for _, s := range sinks {
		c.configured[s] = true
	}
	return c
}

// NewWALCollector returns a collector for w.
func NewWALCollector(w *wal.WAL, maxBytes int64) *WALCollector {
	return &WALCollector{w: w, maxBytes: maxBytes,
		bytes:         prometheus.NewDesc("forwarder_wal_bytes", "Live records in the WAL, bytes as stored (what wal.max_bytes bounds).", nil, nil),
		maxB:          prometheus.NewDesc("forwarder_wal_max_bytes", "wal.max_bytes.", nil, nil),
		file:          prometheus.NewDesc("forwarder_wal_file_bytes", "Size of the WAL file (its high-water mark).", nil, nil),
		records:       prometheus.NewDesc("forwarder_wal_records", "Live records in the WAL.", nil, nil),
		full:          prometheus.NewDesc("forwarder_wal_full", "1 while appends wait for room, or the next one would: under wal.max_bytes (wal.when_full: block) or on the disk (see forwarder_wal_disk_full).", nil, nil),
		failed:        prometheus.NewDesc("forwarder_wal_failed", "1 after a commit failed in a way that leaves durability unknown; the service stops.", nil, nil),
		commits:       prometheus.NewDesc("forwarder_wal_commits_total", "WAL transactions committed (each one fsync in sync: always).", nil, nil),
		dropped:       prometheus.NewDesc("forwarder_wal_dropped_records_total", "Records wal.when_full: drop_oldest deleted before the sink passed them.", []string{"sink"}, nil),
		diskFull:      prometheus.NewDesc("forwarder_wal_disk_full", "1 while appends wait because storing them would leave less than wal.min_free_bytes free, on the file system and in the WAL file; cursor commits go on.", nil, nil),
		diskFree:      prometheus.NewDesc("forwarder_wal_disk_free_bytes", "Free space on the WAL's file system, for an unprivileged process (-1: unknown).", nil, nil),
		fileFree:      prometheus.NewDesc("forwarder_wal_file_free_bytes", "Free pages inside the WAL file, reused before the file grows.", nil, nil),
		minFree:       prometheus.NewDesc("forwarder_wal_min_free_bytes", "wal.min_free_bytes.", nil, nil),
		commitSeconds: prometheus.NewDesc("forwarder_wal_commit_seconds_total", "Time the WAL's commits took, writes and fsyncs (divided by forwarder_wal_commits_total: a commit's mean time).", nil, nil),
		commitPending: prometheus.NewDesc("forwarder_wal_commit_pending_seconds", "How long the WAL's work on the disk under way (page reads, commit, fsync) has run (0: none): a disk that stalls shows here; /healthz fails past 2 minutes.", nil, nil),
		orphaned:      prometheus.NewDesc("forwarder_wal_unconfigured_cursor_lag_records", "Records behind the cursor of a sink the configuration no longer has: the WAL keeps them until the cursor is dropped (forwarder wal drop-cursor).", []string{"cursor"}, nil),
		damaged:       prometheus.NewDesc("forwarder_wal_damaged_records_total", "Records lost to damaged WAL entries (a checksum mismatch: the disk returned other bytes than were written), replaced by placeholders so that the sinks go on past them.", nil, nil),
		reads: prometheus.NewDesc("forwarder_wal_reads_total", "Reads of the WAL by the sinks that returned records, by where they were served from: memory (the entries committed last, kept uncompressed: a sink that keeps up with appends) or the file.",
			[]string{"from"}, nil),
	}
}

func (c *WALCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.bytes, c.maxB, c.file, c.records, c.full, c.failed, c.commits, c.dropped, c.diskFull, c.diskFree, c.fileFree, c.minFree, c.reads, c.commitSeconds, c.commitPending, c.orphaned, c.damaged} {
		ch <- d
	}
}

func (c *WALCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.w.Stats()
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, float64(st.Bytes))
	ch <- prometheus.MustNewConstMetric(c.maxB, prometheus.GaugeValue, float64(c.maxBytes))
	ch <- prometheus.MustNewConstMetric(c.file, prometheus.GaugeValue, float64(st.FileBytes))
	ch <- prometheus.MustNewConstMetric(c.records, prometheus.GaugeValue, float64(st.Records))
	ch <- prometheus.MustNewConstMetric(c.full, prometheus.GaugeValue, b2f(c.w.Full()))
	ch <- prometheus.MustNewConstMetric(c.failed, prometheus.GaugeValue, b2f(c.w.Err() != nil))
	ch <- prometheus.MustNewConstMetric(c.commits, prometheus.CounterValue, float64(st.Commits))
	ch <- prometheus.MustNewConstMetric(c.damaged, prometheus.CounterValue, float64(st.DamagedRecords))
	ch <- prometheus.MustNewConstMetric(c.commitSeconds, prometheus.CounterValue, st.CommitSeconds)
	ch <- prometheus.MustNewConstMetric(c.commitPending, prometheus.GaugeValue, c.w.CommitPending().Seconds())
	ch <- prometheus.MustNewConstMetric(c.diskFull, prometheus.GaugeValue, b2f(c.w.DiskFull()))
	ch <- prometheus.MustNewConstMetric(c.diskFree, prometheus.GaugeValue, float64(st.DiskFreeBytes))
	ch <- prometheus.MustNewConstMetric(c.fileFree, prometheus.GaugeValue, float64(st.FileFreeBytes))
	ch <- prometheus.MustNewConstMetric(c.minFree, prometheus.GaugeValue, float64(c.w.MinFreeBytes()))
	ch <- prometheus.MustNewConstMetric(c.reads, prometheus.CounterValue, float64(st.MemoryReads), "memory")
	ch <- prometheus.MustNewConstMetric(c.reads, prometheus.CounterValue, float64(st.FileReads), "file")
	for name, pos := range st.Cursors {
		if c.configured != nil && !c.configured[name] {
			ch <- prometheus.MustNewConstMetric(c.orphaned, prometheus.GaugeValue, float64(st.NextSeq-1-min(pos, st.NextSeq-1)), name)
		}
	}
	// Every cursor's series, 0 before its first drop: an alert on its
	// increase then sees the first drops too.
	for name := range st.Cursors {
		ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(st.Dropped[name]), name)
	}
	for name, n := range st.Dropped {
		if _, ok := st.Cursors[name]; !ok {
			ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(n), name)
		}
	}
}
