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
}

// NewWALCollector returns a collector for w.
func NewWALCollector(w *wal.WAL, maxBytes int64) *WALCollector {
	return &WALCollector{w: w, maxBytes: maxBytes,
		bytes:   prometheus.NewDesc("forwarder_wal_bytes", "Live records in the WAL, bytes as stored (what wal.max_bytes bounds).", nil, nil),
		maxB:    prometheus.NewDesc("forwarder_wal_max_bytes", "wal.max_bytes.", nil, nil),
		file:    prometheus.NewDesc("forwarder_wal_file_bytes", "Size of the WAL file (its high-water mark).", nil, nil),
		records: prometheus.NewDesc("forwarder_wal_records", "Live records in the WAL.", nil, nil),
		full:    prometheus.NewDesc("forwarder_wal_full", "1 while appends wait for room (wal.when_full: block).", nil, nil),
		failed:  prometheus.NewDesc("forwarder_wal_failed", "1 after a commit failed in a way that leaves durability unknown; the service stops.", nil, nil),
		commits: prometheus.NewDesc("forwarder_wal_commits_total", "WAL transactions committed (each one fsync in sync: always).", nil, nil),
		dropped: prometheus.NewDesc("forwarder_wal_dropped_records_total", "Records wal.when_full: drop_oldest deleted before the sink passed them.", []string{"sink"}, nil),
	}
}

func (c *WALCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.bytes, c.maxB, c.file, c.records, c.full, c.failed, c.commits, c.dropped} {
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
	for name, n := range st.Dropped {
		ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(n), name)
	}
}
