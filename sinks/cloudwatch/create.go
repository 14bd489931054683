package cloudwatch

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs/types"
	"github.com/aws/smithy-go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/logfwd/forwarder/internal/awserr"
	"github.com/logfwd/forwarder/sinks"
)

// Kinds and outcomes of creation calls: the labels of
// forwarder_cloudwatch_creations_total.
const (
	kindGroup     = "group"     // CreateLogGroup
	kindStream    = "stream"    // CreateLogStream
	kindRetention = "retention" // PutRetentionPolicy on a group the sink created

	outcomeCreated   = "created"   // done (for retention: set)
	outcomeExists    = "exists"    // ResourceAlreadyExistsException: someone else made it, or a call whose answer was lost
	outcomeThrottled = "throttled" // ThrottlingException: waited and made again
	outcomeFailed    = "failed"    // any other error, returned to the drainer
)

// throttleSummaryEvery is how often, at most, throttled creation calls are
// logged: one line for all of them, whatever the number of streams.
const throttleSummaryEvery = time.Minute

// creation is what the sink keeps to pace its creation calls: CreateLogStream,
// CreateLogGroup and PutRetentionPolicy have account-wide quotas of calls a
// second that every replica shares (see README).
type creation struct {
	streams *pacer // CreateLogStream, create_rate a second
	groups  *pacer // CreateLogGroup and PutRetentionPolicy, group_create_rate a second

	mu       sync.Mutex
	inflight map[string]*groupCreation // groups being created, by name
	// owed holds the groups this sink tried to create whose retention is
	// not set yet (the creation's answer was lost, or PutRetentionPolicy
	// failed and may succeed on the next try, or the process stopped in
	// between): the next creation sets it, although the group then exists.
	// Also kept in the sink's state (state, once Recover gave it), a key
	// under retentionPrefix each, made before the first CreateLogGroup of
	// the group and deleted once its retention is set or refused for good.
	owed  map[string]bool
	state sinks.State

	throttleMu   sync.Mutex
	throttledAt  time.Time      // when the last summary line was logged
	throttledSum map[string]int // throttled calls since, by kind
}

// groupCreation is one group being created; the other streams of the group
// wait for it instead of making the same calls.
type groupCreation struct {
	done chan struct{}
	err  error
}

func newCreation(streamsPerSecond, groupsPerSecond int) *creation {
	return &creation{streams: newPacer(streamsPerSecond), groups: newPacer(groupsPerSecond),
		inflight: map[string]*groupCreation{}, owed: map[string]bool{}, throttledSum: map[string]int{}}
}

// create makes the group (when the sink may and it is not known to exist)
// and the stream, each at its rate; a stream waiting its turn is counted
// in forwarder_cloudwatch_creations_waiting.
func (s *Sink) create(ctx context.Context, group, stream string) error {
	s.m.waiting.Inc()
	defer s.m.waiting.Dec()
	groupKey := "\x00group\x00" + group
	var groupDenied error // CreateLogGroup refused for want of the permission
	if s.cfg.CreateGroup {
		if err := s.ensureGroup(ctx, group, groupKey); err != nil {
			if !accessDenied(err) || kmsRefused(err) {
				return s.classifyCreate(err, "CreateLogGroup", group, stream)
			}
			// A role may write to groups made elsewhere (by Terraform, say)
			// without logs:CreateLogGroup: the stream is made if the group
			// is there, and the refusal stands only if it is not.
			groupDenied = err
		}
	}
	if !s.cfg.CreateStream {
		// That stream's records wait, retried, until someone makes it;
		// the other streams go on.
		return sinks.NewRetryable("ResourceNotFoundException", fmt.Errorf(
			"log stream %q of group %q does not exist and create_stream is false: create it or set create_stream: true in sink %q", stream, group, s.name))
	}
	err := s.createCall(ctx, kindStream, s.creates.streams, func(ctx context.Context) error {
		_, err := s.api.CreateLogStream(ctx, &cloudwatchlogs.CreateLogStreamInput{LogGroupName: aws.String(group), LogStreamName: aws.String(stream)})
		return err
	})
	var exists *types.ResourceAlreadyExistsException
	var missing *types.ResourceNotFoundException
	if groupDenied != nil && (err == nil || errors.As(err, &exists)) {
		s.known.put(groupKey, "") // it exists: its streams need not try to make it again
	}
	switch {
	case err == nil:
		s.m.created.Inc()
		return nil
	case errors.As(err, &exists):
		return nil
	case errors.As(err, &missing) && groupDenied != nil:
		return s.classifyCreate(groupDenied, "CreateLogGroup", group, stream)
	case errors.As(err, &missing) && s.cfg.CreateGroup:
		s.known.delete(groupKey) // deleted behind our back: create it on the next try
		return sinks.NewRetryable("ResourceNotFoundException", fmt.Errorf("log group %q vanished (deleted while the sink ran): it is made again at the next try: %w", group, awserr.Clean(err)))
	case errors.As(err, &missing):
		return sinks.NewRetryable("ResourceNotFoundException", fmt.Errorf(
			"log group %q does not exist and create_group is false: create the group or set create_group: true in sink %q", group, s.name))
	}
	return s.classifyCreate(err, "CreateLogStream", group, stream)
}

// accessDenied reports whether err is the service's refusal for want of a
// permission.
func accessDenied(err error) bool {
	var ae smithy.APIError
	return errors.As(err, &ae) && (ae.ErrorCode() == "AccessDeniedException" || ae.ErrorCode() == "AccessDenied")
}

// kmsRefused reports whether err is the service's refusal of the group's
// KMS key: AccessDeniedException "The specified KMS key does not exist or
// is not allowed to be used with Arn ..." (the key's policy does not let
// CloudWatch Logs use it), which is the sink's kms_key_id, not the
// credentials' permissions.
func kmsRefused(err error) bool {
	var ae smithy.APIError
	return accessDenied(err) && errors.As(err, &ae) && strings.Contains(ae.ErrorMessage(), "KMS key")
}

// classifyCreate is classify for a creation call. What the service refuses
// in one (InvalidParameterException: a KMS key disabled or not found, tags
// or a class it does not take, a name; AccessDeniedException for a KMS key
// CloudWatch Logs may not use) is the sink's settings, never a record's
// content: the records that need the group or stream wait in the WAL
// instead of being dead-lettered, their partition retrying (with its
// backoff, up to 30 s) until it is fixed, while the streams of other
// groups go on.
func (s *Sink) classifyCreate(err error, op, group, stream string) error {
	var ae smithy.APIError
	switch {
	case kmsRefused(err):
		return sinks.NewRetryable("AccessDeniedException", fmt.Errorf("%s of log group %q was refused its KMS key: check that kms_key_id of sink %q names an enabled key whose key policy allows the service principal logs.<region>.amazonaws.com (kms:Encrypt*, kms:Decrypt*, kms:ReEncrypt*, kms:GenerateDataKey*, kms:Describe*): %w",
			op, group, s.name, awserr.Clean(err)))
	case op == "CreateLogGroup" && len(s.cfg.Tags) > 0 && accessDenied(err) && !s.outcomes.othersTake(group, time.Now()) && errors.As(err, &ae):
		// Tags on a new group need logs:TagResource as well.
		return sinks.NewSinkPermanent(ae.ErrorCode(), fmt.Errorf("the credentials may not create log group %q: grant logs:CreateLogGroup and, as sink %q sets tags, logs:TagResource on it: %w",
			group, s.name, awserr.Clean(err)))
	case errors.As(err, &ae) && ae.ErrorCode() == "InvalidParameterException":
		check := "kms_key_id (the key must be enabled and allow CloudWatch Logs), tags and log_group_class"
		if op == "CreateLogStream" {
			check = "the stream name log_stream renders"
		}
		return sinks.NewRetryable(ae.ErrorCode(), fmt.Errorf("%s refused the parameters of log group %q, stream %q: check %s of sink %q: %w",
			op, group, stream, check, s.name, awserr.Clean(err)))
	case errors.As(err, &ae) && ae.ErrorCode() == "LimitExceededException" && op == "CreateLogStream":
		// Streams have no quota of their number: a limit the service
		// says is reached, which does not pass by itself either.
		return sinks.NewRetryable(ae.ErrorCode(), fmt.Errorf("CreateLogStream of stream %q in log group %q: the service says a limit is reached (LimitExceededException): %w",
			stream, group, awserr.Clean(err)))
	case errors.As(err, &ae) && ae.ErrorCode() == "LimitExceededException":
		// The account's quota of log groups, not a rate: it does not pass
		// by itself, and taken for throttling it would slow every stream.
		return sinks.NewRetryable(ae.ErrorCode(), fmt.Errorf(
			"%s of log group %q: the account's quota is reached (LimitExceededException): delete unused log groups or ask for a higher quota, or name fewer groups in sink %q: %w",
			op, group, s.name, awserr.Clean(err)))
	}
	return s.classifyDenied(err, group, stream)
}

// ensureGroup creates the group unless it is known to exist. Streams of a
// group being created wait for that creation and share its result.
func (s *Sink) ensureGroup(ctx context.Context, group, groupKey string) error {
	for {
		if _, known := s.known.get(groupKey); known {
			return nil
		}
		if groupCheckedHook != nil {
			groupCheckedHook(ctx)
		}
		c := s.creates
		c.mu.Lock()
		// Known again under the lock: a creation that ended since the look
		// above marked the group known before it left inflight, and making
		// the group again would cost a call of the account's quota.
		if _, known := s.known.get(groupKey); known {
			c.mu.Unlock()
			return nil
		}
		if gc := c.inflight[group]; gc != nil {
			c.mu.Unlock()
			select {
			case <-gc.done:
				if gc.err != nil {
					return gc.err
				}
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		gc := &groupCreation{done: make(chan struct{})}
		c.inflight[group] = gc
		c.mu.Unlock()
		return s.createGroupOnce(ctx, group, groupKey, gc)
	}
}

// createGroupOnce makes group for the sends waiting on gc, and lets them
// go however it ends, a panic included (a drainer that recovers it would
// otherwise leave every later send to the group waiting on gc).
func (s *Sink) createGroupOnce(ctx context.Context, group, groupKey string, gc *groupCreation) error {
	c := s.creates
	gc.err = errors.New("the creation of the log group ended abruptly")
	defer func() {
		c.mu.Lock()
		delete(c.inflight, group)
		c.mu.Unlock()
		close(gc.done)
	}()
	gc.err = s.createGroup(ctx, group)
	if gc.err == nil {
		s.known.put(groupKey, "")
	}
	return gc.err
}

// groupCheckedHook, when set (by tests), is called by ensureGroup between
// its first look at the known groups and taking the creations' lock.
var groupCheckedHook func(context.Context)

func (s *Sink) createGroup(ctx context.Context, group string) error {
	in := &cloudwatchlogs.CreateLogGroupInput{LogGroupName: aws.String(group)}
	if s.cfg.LogGroupClass != "" {
		in.LogGroupClass = types.LogGroupClass(s.cfg.LogGroupClass)
	}
	if s.cfg.KMSKeyID != "" {
		in.KmsKeyId = aws.String(s.cfg.KMSKeyID)
	}
	if len(s.cfg.Tags) > 0 {
		in.Tags = s.cfg.Tags
	}
	// The group is owed its retention from the first call on: a call whose
	// answer was lost may have made it, and the next finds it there; so
	// may the next run, should this one stop before the retention is set.
	c := s.creates
	c.mu.Lock()
	owed, st := c.owed[group], c.state
	c.mu.Unlock()
	if s.cfg.RetentionDays > 0 && !owed {
		if st != nil {
			if err := st.Put(ctx, retentionKey(group), nil); err != nil {
				return sinks.NewRetryable("state", fmt.Errorf("record that log group %q is owed its retention: %w", group, err))
			}
		}
		c.mu.Lock()
		c.owed[group] = true
		c.mu.Unlock()
	}
	var conn atomic.Bool // a request of the last attempt got a connection
	err := s.createCall(ctx, kindGroup, s.creates.groups, func(ctx context.Context) error {
		conn.Store(false) // an attempt throttled before made no group
		_, err := s.api.CreateLogGroup(context.WithValue(ctx, connSeenKey{}, &conn), in)
		return err
	})
	var exists *types.ResourceAlreadyExistsException
	switch {
	case errors.As(err, &exists) && !owed:
		s.forgetOwed(ctx, group)
		return nil // someone else made it; its settings are theirs
	case errors.As(err, &exists):
		// This sink made it before, and its retention is not set yet.
	case err != nil:
		if !owed && (!mayHaveMade(err) || !s.mayHaveSent(conn.Load(), err)) {
			// Refused (AccessDenied, a name the service does not take)
			// or never sent: not this sink's group, should another make
			// it. Forgotten even as the sink stops.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			s.forgetOwed(ctx, group)
			cancel()
		}
		return err
	default:
		s.m.created.Inc()
		s.log.Info("created log group", "sink", s.name, "group", group, "retention_days", s.cfg.RetentionDays, "class", s.cfg.LogGroupClass)
	}
	if s.cfg.RetentionDays <= 0 {
		return nil
	}
	// The group's turn covers its retention: one call of each a turn.
	err = s.createCall(ctx, kindRetention, nil, func(ctx context.Context) error {
		_, err := s.api.PutRetentionPolicy(ctx, &cloudwatchlogs.PutRetentionPolicyInput{
			LogGroupName: aws.String(group), RetentionInDays: aws.Int32(int32(s.cfg.RetentionDays))})
		return err
	})
	if err == nil {
		s.forgetOwed(ctx, group)
		if owed {
			s.log.Info("set the retention of log group", "sink", s.name, "group", group, "retention_days", s.cfg.RetentionDays)
		}
		return nil
	}
	var ae smithy.APIError
	if errors.As(err, &ae) && (ae.ErrorCode() == "AccessDeniedException" || ae.ErrorCode() == "AccessDenied" ||
		ae.ErrorCode() == "InvalidParameterException" || ae.ErrorCode() == "ValidationException") {
		// Refused for good (logs:PutRetentionPolicy not granted, a
		// retention the service does not take): the group's records are
		// not held back for its retention. Not credentials that failed
		// for a moment, which the next try sets it with.
		s.forgetOwed(ctx, group)
		s.log.Warn("could not set the retention of log group: its events never expire; grant logs:PutRetentionPolicy, or set retention_days: 0 and set the retention by hand",
			"sink", s.name, "group", group, "retention_days", s.cfg.RetentionDays, "error", err)
		return nil
	}
	return err // the next try sets it
}

// forgetOwed forgets that group is owed its retention. Should the sink's
// state fail to forget it (the WAL failing), the next run sets the
// retention once more.
func (s *Sink) forgetOwed(ctx context.Context, group string) {
	c := s.creates
	c.mu.Lock()
	owed, st := c.owed[group], c.state
	delete(c.owed, group)
	c.mu.Unlock()
	if owed && st != nil {
		if err := st.Delete(ctx, retentionKey(group)); err != nil {
			s.log.Warn("could not delete a log group's owed retention from the sink's state: the next start sets the group's retention_days again; check the WAL's errors", "sink", s.name, "group", group, "error", err)
		}
	}
}

// retentionPrefix starts the sink-state key of each group owed its
// retention (see creation.owed).
const retentionPrefix = "retention/"

func retentionKey(group string) []byte { return []byte(retentionPrefix + group) }

// loadOwed takes the groups owed their retention from st, the sink's
// state, and records those to come there. With retention_days 0 (or
// create_group false) none is owed: the keys an earlier configuration
// left are deleted.
func (s *Sink) loadOwed(ctx context.Context, st sinks.State) error {
	var groups []string
	err := st.Scan([]byte(retentionPrefix), func(k, _ []byte) error {
		groups = append(groups, string(k[len(retentionPrefix):]))
		return nil
	})
	if err != nil {
		return err
	}
	if s.cfg.RetentionDays <= 0 || !s.cfg.CreateGroup {
		for _, g := range groups {
			if err := st.Delete(ctx, retentionKey(g)); err != nil {
				return err
			}
		}
		groups = nil
	}
	c := s.creates
	c.mu.Lock()
	defer c.mu.Unlock()
	c.state = st
	for _, g := range groups {
		c.owed[g] = true
	}
	return nil
}

// errNotSent marks a creation call that createCall did not make: the
// context ended while it waited its turn (after throttled attempts, if
// any, which made nothing either).
var errNotSent = errors.New("cloudwatch: creation call not made")

// mayHaveMade reports whether a CreateLogGroup that failed with err may
// have made the group: not when it was never sent, nor when the service
// answered it with a client error (4xx: refused); yes when its answer was
// lost or was a server error.
func mayHaveMade(err error) bool {
	if errors.Is(err, errNotSent) {
		return false
	}
	var re *awshttp.ResponseError
	return !errors.As(err, &re) || re.HTTPStatusCode() < 400 || re.HTTPStatusCode() >= 500
}

// createCall makes one creation call at the pace of lim and counts its
// outcome. A ThrottlingException is not an error: the call waits with
// backoff and is made again, and every other creation call of lim waits
// as long (the quota is the account's); throttled calls are logged once a
// minute at most, together. Only the context ends the waiting.
//
// With lim nil, the call is made at once and its retries at the pace of
// the groups' pacer.
func (s *Sink) createCall(ctx context.Context, kind string, lim *pacer, call func(context.Context) error) error {
	unpaced := lim == nil
	if unpaced {
		lim = s.creates.groups
	}
	for attempt := 0; ; attempt++ {
		if !unpaced || attempt > 0 {
			if err := lim.wait(ctx); err != nil {
				// Those before, if any, were throttled: none was made.
				return fmt.Errorf("%w: %w", errNotSent, err)
			}
		}
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		err := call(cctx)
		cancel()
		err = awserr.Refetch(ctx, s.creds, err)
		var exists *types.ResourceAlreadyExistsException
		var ae smithy.APIError
		switch {
		case err == nil:
			s.m.creations.WithLabelValues(kind, outcomeCreated).Inc()
			lim.faster()
			return nil
		case errors.As(err, &exists):
			s.m.creations.WithLabelValues(kind, outcomeExists).Inc()
			return err
		case errors.As(err, &ae) && ae.ErrorCode() == "ThrottlingException" && ctx.Err() == nil:
			s.m.creations.WithLabelValues(kind, outcomeThrottled).Inc()
			s.noteThrottled(kind)
			lim.slower()
			lim.pause(createBackoff(attempt))
			continue
		}
		s.m.creations.WithLabelValues(kind, outcomeFailed).Inc()
		return err
	}
}

// createBackoff is the wait after a throttled creation call: 500 ms
// doubling per attempt up to 16 s, the second half of it random.
func createBackoff(attempt int) time.Duration {
	d := 500 * time.Millisecond << min(attempt, 5)
	return d/2 + rand.N(d/2+1)
}

// noteThrottled counts a throttled creation call and logs the summary
// line when the last one is throttleSummaryEvery old.
func (s *Sink) noteThrottled(kind string) {
	c := s.creates
	c.throttleMu.Lock()
	c.throttledSum[kind]++
	now := time.Now()
	if !c.throttledAt.IsZero() && now.Sub(c.throttledAt) < throttleSummaryEvery {
		c.throttleMu.Unlock()
		return
	}
	sum := c.throttledSum
	c.throttledSum, c.throttledAt = map[string]int{}, now
	c.throttleMu.Unlock()
	s.log.Warn("CloudWatch Logs throttled creation calls (an account-wide quota): they wait and are made again with backoff; lower create_rate or group_create_rate, or raise the quota, if this line repeats",
		"sink", s.name, "streams", sum[kindStream], "groups", sum[kindGroup], "retention", sum[kindRetention], "every", throttleSummaryEvery)
}

// pacer spaces calls evenly at a rate a second, one waiter at a time in
// the order they came: the next call's time is decided when its turn
// comes, so that slowing down and pausing hold for every waiter at once.
type pacer struct {
	turn   chan struct{} // holds the turn while no one waits for a slot
	mu     sync.Mutex    // the fields below
	base   time.Duration // the interval as configured
	every  time.Duration // the interval now
	next   time.Time     // the earliest time of the next call
	slowed time.Time     // when it last slowed down
}

func newPacer(perSecond int) *pacer {
	p := &pacer{turn: make(chan struct{}, 1), base: time.Second / time.Duration(perSecond)}
	p.every = p.base
	p.turn <- struct{}{}
	return p
}

// wait returns when the caller may make its call.
func (p *pacer) wait(ctx context.Context) error {
	select {
	case <-p.turn:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { p.turn <- struct{}{} }()
	for {
		p.mu.Lock()
		now := time.Now()
		if !now.Before(p.next) {
			p.next = now.Add(p.every)
			p.mu.Unlock()
			return nil
		}
		d := p.next.Sub(now)
		p.mu.Unlock()
		t := time.NewTimer(d) // a pause may have moved next meanwhile: look again
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}

// pause makes the next call wait at least d from now.
func (p *pacer) pause(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if at := time.Now().Add(d); at.After(p.next) {
		p.next = at
	}
}

// slower halves the rate, at most once a second and down to one call a
// second: the service throttles, so the quota is below the rate (other
// replicas use it too). faster takes the rate back up, a twentieth of the
// way per call that succeeds, to the configured one.
func (p *pacer) slower() {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if now.Sub(p.slowed) < time.Second {
		return // the calls throttled together count once
	}
	p.slowed = now
	p.every = max(p.every, min(2*p.every, time.Second))
}

func (p *pacer) faster() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.every = max(p.base, p.every-p.every/20)
}

func gauge(reg prometheus.Registerer, name, help string, labels prometheus.Labels) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels})
	if reg != nil {
		if err := reg.Register(g); err != nil {
			if are, ok := err.(prometheus.AlreadyRegisteredError); ok {
				return are.ExistingCollector.(prometheus.Gauge)
			}
		}
	}
	return g
}

func counterVec2(reg prometheus.Registerer, name, help string, labels prometheus.Labels, label1, label2 string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, []string{label1, label2})
	if reg != nil {
		if err := reg.Register(c); err != nil {
			if are, ok := err.(prometheus.AlreadyRegisteredError); ok {
				return are.ExistingCollector.(*prometheus.CounterVec)
			}
		}
	}
	return c
}
