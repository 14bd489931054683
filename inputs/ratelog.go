package inputs

import (
	"sync"
	"time"
)

// RateLog lets one log line through per reason per minute and counts the rest.
type RateLog struct {
	mu     sync.Mutex
	last   map[string]time.Time
	hidden map[string]int
}

// Allow reports whether to log now, and how many were not logged before.
func (r *RateLog) Allow(reason string, now time.Time) (int, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		r.last, r.hidden = map[string]time.Time{}, map[string]int{}
	}
	if t, ok := r.last[reason]; ok && now.Sub(t) < time.Minute {
		r.hidden[reason]++
		return 0, false
	}
	n := r.hidden[reason]
	r.last[reason], r.hidden[reason] = now, 0
	return n, true
}
