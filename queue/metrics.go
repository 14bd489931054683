package queue

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the drainers' Prometheus metrics, labelled by sink and never
// by partition (a CloudWatch stream, an S3 key): their number is unbounded.
type Metrics struct {
	Delivered    *prometheus.CounterVec   // records accepted by the destination
	Batches      *prometheus.CounterVec   // batches delivered
	Retries      *prometheus.CounterVec   // failed sends that will be retried, by class and reason
	DeadLetters  *prometheus.CounterVec   // records dead-lettered, by reason
	Evicted      *prometheus.CounterVec   // dead letters removed to keep the bound
	DeadStored   *prometheus.GaugeVec     // dead letters the WAL keeps for the sink
	Skipped      *prometheus.CounterVec   // records skipped after a restart: their partition had delivered them
	EarlyCuts    *prometheus.CounterVec   // batches sent before they were full or old: open partitions' bound, memory, a full WAL
	Spills       *prometheus.CounterVec   // times a partition's queued records were released from memory while it waited out a retry
	Reread       *prometheus.CounterVec   // records the catch-up reader read again for spilled partitions
	LagRecords   *prometheus.GaugeVec     // records in the WAL the sink has not passed
	LagSeconds   *prometheus.GaugeVec     // how long the oldest record the sink has not passed has been in the WAL
	InFlight     *prometheus.GaugeVec     // partitions with a batch in flight
	Paused       *prometheus.GaugeVec     // 1 while a sink-permanent error pauses the sink
	Buffered     *prometheus.GaugeVec     // bytes of records held in memory
	SendDuration *prometheus.HistogramVec // time of one Send
	Admitted     *prometheus.GaugeVec     // partitions admitted under max_partitions
	Overflowed   *prometheus.CounterVec   // records sent to the overflow partition: max_partitions was reached
}

// NewMetrics creates the metrics and registers them with reg (nil: none).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	sink := []string{"sink"}
	m := &Metrics{
		Delivered: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "forwarder_sink_delivered_records_total",
			Help: "Records the sink's destination accepted."}, sink),
		Batches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "forwarder_sink_delivered_batches_total",
			Help: "Batches the sink's destination accepted (some of their records at least: not one whose records were all dead-lettered)."}, sink),
		Retries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "forwarder_sink_retries_total",
			Help: "Failed sends that will be retried (not lost), by error class and reason; a paused sink's refused probes count under sink_permanent."}, []string{"sink", "class", "reason"}),
		DeadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "forwarder_sink_dead_letters_total",
			Help: "Records the destination refused for good, kept as dead letters, by reason."}, []string{"sink", "reason"}),
		Evicted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "forwarder_sink_dead_letters_evicted_total",
			Help: "Oldest dead letters removed to keep the per-sink bound."}, sink),
		DeadStored: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "forwarder_sink_dead_letters_stored",
			Help: "Dead letters the WAL keeps for the sink (the newest 10,000); read from the WAL at start, so it survives restarts."}, sink),
		Skipped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "forwarder_sink_skipped_delivered_records_total",
			Help: "Records skipped after a restart because their partition had already delivered them."}, sink),
		EarlyCuts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "forwarder_sink_early_cuts_total",
			Help: "Batches (S3 objects) sent before they were full or old: to keep the open ones within the sink's bound (max_open_objects) or its memory, or to free a full WAL whose furthest cursor is the sink's."}, sink),
		Spills: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "forwarder_sink_spills_total",
			Help: "Times a partition's queued records were released from memory while it waited out a retry and the sink's memory share was full; they stay in the WAL and are read again once it can send (not lost)."}, sink),
		Reread: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "forwarder_sink_reread_records_total",
			Help: "Records read again from the WAL for partitions that were spilled, in one pass for all of them (the catch-up after an outage)."}, sink),
		LagRecords: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "forwarder_sink_lag_records",
			Help: "Records in the WAL that the sink has not passed yet."}, sink),
		LagSeconds: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "forwarder_sink_lag_seconds",
			Help: "How long the oldest record the sink has not passed has been in the WAL (for one from before the last start: its event-time age, at least the time since the start); 0 when caught up."}, sink),
		InFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "forwarder_sink_inflight_partitions",
			Help: "Partitions with a batch in flight."}, sink),
		Paused: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "forwarder_sink_paused",
			Help: "1 while a sink-permanent error (credentials, access, missing bucket) pauses the sink."}, sink),
		Buffered: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "forwarder_sink_buffered_bytes",
			Help: "Bytes of records the drainer holds in memory for the sink."}, sink),
		SendDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "forwarder_sink_send_duration_seconds",
			Help: "Duration of one send to the destination, failed or not (a batch the sink only takes into what it carries, an S3 member compressed into its open object, is not one).", Buckets: prometheus.ExponentialBuckets(0.005, 2, 14)}, sink),
		Admitted: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "forwarder_sink_admitted_partitions",
			Help: "Partitions admitted under the sink's max_partitions (those idle for 10 minutes are let go)."}, sink),
		Overflowed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "forwarder_sink_overflow_records_total",
			Help: "Records that went to the sink's overflow partition because max_partitions partitions were admitted (delivered there, not dropped)."}, sink),
	}
	if reg != nil {
		reg.MustRegister(m.Delivered, m.Batches, m.Retries, m.DeadLetters, m.Evicted, m.DeadStored, m.Skipped, m.EarlyCuts, m.Spills, m.Reread, m.LagRecords,
			m.LagSeconds, m.InFlight, m.Paused, m.Buffered, m.SendDuration, m.Admitted, m.Overflowed)
	}
	return m
}
