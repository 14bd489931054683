// Package inputs holds what the forward and HTTP inputs share: the view of
// the WAL they append to, the routing rule that keeps records no sink
// wants out of the WAL, the UTF-8 rule for record bodies, and their
// metrics. The protocols live in inputs/forward and inputs/httpin.
package inputs

import (
	"bytes"
	"context"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/logfwd/forwarder/wal"
)

// Appender is what an input needs of the WAL: Append returns once the
// records are durable, and only then may the input acknowledge them.
type Appender interface {
	Append(ctx context.Context, recs []wal.Record, opts wal.AppendOptions) (wal.Result, error)
	// Full reports that appends are waiting for room (wal.when_full: block, or
	// wal.min_free_bytes); DiskFull, that they wait for room on the disk.
	Full() bool
	DiskFull() bool
}

var _ Appender = (*wal.WAL)(nil)

// Pipeline is where an input hands its records.
type Pipeline struct {
	WAL Appender
	// Routed reports whether some sink wants records of this tag. A record
	// no sink wants is counted and not stored, and still acknowledged.
	// Nil: every tag is routed.
	Routed  func(tag string) bool
	Metrics *Metrics
	// Budget bounds the bytes both inputs hold (see Budget). Nil: each
	// input makes one of DefaultBudget bytes for itself.
	Budget *Budget
	// Unrouted, if set, warns of the tags no sink matched.
	Unrouted *UnroutedLog
}

// DefaultBudget is the budget of an input given none: what the default
// memory_limit gives (config.Config.InputMemory).
const DefaultBudget = 48 << 20

// Store routes records and appends the routed ones in one WAL transaction,
// with id's chunk id (ForwardChunkID, HTTPChunkID) and digest. It returns
// once they are durable; an id stored before with another digest is
// wal.ErrChunkConflict, and nothing is stored. input names the input in the
// metrics. Records that no sink wants are dropped from recs before the
// append (recs is modified).
func (p *Pipeline) Store(ctx context.Context, input string, recs []wal.Record, id wal.AppendOptions) (wal.Result, error) {
	kept := recs[:0]
	runTag, run := "", 0 // a run of unrouted records of one tag, noted at once
	lastTag, routed := "", false
	for i, r := range recs {
		// A message or request has one tag: its routing is worked out once.
		if i == 0 || r.Tag != lastTag {
			lastTag, routed = r.Tag, p.Routed == nil || p.Routed(r.Tag)
		}
		if routed {
			kept = append(kept, r)
			continue
		}
		if run > 0 && r.Tag != runTag {
			p.Unrouted.Note(runTag, run)
			run = 0
		}
		runTag, run = r.Tag, run+1
	}
	if run > 0 {
		p.Unrouted.Note(runTag, run)
	}
	if n := len(recs) - len(kept); n > 0 {
		p.Metrics.Unrouted.WithLabelValues(input).Add(float64(n))
	}
	if len(kept) == 0 {
		return wal.Result{}, nil
	}
	res, err := p.WAL.Append(ctx, kept, id)
	if err != nil {
		return res, err
	}
	if res.Duplicate {
		p.Metrics.Deduplicated.WithLabelValues(input).Add(float64(len(kept)))
		return res, nil
	}
	size := 0
	for _, r := range kept {
		size += len(r.Body)
	}
	p.Metrics.Records.WithLabelValues(input).Add(float64(len(kept)))
	p.Metrics.Bytes.WithLabelValues(input).Add(float64(size))
	return res, nil
}

// ValidUTF8 returns body with every invalid UTF-8 sequence replaced by
// U+FFFD, and whether it replaced anything. Invalid UTF-8 in a record is
// not bad input: it is replaced and counted (forwarder_input_invalid_utf8_records_total).
func ValidUTF8(body []byte) ([]byte, bool) {
	if utf8.Valid(body) {
		return body, false
	}
	return bytes.ToValidUTF8(body, []byte("\uFFFD")), true
}

// AppendValidUTF8 appends src to dst with each run of invalid UTF-8 replaced
// by U+FFFD, as bytes.ToValidUTF8 does, so that the caller can make room
// first (ValidUTF8Len) instead of having a copy allocated.
func AppendValidUTF8(dst, src []byte) []byte {
	invalid := false
	for i := 0; i < len(src); {
		if c := src[i]; c < utf8.RuneSelf {
			dst = append(dst, c)
			invalid = false
			i++
			continue
		}
		_, n := utf8.DecodeRune(src[i:])
		if n == 1 {
			if !invalid {
				dst = append(dst, "\uFFFD"...)
				invalid = true
			}
			i++
			continue
		}
		dst = append(dst, src[i:i+n]...)
		invalid = false
		i += n
	}
	return dst
}

// ValidUTF8Len is the length of src once AppendValidUTF8 has replaced its
// invalid UTF-8.
func ValidUTF8Len(src []byte) int {
	n, invalid := 0, false
	for i := 0; i < len(src); {
		if src[i] < utf8.RuneSelf {
			n, invalid = n+1, false
			i++
			continue
		}
		_, w := utf8.DecodeRune(src[i:])
		if w == 1 {
			if !invalid {
				n += len("\uFFFD")
				invalid = true
			}
			i++
			continue
		}
		n, invalid = n+w, false
		i += w
	}
	return n
}

// Metrics are the inputs' Prometheus metrics, labelled by input ("forward", "http").
type Metrics struct {
	Records      *prometheus.CounterVec // records stored
	Bytes        *prometheus.CounterVec // body bytes stored
	Rejected     *prometheus.CounterVec // requests or messages refused, by reason
	Deduplicated *prometheus.CounterVec // records acknowledged again without being stored (a re-sent chunk)
	ChunkReused  *prometheus.CounterVec // forward chunk ids reused for another message: stored without deduplication
	Unrouted     *prometheus.CounterVec // records no sink matches: acknowledged, not stored
	InvalidUTF8  *prometheus.CounterVec // records whose invalid UTF-8 was replaced
	BadTime      *prometheus.CounterVec // records whose time field was no time: stored with the time of arrival
	NilRecords   *prometheus.CounterVec // nil records (forward): acknowledged with their message, nothing stored
	NotMaps      *prometheus.CounterVec // records that are not maps (forward): acknowledged with their message, skipped
	Connections  *prometheus.GaugeVec   // open connections
	AcceptErrors *prometheus.CounterVec // accepts that failed and were retried (see RetryAccept)
	MemoryHeld   *prometheus.GaugeVec   // bytes held of the Budget
	MemoryLimit  prometheus.Gauge       // the Budget's size
	MemoryWaits  *prometheus.CounterVec // reservations that waited for room in the Budget
}

// Init makes input's series of every metric labelled by input alone, at 0,
// so that they are there from the start: an alert's increase() sees the
// first count, a dashboard's rate() has no gap after a restart. The
// forward input's own (chunk ids reused, nil and non-map records) are made
// for it only.
func (m *Metrics) Init(input string) {
	for _, v := range []*prometheus.CounterVec{m.Records, m.Bytes, m.Deduplicated, m.Unrouted, m.InvalidUTF8, m.BadTime, m.AcceptErrors, m.MemoryWaits} {
		v.WithLabelValues(input)
	}
	m.Connections.WithLabelValues(input)
	m.MemoryHeld.WithLabelValues(input)
	if input == "forward" {
		m.ChunkReused.WithLabelValues(input)
		m.NilRecords.WithLabelValues(input)
		m.NotMaps.WithLabelValues(input)
	}
}

// NewMetrics creates the metrics and registers them with reg (nil: none).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	in := []string{"input"}
	m := &Metrics{
		Records: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "forwarder_input_records_total",
			Help: "Records stored in the WAL and acknowledged."}, in),
		Bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "forwarder_input_bytes_total",
			Help: "Bytes of record bodies (JSON) stored."}, in),
		Rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "forwarder_input_rejected_total",
			Help: "Messages or requests refused (nothing of them stored), by reason."}, []string{"input", "reason"}),
		Deduplicated: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "forwarder_input_deduplicated_records_total",
			Help: "Records of a re-sent chunk or Idempotency-Key, acknowledged again without being stored twice."}, in),
		ChunkReused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "forwarder_input_chunk_id_reused_total",
			Help: "Forward messages whose chunk id was stored within dedup_window for another message (a client that reuses ids): stored and acknowledged without deduplication."}, in),
		Unrouted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "forwarder_input_unrouted_records_total",
			Help: "Records whose tag matches no sink: acknowledged and not stored."}, in),
		InvalidUTF8: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "forwarder_input_invalid_utf8_records_total",
			Help: "Records with invalid UTF-8, stored with U+FFFD in its place."}, in),
		BadTime: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "forwarder_input_bad_time_records_total",
			Help: "Records whose time field is not a time the input reads, stored with the time of arrival (the field kept as sent)."}, in),
		NilRecords: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "forwarder_input_nil_records_total",
			Help: "Forward entries whose record is nil, skipped as Fluentd's in_forward skips them: acknowledged with their message, nothing stored."}, in),
		NotMaps: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "forwarder_input_not_map_records_total",
			Help: "Forward entries whose record is not a map (a string, a number, an array), skipped as Fluentd's in_forward skips invalid events: acknowledged with their message, not stored."}, in),
		Connections: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "forwarder_input_connections",
			Help: "Open client connections."}, in),
		AcceptErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "forwarder_input_accept_errors_total",
			Help: "Accepts of a client connection that failed for a reason that passes (no file descriptor left, a connection aborted) and were retried."}, in),
		MemoryHeld: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "forwarder_input_memory_bytes",
			Help: "Bytes the input holds of the inputs' memory budget: messages and bodies read, decompressed and decoded."}, in),
		MemoryLimit: prometheus.NewGauge(prometheus.GaugeOpts{Name: "forwarder_input_memory_limit_bytes",
			Help: "The most the inputs hold together: their memory budget (three eighths of memory_limit, the most one message or request may take) and a sixteenth more kept for small ones."}),
		MemoryWaits: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "forwarder_input_memory_waits_total",
			Help: "Times a connection or request waited for room in the inputs' memory budget (the forward input reads no further meanwhile)."}, in),
	}
	if reg != nil {
		reg.MustRegister(m.Records, m.Bytes, m.Rejected, m.Deduplicated, m.ChunkReused, m.Unrouted, m.InvalidUTF8, m.BadTime, m.NilRecords, m.NotMaps, m.Connections, m.AcceptErrors,
			m.MemoryHeld, m.MemoryLimit, m.MemoryWaits)
	}
	return m
}
