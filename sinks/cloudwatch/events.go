package cloudwatch

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/template"
)

// CloudWatch Logs limits of one PutLogEvents call.
const (
	maxEvents      = 10000
	maxBatchBytes  = 1048576
	eventOverhead  = 26
	maxMessage     = maxBatchBytes - eventOverhead // 1,048,550
	maxSpan        = 24 * time.Hour
	maxAge         = 14 * 24 * time.Hour
	maxFuture      = 2 * time.Hour
	partPrefixSize = len("[part 9999/9999] ")
)

// event is one log event and the record it came from.
type event struct {
	ts int64 // milliseconds
	// msg is the message; it shares the record's bytes (no copy per event)
	// unless the message had to be split or its UTF-8 repaired, and lives
	// no longer than the Send or Recover that made it.
	msg  []byte
	seq  uint64
	part int // index of the part of a split message; 0 for a message that is not split
}

// messageBytes is what a record ships as: its body, or the message_key
// field.
func (s *Sink) messageBytes(r *sinks.Record) []byte {
	if s.messageKey != nil {
		if v, ok := template.Lookup(r.Body, s.messageKey); ok && len(v) > 0 {
			return v
		}
	}
	return r.Body
}

// events turns a batch into events, sorted by time (then record and part:
// the sort is stable), and the records that are too old or too new to
// send. delivered, when not nil, leaves out the events it reports as
// delivered already; a record with such an event is sent (what is left of
// it) whatever its age, so that a record is never dead-lettered after part
// of it was delivered.
func (s *Sink) events(recs []sinks.Record, now time.Time, delivered func(*event) bool) ([]event, []sinks.Rejection) {
	evs := eventsBuffer(len(recs)) // one event a record but for split messages
	var rejected []sinks.Rejection
	oldest := now.Add(-maxAge).UnixMilli()
	newest := now.Add(maxFuture).UnixMilli()
	for i := range recs {
		r := &recs[i]
		ts := r.Time / int64(time.Millisecond)
		n := len(evs)
		var skipped bool
		evs, skipped = s.recordEvents(evs, r, ts, delivered)
		switch {
		case skipped:
		case ts < oldest:
			evs = evs[:n]
			rejected = append(rejected, sinks.Rejection{Seq: r.Seq, Reason: "too_old"})
		case ts > newest:
			evs = evs[:n]
			rejected = append(rejected, sinks.Rejection{Seq: r.Seq, Reason: "too_new"})
		}
	}
	sortEvents(evs)
	return evs, rejected
}

// eventSlices holds the event slices of sends that returned, for the
// events of the next: a call's events are 48 bytes a record, allocated and
// cleared per send otherwise.
var eventSlices sync.Pool // *[]event

// maxPooledEvents is the most events a slice eventSlices keeps has room
// for: a batch's, which is one call's at most but for split messages.
const maxPooledEvents = 2 * maxEvents

// eventsBuffer returns an empty event slice with room for n events.
func eventsBuffer(n int) []event {
	if p, _ := eventSlices.Get().(*[]event); p != nil && cap(*p) >= n {
		return (*p)[:0]
	}
	return make([]event, 0, n)
}

// releaseEvents gives the slice of events that are no longer used (the
// send that made them returned: no call's body or intent refers to them)
// to eventSlices, cleared so that it holds on to no record's bytes.
func releaseEvents(evs []event) {
	if c := cap(evs); c > 0 && c <= maxPooledEvents {
		evs = evs[:c]
		clear(evs)
		evs = evs[:0]
		eventSlices.Put(&evs)
	}
}

// sortEvents sorts events by time, stably. A stream's records mostly come
// in time order already: then there is nothing to move.
func sortEvents(evs []event) {
	byTime := func(a, b event) int { return cmp.Compare(a.ts, b.ts) }
	if !slices.IsSortedFunc(evs, byTime) {
		slices.SortStableFunc(evs, byTime)
	}
}

// allEvents are the events of recs, sorted as events sorts them, with no
// record left out for its age: what Recover rebuilds a call from.
func (s *Sink) allEvents(recs []sinks.Record) []event {
	evs := make([]event, 0, len(recs))
	for i := range recs {
		evs, _ = s.recordEvents(evs, &recs[i], recs[i].Time/int64(time.Millisecond), nil)
	}
	sortEvents(evs)
	return evs
}

// recordEvents appends r's events (one, or the parts of a split message)
// but those delivered reports, and says whether it left one out.
func (s *Sink) recordEvents(evs []event, r *sinks.Record, ts int64, delivered func(*event) bool) ([]event, bool) {
	msg := s.messageBytes(r)
	if !utf8.Valid(msg) { // bodies are valid; a message_key value may not be after unescaping
		msg = []byte(string([]rune(string(msg))))
	}
	if len(msg) <= maxMessage { // one event: no parts to make
		// Appended before delivered looks at it: an event of its own would
		// escape to the heap, one per record.
		evs = append(evs, event{ts: ts, msg: msg, seq: r.Seq})
		if delivered != nil && delivered(&evs[len(evs)-1]) {
			return evs[:len(evs)-1], true
		}
		return evs, false
	}
	skipped := false
	for i, part := range split(msg) {
		e := event{ts: ts, msg: part, seq: r.Seq, part: i}
		if delivered != nil && delivered(&e) {
			skipped = true
			continue
		}
		evs = append(evs, e)
	}
	return evs, skipped
}

// split cuts a message longer than one event can hold into numbered parts.
func split(msg []byte) [][]byte {
	if len(msg) <= maxMessage {
		return [][]byte{msg}
	}
	chunk := maxMessage - partPrefixSize
	var chunks [][]byte
	for len(msg) > 0 {
		n := min(chunk, len(msg))
		for n < len(msg) && n > 0 && !utf8.RuneStart(msg[n]) {
			n--
		}
		chunks = append(chunks, msg[:n])
		msg = msg[n:]
	}
	parts := make([][]byte, len(chunks))
	for i, c := range chunks {
		parts[i] = fmt.Appendf(nil, "[part %d/%d] %s", i+1, len(chunks), c)
	}
	return parts
}

// calls cuts sorted events into PutLogEvents calls within AWS's limits.
func calls(evs []event) [][]event {
	var out [][]event
	start, size := 0, 0
	for i, e := range evs {
		sz := len(e.msg) + eventOverhead
		if i > start && (i-start >= maxEvents || size+sz > maxBatchBytes || time.Duration(e.ts-evs[start].ts)*time.Millisecond > maxSpan) {
			out = append(out, evs[start:i])
			start, size = i, 0
		}
		size += sz
	}
	if start < len(evs) {
		out = append(out, evs[start:])
	}
	return out
}
