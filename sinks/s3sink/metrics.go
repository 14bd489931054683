package s3sink

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are one sink's counters, children of vectors labelled by sink
// only: never by key or partition, whose number is unbounded.
type metrics struct {
	objects, bytes, uncompressed prometheus.Counter
	recovered, multipart         prometheus.Counter
	fallbacks, sanitised         prometheus.Counter
	// Keys If-None-Match: * found taken: holding this sink's own object
	// (counted as delivered), or another writer's (the sink pauses).
	conflictSame, conflictOther prometheus.Counter
	// Staging (see staging.go): members it had no room for or could not
	// write, staged objects rebuilt from the WAL or given up (neither
	// their file nor the WAL held them whole), and the bytes staged.
	stagingFull, stagingRebuilt, stagingGivenUp prometheus.Counter
	stagingBytes                                prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, sink string) (*metrics, error) {
	vec := func(name, help string, labels ...string) (*prometheus.CounterVec, error) {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, append([]string{"sink"}, labels...))
		if reg == nil {
			return v, nil
		}
		if err := reg.Register(v); err != nil {
			// Another S3 sink registered it: share its vector.
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
					return existing, nil
				}
			}
			return nil, err
		}
		return v, nil
	}
	m := &metrics{}
	for _, c := range []struct {
		dst        *prometheus.Counter
		name, help string
	}{
		{&m.objects, "forwarder_s3_objects_uploaded_total", "Objects uploaded to S3 (re-uploads after a crash included)."},
		{&m.bytes, "forwarder_s3_uploaded_bytes_total", "Bytes of objects uploaded to S3, as stored (compressed)."},
		{&m.uncompressed, "forwarder_s3_uncompressed_bytes_total", "Bytes of JSON lines in the objects uploaded to S3, before compression."},
		{&m.recovered, "forwarder_s3_recovered_intents_total", "Uploads a crash or shutdown interrupted, finished at the next start."},
		{&m.multipart, "forwarder_s3_multipart_uploads_total", "Objects uploaded in parts (multipart_threshold)."},
		{&m.fallbacks, "forwarder_s3_key_fallback_total", "Records whose key template named a missing field or tag part, rendered as \"unknown\"."},
		{&m.stagingFull, "forwarder_s3_staging_full_total", "Members of open objects that staging had no room for (staging_max_bytes) or could not write: each finished its object early, or began one held in memory."},
		{&m.stagingRebuilt, "forwarder_s3_staging_rebuilt_total", "Staged objects whose file was missing or damaged at upload, rebuilt from the WAL."},
		{&m.stagingGivenUp, "forwarder_s3_staging_given_up_total", "Staged objects whose file was damaged at upload and whose records the WAL no longer held all of (a damaged entry, or drop_oldest): given up, the records left sent again in new objects."},
		{&m.sanitised, "forwarder_s3_key_sanitised_total", "Records whose key had a value changed: a \"/\" in a tag or field rendered \"_\", an empty, \".\" or \"..\" path segment rendered with \"_\", a control character replaced, or values shortened to fit 1,024 bytes."},
	} {
		v, err := vec(c.name, c.help)
		if err != nil {
			return nil, err
		}
		*c.dst = v.WithLabelValues(sink)
	}
	conflicts, err := vec("forwarder_s3_conditional_conflicts_total",
		"Uploads refused because the key existed (412 to If-None-Match: *), by what it held: outcome=\"same\", this very object (an earlier upload landed; counted as delivered); outcome=\"other\", another writer's (the sink pauses).",
		"outcome")
	if err != nil {
		return nil, err
	}
	m.conflictSame, m.conflictOther = conflicts.WithLabelValues(sink, "same"), conflicts.WithLabelValues(sink, "other")
	staged := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "forwarder_s3_staging_bytes",
		Help: "Bytes of open objects' members staged on disk (bounded by staging_max_bytes)."}, []string{"sink"})
	if reg != nil {
		if err := reg.Register(staged); err != nil {
			var are prometheus.AlreadyRegisteredError
			existing, ok := (*prometheus.GaugeVec)(nil), false
			if errors.As(err, &are) {
				existing, ok = are.ExistingCollector.(*prometheus.GaugeVec)
			}
			if !ok {
				return nil, err
			}
			staged = existing
		}
	}
	m.stagingBytes = staged.WithLabelValues(sink)
	return m, nil
}
