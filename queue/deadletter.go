package queue

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// DeadLetter is a record a sink's destination refused for good, kept in
// the WAL (bounded per sink) so that an operator can see and replay it.
type DeadLetter struct {
	Seq    uint64          `json:"seq"`
	Time   time.Time       `json:"time"` // event time
	Tag    string          `json:"tag"`
	Reason string          `json:"reason"`
	At     time.Time       `json:"dead_lettered_at"`
	Body   json.RawMessage `json:"body"` // the record's JSON body (a JSON string if it was not JSON)
}

func encodeDeadLetter(r *sinks.Record, reason string, at time.Time) []byte {
	d := DeadLetter{Seq: r.Seq, Time: time.Unix(0, r.Time).UTC(), Tag: r.Tag, Reason: reason, At: at.UTC(), Body: r.Body}
	if !json.Valid(r.Body) {
		d.Body, _ = json.Marshal(string(r.Body))
	}
	b, _ := json.Marshal(d) // cannot fail: every field is plain or checked JSON
	return b
}

// DeadLetters calls fn for each dead letter stored for sink, oldest first.
func DeadLetters(w *wal.WAL, sink string, fn func(DeadLetter) error) error {
	return w.ScanState(sink, []byte(prefixDead), func(k, v []byte) error {
		var d DeadLetter
		if err := json.Unmarshal(v, &d); err != nil {
			return fmt.Errorf("decode dead letter %x of sink %q: %w", k, sink, err)
		}
		return fn(d)
	})
}
