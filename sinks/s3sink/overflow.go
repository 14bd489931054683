package s3sink

import (
	"time"

	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/template"
)

var _ sinks.Overflower = (*Sink)(nil)

// emptyObject is the body the overflow partition is rendered from.
var emptyObject = []byte("{}")

// Overflow is the key of a record beyond max_partitions: the key rendered
// as for a record without fields whose tag is the fallback, at r's time
// (logs/unknown/2026/12/02/03/HOST-SEQ.json.gz with the default key): one
// object per time bucket, as for any partition.
func (s *Sink) Overflow(r *sinks.Record) string { return s.keys.overflow(r) }

func (k *keyRenderer) overflow(r *sinks.Record) string {
	p, _ := k.partition(&sinks.Record{Seq: r.Seq, Time: r.Time, Tag: fallback, Body: emptyObject})
	return p
}

// Family is r's partition with the time bucket left out (the key rendered
// at the Unix epoch): what max_partitions counts, so that every hour of a
// tag's objects counts once.
func (s *Sink) Family(r *sinks.Record, partition string) string { return s.keys.family(r, partition) }

func (k *keyRenderer) family(r *sinks.Record, partition string) string {
	if k.tmpl.Finest() == 0 {
		return partition
	}
	p, _ := k.partition(&sinks.Record{Seq: r.Seq, Tag: r.Tag, Body: r.Body})
	return p
}

// Explain names the placeholder of the key that took the most values in
// recs, records that went to the overflow partition.
func (s *Sink) Explain(recs []sinks.Record) string {
	ds := make([]template.Data, len(recs))
	for i, r := range recs {
		ds[i] = template.Data{Tag: r.Tag, Body: r.Body, Time: time.Unix(0, r.Time)}
	}
	return template.Spread([]template.Named{{Key: "key", T: s.keys.tmpl}}, ds, fallback)
}

// routed is the partition the drainer gives r (State.Admitted), with keys
// rendering the sink's partitions: what Recover and a rebuild keep a
// range's records by.
func routed(st sinks.State, keys *keyRenderer, r *sinks.Record) string {
	p, _ := keys.partition(r)
	if st.Admitted(keys.family(r, p), r.Seq) {
		return p
	}
	return keys.overflow(r)
}
