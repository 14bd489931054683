package cloudwatchlogs

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// MaxResponseBytes caps the events of one GetLogEvents or FilterLogEvents
// page, counted like PutLogEvents (len(message) + 26 per event); a page
// always holds at least one event when one is available.
const MaxResponseBytes = 1_048_576

var readTokenRE = regexp.MustCompile(`^[fb]/[0-9]{56}$`)

type outputEvent struct {
	Timestamp     int64  `json:"timestamp"`
	Message       string `json:"message"`
	IngestionTime int64  `json:"ingestionTime"`
}

type getLogEventsIn struct {
	LogGroupName       *string `json:"logGroupName"`
	LogGroupIdentifier *string `json:"logGroupIdentifier"`
	LogStreamName      *string `json:"logStreamName"`
	StartTime          *int64  `json:"startTime"`
	EndTime            *int64  `json:"endTime"`
	NextToken          *string `json:"nextToken"`
	Limit              *int32  `json:"limit"`
	StartFromHead      *bool   `json:"startFromHead"`
}

type getLogEventsOut struct {
	Events            []outputEvent `json:"events"`
	NextForwardToken  string        `json:"nextForwardToken"`
	NextBackwardToken string        `json:"nextBackwardToken"`
}

func readToken(dir byte, pos int) string { return fmt.Sprintf("%c/%056d", dir, pos) }

// sparseToken is the forward token after the empty page at pos that
// SetSparsePages serves: "f/1" and pos in 55 digits.
func sparseToken(pos int) string { return fmt.Sprintf("f/1%055d", pos) }

// readable keeps the events ingested at or before ms (SetReadDelay).
func readable(events []storedEvent, ms int64) []storedEvent {
	var out []storedEvent
	for _, ev := range events {
		if ev.IngestionTime <= ms {
			out = append(out, ev)
		}
	}
	return out
}

func (s *Server) getLogEvents(body []byte) (any, *apiError) {
	var limit, pos int
	var dir byte
	var emptyServed bool // a sparse forward page: the empty page at pos was served
	return serve(s, body, handler[getLogEventsIn]{find: findStream,
		check: func(in *getLogEventsIn) (string, string, *apiError) {
			groupName, e := resolveGroup(in.LogGroupName, in.LogGroupIdentifier)
			if e != nil {
				return "", "", e
			}
			if e := checkStreamName("logStreamName", in.LogStreamName); e != nil {
				return "", "", e
			}
			if e := checkLimit(in.Limit, 10_000); e != nil {
				return "", "", e
			}
			limit = 10_000
			if in.Limit != nil {
				limit = int(*in.Limit)
			}
			if in.NextToken != nil {
				t := *in.NextToken
				if !readTokenRE.MatchString(t) {
					return "", "", badNextToken()
				}
				digits := t[2:]
				if digits[0] == '1' {
					emptyServed, digits = true, digits[1:]
				}
				p, err := strconv.ParseInt(digits, 10, 64)
				if err != nil || p > 1<<40 || emptyServed && t[0] != 'f' {
					return "", "", badNextToken()
				}
				dir, pos = t[0], int(p)
			}
			return groupName, *in.LogStreamName, nil
		},
		run: func(in *getLogEventsIn, _ *group, st *stream) (any, *apiError) {
			delay, sparse := s.readSwitches()

			st.mu.Lock()
			defer st.mu.Unlock()
			// The stream is sorted by timestamp: the time range is one slice.
			// startTime is inclusive, endTime exclusive.
			view := st.events
			if in.StartTime != nil {
				view = view[sort.Search(len(view), func(i int) bool { return view[i].Timestamp >= *in.StartTime }):]
			}
			if in.EndTime != nil {
				view = view[:sort.Search(len(view), func(i int) bool { return view[i].Timestamp >= *in.EndTime })]
			}
			if delay > 0 {
				view = readable(view, s.nowMs()-delay.Milliseconds())
			}
			n := len(view)
			if dir == 0 {
				if in.StartFromHead != nil && *in.StartFromHead {
					dir, pos = 'f', 0
				} else {
					dir, pos = 'b', n
				}
			}
			pos = min(pos, n)

			if dir == 'f' && sparse > 0 && pos < n {
				if !emptyServed {
					// An empty page while events remain: the reader must go on.
					return getLogEventsOut{Events: []outputEvent{}, NextForwardToken: sparseToken(pos), NextBackwardToken: readToken('b', pos)}, nil
				}
				limit = min(limit, sparse)
			}
			if dir == 'f' && pos == n && in.NextToken != nil {
				// The end: the token sent comes back unchanged.
				return getLogEventsOut{Events: []outputEvent{}, NextForwardToken: *in.NextToken, NextBackwardToken: readToken('b', pos)}, nil
			}

			var from, to int
			if dir == 'f' {
				from, to = pos, pos
				size := 0
				for to < n && to-from < limit {
					sz := len(view[to].Message) + EventOverhead
					if to > from && size+sz > MaxResponseBytes {
						break
					}
					size += sz
					to++
				}
			} else {
				from, to = pos, pos
				size := 0
				for from > 0 && to-from < limit {
					sz := len(view[from-1].Message) + EventOverhead
					if to > from && size+sz > MaxResponseBytes {
						break
					}
					size += sz
					from--
				}
			}
			out := getLogEventsOut{
				Events:            make([]outputEvent, 0, to-from),
				NextForwardToken:  readToken('f', to),
				NextBackwardToken: readToken('b', from),
			}
			for _, ev := range view[from:to] {
				out.Events = append(out.Events, outputEvent{Timestamp: ev.Timestamp, Message: ev.Message, IngestionTime: ev.IngestionTime})
			}
			return out, nil
		}})
}

type filterLogEventsIn struct {
	LogGroupName        *string  `json:"logGroupName"`
	LogGroupIdentifier  *string  `json:"logGroupIdentifier"`
	LogStreamNames      []string `json:"logStreamNames"`
	LogStreamNamePrefix *string  `json:"logStreamNamePrefix"`
	StartTime           *int64   `json:"startTime"`
	EndTime             *int64   `json:"endTime"`
	FilterPattern       *string  `json:"filterPattern"`
	NextToken           *string  `json:"nextToken"`
	Limit               *int32   `json:"limit"`
}

type filteredEvent struct {
	LogStreamName string `json:"logStreamName"`
	Timestamp     int64  `json:"timestamp"`
	Message       string `json:"message"`
	IngestionTime int64  `json:"ingestionTime"`
	EventID       string `json:"eventId"`
	id            uint64
}

type filterLogEventsOut struct {
	Events    []filteredEvent `json:"events"`
	NextToken *string         `json:"nextToken,omitempty"`
}

func (s *Server) filterLogEvents(body []byte) (any, *apiError) {
	var names map[string]bool
	var prefix string
	var terms []string
	var limit, offset int
	return serve(s, body, handler[filterLogEventsIn]{find: findGroup,
		check: func(in *filterLogEventsIn) (string, string, *apiError) {
			groupName, e := resolveGroup(in.LogGroupName, in.LogGroupIdentifier)
			if e != nil {
				return "", "", e
			}
			if in.LogStreamNames != nil && in.LogStreamNamePrefix != nil {
				return "", "", invalidParam("logStreamNames and logStreamNamePrefix are mutually exclusive parameters.")
			}
			if in.LogStreamNames != nil {
				if len(in.LogStreamNames) < 1 || len(in.LogStreamNames) > 100 {
					return "", "", validation(fmt.Sprint(in.LogStreamNames), "logStreamNames", "Member must have length between 1 and 100")
				}
				names = map[string]bool{}
				for i, n := range in.LogStreamNames {
					if e := checkStreamName(fmt.Sprintf("logStreamNames.%d.member", i+1), &n); e != nil {
						return "", "", e
					}
					names[n] = true
				}
			}
			prefix = ""
			if in.LogStreamNamePrefix != nil {
				if e := checkStreamName("logStreamNamePrefix", in.LogStreamNamePrefix); e != nil {
					return "", "", e
				}
				prefix = *in.LogStreamNamePrefix
			}
			if in.FilterPattern != nil {
				if terms, e = parseFilterPattern(*in.FilterPattern); e != nil {
					return "", "", e
				}
			}
			if e := checkLimit(in.Limit, 10_000); e != nil {
				return "", "", e
			}
			limit = 10_000
			if in.Limit != nil {
				limit = int(*in.Limit)
			}
			if in.NextToken != nil {
				v, ok := decodeToken(*in.NextToken, "e")
				var err error
				if ok {
					offset, err = strconv.Atoi(v)
				}
				if !ok || err != nil || offset < 0 {
					return "", "", badNextToken()
				}
			}
			return groupName, "", nil
		},
		run: func(in *filterLogEventsIn, g *group, _ *stream) (any, *apiError) {
			var streams []*stream
			for name, st := range g.streams {
				if (names == nil || names[name]) && strings.HasPrefix(name, prefix) {
					streams = append(streams, st)
				}
			}

			delay, _ := s.readSwitches()
			readyMs := s.nowMs() - delay.Milliseconds()
			var matched []filteredEvent
			for _, st := range streams {
				st.mu.Lock()
				for _, ev := range st.events {
					if in.StartTime != nil && ev.Timestamp < *in.StartTime {
						continue
					}
					if in.EndTime != nil && ev.Timestamp > *in.EndTime {
						continue
					}
					if !matchTerms(ev.Message, terms) || delay > 0 && ev.IngestionTime > readyMs {
						continue
					}
					matched = append(matched, filteredEvent{
						LogStreamName: st.name,
						Timestamp:     ev.Timestamp,
						Message:       ev.Message,
						IngestionTime: ev.IngestionTime,
						EventID:       fmt.Sprintf("%056d", ev.id),
						id:            ev.id,
					})
				}
				st.mu.Unlock()
			}
			sort.Slice(matched, func(i, j int) bool {
				a, b := matched[i], matched[j]
				if a.Timestamp != b.Timestamp {
					return a.Timestamp < b.Timestamp
				}
				if a.LogStreamName != b.LogStreamName {
					return a.LogStreamName < b.LogStreamName
				}
				return a.id < b.id
			})
			from := min(offset, len(matched))
			to, size := from, 0
			for to < len(matched) && to-from < limit {
				sz := len(matched[to].Message) + EventOverhead
				if to > from && size+sz > MaxResponseBytes {
					break
				}
				size += sz
				to++
			}
			out := filterLogEventsOut{Events: matched[from:to]}
			if out.Events == nil {
				out.Events = []filteredEvent{}
			}
			if to < len(matched) {
				tok := encodeToken("e/" + strconv.Itoa(to))
				out.NextToken = &tok
			}
			return out, nil
		}})
}

var plainTermRE = regexp.MustCompile(`^[A-Za-z0-9_]+$`)

// parseFilterPattern accepts the empty pattern and plain terms: words of
// letters, digits and '_', or any text in double quotes (\" and \\ escape a
// quote and a backslash). Every term must occur in the message, case
// sensitively. JSON, space-delimited, regular-expression, '?' (or) and '-'
// (not) patterns are refused.
func parseFilterPattern(p string) ([]string, *apiError) {
	unsupported := func() *apiError {
		return invalidParam("Filter pattern %q is not supported by this emulator: it supports only the empty pattern and plain terms.", p)
	}
	var terms []string
	rest := strings.TrimSpace(p)
	for rest != "" {
		if rest[0] == '"' {
			var b strings.Builder
			i := 1
			for ; i < len(rest) && rest[i] != '"'; i++ {
				if rest[i] == '\\' && i+1 < len(rest) && (rest[i+1] == '"' || rest[i+1] == '\\') {
					i++
				}
				b.WriteByte(rest[i])
			}
			if i >= len(rest) {
				return nil, invalidParam("Invalid filter pattern %q: unterminated quoted term.", p)
			}
			if b.Len() > 0 {
				terms = append(terms, b.String())
			}
			rest = strings.TrimSpace(rest[i+1:])
			continue
		}
		term, after, _ := strings.Cut(rest, " ")
		switch {
		case strings.ContainsAny(term[:1], "{[%?-"):
			return nil, unsupported()
		case !plainTermRE.MatchString(term):
			return nil, invalidParam("Invalid character(s) in term '%s'", term)
		}
		terms = append(terms, term)
		rest = strings.TrimSpace(after)
	}
	return terms, nil
}

func matchTerms(msg string, terms []string) bool {
	for _, t := range terms {
		if !strings.Contains(msg, t) {
			return false
		}
	}
	return true
}
