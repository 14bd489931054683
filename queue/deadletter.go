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
// Dead letters that do not decode (damaged in the file) are skipped, and
// a *DamagedDeadLettersError counts them once the others are listed.
func DeadLetters(w *wal.WAL, sink string, fn func(DeadLetter) error) error {
	var damaged *DamagedDeadLettersError
	err := w.ScanState(sink, []byte(prefixDead), func(k, v []byte) error {
		var d DeadLetter
		if err := json.Unmarshal(v, &d); err != nil {
			if damaged == nil {
				damaged = &DamagedDeadLettersError{Sink: sink, Err: err}
				if len(k) == len(prefixDead)+8 {
					damaged.FirstSeq = be64(k[len(prefixDead):])
				}
			}
			damaged.Count++
			return nil
		}
		return fn(d)
	})
	if err == nil && damaged != nil {
		return damaged
	}
	return err
}

// DamagedDeadLettersError says how many of a sink's dead letters could not
// be decoded: their bytes in the WAL are damaged.
type DamagedDeadLettersError struct {
	Sink     string
	Count    int
	FirstSeq uint64 // the first one's record, when its key says it
	Err      error  // why the first one did not decode
}

func (e *DamagedDeadLettersError) Error() string {
	what := fmt.Sprintf("%d dead letters of sink %q are damaged and were left out", e.Count, e.Sink)
	if e.Count == 1 {
		what = fmt.Sprintf("1 dead letter of sink %q is damaged and was left out", e.Sink)
	}
	return fmt.Sprintf("%s (the first of record %d: %v); the others are listed", what, e.FirstSeq, e.Err)
}
