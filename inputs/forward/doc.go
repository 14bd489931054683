// Package forward is the Fluent forward protocol input (v1, server side):
// what Fluent Bit's and Fluentd's forward outputs, and the fluent-logger
// libraries, send to an aggregator.
//
// It accepts the four modes — Message [tag, time, record, option?],
// Forward [tag, [[time, record], ...], option?], PackedForward
// [tag, bin|str, option?] and CompressedPackedForward (option.compressed
// "gzip", one or several gzip members; "zstd", one or several zstd frames
// of windows up to 8 MiB; "text", Fluentd's word for none,
// and a nil option are plain PackedForward) — with the time as EventTime
// (ext 0), integer or float seconds (0 means "now"), or Fluent Bit's
// [time, metadata] pair, whose metadata is not kept (entries whose pair
// has the time -1 or -2 seconds are Fluent Bit's group markers, not
// records: left out). Each record becomes a compact JSON object once, here
// (see transcoder for the rules).
//
// A connection reads one message, stores it in the WAL and, when the
// message carries option.chunk, answers {"ack": chunk} only after the
// records are durable; it reads the next message only then. A chunk id
// seen within wal.dedup_window is acknowledged again without its records
// being stored twice. While the WAL is full the store waits and the
// client feels TCP backpressure.
//
// With shared_key set, a connection starts with the HELO/PING/PONG
// handshake (and checks users, if any). TLS, and client certificates
// with client_ca_file, are configured in tls. The handshake, TLS's and
// then HELO/PING/PONG, must be over within handshake_timeout of the accept
// (reason handshake_timeout), with a PING of at most 64 KiB. Until it is,
// the connection gives way to a new one when max_connections are open: the
// oldest connection still in its handshake is closed (reason evicted,
// inputs.Slots); then the one idle the longest (waiting for a message,
// nothing of one read: reason evicted); a new connection is refused only
// when every open one is at work. An idle connection is never closed on a
// timer: a client that writes without waiting for acks would lose the
// first message it writes into it after a quiet spell; TCP keepalive finds
// peers that are gone.
//
// What a connection holds of messages — the bytes read, the entries of a
// CompressedPackedForward payload as they come out of the decompressor (a
// window as large as the largest entry, not the whole payload), the
// records' JSON and the records — is reserved from the inputs' memory
// budget (inputs.Budget) before it is allocated, and grows with the bytes
// that arrived, never with a length or count the message declares. A
// connection with nothing pending reads into a small buffer of its own and
// holds nothing of the budget. When there is no room, the connection reads
// no further (the client feels TCP backpressure) until there is, or until
// the message's minute is up (reason memory_full); a message that needs
// more than the budget gives one is refused at once (reason
// over_memory_budget), and so is the connection holding the least when
// every connection holding part of the budget waits for more (memory_full).
// Neither is acknowledged: the client sends the message again.
//
// Bad input — malformed or truncated msgpack, wrong types, a tag that breaks
// the inputs' tag rule (inputs.CheckTag: empty, over 1,024 bytes, invalid
// UTF-8, control characters; reason bad_tag), a message over
// max_message_bytes or a compressed payload over four times that once
// decompressed, more records than max_records_per_message (reason
// too_many_records), a message of metrics or traces (option fluent_signal 1
// or 2; reason unsupported_signal), a map key that is not a string and takes more than
// 64 KiB as JSON, bad gzip or zstd, a failed handshake, a message that does not
// arrive whole within a minute of its first byte — closes that connection
// with one log line (remote address, what was wrong, where) and a count
// in forwarder_input_rejected_total; nothing of that message is stored and
// other connections are not affected. Connections beyond max_connections
// are closed at once (see above for those in their handshake and idle). An accept that fails
// for a reason that passes (no file descriptor left) is retried with a
// pause and counted (inputs.RetryAccept), never fatal. UDP heartbeats are
// not answered (answering is optional).
package forward
