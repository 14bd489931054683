package httpin

import (
	"bytes"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/logfwd/forwarder/inputs"
	"github.com/logfwd/forwarder/wal"
)

// parseStats is what parsing a body counted besides its records.
type parseStats struct {
	invalidUTF8 int // records whose invalid UTF-8 was replaced with U+FFFD
}

// badRequest is a body refused as a whole: nothing of it is stored.
type badRequest struct {
	reason string // the metric's reason: reasonMalformed or reasonBadTime
	msg    string // for the client: where, and what
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
	return parseInto(&buf, data, tag, timeField, now)
}

// parseInto is parseBody writing the bodies into *buf (from its start,
// growing it as needed); *buf is the buffer the records point into after.
func parseInto(buf *[]byte, data []byte, tag, timeField string, now time.Time) ([]wal.Record, parseStats, error) {
	out := *buf
	if cap(out) < len(data) {
		out = make([]byte, 0, len(data)) // compacting never grows the bytes but for U+FFFD
	}
	p := parser{
		s:   scanner{data: bytes.TrimPrefix(data, utf8BOM), timeField: timeField, out: out[:0]},
		now: now.UnixNano(),
	}
	defer func() { *buf = p.s.out }()
	var err error
	p.s.skipSpace()
	switch {
	case p.s.pos == len(p.s.data):
	case p.s.data[p.s.pos] == '[':
		err = p.array()
	default:
		// About one record a line: size the spans once.
		p.spans = make([]span, 0, bytes.Count(p.s.data, []byte{'\n'})+1)
		err = p.stream()
	}
	if err != nil {
		return nil, parseStats{}, err
	}
	recs := make([]wal.Record, len(p.spans))
	for i, sp := range p.spans {
		recs[i] = wal.Record{Time: sp.time, Tag: tag, Body: p.s.out[sp.start:sp.end:sp.end]}
	}
	return recs, p.stats, nil
}

type parser struct {
	s     scanner
	now   int64
	spans []span
	stats parseStats
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
			line := 1 + bytes.Count(p.s.data[:start], []byte{'\n'})
			return at(fmt.Sprintf("line %d", line), err)
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
				return at(fmt.Sprintf("element %d", n), err)
			}
			p.s.skipSpace()
			if p.s.pos >= len(p.s.data) {
				return at(fmt.Sprintf("element %d", n), errEOF)
			}
			c := p.s.data[p.s.pos]
			p.s.pos++
			if c == ']' {
				break
			}
			if c != ',' {
				return at(fmt.Sprintf("element %d", n), p.s.badChar(p.s.pos-1, "after array element"))
			}
			p.s.skipSpace()
		}
	}
	p.s.skipSpace()
	if p.s.pos < len(p.s.data) {
		return at("after the array", p.s.badChar(p.s.pos, "after top-level value"))
	}
	return nil
}

// record scans the object at s.pos into a span.
func (p *parser) record() error {
	s := &p.s
	if s.pos >= len(s.data) {
		return errEOF
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
		if err != nil {
			return &timeError{field: s.timeField, err: err}
		}
		if ok {
			t = ns
		}
	}
	if s.nonASCII && !utf8.Valid(s.out[start:]) {
		fixed, _ := inputs.ValidUTF8(s.out[start:])
		s.out = append(s.out[:start], fixed...)
		p.stats.invalidUTF8++
	}
	p.spans = append(p.spans, span{start: start, end: len(s.out), time: t})
	return nil
}

var errNotObject = errors.New("not a JSON object")

type timeError struct {
	field string
	err   error
}

func (e *timeError) Error() string { return fmt.Sprintf("field %q: %v", e.field, e.err) }

// at names where in the body err happened, for the client.
func at(where string, err error) error {
	var te *timeError
	switch {
	case errors.As(err, &te):
		return &badRequest{reason: reasonBadTime, msg: where + ": " + te.Error()}
	case errors.Is(err, errNotObject):
		return &badRequest{reason: reasonMalformed, msg: where + ": " + err.Error()}
	}
	return &badRequest{reason: reasonMalformed, msg: where + ": invalid JSON: " + err.Error()}
}
