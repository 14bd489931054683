// Package cloudwatchlogs is a strict, in-memory Amazon CloudWatch Logs
// service for tests and the forwarder's dev mode. The real
// aws-sdk-go-v2/service/cloudwatchlogs client talks to it unchanged
// (o.BaseEndpoint = the URL from Start, static credentials, any region).
//
// It is stricter than moto: it enforces every PutLogEvents limit AWS
// documents and reports rejected events with the indexes AWS documents.
//
// # Protocol
//
// awsJson1.1: POST / with X-Amz-Target: Logs_20140328.<Operation> and
// Content-Type: application/x-amz-json-1.1 (parameters allowed). Successful
// answers are 200 with a JSON body (an empty body for operations without
// output). Errors are {"__type": CODE, "message": TEXT} (plus
// expectedSequenceToken where it applies), with the header
// x-amzn-ErrorType: CODE and x-amzn-RequestId on every answer. Client errors
// are 400, injected server errors 500 or 503. Unknown members in a request
// are ignored. Other refusals:
//
//   - no or another service's X-Amz-Target, an operation not listed below, or
//     a method other than POST: 400 UnknownOperationException;
//   - another Content-Type, a body that is not JSON or a member of the wrong
//     JSON type: 400 SerializationException;
//   - a body over 16 MiB: 413 RequestEntityTooLargeException.
//
// # Authentication
//
// Any SigV4 signature is accepted and none is verified, but a request
// without an Authorization header gets 403
// MissingAuthenticationTokenException "Missing Authentication Token" (the
// status of AWS's common MissingAuthenticationToken error).
//
// # Operations
//
// CreateLogGroup, CreateLogStream, DeleteLogGroup, DeleteLogStream,
// DescribeLogGroups, DescribeLogStreams, PutRetentionPolicy,
// DeleteRetentionPolicy, PutLogEvents, GetLogEvents, FilterLogEvents.
//
// # Rules
//
// Every refusal below is 400 InvalidParameterException unless it says
// otherwise; model constraints use AWS's wording, "1 validation error
// detected: Value 'V' at 'PATH' failed to satisfy constraint: ...". Only the
// first broken constraint of a request is reported. Lengths of names count
// characters; sizes of messages count UTF-8 bytes.
//
// Names, in every operation that takes them:
//   - log group name (and logGroupNamePrefix): 1-512 characters of
//     [.\-_/#A-Za-z0-9]; CreateLogGroup also refuses names starting with
//     "aws/" ("/aws/..." is allowed, as in AWS);
//   - log stream name (and logStreamNamePrefix): 1-512 characters without
//     ':' or '*';
//   - logGroupIdentifier: a group name or arn:aws:logs:REGION:ACCOUNT:log-group:NAME,
//     1-2048 characters of [\w#+=/:,.@-] (so not the ARN form ending in
//     ":*"); it excludes logGroupName;
//   - a missing required member: "Value null at 'PATH' ... Member must not be null".
//
// Groups and streams:
//   - CreateLogGroup of an existing group, CreateLogStream of an existing
//     stream: ResourceAlreadyExistsException ("The specified log group already
//     exists", "The specified log stream already exists");
//   - a missing group or stream: ResourceNotFoundException ("The specified log
//     group does not exist.", "The specified log stream does not exist.");
//   - CreateLogGroup takes logGroupClass STANDARD (the default) or
//     INFREQUENT_ACCESS (anything else is refused), kmsKeyId (at most 256
//     characters, stored, not checked against KMS) and tags (1-50; keys 1-128
//     characters, values at most 256);
//   - PutRetentionPolicy accepts retentionInDays 1, 3, 5, 7, 14, 30, 60, 90,
//     120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288 or
//     3653 and refuses any other value; DeleteRetentionPolicy clears it.
//     Retention only decides which new events are refused; stored events do
//     not expire.
//   - DeleteLogGroup removes the group with its streams and events.
//
// PutLogEvents, checked in this order after the names; a refused call stores
// nothing:
//  1. logEvents has 1 to 10,000 (MaxBatchEvents) events;
//  2. each event in turn has a timestamp and a message; the message is valid
//     UTF-8 (raw bytes that are not UTF-8 and \u escapes of unpaired
//     surrogates are refused: "Invalid UTF-8 in the log event message at
//     'logEvents.N.member.message'.", N counting from 1); it has at least 1
//     byte; and len(message)+26 is at most 1,048,576 (MaxEventBytes), so the
//     largest message is 1,048,550 bytes ("Log event too large: S bytes
//     exceeds limit of 1048576"). The Go SDK never sends invalid UTF-8: it
//     replaces it with U+FFFD, which is then stored;
//  3. the sum over the events of len(message)+26 is at most 1,048,576
//     (MaxBatchBytes) ("Upload too large: S bytes exceeds limit of 1048576");
//  4. timestamps never decrease ("Log events in a single PutLogEvents request
//     must be in chronological order."); equal timestamps are in order;
//  5. the group, then the stream, exist (ResourceNotFoundException);
//  6. with legacy sequence tokens on, the token (see below);
//  7. the events are classified by age (see Rejected events); rejected
//     events are not an error;
//  8. the events kept may span at most 24 h: last − first > 86,400,000 ms
//     is refused ("The batch of log events in a single PutLogEvents request
//     cannot span more than 24 hours."); rejected events do not count.
//
// Rejected events. Each event is judged against now = Options.Now() in
// milliseconds; because the batch is sorted, each rule cuts a prefix or a
// suffix of it:
//   - too old: timestamp < now − 14 days (an event exactly 14 days old is
//     kept). tooOldLogEventEndIndex is the number of such events, the
//     exclusive end of the prefix; absent when 0.
//   - expired, when the group has a retention of R days: timestamp < now − R
//     days. expiredLogEventEndIndex is the exclusive end of the prefix of
//     events older than the retention, reported only when it reaches past
//     tooOldLogEventEndIndex (with R ≥ 14 it never does).
//   - too new: timestamp > now + 2 h (exactly 2 h ahead is kept).
//     tooNewLogEventStartIndex is the index of the first such event, the
//     inclusive start of the suffix; absent when there is none.
//
// The events rejected are therefore the first max(tooOldLogEventEndIndex,
// expiredLogEventEndIndex) and those from tooNewLogEventStartIndex on. The
// call succeeds, stores the others (possibly none) and answers
// rejectedLogEventsInfo, which is absent when nothing was rejected. AWS's
// reference describes tooOldLogEventEndIndex as "the index of the last log
// event that is too old. This field is exclusive." and
// tooNewLogEventStartIndex as "the index of the first log event that is too
// new. This field is inclusive."; it says no more of expiredLogEventEndIndex
// than "the expired log events", so its meaning here is this package's
// reading. moto 5.2.1 differs: its tooOldLogEventEndIndex is the index of the
// last too-old event and its tooNewLogEventStartIndex that of the last too-new
// event, and it has no expired index.
//
// Stored events get ingestionTime = now. A stream stays sorted by timestamp
// (arrival order for equal timestamps), as GetLogEvents reads it, whatever
// the order of the batches. Every successful call answers nextSequenceToken
// (56 digits) and advances the stream's uploadSequenceToken; with legacy
// tokens off, as in AWS since January 2023, the sequenceToken sent is
// ignored.
//
// Legacy sequence tokens (SetLegacySequenceTokens(true), AWS before 2023):
// the sequenceToken sent must equal the stream's current token; a stream
// that never had a successful put has none and the token must be omitted.
// Otherwise the call fails, storing nothing, with
//   - DataAlreadyAcceptedException "The given batch of log events has
//     already been accepted. The next batch can be sent with sequenceToken:
//     T" when the token sent is the one the last successful put used (none
//     for the first put) and the messages are those of that put (timestamps
//     are not compared);
//   - InvalidSequenceTokenException "The given sequenceToken is invalid. The
//     next expected sequenceToken is: T" otherwise;
//
// both with expectedSequenceToken T, or T "null" and no
// expectedSequenceToken on a stream that has had no put.
//
// # Reads
//
// GetLogEvents: startTime inclusive, endTime exclusive; limit 1-10,000
// (default 10,000); a page also stops before MaxResponseBytes (1 MiB counted
// as len(message)+26, at least one event). Tokens are "f/" or "b/" and 56
// digits, a position in the time-filtered stream; the prefix gives the
// direction (startFromHead only matters without a token). Without a token,
// startFromHead=true reads from the oldest event forwards and the default
// reads the newest page. nextForwardToken and nextBackwardToken are always
// present; at either end the token sent comes back unchanged. Anything else
// is "The specified nextToken is invalid.". As in the service, a page may be
// short or empty while events remain (see SetSparsePages): a reader goes on
// until the forward token comes back unchanged.
//
// FilterLogEvents: the group's streams, or those of logStreamNames (1-100;
// names that do not exist are ignored) or logStreamNamePrefix (not both);
// startTime and endTime both inclusive; events sorted by timestamp, then
// stream name, then arrival; limit 1-10,000 (default 10,000) and the 1 MiB
// page cap; nextToken only while more events match. filterPattern: empty,
// or terms separated by spaces that must all occur in the message, case
// sensitively; a term is a word of [A-Za-z0-9_] or any text in double
// quotes (\" and \\ escape). Other characters outside quotes are refused
// ("Invalid character(s) in term 'T'"), and JSON ({...}), space-delimited
// ([...]), regular-expression (%...%), '?' and '-' patterns are refused as
// not supported by this emulator rather than answered wrongly.
//
// DescribeLogGroups: logGroupNamePrefix, logGroupClass, limit 1-50 (default
// 50), nextToken; sorted by name. logGroupNamePattern is refused as not
// supported. storedBytes is the sum of the group's message bytes.
//
// DescribeLogStreams: logGroupName or logGroupIdentifier,
// logStreamNamePrefix, orderBy LogStreamName (default) or LastEventTime
// (not with a prefix: "Cannot order by LastEventTime with a
// logStreamNamePrefix."), descending, limit 1-50 (default 50), nextToken.
// Streams carry creationTime, first and last event timestamps,
// lastIngestionTime, uploadSequenceToken and arn; storedBytes is 0, as AWS
// reports it since it deprecated the field.
//
// # Test switches
//
// Each has an Options field for its initial value and a setter that is safe
// to call at any time, from any goroutine. A request goes through them in
// this order:
//  1. SetLatency(d): the request waits d first (a client that gives up, or
//     Close, ends the wait);
//  2. no Authorization header: 403 MissingAuthenticationTokenException;
//  3. SetDenyAll(code): every request fails with that code:
//     AccessDeniedException and UnrecognizedClientException with 400, as
//     CloudWatch Logs models them (ThrottlingException too); any other code,
//     ExpiredTokenException for example, with 403 like AWS's common errors;
//     "" turns it off;
//  4. SetFailures(rate, status): that fraction of all requests, drawn at
//     random (Options.Seed), fails without doing anything: status 503 as
//     ServiceUnavailableException, 500 or another 5xx as InternalFailure;
//  5. the method, target, Content-Type and body size are checked (see
//     Protocol);
//  6. quotas: an operation above its quota of calls a second gets 400
//     ThrottlingException "Rate exceeded" ({"__type":"ThrottlingException",
//     "message":"Rate exceeded"}, x-amzn-ErrorType: ThrottlingException, as
//     AWS answers and as the SDK reads it into *types.ThrottlingException)
//     and does nothing; a token bucket of one second's worth of calls
//     refilled continuously on the real clock. Options.AWSQuotas gives every
//     operation AWS's default quota for the Region (AWSQuota: CreateLogStream
//     50, CreateLogGroup 10, PutRetentionPolicy 5, PutLogEvents 5,000, ...);
//     Options.Quotas and SetQuota(op, n) set one (0 turns it off);
//     SetThrottle(n) is SetQuota("PutLogEvents", n). Without them there is
//     no quota. Throttled(op) counts the throttled answers;
//  7. the operation runs;
//  8. SetDropResponses(rate): that fraction of PutLogEvents calls (whatever
//     their outcome) closes the connection without an answer, after the
//     events were stored: the client sees a transport error and cannot tell
//     whether the batch landed. A resend stores the batch again, as AWS would.
//
// SetLegacySequenceTokens(on) switches the PutLogEvents token rules above.
//
// Two switches change what reads see, not requests:
//   - SetReadDelay(d): GetLogEvents and FilterLogEvents see an event only
//     once d has passed since its ingestionTime (by Options.Now), as a
//     service whose events become readable a moment after the call that
//     stored them (CloudWatch Logs documents no bound on that moment);
//   - SetSparsePages(n): a forward GetLogEvents read serves, while events
//     remain, an empty page (its nextForwardToken is "f/1" and the position
//     in 55 digits) and then a page of at most n events, alternately.
//
// # Inspection
//
// Groups, Events and Calls read the state directly, without HTTP: groups
// with their retention, class, KMS key, tags and streams (event counts,
// stored message bytes, first and last timestamps); a stream's events; the
// number of requests per operation, whatever their outcome (requests with no
// Logs_20140328 target count under ""); Throttled, the requests per
// operation its quota refused; Quotas, the quotas in force.
//
// # Concurrency
//
// Any number of clients may call at once. Calls on one stream run one at a
// time, from validation against the stream to storage; calls on different
// streams run in parallel. Every operation decodes, validates, then looks up
// its group and stream under the server's lock (one helper, handler.go), so
// a call that creates or deletes a group or stream waits for the calls in
// progress.
package cloudwatchlogs
