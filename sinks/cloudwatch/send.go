package cloudwatch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"slices"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs/types"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"

	"github.com/logfwd/forwarder/internal/awserr"
	"github.com/logfwd/forwarder/sinks"
)

// Send delivers one stream's batch: one PutLogEvents at a time, in order.
// Before each call it commits the call's intent (see doc.go); a call that
// succeeds while later calls of the batch are still to be made is marked
// delivered, so that a failure of a later call sends again only the calls
// that did not land. The intents go with the batch's delivery
// (Outcome.DeleteState).
func (s *Sink) Send(ctx context.Context, b *sinks.Batch) (sinks.Outcome, error) {
	group, stream := splitPartition(b.Partition)
	if err := s.settleLost(ctx, b.State, b.Partition); err != nil {
		return sinks.Outcome{}, err
	}
	known := s.intents.of(b.Partition)
	var delivered func(*event) bool
	var out sinks.Outcome
	for _, in := range known {
		if !in.Delivered {
			continue
		}
		delivered = func(e *event) bool { return deliveredBy(known, e) }
		for _, rj := range in.Rejected {
			if rj.Seq >= b.First() && rj.Seq <= b.Last() {
				out.Rejected = append(out.Rejected, rj)
			}
		}
	}
	evs, rejected := s.events(b.Records, s.now(), delivered)
	defer releaseEvents(evs)
	out.Rejected = append(out.Rejected, rejected...)
	cs := calls(evs)
	splits := 0
	retried := s.refusedBefore(b.Partition) // this batch was refused whole before: its refusals are counted
	// landed: a call of the batch was taken (now, or by an earlier try);
	// alone: the records of events refused in calls of their own.
	landed, alone := tookSome(known), map[uint64]bool{}
	var refused *sinks.Error // the last refusal
	// held: calls refused past the splits held on the way to a pause (see
	// below), set aside rather than dead-lettered: split again with the
	// whole budget once a call lands.
	var held [][]event
	holding, taken := true, false
	for {
		for i := 0; i < len(cs); i++ {
			call := cs[i]
			tok, _ := s.tokens.get(group + "\x00" + stream)
			body := newPutBody(group, stream, tok, call)
			in := newIntent(b.Partition, b.First(), call, body, time.Now().UnixMilli())
			in.after(known)
			s.setPrior(in, call)
			if err := putIntent(ctx, b.State, in); err != nil {
				releaseBody(body.b)
				return sinks.Outcome{}, sinks.NewRetryable("state", err)
			}
			s.intents.add(in)
			rj, mayHaveSent, err := s.putTraced(ctx, group, stream, call, body)
			unsent := err != nil && (notSent(err) || !mayHaveSent)
			if err == nil || sinks.Classify(err).Class != sinks.RecordPermanent && !unsent {
				// Landed, or may have (an answer lost: settleLost reads it
				// back before the batch is sent again, and takes back what
				// did not land): counted as stored.
				s.noteSent(b.Partition, call)
			}
			if err == nil {
				landed = true
			}
			if unsent {
				// The call did not land (throttled, refused for its events,
				// or never sent): its intent goes, so that it is not read
				// back before the batch is sent again, nor at start after a
				// crash. A split's first half takes the key again. Also when
				// the stop cancelled the call: it is why it never connected.
				dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stateTimeout)
				if b.State.Delete(dctx, in.key()) == nil {
					s.intents.remove(in)
				}
				cancel()
			}
			if err != nil {
				var e *sinks.Error
				if !errors.As(err, &e) || e.Class != sinks.RecordPermanent {
					return sinks.Outcome{}, err
				}
				refused = e
				if len(call) == 1 && !alone[call[0].seq] { // a split message's parts are one record
					alone[call[0].seq] = true
					if !retried {
						s.noteRefusedAlone(b.Partition) // counted once, not at each try of the batch
					}
				}
				// Splits: 64, and 16 more per record found refused alone, so
				// that a batch with a few such records finds each; held at 64
				// while the service has taken no call, of the batch or of
				// another stream, and refused refusedToPause records alone
				// (it may refuse every event: the sink pauses below).
				budget := min(maxSplits+splitsPerRefused*len(alone), maxSplitsAll)
				hold := holding && !landed && s.refusingAll(len(alone)) && !s.takenWithin(takenWindow)
				if hold {
					budget = maxSplits
				}
				if len(call) > 1 && splits < budget {
					// The service refused the call without saying for which
					// event (InvalidParameterException): its halves are sent in
					// its place, the first under its intent's key, so that only
					// the events it refuses are dead-lettered.
					splits++
					s.m.splitCalls.Inc()
					half := len(call) / 2
					cs = slices.Replace(cs, i, i+1, call[:half], call[half:])
					i--
					continue
				}
				if len(call) > 1 && hold {
					held = append(held, call)
					continue
				}
				for _, ev := range call { // this call's records are refused for good
					rj = append(rj, sinks.Rejection{Seq: ev.seq, Reason: e.Reason})
				}
			}
			if err == nil && (i < len(cs)-1 || len(held) > 0) {
				// Later calls may fail: this one is not to be sent again. Should
				// the commit fail, a retry in this process still skips it, and
				// after a crash Recover reads the stream for it. A refused call
				// is not recorded: its events are sent again with the batch,
				// should the batch not be delivered now.
				done := *in
				done.Delivered, done.Rejected = true, rj
				s.intents.add(&done)
				if err := putIntent(ctx, b.State, &done); err != nil {
					return sinks.Outcome{}, sinks.NewRetryable("state", err)
				}
			}
			out.Rejected = append(out.Rejected, rj...)
		}
		// Looked at once: what follows must not see another stream's call
		// taken meanwhile, which would leave held calls neither sent nor
		// refused.
		taken = s.takenWithin(takenWindow)
		if len(held) == 0 || !landed && !taken {
			break
		}
		cs, held, holding = held, nil, false // a call landed: split them all the way
	}
	if refused != nil && (len(held) > 0 || s.refusingAll(len(alone))) && !landed && !taken {
		// (Only a batch of calls refused: one that made no call, its
		// records dropped before any, as too old, says nothing.)
		// Not these events' content: the service took none of the batch's
		// and refused each record it was sent alone, and no stream's events
		// for a while. Dead-lettered, every record would go (and the oldest
		// dead letters with them, past their bound): the sink pauses, and
		// the batch is sent again whole. While other streams' calls are
		// taken, the batch's events are dead-lettered: its stream's
		// content, which a pause of every stream would not mend. So they
		// are after maxRefusedBatches such pauses in a row for the
		// partition: its content after all (a stream of bad records alone).
		if s.refusedBatch(b.Partition) {
			return sinks.Outcome{}, sinks.NewSinkPermanent(refused.Reason, fmt.Errorf("the service refused each of %d records sent alone and took none of a batch of %d events: it refuses every event (a rule of the endpoint's own, or a proxy), not their content; nothing is dead-lettered (after %d such tries in a row the batch is): %w", len(alone), len(evs), maxRefusedBatches, refused.Err))
		}
		s.log.Warn("a batch the service refused whole, record by record, is dead-lettered as its stream's content: it was refused at each of the sink's last tries, and no stream's events were taken meanwhile",
			"group", group, "stream", stream, "events", len(evs), "tries", maxRefusedBatches, "error", refused.Err)
		// Taken for content: this stream's refusals say nothing more of
		// the service (other streams' still count).
		s.forgetRefusedAlone(b.Partition)
		for _, call := range held {
			for _, ev := range call {
				out.Rejected = append(out.Rejected, sinks.Rejection{Seq: ev.seq, Reason: refused.Reason})
			}
		}
		held = nil
	}
	if len(held) > 0 {
		// Neither sent nor refused (cannot happen: held calls are left
		// only on the way to a pause): sent again rather than passed.
		return sinks.Outcome{}, sinks.NewRetryable("held", fmt.Errorf("%d calls of stream %q of group %q were set aside and not sent", len(held), stream, group))
	}
	s.refusedBatchDone(b.Partition)
	out.Rejected = dedupRejections(out.Rejected)
	out.DeleteState = s.intents.done(b.Partition, b.Last())
	return out, nil
}

// stateTimeout bounds the removal of the intent of a call that did not
// land, which is made also when the stop cancelled the call.
const stateTimeout = 5 * time.Second

// putTraced is put, and whether it may have sent a request: false when
// none of the call's requests got a connection (a dial refused or timed
// out, a DNS failure, a TLS handshake or proxy that failed, a stop that
// cancelled the dial), whatever error the SDK wraps that in. That is
// learnt from the requests' connections (connTrace) once the sink's HTTP
// client is known to report them (a net/http client whose connection was
// seen, Sink.traceable); until then, from the error (sinks.NoConnection).
func (s *Sink) putTraced(ctx context.Context, group, stream string, evs []event, body putBody) (_ []sinks.Rejection, mayHaveSent bool, _ error) {
	var conn atomic.Bool
	rj, err := s.put(context.WithValue(ctx, connSeenKey{}, &conn), group, stream, evs, body)
	return rj, s.mayHaveSent(conn.Load(), err), err
}

// mayHaveSent reports whether a call that ended with err (nil: it
// succeeded) may have sent a request, connected telling whether its trace
// (a context with connSeenKey) saw a connection.
func (s *Sink) mayHaveSent(connected bool, err error) bool {
	if connected && s.traceable {
		s.connTraced.Store(true)
	}
	switch {
	case err == nil:
		return true
	case s.connTraced.Load():
		return connected
	default:
		return !sinks.NoConnection(err)
	}
}

// notLanded is the error of a call none of whose requests landed (each
// was answered with a refusal), though the error is another call's: the
// creation of its stream or group that failed.
type notLanded struct{ err error }

func (e notLanded) Error() string { return e.err.Error() }
func (e notLanded) Unwrap() error { return e.err }

// connSeenKey is the context key of the flag connTrace sets when a
// request of the call gets a connection.
type connSeenKey struct{}

// connTrace, the last middleware before the HTTP client, sets the flag a
// call's context carries (connSeenKey) when one of its requests gets a
// connection. Only the requests' own: credentials are fetched before, with
// a context without the trace.
type connTrace struct{}

func (connTrace) ID() string { return "forwarder.connTrace" }

func (connTrace) HandleDeserialize(ctx context.Context, in middleware.DeserializeInput, next middleware.DeserializeHandler) (
	middleware.DeserializeOutput, middleware.Metadata, error,
) {
	if seen, ok := ctx.Value(connSeenKey{}).(*atomic.Bool); ok {
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { seen.Store(true) }})
	}
	return next.HandleDeserialize(ctx, in)
}

// notSent reports whether err says the call did not land: the service's
// answer refusing it (a 4xx: throttled, denied, a missing stream), or no
// credentials to sign it with (the request never left); not a 5xx or a
// lost answer, after which it may have. A connection that could not be
// made is putTraced's to tell.
func notSent(err error) bool {
	var nl notLanded
	if errors.As(err, &nl) {
		return true
	}
	var re *awshttp.ResponseError
	if errors.As(err, &re) && re.HTTPStatusCode() != 0 { // 0: no answer (the request failed to be sent, or its answer was lost)
		return re.HTTPStatusCode() >= 400 && re.HTTPStatusCode() < 500
	}
	return awserr.NoCredentials(err)
}

// settleLost resolves, before a batch of partition is sent, the calls of
// this run whose answer was lost (a timeout, a dropped connection, a 5xx):
// each is read back from its stream once settle old, as Recover does after
// a crash, so that a call that landed is not sent again (kept delivered,
// its batch skips its events), one that landed in part sends only what is
// missing, and one that did not land is sent again. Without logs:GetLogEvents
// the call is sent again (at least once).
func (s *Sink) settleLost(ctx context.Context, st sinks.State, partition string) error {
	var route func(*sinks.Record) string
	for _, in := range s.intents.of(partition) {
		if in.Delivered {
			continue
		}
		if route == nil {
			route = func(r *sinks.Record) string { return s.routed(st, r) }
		}
		result, n, err := s.resolve(ctx, st, in, route, false, true)
		if err != nil {
			if ctx.Err() != nil {
				return sinks.NewRetryable("stopping", ctx.Err())
			}
			var se *sinks.Error
			switch {
			case !errors.As(err, &se):
				err = sinks.NewRetryable("read_back", err)
			case se.Class == sinks.RecordPermanent || se.Class == sinks.Throttled:
				// About the read, not the batch's records (which a
				// RecordPermanent would dead-letter) nor PutLogEvents' rate
				// (which a throttle would slow for every stream).
				err = sinks.NewRetryable("read_back_"+se.Reason, se.Err)
			}
			return err
		}
		s.m.indoubt.WithLabelValues(result).Inc()
		s.log.Debug("a call whose answer was lost is resolved by reading its stream back", "sink", s.name, "group", in.Group, "stream", in.Stream,
			"events", in.Events, "result", result, "events_sent_again", n)
	}
	return nil
}

// tookSome reports whether one of known is a delivered call the service
// took events of (not one it refused whole).
func tookSome(known []*intent) bool {
	for _, in := range known {
		if in.Delivered && len(in.Rejected) < in.Events {
			return true
		}
	}
	return false
}

// maxSplits bounds the calls a batch splits (about 14 find one refused
// event among 10,000), and splitsPerRefused more for each event found
// refused alone, so that a batch with a few such events finds each of
// them, up to maxSplitsAll; past the bound the rest is dead-lettered whole
// instead of sending up to 2n-1 calls. A refusal of every event (a rule of a compatible
// service's own) pauses the sink instead (refusedToPause).
const (
	maxSplits        = 64
	splitsPerRefused = 16
	maxSplitsAll     = 1024
)

// maxRefusedBatches: a partition's batch refused whole this many Sends in
// a row (a pause each) is dead-lettered after all.
const maxRefusedBatches = 10

// refusedBatch counts a Send of partition's batch that the service
// refused whole and reports whether the sink is to pause for it (fewer
// than maxRefusedBatches in a row); otherwise the count starts again.
func (s *Sink) refusedBatch(partition string) bool {
	s.refusedMu.Lock()
	defer s.refusedMu.Unlock()
	if s.refusedBatches == nil {
		s.refusedBatches = map[string]int{}
	}
	n := s.refusedBatches[partition] + 1
	if n >= maxRefusedBatches {
		delete(s.refusedBatches, partition)
		return false
	}
	s.refusedBatches[partition] = n
	return true
}

// noteRefusedAlone counts a record of partition refused in a call of its
// own.
func (s *Sink) noteRefusedAlone(partition string) {
	s.refusedMu.Lock()
	defer s.refusedMu.Unlock()
	if s.refusedBy == nil {
		s.refusedBy = map[string]int64{}
	}
	s.refusedBy[partition]++
	s.refusedAlone.Add(1)
}

// forgetRefusedAlone takes partition's refusals out of the count: its
// batch was dead-lettered as its content.
func (s *Sink) forgetRefusedAlone(partition string) {
	s.refusedMu.Lock()
	defer s.refusedMu.Unlock()
	s.refusedAlone.Add(-s.refusedBy[partition])
	delete(s.refusedBy, partition)
}

// clearRefusedAlone starts the count again: a call was taken.
func (s *Sink) clearRefusedAlone() {
	if s.refusedAlone.Load() == 0 {
		return // the common case, without the lock
	}
	s.refusedMu.Lock()
	defer s.refusedMu.Unlock()
	s.refusedAlone.Store(0)
	clear(s.refusedBy)
}

// refusedBefore reports whether partition's batch was refused whole at
// the Send before (a pause).
func (s *Sink) refusedBefore(partition string) bool {
	s.refusedMu.Lock()
	defer s.refusedMu.Unlock()
	return s.refusedBatches[partition] > 0
}

// refusedBatchDone forgets partition's refusals in a row: its batch is
// delivered (or dead-lettered).
func (s *Sink) refusedBatchDone(partition string) {
	s.refusedMu.Lock()
	delete(s.refusedBatches, partition)
	s.refusedMu.Unlock()
}

// takenWindow: a PutLogEvents taken within it, by any stream, says the
// service takes events: a batch it refuses whole is its content.
const takenWindow = 30 * time.Second

// takenWithin reports whether a PutLogEvents was taken within d.
func (s *Sink) takenWithin(d time.Duration) bool {
	at := s.lastTaken.Load()
	return at != 0 && time.Since(time.Unix(0, at)) <= d
}

// refusedToPause: this many events refused alone, and none of the batch
// taken once every call of it was made, is the service refusing every
// event: a sink-permanent error. A batch with as many refused events at
// its head goes on to the calls after them, which land.
const refusedToPause = 8

// refusingAll reports whether the service looks to refuse every event:
// alone records of the batch, or as many across batches (a low-rate
// stream's), were refused each in a call of its own, refusedToPause or
// more, with no call taken since.
func (s *Sink) refusingAll(alone int) bool {
	return alone >= refusedToPause || s.refusedAlone.Load() >= refusedToPause
}

// callTimeout bounds one call of the CloudWatch Logs API (PutLogEvents or
// a creation): a call that has no answer by then (an endpoint or proxy that
// took the request and went quiet) ends as a timeout and is retried, so
// that no stream waits on it for good. PutLogEvents takes at most 1 MiB.
var callTimeout = time.Minute

// put sends one call of evs, whose body with the token known when it was
// built is body, creating the group and stream when they are missing and
// following a service's sequence token. It gives body's buffer back.
func (s *Sink) put(ctx context.Context, group, stream string, evs []event, body putBody) ([]sinks.Rejection, error) {
	key := group + "\x00" + stream
	// The SDK serializes the names and the token; the events go in a body
	// built here (body.go), which the SDK signs and sends in its place.
	in := &cloudwatchlogs.PutLogEventsInput{
		LogGroupName:  aws.String(group),
		LogStreamName: aws.String(stream),
		LogEvents:     []types.InputLogEvent{},
	}
	var other []byte // the body with a token that came after body was built
	defer func() { releaseBody(body.b); releaseBody(other) }()
	created := false
	for attempt := 0; ; attempt++ {
		tok, _ := s.tokens.get(key)
		in.SequenceToken = nil
		if tok != "" {
			in.SequenceToken = aws.String(tok)
		}
		opt := withBody(body.b, body.sum)
		if tok != body.token {
			if other == nil {
				other = bodyBuffer(putBodyBytes(group, stream, tok, evs))
			}
			other = appendPutBody(other[:0], group, stream, tok, evs)
			opt = withBody(other, "")
		}
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		res, err := s.api.PutLogEvents(cctx, in, opt)
		cancel()
		err = awserr.Refetch(ctx, s.creds, err)
		if err == nil {
			s.m.puts.Inc()
			now := time.Now()
			s.outcomes.note(group, false, now)
			s.lastTaken.Store(now.UnixNano())
			s.clearRefusedAlone()
			s.tokens.put(key, aws.ToString(res.NextSequenceToken))
			rj := rejections(res.RejectedLogEventsInfo, evs)
			s.m.events.Add(float64(len(evs) - len(rj)))
			return rj, nil
		}
		var bad *types.InvalidSequenceTokenException
		var dup *types.DataAlreadyAcceptedException
		var missing *types.ResourceNotFoundException
		switch {
		case errors.As(err, &bad) && attempt < 5:
			// A service that still uses sequence tokens: take the one it expects.
			s.m.tokenRetries.Inc()
			s.tokens.put(key, aws.ToString(bad.ExpectedSequenceToken))
			s.log.Debug("sequence token refused; sending again with the expected one", "group", group, "stream", stream)
			continue
		case errors.As(err, &dup):
			// This very batch was accepted before (a resend after a lost answer).
			s.tokens.put(key, aws.ToString(dup.ExpectedSequenceToken))
			s.m.puts.Inc()
			s.m.events.Add(float64(len(evs)))
			now := time.Now()
			s.outcomes.note(group, false, now)
			s.lastTaken.Store(now.UnixNano())
			s.clearRefusedAlone()
			return nil, nil
		case errors.As(err, &missing) && !created:
			s.tokens.delete(key)
			if err := s.create(ctx, group, stream); err != nil {
				// Every PutLogEvents of the call was answered (refused):
				// none landed, whatever the creation's error says.
				return nil, notLanded{err}
			}
			created = true
			continue
		}
		return nil, s.classifyDenied(err, group, stream)
	}
}

// rejections maps rejectedLogEventsInfo back to records.
func rejections(info *types.RejectedLogEventsInfo, evs []event) []sinks.Rejection {
	if info == nil {
		return nil
	}
	var out []sinks.Rejection
	add := func(from, to int, reason string) {
		for i := max(from, 0); i < min(to, len(evs)); i++ {
			out = append(out, sinks.Rejection{Seq: evs[i].seq, Reason: reason})
		}
	}
	tooOld := int(aws.ToInt32(info.TooOldLogEventEndIndex))
	add(0, tooOld, "too_old")
	if info.ExpiredLogEventEndIndex != nil {
		add(tooOld, int(*info.ExpiredLogEventEndIndex), "expired")
	}
	if info.TooNewLogEventStartIndex != nil {
		add(int(*info.TooNewLogEventStartIndex), len(evs), "too_new")
	}
	return out
}

// dedupRejections keeps one rejection per record (a split message's parts
// share their record).
func dedupRejections(rj []sinks.Rejection) []sinks.Rejection {
	if len(rj) < 2 {
		return rj
	}
	seen := make(map[uint64]bool, len(rj))
	out := rj[:0]
	for _, r := range rj {
		if !seen[r.Seq] {
			seen[r.Seq] = true
			out = append(out, r)
		}
	}
	return out
}

// classify maps an error of the CloudWatch Logs API to the drainer's classes.
func classify(err error, group, stream string) error {
	if awserr.NoCredentials(err) {
		if awserr.CredentialsTransient(err) { // STS or the credential endpoint failed for a moment
			return sinks.NewRetryable("credentials", awserr.Clean(err))
		}
		return sinks.NewSinkPermanent("no_credentials", awserr.NoCredentialsHelp(awserr.Clean(err)))
	}
	if awserr.ClockSkew(err) { // the next call is signed with the offset the SDK learnt
		return sinks.NewRetryable("clock_skew", awserr.Clean(err))
	}
	err = awserr.Clean(err)
	if awserr.NotRenewed(err) { // expired, and fetched again the same
		return sinks.NewSinkPermanent("expired_credentials", awserr.NotRenewedHelp(err))
	}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		code := ae.ErrorCode()
		switch code {
		case "ThrottlingException", "LimitExceededException", "RequestLimitExceeded":
			return sinks.NewThrottled(code, 0, err)
		case "AccessDeniedException", "AccessDenied":
			return sinks.NewSinkPermanent(code, fmt.Errorf("the credentials may not write to log group %q: grant logs:PutLogEvents, logs:CreateLogStream and logs:CreateLogGroup on it: %w", group, err))
		case "UnrecognizedClientException", "InvalidClientTokenId", "InvalidSignatureException", "IncompleteSignature",
			"MissingAuthenticationTokenException", "MissingAuthenticationToken", "SignatureDoesNotMatch":
			return sinks.NewSinkPermanent(code, fmt.Errorf("AWS does not accept the credentials: check the credential chain (environment, shared config, web identity, instance profile): %w", err))
		case "ExpiredTokenException", "ExpiredToken", "TokenRefreshRequired":
			// The sink had its credentials fetched again (expired), and
			// got new ones (awserr.Refetch): the next try uses them.
			return sinks.NewRetryable(code, fmt.Errorf("the AWS credentials had expired; new ones were fetched for the next try: %w", err))
		case "InvalidParameterException":
			return sinks.NewRecordPermanent(code, err)
		case "ResourceNotFoundException":
			return sinks.NewRetryable(code, fmt.Errorf("log stream %q of group %q: %w", stream, group, err))
		case "ServiceUnavailableException", "InternalFailure", "InternalServerError", "OperationAbortedException":
			return sinks.NewRetryable(code, err)
		}
		var re *awshttp.ResponseError
		if errors.As(err, &re) && re.HTTPStatusCode() >= http.StatusInternalServerError {
			return sinks.NewRetryable(fmt.Sprintf("http_%d", re.HTTPStatusCode()), err)
		}
		return sinks.NewRetryable(code, err)
	}
	var re *awshttp.ResponseError
	if errors.As(err, &re) && re.HTTPStatusCode() >= http.StatusInternalServerError {
		// An answer that is no AWS error (the HTML of a load balancer or
		// proxy in front of the endpoint): its status, not "network".
		return sinks.NewRetryable(fmt.Sprintf("http_%d", re.HTTPStatusCode()), fmt.Errorf("the endpoint answered HTTP %d without an AWS error (a load balancer or proxy in front of it?): %w", re.HTTPStatusCode(), err))
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return sinks.NewRetryable("timeout", fmt.Errorf("no answer within %s: the call may have landed (a PutLogEvents is read back from its stream before it is sent again): %w", callTimeout, err))
	}
	if errors.Is(err, context.Canceled) {
		return sinks.NewRetryable("timeout", err)
	}
	return sinks.NewRetryable("network", err)
}
