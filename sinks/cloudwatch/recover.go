package cloudwatch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs/types"
	"github.com/aws/smithy-go"

	"github.com/logfwd/forwarder/internal/awserr"
	"github.com/logfwd/forwarder/sinks"
)

// What Recover made of a call in doubt: the result label of
// forwarder_cloudwatch_indoubt_calls_total.
const (
	resultDelivered  = "delivered"  // every event found: nothing sent again
	resultResent     = "resent"     // none found: the call is sent again
	resultPartial    = "partial"    // some found: the others are sent again
	resultUnresolved = "unresolved" // sent again without knowing
)

// readThrottlesWaited is how many ThrottlingExceptions in a row a read
// waits out (1 s, then 2 s) before Recover returns the throttling.
const readThrottlesWaited = 2

// readTimeout bounds one GetLogEvents page. A variable for the tests.
var readTimeout = 30 * time.Second

// errNoRead: GetLogEvents is refused (AccessDenied).
var errNoRead = errors.New("cloudwatch: GetLogEvents refused")

// errReadRefused: GetLogEvents refused this read's parameters (a
// compatible service that does not take them): the call is sent again.
var errReadRefused = errors.New("cloudwatch: GetLogEvents refused the read")

// liveSettle bounds the wait for a call of this run whose answer was lost
// (settleLost), whatever settle says: the stream's sends wait on it, in a
// slot of the sink's.
const liveSettle = time.Minute

// Recover resolves the PutLogEvents calls a crash left in doubt, before the
// drainer reads a record: for each intent not known to be delivered, it
// waits until the call is settle old, reads the stream back over the
// call's time window and looks for the call's events (see doc.go). A call
// found whole is recorded as delivered (with a delivered mark when it was
// all that was left of its batch, so the drainer skips its records); one
// found in part keeps an intent that names the events to send again; one
// not found is sent again by the drainer.
//
// GetLogEvents failing does not fail Recover for good: a classified error
// is returned and the drainer calls Recover again (an intent resolved
// stays resolved); AccessDenied makes every call in doubt be sent again,
// for the rest of the run. Recover returns an unclassified error only when
// the WAL fails or an intent is damaged.
func (s *Sink) Recover(ctx context.Context, st sinks.State) error {
	if err := s.loadOwed(ctx, st); err != nil {
		return fmt.Errorf("read the log groups owed their retention: %w", err)
	}
	all, err := loadIntents(st)
	if err != nil {
		return fmt.Errorf("read intents: %w", err)
	}
	s.intents.reset()
	route, renamed := s.routerOf(st)
	byPart := map[string][]*intent{}
	var parts []string
	for _, in := range all {
		s.intents.add(in)
		if in.Delivered {
			if err := s.checkDelivered(ctx, st, in, route, renamed); err != nil {
				return err
			}
			continue
		}
		p := in.partition()
		if byPart[p] == nil {
			parts = append(parts, p)
		}
		byPart[p] = append(byPart[p], in)
	}
	if len(parts) == 0 {
		return nil
	}
	start := time.Now()
	s.unbuilt.Store(0)
	var (
		mu       sync.Mutex
		counts   = map[string]int{}
		again    int // events the drainer sends again
		firstErr error
		next     int
		wg       sync.WaitGroup
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A stream's intents one after the other (they may share a batch), a
	// few streams at once: the reads' rate is the limiter's.
	for range min(len(parts), 4) {
		wg.Go(func() {
			for {
				mu.Lock()
				if next == len(parts) || firstErr != nil {
					mu.Unlock()
					return
				}
				p := parts[next]
				next++
				mu.Unlock()
				for _, in := range byPart[p] {
					if !s.intents.has(in) {
						continue // a call resolved before it took it along
					}
					result, n, err := s.resolve(ctx, st, in, route, renamed, false)
					mu.Lock()
					if err != nil {
						if firstErr == nil {
							firstErr = err
							cancel()
						}
						mu.Unlock()
						return
					}
					counts[result]++
					again += n
					mu.Unlock()
					s.m.indoubt.WithLabelValues(result).Inc()
				}
			}
		})
	}
	wg.Wait()
	if n := counts[resultDelivered] + counts[resultResent] + counts[resultPartial] + counts[resultUnresolved]; n > 0 {
		args := []any{"sink", s.name,
			"calls", n, resultDelivered, counts[resultDelivered], resultResent, counts[resultResent], resultPartial, counts[resultPartial],
			resultUnresolved, counts[resultUnresolved], "events_sent_again", again, "took", time.Since(start).Round(time.Millisecond)}
		level := slog.LevelInfo
		if u := s.unbuilt.Load(); u > 0 {
			// Sent again without knowing whether they had landed.
			args, level = append(args, "cannot_rebuild", u), slog.LevelWarn
		}
		msg := "resolved PutLogEvents calls an earlier run left in doubt (a crash, or a stop that cut them short), by reading their streams back"
		if s.shared {
			msg = "resolved PutLogEvents calls an earlier run left in doubt (a crash, or a stop that cut them short): sent again, not read back (names replicas may share)"
		}
		s.log.Log(ctx, level, msg, args...)
	}
	return firstErr
}

// routerOf returns how the records of the calls in doubt were routed: as
// the partitioning stored before this start (sinks.State.Partitioning)
// routed them, renamed when it is not the sink's (the log_group,
// log_stream, fallback or host name changed since).
func (s *Sink) routerOf(st sinks.State) (route func(*sinks.Record) string, renamed bool) {
	route = func(r *sinks.Record) string { return s.routed(st, r) }
	desc := st.Partitioning()
	if desc == nil || bytes.Equal(desc, s.Partitioning()) {
		return route, false
	}
	old, err := s.Router(desc, st)
	if err != nil {
		s.log.Warn("cannot route records as the configuration before this start did: calls it left in doubt are rebuilt with today's names, and those that cannot be are sent again", "sink", s.name, "error", err)
		return route, false
	}
	return old, true
}

// eventKey is what a read-back event is matched on.
type eventKey struct {
	ts  int64
	msg string
}

// resolve decides one call in doubt and records the outcome in st. It
// returns the result and how many of the call's events the drainer sends
// again.
//
// With renamed (the names changed since the call), a call found whole that
// was all that was left of its batch is marked delivered under its old
// names, which the drainer reads after the change; every other batch is
// sent again whole under the new names (its delivered calls' intents are
// of streams it no longer sends to).
//
// With live (a call of this run whose answer was lost, resolved before its
// batch is sent again: settleLost), a call found whole is kept delivered
// rather than marked so: the batch being sent skips its events.
func (s *Sink) resolve(ctx context.Context, st sinks.State, in *intent, route func(*sinks.Record) string, renamed, live bool) (string, int, error) {
	p := in.partition()
	recs, err := st.ReadRange(in.BatchFirst, in.Last, func(r *sinks.Record) bool { return route(r) == p })
	if err != nil {
		return "", 0, fmt.Errorf("read records %d to %d for the call in doubt to stream %q of group %q: %w", in.BatchFirst, in.Last, in.Stream, in.Group, err)
	}
	var call []event
	covered := true // every event of the batch up to in.Last is this call's or a delivered one's
	known := s.intents.of(p)
	for _, e := range s.allEvents(recs) {
		switch {
		case deliveredBy(known, &e):
			// Landed in a delivered call: not in this one, which sends
			// again events that call did not land (intent.Attempt).
		case in.covers(&e):
			call = append(call, e)
		default:
			covered = false
		}
	}
	if !in.matches(call) {
		// The WAL dropped records of the call (wal.when_full: drop_oldest),
		// or the configuration changed: the sink's match, its names, or how
		// messages are rendered (message_key).
		if err := s.forget(ctx, st, in); err != nil {
			return "", 0, err
		}
		// At start, a change of the configuration makes every call in
		// doubt so: the first is warned, the others counted in the summary.
		if live || s.unbuilt.Add(1) == 1 {
			says := "what is left of its records is sent again, which may duplicate events"
			if len(call) == 0 {
				says = "none of its records is left to send again"
			}
			if !live {
				says += "; other calls like it are counted in the summary line once the calls in doubt are resolved (cannot_rebuild)"
			}
			s.log.Warn("a PutLogEvents call left in doubt (by a crash, or an answer lost) cannot be rebuilt from the WAL (drop_oldest dropped some of its records, or a damaged entry lost them, or the sink's match, log_group, log_stream or message_key changed since): "+says,
				"sink", s.name, "group", in.Group, "stream", in.Stream, "events", in.Events, "rebuilt", len(call))
		}
		return resultUnresolved, len(call), nil
	}
	if s.shared {
		// Another forwarder may write the stream (Options.SharedStreams):
		// its identical events would pass for this call's in a read-back.
		s.sharedSaid.Do(func() {
			s.log.Info("a call in doubt is sent again without reading the stream back: the stream names have no ${hostname}, so another forwarder may write the same streams, and its identical events would pass for the call's (a loss); events of a call that landed are stored twice",
				"sink", s.name, "group", in.Group, "stream", in.Stream)
		})
		return resultUnresolved, len(call), s.forget(ctx, st, in)
	}
	// Settle counts from the call's start; at most settle from now, should
	// the clock have gone back since.
	settle := time.Duration(s.cfg.Settle)
	if live {
		settle = min(settle, liveSettle)
	}
	if wait := min(time.Until(time.UnixMilli(in.Started).Add(settle)), settle); wait > 0 && !s.noRead.Load() {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return "", 0, ctx.Err()
		}
	}
	if s.noRead.Load() {
		return resultUnresolved, len(call), s.forget(ctx, st, in)
	}
	need := make(map[eventKey]int, len(call))
	for _, e := range call {
		need[eventKey{e.ts, string(e.msg)}]++
	}
	found, earlier, err := s.readWindow(ctx, in, need)
	if errors.Is(err, errNoRead) || errors.Is(err, errReadRefused) {
		return resultUnresolved, len(call), s.forget(ctx, st, in)
	}
	if err != nil {
		return "", 0, err
	}
	for k := range need {
		// Copies earlier calls stored that the ingestion time did not
		// tell apart (this host's clock behind the service's) are theirs.
		if p := in.priorCopies(k); p > earlier[k] {
			found[k] = max(0, found[k]-(p-earlier[k]))
		}
	}
	missing := unmatched(call, found)
	s.unnote(p, call, missing)
	if len(missing) == len(call) && len(unmatched(call, earlier)) == 0 && s.skewed.CompareAndSwap(false, true) {
		// Every event is there, ingested before the call started: this
		// host's clock is ahead of the service's (or identical events came
		// earlier). Sent again: a duplicate rather than a loss.
		s.log.Warn("a call in doubt has every event in the stream, ingested before the call started: identical events of earlier calls, or this host's clock is ahead of CloudWatch Logs' (check NTP: calls in doubt would be sent again, duplicates, until it is right); the call is sent again",
			"sink", s.name, "group", in.Group, "stream", in.Stream)
	}
	switch {
	case len(missing) == len(call):
		s.log.Debug("a call in doubt did not land: it is sent again", "sink", s.name, "group", in.Group, "stream", in.Stream, "events", in.Events)
		return resultResent, len(call), s.forget(ctx, st, in)
	case len(missing) == 0 && covered && !live && !s.intents.rejected(p, in.Last):
		// All that was left of the batch: a delivered mark makes the
		// drainer skip its records. (With events an earlier call of the
		// batch had refused, the intent is kept delivered instead: the
		// batch is sent again, its delivered calls skipped, and the
		// refused events dead-lettered.)
		keys := s.intents.done(p, in.Last)
		if err := st.Delivered(ctx, p, in.Last, keys); err != nil {
			return "", 0, sinks.NewRetryable("state", fmt.Errorf("record delivery of the call in doubt to stream %q of group %q: %w", in.Stream, in.Group, err))
		}
		s.countLanded(len(call))
		return resultDelivered, 0, nil
	}
	if renamed {
		result := resultPartial
		if len(missing) == 0 {
			result = resultDelivered
		}
		s.log.Info("a call in doubt is of a batch the new names send again whole: its events that landed are sent again",
			"sink", s.name, "group", in.Group, "stream", in.Stream, "events", in.Events, "not_found", len(missing))
		return result, len(call), s.forget(ctx, st, in)
	}
	done := *in
	done.Delivered, done.Missing = true, missing
	if err := putIntent(ctx, st, &done); err != nil {
		return "", 0, sinks.NewRetryable("state", err)
	}
	s.intents.add(&done)
	s.countLanded(len(call) - len(missing))
	if len(missing) > 0 {
		s.log.Info("a call in doubt landed in part: the events not found in the stream are sent again",
			"sink", s.name, "group", in.Group, "stream", in.Stream, "events", in.Events, "not_found", len(missing))
		return resultPartial, len(missing), nil
	}
	return resultDelivered, 0, nil
}

// countLanded counts a call in doubt found landed, with the events of it
// found, as the call's answer would have been counted.
func (s *Sink) countLanded(events int) {
	s.m.puts.Inc()
	s.m.events.Add(float64(events))
}

// checkDelivered forgets the intent of a delivered call none of whose
// events the WAL holds for its stream any more: the records were dropped
// (wal.when_full: drop_oldest), or the sink's names changed and they are
// another stream's now. Nothing would delete it otherwise.
//
// With renamed (the names changed since), it is forgotten: its batch is
// sent again whole under the new names.
func (s *Sink) checkDelivered(ctx context.Context, st sinks.State, in *intent, route func(*sinks.Record) string, renamed bool) error {
	if renamed {
		s.log.Debug("forgetting the intent of a delivered call: the names changed since, and its batch is sent again under the new ones", "sink", s.name, "group", in.Group, "stream", in.Stream)
		return s.forget(ctx, st, in)
	}
	p := in.partition()
	recs, err := st.ReadRange(in.First, in.Last, func(r *sinks.Record) bool { return route(r) == p })
	if err != nil {
		return fmt.Errorf("read records %d to %d for the delivered call to stream %q of group %q: %w", in.First, in.Last, in.Stream, in.Group, err)
	}
	for _, e := range s.allEvents(recs) {
		if in.covers(&e) {
			return nil
		}
	}
	s.log.Debug("forgetting the intent of a delivered call whose records the stream no longer has in the WAL", "sink", s.name, "group", in.Group, "stream", in.Stream)
	return s.forget(ctx, st, in)
}

// forget deletes the intent of a call that is to be sent again.
func (s *Sink) forget(ctx context.Context, st sinks.State, in *intent) error {
	if err := st.Delete(ctx, in.key()); err != nil {
		return sinks.NewRetryable("state", fmt.Errorf("delete intent of a call to stream %q of group %q: %w", in.Stream, in.Group, err))
	}
	s.intents.remove(in)
	return nil
}

func deliveredBy(known []*intent, e *event) bool {
	for _, in := range known {
		if in.delivered(e) {
			return true
		}
	}
	return false
}

// unmatched matches the call's events against those found, as multisets
// of (timestamp, message), and returns the events (record, part) left
// without a match. Of identical events, the last ones of the call are left.
func unmatched(call []event, found map[eventKey]int) [][2]uint64 {
	var missing [][2]uint64
	for _, e := range call {
		k := eventKey{e.ts, string(e.msg)}
		if found[k] > 0 {
			found[k]--
			continue
		}
		missing = append(missing, [2]uint64{e.seq, uint64(e.part)})
	}
	sort.Slice(missing, func(i, j int) bool {
		return missing[i][0] < missing[j][0] || missing[i][0] == missing[j][0] && missing[i][1] < missing[j][1]
	})
	return missing
}

// readWindow reads the intent's stream over its call's time window, from
// the head, page after page until the forward token comes back unchanged
// (a page may be short or empty while events remain), and counts the
// events that need holds: in found those ingested at or after the call
// started, in earlier the others, which an earlier call stored (an
// identical event of the same millisecond is not one of this call's). A
// stream or group that does not exist holds none. ThrottlingException
// waits and reads the page again. Once every event needed is found, the
// rest of the window is not read.
//
// The events are read unmasked: in a log group with a data protection
// policy, an event as stored has the sensitive data of its message masked
// and would not match the event sent. Without logs:Unmask the read is
// refused; the streams are then read as stored (masked events are not
// found, and sent again).
func (s *Sink) readWindow(ctx context.Context, in *intent, need map[eventKey]int) (found, earlier map[eventKey]int, err error) {
	found, earlier = map[eventKey]int{}, map[eventKey]int{}
	input := &cloudwatchlogs.GetLogEventsInput{
		LogGroupName: aws.String(in.Group), LogStreamName: aws.String(in.Stream),
		StartTime: aws.Int64(in.MinTime), EndTime: aws.Int64(in.MaxTime + 1), StartFromHead: aws.Bool(true),
		Unmask: !s.noUnmask.Load(),
	}
	left := 0 // events needed and not found yet
	for k, n := range need {
		left += n + in.priorCopies(k) // with copies earlier calls stored, the whole window is read
	}
	throttled := 0
	var unmaskErr error // the refusal of a read with unmask, until a read without it is taken
	for {
		if err := s.reads.wait(ctx); err != nil {
			return nil, nil, err
		}
		pageCtx, cancel := context.WithTimeout(ctx, readTimeout)
		out, err := s.api.GetLogEvents(pageCtx, input)
		cancel()
		err = awserr.Refetch(ctx, s.creds, err)
		if err != nil {
			var missing *types.ResourceNotFoundException
			var ae smithy.APIError
			switch {
			case errors.As(err, &missing):
				return found, earlier, nil
			case input.Unmask && unmaskRefused(err):
				// Refused with unmask: for want of logs:Unmask (AccessDenied),
				// or a log group that does not take it (its class): read as
				// stored, and so are the reads after, once a read without it
				// is taken (an AccessDenied may be for GetLogEvents itself).
				// Other errors (a 5xx, credentials) are not about unmask: as
				// without it.
				unmaskErr = err
				input.Unmask = false
				continue
			case errors.As(err, &ae) && (ae.ErrorCode() == "AccessDeniedException" || ae.ErrorCode() == "AccessDenied"):
				if s.noRead.CompareAndSwap(false, true) {
					s.log.Warn("GetLogEvents is refused: PutLogEvents calls a crash leaves in doubt are sent again, which may duplicate their events; grant logs:GetLogEvents on the sink's log groups to resolve them",
						"sink", s.name, "group", in.Group, "error", awserr.Clean(err))
				}
				return nil, nil, errNoRead
			case errors.As(err, &ae) && (ae.ErrorCode() == "InvalidParameterException" || ae.ErrorCode() == "ValidationException"):
				// Not the call's records (a PutLogEvents refused so would be
				// theirs): the read is what the service does not take.
				s.log.Warn("GetLogEvents refused the read of a call in doubt: it is sent again, which may duplicate its events",
					"sink", s.name, "group", in.Group, "stream", in.Stream, "error", awserr.Clean(err))
				return nil, nil, errReadRefused
			case errors.As(err, &ae) && ae.ErrorCode() == "ThrottlingException" && ctx.Err() == nil && throttled < readThrottlesWaited:
				// Waited out here a few times; then returned, so that the
				// drainer counts it, says it and retries (the calls
				// resolved so far stay resolved).
				throttled++
				wait := min(time.Second<<min(throttled-1, 5), 30*time.Second)
				t := time.NewTimer(wait)
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
					return nil, nil, ctx.Err()
				}
				continue
			}
			if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
				return nil, nil, sinks.NewRetryable("timeout", fmt.Errorf("GetLogEvents of a call in doubt: no answer within %s: %w", readTimeout, awserr.Clean(err)))
			}
			return nil, nil, classify(err, in.Group, in.Stream)
		}
		if unmaskErr != nil && s.noUnmask.CompareAndSwap(false, true) {
			s.log.Info("GetLogEvents with unmask is refused (logs:Unmask is not granted, or the log group does not take it): calls a crash left in doubt are resolved by reading their events as stored; "+
				"in a log group with a data protection policy, events whose messages are masked are not recognised and are sent again, which may duplicate them: grant logs:Unmask on the sink's log groups to resolve those exactly once",
				"sink", s.name, "group", in.Group, "error", awserr.Clean(unmaskErr))
		}
		unmaskErr = nil
		throttled = 0
		for _, e := range out.Events {
			k := eventKey{aws.ToInt64(e.Timestamp), aws.ToString(e.Message)}
			switch _, ok := need[k]; {
			case !ok:
			case aws.ToInt64(e.IngestionTime) >= in.Started:
				if found[k]++; found[k] <= need[k] {
					left--
				}
			default:
				earlier[k]++
			}
		}
		next := aws.ToString(out.NextForwardToken)
		if left == 0 || next == "" || input.NextToken != nil && next == *input.NextToken {
			return found, earlier, nil
		}
		input.NextToken = aws.String(next)
	}
}

// unmaskRefused reports whether err is GetLogEvents refusing its unmask:
// AccessDenied (no logs:Unmask), or a refusal of the request's parameters.
func unmaskRefused(err error) bool {
	var ae smithy.APIError
	if !errors.As(err, &ae) {
		return false
	}
	switch ae.ErrorCode() {
	case "AccessDeniedException", "AccessDenied", "InvalidParameterException", "ValidationException":
		return true
	}
	return false
}

// limiter spaces calls evenly at a rate a second, without bursts.
type limiter struct {
	mu    sync.Mutex
	every time.Duration
	next  time.Time
}

func newLimiter(perSecond int) *limiter {
	return &limiter{every: time.Second / time.Duration(perSecond)}
}

// wait returns when the caller may make its call.
func (l *limiter) wait(ctx context.Context) error {
	l.mu.Lock()
	now := time.Now()
	at := l.next
	if at.Before(now) {
		at = now
	}
	l.next = at.Add(l.every)
	l.mu.Unlock()
	d := time.Until(at)
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
