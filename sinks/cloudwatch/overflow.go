package cloudwatch

import (
	"time"

	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/template"
)

var _ sinks.Overflower = (*Sink)(nil)

// emptyObject is the body the overflow partition is rendered from.
var emptyObject = []byte("{}")

// Overflow is the log group and stream of a record beyond max_partitions:
// the names rendered as for a record without fields whose tag is the
// fallback ("/eks/unknown" and "unknown-HOST" with the default names), so
// that ${hostname} still gives each replica a stream of its own.
func (s *Sink) Overflow(r *sinks.Record) string {
	if !s.timed && s.overflow != "" {
		return s.overflow // the same for every record
	}
	return s.partition(&sinks.Record{Seq: r.Seq, Time: r.Time, Tag: s.cfg.Fallback, Body: emptyObject}, false)
}

// Family is r's group and stream with the event time left out of them
// (names with strftime verbs render those of the Unix epoch): what
// max_partitions counts.
func (s *Sink) Family(r *sinks.Record, partition string) string {
	if !s.timed {
		return partition
	}
	return s.partition(&sinks.Record{Seq: r.Seq, Tag: r.Tag, Body: r.Body}, false)
}

// Explain names the template and placeholder that took the most values in
// recs, records that went to the overflow partition.
func (s *Sink) Explain(recs []sinks.Record) string {
	ds := make([]template.Data, len(recs))
	for i, r := range recs {
		ds[i] = template.Data{Tag: r.Tag, Body: r.Body, Time: time.Unix(0, r.Time)}
	}
	return template.Spread([]template.Named{{Key: "log_group", T: s.group}, {Key: "log_stream", T: s.stream}}, ds, s.cfg.Fallback)
}

// routed is the partition the drainer gives r (State.Admitted): what
// Recover keeps a range's records by.
func (s *Sink) routed(st sinks.State, r *sinks.Record) string {
	p := s.partition(r, false)
	if st.Admitted(s.Family(r, p), r.Seq) {
		return p
	}
	return s.Overflow(r)
}
