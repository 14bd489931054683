// Package httpin is the HTTP input: clients POST JSON log records, and are
// answered 200 only once the records are durable in the WAL.
//
// # Protocol
//
//	POST /v1/logs/{tag}
//	POST /v1/logs?tag={tag}
//
// The tag is the records' routing tag: not empty, at most 1024 bytes of
// UTF-8, no control characters. The body is, by its first byte that is not
// white space:
//
//   - '{': NDJSON, one JSON object per line, blank lines ignored; a single
//     object is the one-line case, and objects that span lines (pretty-printed)
//     or share one are read as well: objects separated by white space;
//   - '[': a JSON array of objects.
//
// Content-Encoding: gzip is read (several gzip members too); no other
// encoding is. Each object becomes one record whose body is the object
// compacted, its keys in the sender's order. Invalid UTF-8 is replaced with
// U+FFFD and counted, not refused. The record's time is the top-level field
// named by time_field (kept in the body): an RFC 3339 string (also with a
// space for the T, in lower case, with an offset without its colon, or with
// none: UTC), or a number of seconds since the epoch (fractional allowed),
// or of milliseconds above 1e11, microseconds above 1e14, nanoseconds above
// 1e17; without the field (or with null), the time the request was
// received. A field that is no such time is not refused either: the
// record takes the time of arrival, counted (and warned about once a
// minute).
//
// Answers, each with a JSON body:
//
//	200 {"stored": N}                every record is durable (N counts them all,
//	200 {"stored": N, "unrouted": M}   M of them wanted by no sink: not stored)
//	400 {"error": "line 3: invalid JSON: ..."}  nothing of the request is stored
//	401 missing or wrong "Authorization: Bearer <token>" (WWW-Authenticate: Bearer)
//	404 another path; 405 another method (Allow: POST)
//	413 a body over max_body_bytes, before or after decompression; more
//	    records than max_records_per_request; a request that needs more
//	    memory than the inputs' budget gives one (nothing is stored)
//	422 an Idempotency-Key already used for a request with another tag or body
//	415 a Content-Encoding other than gzip or identity
//	408 a body that stopped arriving (a minute at less than 1 KiB a second)
//	    or was not whole within 3 minutes; one that keeps arriving is read
//	    to its end
//	503 the WAL is full, the inputs' memory budget had no room for the
//	    request in time, or the server is stopping (Retry-After: 1)
//	500 the WAL failed
//
// Lines and array elements in error messages are numbered from 1.
//
// An Idempotency-Key header (at most 1024 bytes) is stored with the
// records in the same transaction, with a SHA-256 of the request's tag and
// decompressed body; the same key with the same request again within the
// WAL's dedup window is answered as the first time, with X-Duplicate: true,
// and stores nothing. The same key with another tag or body is answered
// 422 and stores nothing: a key names one request. In the WAL a key is
// "http:" and the key (inputs.HTTPChunkID), apart from forward chunk ids. A request answered 503 after waiting for room stored
// nothing: the WAL takes a request whole or not at all, and one whose wait
// ran out is not taken. Sent again with its Idempotency-Key, a request
// whose answer was lost is not stored twice.
//
// A request's body, decompressed, and the records parsed from it are
// reserved from the inputs' memory budget (inputs.Budget) before they are
// allocated: the body is read into a buffer that starts small (16 KiB, or
// the Content-Length when that is less) and doubles as bytes arrive, never
// sized from a Content-Length. A request that finds no room waits for up
// to 5 s, then is answered 503 (reason memory_full), as it is at once when
// every request and connection holding part of the budget waits for more
// and it holds the least; one that needs more than the budget gives one is
// answered 413 (reason over_memory_budget).
//
// Bad input is answered and counted (forwarder_input_rejected_total, by
// reason) and logged, the first of a minute for each reason as a warning
// and the rest at debug level; it never stops the server or another
// client. A request head Go's server refuses itself, before the handler
// (400 a malformed line, 431 headers too large, 501, 417), is counted as
// bad_request_head when its connection closes (Server.headRefused), from
// what the connection saw (limitedConn).
//
// Connections beyond max_connections are closed at once, before any
// answer (reason too_many_connections), except that a connection that has
// not yet sent an authenticated request gives way to a new one: the oldest
// such is closed instead (reason evicted; see limitListener). A connection
// that has not sent a request's headers within read_header_timeout is
// closed; a request without the right token is answered 401 and its
// connection closed. An accept that
// fails for a reason that passes (no file descriptor left) is retried with
// a pause and counted (inputs.RetryAccept), never fatal.
package httpin
