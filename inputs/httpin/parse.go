package httpin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/logfwd/forwarder/inputs"
	"github.com/logfwd/forwarder/wal"
)

// parseStats is what parsing a body counted besides its records.
type parseStats struct {
	invalidUTF8 int    // records whose invalid UTF-8 was replaced with U+FFFD
	badTime     int    // records whose time field is no time: stored with the time of arrival
	badTimeWhy  string // the first of them: where, and what
	nonFinite   int    // numbers written nan, inf, NaN or Infinity, stored as null
}

// badRequest is a body refused as a whole: nothing of it is stored.
type badRequest struct {
	reason string // the metric's reason: reasonMalformed or reasonTooManyRecords
	msg    string // for the client: where, and what
	status int    // 0: 400
}

func (e *badRequest) Error() string { return e.msg }

var utf8BOM = []byte("\xef\xbb\xbf")

// parseBody turns a request body into records of tag, or refuses it whole.
// The first byte that is not white space decides the form: '[' a JSON
// array of objects; '{' one object or many, each on its own line (NDJSON;
// blank lines are ignored, and a pretty-printed object or objects merely
// separated by white space are read as well). Each record's body is its
// object compacted, keys in the sender's order, with invalid UTF-8
// replaced; its time comes from the top-level field timeField (see
// eventTime), else now.
//
// The records' bodies share one buffer; every record has its own
// sub-slice of it, capped so that appending to one cannot reach another.
func parseBody(data []byte, tag, timeField string, now time.Time) ([]wal.Record, parseStats, error) {
	var buf []byte
	return parseInto(&buf, data, tag, timeField, now, limits{})
}

// limits bound what parsing a body may hold: at most maxRecords records
// (0: no bound), and buffers reserved from hold (nil: none) before they
// are allocated, waiting for room until ctx ends.
type limits struct {
	maxRecords int
	hold       *inputs.Hold
	ctx        context.Context
}

func (l limits) context() context.Context {
	if l.ctx == nil {
		return context.Background()
	}
	return l.ctx
}

// parseInto is parseBody writing the bodies into *buf (from its start). A
// *buf too small for data is replaced by a buffer reserved from lim.hold;
// *buf is the buffer the records point into after, and the records'
// slice is reserved from lim.hold too (its capacity): give both back with
// releaseBuf and releaseRecords. An error that is
// inputs.ErrOverBudget or inputs.ErrNoRoom is no room in the budget; any
// other is a *badRequest.
func parseInto(buf *[]byte, data []byte, tag, timeField string, now time.Time, lim limits) ([]wal.Record, parseStats, error) {
	out := *buf
	if cap(out) < len(data) {
		// Compacting never grows the bytes but for U+FFFD, which makes room for itself.
		var err error
		if out, err = reserveBuf(lim.context(), lim.hold, inputs.BufClass(len(data)), nil); err != nil {
			return nil, parseStats{}, err
		}
		if cap(*buf) > 0 {
			releaseBuf(lim.hold, *buf)
		}
		*buf = out
	}
	p := parser{
		s:   scanner{data: bytes.TrimPrefix(data, utf8BOM), timeField: timeField, out: out[:0]},
		now: now.UnixNano(),
		lim: lim,
	}
	p.s.grow = p.growOut
	defer func() {
		*buf = p.s.out
		lim.hold.Release(int64(cap(p.spans)) * spanSize)
	}()
	var err error
	p.s.skipSpace()
	switch {
	case p.s.pos == len(p.s.data):
	case p.s.data[p.s.pos] == '[':
		err = p.array()
	default:
		// About one record a line: size the spans once, from the lines
		// that came, and no more than the records a request may hold.
		n := bytes.Count(p.s.data, []byte{'\n'}) + 1
		if lim.maxRecords > 0 {
			n = min(n, lim.maxRecords+1)
		}
		if err = p.growSpans(n); err == nil {
			err = p.stream()
		}
	}
	if err != nil {
		return nil, parseStats{}, err
	}
	n := inputs.RecordsClass(len(p.spans))
	if n-len(p.spans) > len(p.spans)/4 {
		n = len(p.spans) // a class would waste more than it saves
	}
	if err := lim.hold.Grow(lim.context(), int64(n)*inputs.RecordSize); err != nil {
		return nil, parseStats{}, err
	}
	recs := inputs.GetRecords(n)[:len(p.spans)]
	for i, sp := range p.spans {
		recs[i] = wal.Record{Time: sp.time, Tag: tag, Body: p.s.out[sp.start:sp.end:sp.end]}
	}
	p.stats.nonFinite = p.s.nonFiniteSeen
	return recs, p.stats, nil
}

// releaseRecords gives back the records' slice of parseInto.
func releaseRecords(hold *inputs.Hold, recs []wal.Record) {
	hold.Release(int64(cap(recs)) * inputs.RecordSize)
	inputs.PutRecords(recs)
}

// spanSize is what one span takes, for the budget.
const spanSize = 24

type parser struct {
	s     scanner
	now   int64
	spans []span
	stats parseStats
	lim   limits
}

// growSpans makes room for n spans in all, reserved first.
func (p *parser) growSpans(n int) error {
	if n <= cap(p.spans) {
		return nil
	}
	if err := p.lim.hold.Grow(p.lim.context(), int64(n)*spanSize); err != nil {
		return err
	}
	grown := append(make([]span, 0, n), p.spans...)
	p.lim.hold.Release(int64(cap(p.spans)) * spanSize)
	p.spans = grown
	return nil
}

// growOut is the scanner's way to room for n more bytes of output: a
// bigger buffer, reserved first.
func (p *parser) growOut(n int) error {
	out := p.s.out
	size := inputs.BufClass(max(len(out)+n, cap(out)+cap(out)/4))
	grown, err := reserveBuf(p.lim.context(), p.lim.hold, size, nil)
	if err != nil {
		return err
	}
	p.s.out = append(grown, out...)
	releaseBuf(p.lim.hold, out)
	return nil
}

// span is a record's body in s.out, and its time.
type span struct {
	start, end int
	time       int64
}

// stream reads objects separated by white space: NDJSON, or one object.
func (p *parser) stream() error {
	for {
		p.s.skipSpace()
		if p.s.pos == len(p.s.data) {
			return nil
		}
		start := p.s.pos
		if err := p.record(); err != nil {
			// The line of the error, and that of its record's start when
			// the record spans lines (pretty-printed JSON).
			line := 1 + bytes.Count(p.s.data[:start], []byte{'\n'})
			at := line + bytes.Count(p.s.data[start:min(p.s.pos, len(p.s.data))], []byte{'\n'})
			if at == line {
				return p.at(fmt.Sprintf("line %d", line), err)
			}
			return p.at(fmt.Sprintf("line %d (in the record from line %d)", at, line), err)
		}
	}
}

// array reads a JSON array of objects.
func (p *parser) array() error {
	p.s.pos++
	p.s.skipSpace()
	if p.s.pos < len(p.s.data) && p.s.data[p.s.pos] == ']' {
		p.s.pos++
	} else {
		for n := 1; ; n++ {
			if err := p.record(); err != nil {
				return p.at(fmt.Sprintf("element %d", n), err)
			}
			p.s.skipSpace()
			if p.s.pos >= len(p.s.data) {
				return p.at(fmt.Sprintf("element %d", n), errEOF)
			}
			c := p.s.data[p.s.pos]
			p.s.pos++
			if c == ']' {
				break
			}
			if c != ',' {
				return p.at(fmt.Sprintf("element %d", n), p.s.badChar(p.s.pos-1, "after array element"))
			}
			p.s.skipSpace()
		}
	}
	p.s.skipSpace()
	if p.s.pos < len(p.s.data) {
		return p.at("after the array", p.s.badChar(p.s.pos, "after top-level value"))
	}
	return nil
}

// record scans the object at s.pos into a span.
func (p *parser) record() error {
	s := &p.s
	if s.pos >= len(s.data) {
		return errEOF
	}
	if p.lim.maxRecords > 0 && len(p.spans) >= p.lim.maxRecords {
		return errTooManyRecords
	}
	switch c := s.data[s.pos]; {
	case c == '{':
	case c == '[' || c == '"' || c == '-' || isDigit(c) || c == 't' || c == 'f' || c == 'n':
		return errNotObject
	default:
		return s.badChar(s.pos, "looking for beginning of value")
	}
	start := len(s.out)
	s.timeStart, s.nonASCII = -1, false
	if err := s.object(1); err != nil {
		return err
	}
	t := p.now
	if s.timeStart >= 0 {
		ns, ok, err := eventTime(s.out[s.timeStart:s.timeEnd])
		if s.timeNonFinite {
			err = errors.New("not a finite number")
		}
		switch {
		case err != nil:
			// Not bad input: the record is kept (its field as sent, in
			// the body), with the time of arrival, and counted.
			if p.stats.badTime++; p.stats.badTimeWhy == "" {
				p.stats.badTimeWhy = fmt.Sprintf("record %d: field %q: %v", len(p.spans)+1, s.timeField, err)
			}
		case ok:
			t = ns
		}
	}
	if s.nonASCII && !utf8.Valid(s.out[start:]) {
		// The record with its invalid UTF-8 replaced is written after it,
		// in room made first, then moved into its place; the room left
		// must still hold the rest of the body, which the scanner copies
		// without looking.
		end := len(s.out)
		n := inputs.ValidUTF8Len(s.out[start:end])
		if need := max(end+n, start+n+len(s.data)-s.pos); need > cap(s.out) {
			if err := p.growOut(need - end); err != nil {
				return err
			}
		}
		s.out = inputs.AppendValidUTF8(s.out, s.out[start:end])
		s.out = append(s.out[:start], s.out[end:]...)
		p.stats.invalidUTF8++
	}
	if len(p.spans) == cap(p.spans) {
		if err := p.growSpans(max(2*cap(p.spans), 64)); err != nil {
			return err
		}
	}
	p.spans = append(p.spans, span{start: start, end: len(s.out), time: t})
	return nil
}

var (
	errNotObject      = errors.New("not a JSON object")
	errTooManyRecords = errors.New("too many records")
)

// at names where in the body err happened, for the client. No room in the
// budget passes as it is: it is not the body's fault.
func (p *parser) at(where string, err error) error {
	switch {
	case errors.Is(err, inputs.ErrOverBudget), errors.Is(err, inputs.ErrNoRoom):
		return err
	case errors.Is(err, errTooManyRecords):
		return &badRequest{reason: reasonTooManyRecords, status: http.StatusRequestEntityTooLarge,
			msg: fmt.Sprintf("more than %d records in one request (max_records_per_request): nothing was stored; send them in several requests", p.lim.maxRecords)}
	case errors.Is(err, errNotObject):
		return &badRequest{reason: reasonMalformed, msg: where + ": " + err.Error()}
	}
	return &badRequest{reason: reasonMalformed, msg: where + ": invalid JSON: " + err.Error()}
}
