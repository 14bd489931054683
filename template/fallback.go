package template

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Missing lists the placeholders of t that d lacks: the fields without a
// default and the tag parts that rendered the fallback.
func (t *Template) Missing(d *Data) []string {
	var out []string
	for i := range t.parts {
		p := &t.parts[i]
		switch p.kind {
		case tagPart:
			if _, ok := tagN(d.Tag, p.n); !ok {
				out = append(out, fmt.Sprintf("${tag[%d]}", p.n))
			}
		case field:
			if v, ok := lookupScalar(d.Body, p.path); !p.hasDf && (!ok || len(v) == 0) { // as rendering looks it up: an object or a list is no value
				out = append(out, "${record."+strings.Join(p.path, ".")+"}")
			}
		}
	}
	return out
}

// FallbackLog warns, at most once per Interval per template, that records
// lacked what a template names and were sent under the fallback name: a
// typo in a field (${record.kubernetes.namespace}) sends every record to
// one name, which its counter alone would not tell anyone.
type FallbackLog struct {
	Log      *slog.Logger
	Interval time.Duration // default a minute
	What     string        // what the templates render: "log group or stream", "key"

	mu    sync.Mutex
	state map[*Template]*fallbackState
}

type fallbackState struct {
	next  time.Time
	count int // records since the last line
}

// Note counts a record d that t rendered with fallback, and logs a line
// when one is due: the template, what was missing, a tag, and how many
// records fell back since the last line.
func (l *FallbackLog) Note(t *Template, d *Data, fallback string) {
	if l == nil || l.Log == nil {
		return
	}
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state == nil {
		l.state = map[*Template]*fallbackState{}
	}
	st := l.state[t]
	if st == nil {
		st = &fallbackState{}
		l.state[t] = st
	}
	st.count++
	if now.Before(st.next) {
		return
	}
	interval := l.Interval
	if interval <= 0 {
		interval = time.Minute
	}
	l.Log.Warn(fmt.Sprintf("records lack what the %s template names and go under the fallback %q: check the template against the records (a field name may be misspelt), or give the field a default with ${record.FIELD|default}", l.What, fallback),
		"template", t.String(), "missing", strings.Join(t.Missing(d), ","), "tag", d.Tag, "records", st.count, "interval", interval)
	st.count, st.next = 0, now.Add(interval)
}

// ChangedLog warns, at most once per Interval, that records rendered a
// name or key of template T that the destination's rules do not allow, and
// that it was sent changed (characters replaced, values shortened): two
// values that differ only there share a name, which a counter alone would
// not tell anyone.
type ChangedLog struct {
	Log      *slog.Logger
	Interval time.Duration // default a minute
	What     string        // what T renders: "log group name", "key"
	T        *Template

	next  atomic.Int64 // Unix nanoseconds when a line is due
	count atomic.Int64 // records changed since the last line
}

// Due reports whether the next Note logs a line: the caller keeps what it
// rendered for it only then.
func (l *ChangedLog) Due() bool {
	return l != nil && l.Log != nil && time.Now().UnixNano() >= l.next.Load()
}

// Note counts a record whose rendering was changed to sentAs, and logs a
// line when one is due and rendered is known: the template, a tag, the
// rendering and what was sent instead (each over 200 bytes cut to its
// first and last 100), how, and
// how many records were changed since the last line.
func (l *ChangedLog) Note(tag string, rendered []byte, sentAs, how string) {
	if l == nil || l.Log == nil {
		return
	}
	l.count.Add(1)
	now := time.Now().UnixNano()
	next := l.next.Load()
	if rendered == nil || now < next {
		return
	}
	interval := l.Interval
	if interval <= 0 {
		interval = time.Minute
	}
	if !l.next.CompareAndSwap(next, now+int64(interval)) {
		return // another record's line
	}
	cut := func(b string) string { // its head and its tail, where ${hostname} is
		if len(b) > 200 {
			return strings.ToValidUTF8(b[:100], "") + "..." + strings.ToValidUTF8(b[len(b)-100:], "")
		}
		return strings.ToValidUTF8(b, "\uFFFD")
	}
	l.Log.Warn(fmt.Sprintf("records render a %s that breaks the destination's rules; it is sent changed: %s", l.What, how),
		"template", l.T.String(), "tag", tag, "rendered", cut(string(rendered)), "sent_as", cut(sentAs), "records", l.count.Swap(0), "interval", interval)
}
