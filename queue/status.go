package queue

import (
	"context"
	"log/slog"
	"sort"
	"time"
)

// Status is a drainer's state for /status and /readyz.
type Status struct {
	Sink         string    `json:"sink"`
	State        string    `json:"state"` // starting, running, throttled, paused, stopped, failed
	Cursor       uint64    `json:"cursor"`
	LagRecords   uint64    `json:"lag_records"`
	LagSeconds   float64   `json:"lag_seconds"`
	InFlight     int       `json:"inflight_partitions"`
	Concurrency  int       `json:"concurrency"`            // partitions allowed in flight now (lowered while throttled)
	Partitions   int       `json:"partitions"`             // partitions with records pending
	CatchingUp   int       `json:"catching_up_partitions"` // spilled partitions being read again from the WAL
	Buffered     int       `json:"buffered_bytes"`
	Delivered    uint64    `json:"delivered_records"`
	DeadLettered uint64    `json:"dead_lettered_records"`
	LastError    string    `json:"last_error,omitempty"`
	LastErrorAt  time.Time `json:"last_error_at,omitzero"`
}

func (l *loop) updateStatus() {
	d := l.d
	st := d.w.Stats()
	lag := uint64(0)
	if st.NextSeq-1 > l.cursor {
		lag = st.NextSeq - 1 - l.cursor
	}
	lagSec := 0.0
	if lag > 0 {
		if recs, err := d.w.Read(l.cursor+1, 1, 0); err == nil && len(recs) > 0 {
			lagSec = max(0, time.Since(time.Unix(0, recs[0].Time)).Seconds())
		}
	}
	state := "running"
	switch {
	case l.paused != nil:
		state = "paused"
	case time.Now().Before(l.throttleUntil):
		state = "throttled"
	case l.retrying():
		state = "retrying"
	}
	d.lagRecords.Set(float64(lag))
	d.lagSeconds.Set(lagSec)
	d.inflight.Set(float64(l.inflight))
	d.buffered.Set(float64(l.buffered))
	d.setState(func(s *Status) {
		s.State, s.Cursor, s.LagRecords, s.LagSeconds = state, l.cursor, lag, lagSec
		s.InFlight, s.Concurrency, s.Partitions, s.Buffered = l.inflight, l.limit, len(l.parts), l.buffered
		s.CatchingUp = len(l.joined)
		s.Delivered, s.DeadLettered = l.delivered, l.deadLettered
		if l.lastErr != "" {
			s.LastError, s.LastErrorAt = l.lastErr, l.lastErrAt
		}
	})
}

// summarize logs, once per SummaryInterval, how many sends failed and
// why. Failed sends are retried and lose nothing: the line is at info
// level when every partition has since delivered, at warning level while
// some are still failing.
func (l *loop) summarize(now time.Time) {
	if len(l.failures) == 0 || now.Sub(l.lastSummary) < l.d.opts.SummaryInterval {
		return
	}
	failing := 0
	for _, p := range l.parts {
		if p.attempts > 0 {
			failing++
		}
	}
	args := []any{"interval", l.d.opts.SummaryInterval, "partitions_still_failing", failing}
	keys := make([]string, 0, len(l.failures))
	for k := range l.failures {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, k, l.failures[k])
	}
	level := slog.LevelInfo
	if failing > 0 || l.paused != nil || now.Before(l.throttleUntil) {
		level = slog.LevelWarn
	}
	l.d.log.Log(context.Background(), level, "sends failed and are retried; nothing is dropped for them (counts by class/reason)", args...)
	l.failures = map[string]int{}
	l.lastSummary = now
}
