package queue

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// A drainer's states (Status.State), as /status shows them (README.md,
// Admin endpoints). They are the sink's, not a partition's: those are
// phases (doc.go, Partition phases), which /status does not show.
const (
	StateStarting   = "starting"   // Run has not registered the cursor yet
	StateRecovering = "recovering" // the sink finishes work a crash left half done (sinks.Recoverer)
	StateRunning    = "running"
	StateRetrying   = "retrying"  // the destination seems down: one batch at a time (flow.retrying)
	StateThrottled  = "throttled" // every partition waits out a throttle
	StatePaused     = "paused"    // a sink-permanent error: probed every PauseRetry
	StateStopped    = "stopped"
	StateFailed     = "failed" // Run returned an error
)

// Status is a drainer's state for /status and /readyz.
type Status struct {
	Sink        string  `json:"sink"`
	State       string  `json:"state"` // one of the State constants
	Cursor      uint64  `json:"cursor"`
	LagRecords  uint64  `json:"lag_records"`
	LagSeconds  float64 `json:"lag_seconds"`
	InFlight    int     `json:"inflight_partitions"`
	Concurrency int     `json:"concurrency"`            // partitions allowed in flight now (lowered while throttled)
	Partitions  int     `json:"partitions"`             // partitions with records pending
	CatchingUp  int     `json:"catching_up_partitions"` // spilled partitions being read again from the WAL
	// Unreachable: sends in a row could not connect to the destination and
	// partitions were spilled; new records are not read until a send ends
	// otherwise (see catchup.go).
	Unreachable bool `json:"unreachable,omitempty"`
	// Admitted is how many partitions max_partitions (MaxPartitions)
	// admits now; Overflowed the records that went to the overflow
	// partition since the start. All three are 0 without a bound.
	Admitted      int       `json:"admitted_partitions,omitempty"`
	MaxPartitions int       `json:"max_partitions,omitempty"`
	Overflowed    uint64    `json:"overflow_records,omitempty"`
	Buffered      int       `json:"buffered_bytes"`
	Delivered     uint64    `json:"delivered_records"`
	DeadLettered  uint64    `json:"dead_lettered_records"`
	LastError     string    `json:"last_error,omitempty"`
	LastErrorAt   time.Time `json:"last_error_at,omitzero"`
}

// lag is how many records are after cursor, and how long the oldest of
// them has waited.
func (d *Drainer) lag(cursor uint64) (uint64, float64) {
	st := d.w.Stats()
	if st.NextSeq-1 <= cursor {
		return 0, 0
	}
	return st.NextSeq - 1 - cursor, d.w.Age(max(cursor+1, st.FirstSeq)).Seconds()
}

// updateLag sets the lag metrics and status from cursor, before the loop
// runs (finishInterrupted).
func (d *Drainer) updateLag(cursor uint64) {
	lag, lagSec := d.lag(cursor)
	d.lagRecords.Set(float64(lag))
	d.lagSeconds.Set(lagSec)
	d.setState(func(s *Status) { s.LagRecords, s.LagSeconds = lag, lagSec })
}

func (l *loop) updateStatus() {
	d := l.d
	lag, lagSec := d.lag(l.cursor)
	state := StateRunning
	switch {
	case l.paused != nil:
		state = StatePaused
	case time.Now().Before(l.throttleUntil):
		state = StateThrottled
	case l.retrying():
		state = StateRetrying
	}
	d.lagRecords.Set(float64(lag))
	d.lagSeconds.Set(lagSec)
	d.inflight.Set(float64(l.inflight))
	d.buffered.Set(float64(l.mem.buffered()))
	d.setState(func(s *Status) {
		s.State, s.Cursor, s.LagRecords, s.LagSeconds = state, l.cursor, lag, lagSec
		s.InFlight, s.Concurrency, s.Partitions, s.Buffered = l.inflight, l.limit, len(l.parts), l.mem.buffered()
		s.CatchingUp = len(l.joined)
		s.Unreachable = l.holdHead()
		if l.guard != nil {
			s.Admitted, s.MaxPartitions, s.Overflowed = l.guard.open(), d.lim.MaxPartitions, l.overflowTotal
		}
		s.Delivered, s.DeadLettered = l.delivered, l.deadLettered
		if l.lastErr != "" {
			s.LastError, s.LastErrorAt = l.lastErr, l.lastErrAt
		}
	})
}

// summarize logs, once per SummaryInterval, how many sends failed and
// why, and how many records were dead-lettered and why. Failed sends are
// retried and lose nothing: that line is at info level when every
// partition has since delivered, at warning level while some are still
// failing. Dead letters are records the destination will never take: a
// warning that says where they are kept.
func (l *loop) summarize(now time.Time) {
	if now.Sub(l.lastSummary) < l.d.opts.SummaryInterval {
		return
	}
	l.summarizeNow(now)
}

// summarizeNow is summarize, whenever the last summary was.
func (l *loop) summarizeNow(now time.Time) {
	evicted := l.evictedUnlogged.Swap(0)
	if len(l.failures)+len(l.deadReasons)+l.skippedUnlogged == 0 && evicted == 0 {
		return
	}
	l.lastSummary = now
	if l.skippedUnlogged > 0 {
		l.d.log.Info("records not sent again: their partitions had delivered them before this start (forwarder_sink_skipped_delivered_records_total)",
			"interval", l.d.opts.SummaryInterval, "skipped", l.skippedUnlogged)
		l.skippedUnlogged = 0
	}
	if len(l.deadReasons) > 0 {
		args := []any{"interval", l.d.opts.SummaryInterval}
		args = append(args, countArgs(l.deadReasons)...)
		l.d.log.Warn(fmt.Sprintf("records dead-lettered: the destination refuses them for their content and will never take them; they are not sent again but kept as dead letters in the WAL (the newest %d per sink): list them with forwarder wal dead-letters (counts by reason)", l.d.opts.MaxDeadLetters), args...)
		l.deadReasons = map[string]int{}
	}
	if evicted > 0 {
		l.d.log.Warn(fmt.Sprintf("dead letters deleted: the oldest went to keep the newest %d per sink; their records are gone", l.d.opts.MaxDeadLetters),
			"interval", l.d.opts.SummaryInterval, "deleted", evicted)
	}
	if len(l.failures) == 0 {
		return
	}
	failing := 0
	for _, p := range l.parts {
		if p.attempts > 0 {
			failing++
		}
	}
	args := []any{"interval", l.d.opts.SummaryInterval, "partitions_still_failing", failing}
	args = append(args, countArgs(l.failures)...)
	if l.lastRetried != "" {
		args = append(args, "last_error", l.lastRetried) // what the destination said, and what to fix
	}
	if failing > 0 || l.paused != nil || now.Before(l.throttleUntil) {
		l.d.log.Warn("sends failed and are retried; nothing is dropped for them (counts by class/reason)", args...)
	} else {
		l.d.log.Info("sends failed and were retried; every partition has delivered since, nothing was dropped (counts by class/reason)", args...)
	}
	l.failures = map[string]int{}
}

// countArgs is a log line's attribute "counts": "key=n key=n", by sorted
// key. One attribute, not one per key: the keys are reasons and error
// codes, which as JSON fields would add to a log store's mapping with
// every new one.
func countArgs(counts map[string]int) []any {
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%d", k, counts[k])
	}
	return []any{"counts", b.String()}
}

// unmatch counts a record this sink's match refused, keeping a few of
// their tags for checkRouting.
func (l *loop) unmatch(tag string) {
	l.unmatched++
	if len(l.unmatchedTags) < 5 && !slices.Contains(l.unmatchedTags, tag) {
		l.unmatchedTags = append(l.unmatchedTags, strings.Clone(tag)) // read buffers are reused
	}
}

// checkRouting warns, once per SummaryInterval, when the sink took none of
// the records read in it because its match refused every tag: a match
// that fits no tag the clients send (pod.** against Fluent Bit's kube.*)
// would otherwise leave the sink empty without a word.
func (l *loop) checkRouting(now time.Time) {
	if now.Sub(l.lastRouting) < l.d.opts.SummaryInterval {
		return
	}
	if l.matched == 0 && l.unmatched > 0 {
		l.d.log.Warn("the sink took none of the records read: its match refused every tag; other sinks may take them, and those no sink matches are not stored; check the sink's match",
			"interval", l.d.opts.SummaryInterval, "records", l.unmatched, "tags", strings.Join(l.unmatchedTags, ","))
	}
	l.matched, l.unmatched, l.unmatchedTags, l.lastRouting = 0, 0, l.unmatchedTags[:0], now
}
