// Package cloudwatch is the CloudWatch Logs sink: it ships records to log
// streams named from each record (log_group, log_stream templates), one
// PutLogEvents in flight per stream, each call recorded before it is made
// so that a crash neither loses nor repeats it (see Exactly once across
// crashes).
//
// # Delivery
//
// The drainer (package queue) keeps at most one batch in flight per
// partition, and a partition here is one log stream: within one stream,
// one PutLogEvents at a time per process, so the pre-2023
// InvalidSequenceTokenException races of several flush threads cannot
// happen. Sequence tokens are never fetched; the previous response's
// nextSequenceToken is echoed (AWS has ignored it since January 2023; a
// compatible service that still wants it gets it), and an
// InvalidSequenceTokenException adopts expectedSequenceToken and resends,
// counted (forwarder_cloudwatch_sequence_token_retries_total) and logged at
// debug level only.
//
// A PutLogEvents answered with ResourceNotFoundException creates the log
// group (create_group: with retention_days, log_group_class, kms_key_id and
// tags) and the stream (create_stream), then is sent again. What exists is
// remembered in a bounded cache, so millions of short-lived streams do not
// grow memory; creation calls stay off the hot path.
//
// Creation calls have account-wide quotas (CreateLogStream 50 a second,
// CreateLogGroup 10, PutRetentionPolicy 5), so they are paced for the whole
// sink (create.go): create_rate CreateLogStream calls a second and
// group_create_rate groups a second (CreateLogGroup, then
// PutRetentionPolicy), evenly spaced, one waiter at a time in arrival
// order; the streams of a group being created wait for that creation. A
// ThrottlingException on a creation is waited out with backoff (every
// creation of the sink waits, and the pace halves, at most once a second,
// then climbs back as calls succeed) and the call is made again: counted,
// and logged in one warning a minute at most for all streams, never
// returned to the drainer.
//
// # Exactly once across crashes
//
// PutLogEvents has no idempotency key, and since 2023 it never answers
// DataAlreadyAcceptedException: whether a call a crash interrupted landed
// can only be learnt by reading the stream. So Send, for each call of a
// batch (a batch is one call unless a message is split in parts):
//
//  1. commits, durably, the call's intent: sink-state key
//     "call/<group>\x00<stream>\x00<seq of the call's first event, 20
//     digits>.<its part>" → JSON {v, group, stream, batch_first (the
//     batch's first sequence number), first, last (the smallest and
//     largest sequence numbers of the call's records), events, min_ts,
//     max_ts (milliseconds), from_seq, from_part, to_seq, to_part (the
//     call's first and last events), sha256 (hex, of the call's
//     PutLogEvents body with the sequence token known then, which token
//     keeps: the payload hash SigV4 signs, so the body is hashed once; in
//     version 1 intents, which are still read, of the events in order,
//     each its timestamp and its message's length as 8-byte big-endian
//     integers, then the message), started (Unix milliseconds, just before
//     the commit; a retry of the call, after an answer was lost, keeps the
//     first try's, whose events are the call's too), prior_known and
//     prior (what earlier calls of the process stored at the call's first
//     millisecond, by message: prior.go; an intent with prior is format
//     version 4, which a build that would ignore it refuses)}, and
//     delivered, missing and rejected once known;
//  2. calls PutLogEvents; a call refused whole for an event it does not
//     name (InvalidParameterException) is replaced by its two halves, the
//     first under the same intent key, down to single events, which alone
//     are dead-lettered;
//  3. when calls of the batch follow, rewrites the intent with delivered
//     true (and the records the answer rejected), so that a failure of a
//     later call sends again only the calls that did not land;
//  4. returns Outcome.DeleteState = the stream's intents up to the batch's
//     last record: the drainer deletes them in the WAL transaction that
//     records the batch as delivered and moves the cursor.
//
// A batch's events are sorted by (timestamp, record, part) and cut into
// calls in that order, so an intent names its call's events without
// holding them: they are the events of the stream's records from first to
// last that lie from (min_ts, from_seq, from_part) to (max_ts, to_seq,
// to_part). Events of a delivered call are left out when the batch is sent
// again, except those listed in missing.
//
// Recover, which the drainer calls at start before it reads a record,
// takes every intent not known to be delivered: it rebuilds the call's
// events from the WAL (State.ReadRange from batch_first to last, keeping
// the stream's records) and checks them against events and sha256; waits
// until the call is settle old (events become readable a moment after the
// call; no bound is documented); reads the stream with GetLogEvents over
// min_ts to max_ts + 1 ms, from the head, page after page until
// nextForwardToken comes back unchanged (a page may be empty while events
// remain), at most read_rate calls a second for the sink, waiting out
// ThrottlingException; and matches the call's events with those read as
// multisets of (timestamp, message), counting only events the service
// ingested at or after started (an identical event of the same
// millisecond that an earlier call stored is not one of this call's).
// Then, by forwarder_cloudwatch_indoubt_calls_total's result:
//
//   - delivered: every event found. When the call was all that was left of
//     its batch, a delivered mark up to last is committed with the intent's
//     deletion (State.Delivered) and the drainer skips its records; else
//     the intent is kept with delivered true and the batch's other records
//     are sent when the drainer reads them;
//   - resent: none found (or no stream): the intent is deleted and the
//     drainer sends the call again;
//   - partial: some found (events the service rejected, other writers):
//     the intent is kept, delivered, with missing, and only those events
//     are sent again; those the service rejects again are dead-lettered.
//     The call that sends them may begin at the same event (the service
//     refuses the oldest): its intent carries attempt, one more than the
//     delivered intent's (key suffix .<attempt>, version 3), so that it
//     does not replace the record of what landed, and its events are
//     rebuilt without the delivered call's;
//   - unresolved: sent again without knowing: GetLogEvents answered
//     AccessDenied (one warning naming logs:GetLogEvents, then the same for
//     every call in doubt of the run), or the WAL no longer holds the
//     call's events as they were (wal.when_full: drop_oldest dropped some,
//     the names changed, or message_key renders them otherwise now).
//
// Streams are read with unmask, so that data a log group's data protection
// policy masks does not hide events that landed; a read refused for it
// (AccessDenied: no logs:Unmask; another refusal: a log group that does
// not take it) is made again as stored, and so are the reads after it (one
// info line): masked events are then not found.
//
// A call whose answer is lost while the process runs (a timeout, a dropped
// connection, a 5xx) keeps its intent, and is resolved in the same way at
// the start of the next Send of its stream (settleLost), before anything
// is sent: a call found whole is kept delivered, and the batch skips its
// events. What noteSent counted of events not found is taken back (prior.go).
// A call refused outright (a 4xx), or never sent (no connection, no
// credentials), deletes its intent: it did not land.
//
// Other GetLogEvents errors fail Recover with their class; the drainer
// calls it again (what was resolved stays resolved). At the end Recover
// logs one line, "resolved PutLogEvents calls an earlier run left in doubt
// (a crash, or a stop that cut them short), by reading their streams
// back", with calls, delivered, resent, partial,
// unresolved, events_sent_again and took. Intents of delivered calls none
// of whose records the WAL still holds for their stream are deleted at
// start.
//
// The sink's state also holds a key "retention/<group>" for each group
// the sink set out to create with retention_days and whose retention is
// not set yet (see creation.owed in create.go): Recover loads them, and
// the group's next creation sets the retention although the group exists.
//
// # Guarantee
//
// For streams this forwarder writes alone (the default names put
// ${hostname} in them) and events readable within settle of their call,
// every record the WAL acknowledged is in its stream exactly once, across
// crashes of the process and of the machine and restarts, or is
// dead-lettered. The exceptions are stated where they arise:
//
//   - events not yet readable when the stream is read: the call is sent
//     again, a duplicate counted as resent, never a loss;
//   - a host clock ahead of CloudWatch Logs' by more than a call's latency:
//     calls that landed look ingested before they started and are sent
//     again (duplicates; one warning says to check the clock);
//   - a host clock behind CloudWatch Logs': an identical event an earlier
//     call stored just before the call started looks ingested after it,
//     and would be taken for the call's. Copies the process's earlier calls
//     stored at the call's first millisecond are not (the intent counts
//     them: prior.go); others, of the first call to a stream after a start
//     or of a call beginning before the stream's last millisecond, stored
//     less than the clocks' difference before the call started, are (a
//     call that did not land taken for delivered: keep the clock in sync);
//   - another writer that stores in the stream, after the call started,
//     events identical (millisecond and message) to some of the call's:
//     those are taken as delivered;
//   - AccessDenied on GetLogEvents, drop_oldest and a change of the names
//     or of message_key while calls are in doubt: at least once.
//
// # Events
//
// A record's message is its JSON body, or with message_key that field's
// string value (another value type ships as its JSON; a missing or empty
// one ships the whole body). Timestamps are the event times in
// milliseconds. Before a call, events are sorted by time; events more than
// 14 days old or more than 2 hours in the future are dead-lettered
// ("too_old", "too_new") instead of being sent to fail; events AWS reports
// in rejectedLogEventsInfo are dead-lettered with "too_old", "expired" or
// "too_new". Batches keep AWS's limits: 10,000 events, 1,048,576 bytes
// counted as message bytes + 26 per event, a span of 24 hours.
//
// A message over 1,048,550 bytes (the largest that fits one event) is split
// into numbered parts at UTF-8 boundaries, each sent as its own event with
// the record's timestamp and the prefix "[part I/N] " (I from 1), so the
// parts read back in order.
//
// # Names
//
// Rendered names are sanitised to CloudWatch's rules: a group keeps
// [.-_/#A-Za-z0-9], anything else becomes "_", a leading "aws/" becomes
// "_aws/"; a stream loses ":" and "*" (each becomes "_"). A name over 512
// bytes is rendered again with its longest values shortened
// (template.AppendFoundWithin), so that the template's own text (the
// ${hostname} that keeps replicas apart) is kept; cut at 512 only when
// that is not enough. A field missing from a record renders the sink's
// fallback, counted in forwarder_cloudwatch_name_fallback_total. Before
// that, a tag or field never changes a name's path (package template): a
// "/" inside it becomes "_", and a segment it leaves empty, "." or ".."
// gets "_". A record whose names any of this changed is counted in
// forwarder_cloudwatch_name_sanitised_total, with a warning a minute for
// each template (template.ChangedLog).
//
// # Errors
//
// ThrottlingException is throttled (every stream of the sink backs off and
// fewer are sent at once); AccessDeniedException, UnrecognizedClient and
// invalid credentials pause the sink (sink-permanent); a missing group or
// stream that the sink may not create holds back its own records
// (retried); a PutLogEvents refused whole with
// an InvalidParameterException that checks before sending did not foresee
// is sent again in halves (64 splits a batch, and 16 more per record found
// refused alone, up to 1,024) and dead-letters only the events refused
// alone, unless, every call of the batch made, none was taken, 8 or more
// records were refused alone and no stream's call was taken for 30 s: the
// service refuses every event, and the sink pauses (for 9 tries in a row
// of the batch at most; then it is dead-lettered); network errors, 5xx, clock skew, expired
// credentials (fetched again), a credential service failing for a moment,
// and creations refused for the sink's settings or the group quota are
// retried.
//
// # Metrics
//
// Labelled by sink: forwarder_cloudwatch_put_log_events_total,
// forwarder_cloudwatch_events_total, forwarder_cloudwatch_created_total,
// forwarder_cloudwatch_creations_total{kind,outcome} (kind group, stream or
// retention; outcome created, exists, throttled or failed),
// forwarder_cloudwatch_creations_waiting (streams waiting for creation),
// forwarder_cloudwatch_sequence_token_retries_total,
// forwarder_cloudwatch_split_calls_total,
// forwarder_cloudwatch_name_fallback_total,
// forwarder_cloudwatch_name_sanitised_total, and
// forwarder_cloudwatch_indoubt_calls_total{result} (delivered, resent,
// partial, unresolved).
package cloudwatch
