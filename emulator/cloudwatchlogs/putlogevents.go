package cloudwatchlogs

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"sort"
	"unicode/utf8"
)

// Limits of one PutLogEvents call.
const (
	MaxBatchEvents  = 10_000
	MaxBatchBytes   = 1_048_576 // sum over the events of UTF-8 len(message) + EventOverhead
	MaxEventBytes   = 1_048_576 // one event's len(message) + EventOverhead
	EventOverhead   = 26
	MaxBatchSpanMs  = 24 * 3600 * 1000
	MaxPastAgeMs    = 14 * 24 * 3600 * 1000
	MaxFutureSkewMs = 2 * 3600 * 1000
	dayMs           = 24 * 3600 * 1000
)

type inputEvent struct {
	Timestamp *int64          `json:"timestamp"`
	Message   json.RawMessage `json:"message"`
}

type putLogEventsIn struct {
	LogGroupName  *string       `json:"logGroupName"`
	LogStreamName *string       `json:"logStreamName"`
	LogEvents     *[]inputEvent `json:"logEvents"`
	SequenceToken *string       `json:"sequenceToken"`
}

type rejectedInfo struct {
	TooNewLogEventStartIndex *int32 `json:"tooNewLogEventStartIndex,omitempty"`
	TooOldLogEventEndIndex   *int32 `json:"tooOldLogEventEndIndex,omitempty"`
	ExpiredLogEventEndIndex  *int32 `json:"expiredLogEventEndIndex,omitempty"`
}

type putLogEventsOut struct {
	NextSequenceToken     string        `json:"nextSequenceToken,omitempty"`
	RejectedLogEventsInfo *rejectedInfo `json:"rejectedLogEventsInfo,omitempty"`
}

func int32p(v int) *int32 { x := int32(v); return &x }

func (s *Server) putLogEvents(body []byte) (any, *apiError) {
	var events []storedEvent
	var hash [32]byte
	return serve(s, body, handler[putLogEventsIn]{find: findStream,
		check: func(in *putLogEventsIn) (string, string, *apiError) {
			if e := checkGroupName("logGroupName", in.LogGroupName); e != nil {
				return "", "", e
			}
			if e := checkStreamName("logStreamName", in.LogStreamName); e != nil {
				return "", "", e
			}
			if in.LogEvents == nil {
				return "", "", notNull("logEvents")
			}
			raw := *in.LogEvents
			if len(raw) == 0 {
				return "", "", validation("[]", "logEvents", "Member must have length greater than or equal to 1")
			}
			if len(raw) > MaxBatchEvents {
				return "", "", invalidParam("1 validation error detected: Value at 'logEvents' failed to satisfy constraint: Member must have length less than or equal to %d", MaxBatchEvents)
			}

			events = make([]storedEvent, len(raw))
			total := 0
			h := sha256.New()
			for i, ev := range raw {
				path := fmt.Sprintf("logEvents.%d.member", i+1)
				if ev.Timestamp == nil {
					return "", "", notNull(path + ".timestamp")
				}
				msg, e := decodeMessage(ev.Message, path+".message")
				if e != nil {
					return "", "", e
				}
				if len(msg) == 0 {
					return "", "", validation("", path+".message", "Member must have length greater than or equal to 1")
				}
				size := len(msg) + EventOverhead
				if size > MaxEventBytes {
					return "", "", invalidParam("Log event too large: %d bytes exceeds limit of %d", size, MaxEventBytes)
				}
				total += size
				events[i].Timestamp = *ev.Timestamp
				events[i].Message = msg
				var n [8]byte
				binary.BigEndian.PutUint64(n[:], uint64(len(msg)))
				h.Write(n[:])
				h.Write([]byte(msg))
			}
			if total > MaxBatchBytes {
				return "", "", invalidParam("Upload too large: %d bytes exceeds limit of %d", total, MaxBatchBytes)
			}
			for i := 1; i < len(events); i++ {
				if events[i].Timestamp < events[i-1].Timestamp {
					return "", "", invalidParam("Log events in a single PutLogEvents request must be in chronological order.")
				}
			}
			h.Sum(hash[:0])
			return *in.LogGroupName, *in.LogStreamName, nil
		},
		run: func(in *putLogEventsIn, g *group, st *stream) (any, *apiError) {
			retention := g.retention

			s.swMu.Lock()
			legacy := s.legacyTokens
			s.swMu.Unlock()

			st.mu.Lock()
			defer st.mu.Unlock()

			current := st.token()
			if legacy {
				given := ""
				if in.SequenceToken != nil {
					given = *in.SequenceToken
				}
				if given != current {
					expected := any(nil)
					shown := "null"
					if current != "" {
						expected, shown = current, current
					}
					if st.puts > 0 && given == st.prevToken && hash == st.lastHash {
						e := clientErr("DataAlreadyAcceptedException", "The given batch of log events has already been accepted. The next batch can be sent with sequenceToken: %s", shown)
						e.Extra = map[string]any{"expectedSequenceToken": expected}
						return nil, e
					}
					e := clientErr("InvalidSequenceTokenException", "The given sequenceToken is invalid. The next expected sequenceToken is: %s", shown)
					e.Extra = map[string]any{"expectedSequenceToken": expected}
					return nil, e
				}
			}

			// Events are sorted, so each rule rejects a prefix or a suffix.
			now := s.nowMs()
			n := len(events)
			tooOld := sort.Search(n, func(i int) bool { return events[i].Timestamp >= now-MaxPastAgeMs })
			expired := 0
			if retention > 0 {
				expired = sort.Search(n, func(i int) bool { return events[i].Timestamp >= now-int64(retention)*dayMs })
			}
			tooNew := sort.Search(n, func(i int) bool { return events[i].Timestamp > now+MaxFutureSkewMs })
			lo, hi := max(tooOld, expired), tooNew
			if hi-lo > 1 && events[hi-1].Timestamp-events[lo].Timestamp > MaxBatchSpanMs {
				return nil, invalidParam("The batch of log events in a single PutLogEvents request cannot span more than 24 hours.")
			}

			out := putLogEventsOut{}
			if tooOld > 0 || expired > tooOld || tooNew < n {
				info := &rejectedInfo{}
				if tooOld > 0 {
					info.TooOldLogEventEndIndex = int32p(tooOld)
				}
				if expired > tooOld {
					info.ExpiredLogEventEndIndex = int32p(expired)
				}
				if tooNew < n {
					info.TooNewLogEventStartIndex = int32p(tooNew)
				}
				out.RejectedLogEventsInfo = info
			}

			if hi > lo {
				batch := events[lo:hi]
				for i := range batch {
					batch[i].IngestionTime = now
					batch[i].id = s.eventIDs.Add(1)
					st.bytes += int64(len(batch[i].Message))
				}
				st.insert(batch)
				st.lastIngestion = now
			}
			st.prevToken = current
			st.lastHash = hash
			st.puts++
			out.NextSequenceToken = st.token()
			return out, nil
		}})
}

// decodeMessage turns a JSON string into a Go string, refusing invalid UTF-8:
// raw bytes that are not UTF-8, and \u escapes of unpaired surrogates (which
// encoding/json would silently turn into U+FFFD).
func decodeMessage(raw json.RawMessage, path string) (string, *apiError) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", notNull(path)
	}
	if raw[0] != '"' {
		return "", clientErr("SerializationException", "Expected a string at '%s'.", path)
	}
	if !utf8.Valid(raw) || hasLoneSurrogate(raw) {
		return "", invalidParam("Invalid UTF-8 in the log event message at '%s'.", path)
	}
	var msg string
	if err := json.Unmarshal(raw, &msg); err != nil {
		return "", clientErr("SerializationException", "Could not parse '%s': %v", path, err)
	}
	return msg, nil
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// hasLoneSurrogate reports whether a JSON string literal holds a \u escape of
// a surrogate that is not part of a high-low pair.
func hasLoneSurrogate(raw []byte) bool {
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		i++
		if i >= len(raw) || raw[i] != 'u' {
			continue
		}
		r, ok := hex4(raw[i+1:])
		if !ok {
			return false // malformed: the decoder reports it
		}
		i += 4
		switch {
		case r >= 0xDC00 && r <= 0xDFFF:
			return true
		case r >= 0xD800 && r <= 0xDBFF:
			if i+6 < len(raw) && raw[i+1] == '\\' && raw[i+2] == 'u' {
				if r2, ok := hex4(raw[i+3:]); ok && r2 >= 0xDC00 && r2 <= 0xDFFF {
					i += 6
					continue
				}
			}
			return true
		}
	}
	return false
}
