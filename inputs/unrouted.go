package inputs

import (
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// UnroutedLog warns, at most once per Interval, of the tags that no sink
// matched: their records are acknowledged and not stored, which a match
// that fits none of the clients' tags (pod.** against Fluent Bit's
// kube.*) would otherwise do without a word. Its line names the tags
// (a few of them) and how many records each had.
type UnroutedLog struct {
	Log      *slog.Logger
	Interval time.Duration // default a minute

	mu    sync.Mutex
	next  time.Time
	count map[string]int // by tag, since the last line (at most maxUnroutedTags)
	other int            // records of tags beyond those
}

const maxUnroutedTags = 10

// Note counts n records of tag that no sink matched, and logs when due.
func (l *UnroutedLog) Note(tag string, n int) {
	if l == nil || l.Log == nil {
		return
	}
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.count == nil {
		l.count = map[string]int{}
	}
	if _, ok := l.count[tag]; ok || len(l.count) < maxUnroutedTags {
		l.count[tag] += n
	} else {
		l.other += n
	}
	if now.Before(l.next) {
		return
	}
	interval := l.Interval
	if interval <= 0 {
		interval = time.Minute
	}
	tags := make([]string, 0, len(l.count))
	for t := range l.count {
		tags = append(tags, t)
	}
	sort.Strings(tags)
	var b strings.Builder
	total := l.other
	for i, t := range tags {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(t + "=" + strconv.Itoa(l.count[t]))
		total += l.count[t]
	}
	l.Log.Warn("records of tags that no sink matches are acknowledged and not stored: check the sinks' match against these tags",
		"records", total, "tags", b.String(), "other_tags_records", l.other, "interval", interval)
	clear(l.count)
	l.other, l.next = 0, now.Add(interval)
}
