package cloudwatch

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/aws/smithy-go"

	"github.com/logfwd/forwarder/internal/awserr"
	"github.com/logfwd/forwarder/sinks"
)

// deniedWindow: an AccessDenied for one log group is taken for that
// group's alone when another group took events within it, and has not been
// refused since (an IAM policy that allows some groups only: /eks/*, and a
// group the template rendered outside them). Credentials refused
// everywhere are seen on each group that sends, which pauses the sink at
// once; a group that took events and sent nothing since holds the pause
// off for at most this. It outlasts a paused sink's 30 s between tries
// and a partition's backoff, so that a denied group among groups that send
// now and then does not pause and unpause the sink in turn.
const deniedWindow = 2 * time.Minute

// maxGroupOutcomes bounds the groups whose last outcome is kept.
const maxGroupOutcomes = 10_000

// groupOutcomes keeps, by log group, whether its last call was taken or
// refused with AccessDenied, and when.
type groupOutcomes struct {
	mu   sync.Mutex
	last map[string]groupOutcome
}

type groupOutcome struct {
	denied bool
	at     time.Time
}

func (g *groupOutcomes) note(group string, denied bool, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.last == nil {
		g.last = map[string]groupOutcome{}
	}
	if _, ok := g.last[group]; !ok && len(g.last) >= maxGroupOutcomes {
		// Only outcomes within deniedWindow count: the older go first.
		for name, o := range g.last {
			if now.Sub(o.at) > deniedWindow {
				delete(g.last, name)
			}
		}
		if len(g.last) >= maxGroupOutcomes {
			g.last = map[string]groupOutcome{}
		}
	}
	g.last[group] = groupOutcome{denied, now}
}

// othersTake reports whether a group other than group took events within
// deniedWindow of now and was not refused since.
func (g *groupOutcomes) othersTake(group string, now time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for name, o := range g.last {
		if name != group && !o.denied && now.Sub(o.at) <= deniedWindow {
			return true
		}
	}
	return false
}

// classifyDenied is classify for an error of a call about group: an
// AccessDenied (not a KMS key's) while other groups take events holds back
// that group's records, retried with their partition's backoff, while the
// others go on, instead of pausing the whole sink; refused with no other
// group taking events (credentials that may write nowhere), the sink
// pauses (classify).
func (s *Sink) classifyDenied(err error, group, stream string) error {
	if !accessDenied(err) || kmsRefused(err) {
		return classify(err, group, stream)
	}
	now := time.Now()
	s.outcomes.note(group, true, now)
	if !s.outcomes.othersTake(group, now) {
		return classify(err, group, stream)
	}
	code := "AccessDeniedException"
	var ae smithy.APIError
	if errors.As(err, &ae) {
		code = ae.ErrorCode()
	}
	return sinks.NewRetryable(code, fmt.Errorf("the credentials may not write to log group %q, though other log groups take events: grant logs:PutLogEvents, logs:CreateLogStream and logs:CreateLogGroup on it, or fix the log_group template of sink %q; its records wait in the WAL: %w",
		group, s.name, awserr.Clean(err)))
}
