// Package cloudwatch is the CloudWatch Logs sink: it ships records to log
// streams named from each record (log_group, log_stream templates), one
// PutLogEvents in flight per stream.
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
// "_aws/", at most 512 bytes; a stream loses ":" and "*" (each becomes
// "_"), at most 512 bytes. A field missing from a record renders the
// sink's fallback, counted in forwarder_cloudwatch_name_fallback_total.
// Before that, a tag or field never changes a name's path (package
// template): a "/" inside it becomes "_", and a segment it leaves empty,
// "." or ".." gets "_", counted in forwarder_cloudwatch_name_sanitised_total.
//
// # Errors
//
// ThrottlingException is throttled (every stream of the sink backs off and
// fewer are sent at once); AccessDeniedException, UnrecognizedClient,
// invalid or expired credentials, and a missing group or stream that the
// sink may not create pause the sink (sink-permanent); an
// InvalidParameterException that checks before sending did not foresee
// dead-letters that call's records; network errors and 5xx are retried.
package cloudwatch
