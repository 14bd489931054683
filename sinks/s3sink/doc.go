// Package s3sink delivers records to Amazon S3 (or a compatible service) as
// compressed JSON-lines objects whose keys and bytes are a pure function of
// the records they hold, so that an upload repeated after a crash rewrites
// the same object instead of adding a second one.
//
// # Objects
//
// An object holds records of one partition in sequence order, one line
// each, every line ending in "\n". A line is the
// record's body as stored in the WAL, byte for byte, with up to two members
// added right after its opening brace, in this order:
//
//   - time_key (default "@timestamp"), when the body has no top-level member
//     of that name: the event time in UTC as RFC 3339 with nine fractional
//     digits, always 30 characters: "2025-06-15T15:06:40.123456789Z";
//   - tag_key (default empty: off), likewise: the record's tag, as a JSON
//     string (package internal/jsonstr: `"`, `\` and control characters
//     escaped, each byte of invalid UTF-8, which only tags stored before
//     the inputs refused them can hold, as \ufffd).
//
// A body that is not a JSON object is written as it is.
//
// An object is built member by member: each batch the drainer hands the
// sink (at most an eighth of max_object_bytes of lines, and 8 MiB) is
// compressed on its own, and the object is its members one after the
// other. A gzip object is one gzip stream: its header, each member raw
// deflate ended by a sync flush (a fresh dictionary each), then an empty
// final block and the trailer (CRC-32 and length of all the lines), so
// that readers that stop after a first gzip member (README.md, S3) read
// it whole; objects of intents made before (encoding.OneStream false) are
// rebuilt as they were, gzip members one after the other. zstd objects are
// frames one after the other. x-amz-meta-forwarder-records says how many
// records an object holds, to check a reader. Between batches the object is carried
// (sinks.Outcome.Carry): the drainer holds it, counted against the sink's
// memory share, and keeps the cursor before its records. Its members are
// staged (see Staging) or, without staging, held in the carry. Each
// member depends on its lines and nothing else:
//
//   - gzip (github.com/klauspost/compress/flate) at compression_level 1-9:
//     raw deflate ended by a sync flush, after the header (no name, no
//     modification time, OS 255) for the first;
//   - zstd (github.com/klauspost/compress/zstd) at compression_level 1-4
//     (fastest to best): a frame from a single encoder goroutine, with a
//     content checksum;
//   - none: the lines.
//
// The compressor is fed in chunks cut at the first line end after each
// 256 KiB, a function of the lines alone. Objects carry Content-Type
// application/x-ndjson, Content-Encoding gzip or zstd (none: absent), the
// sink's sse, kms_key_id, storage_class, acl and tags (x-amz-tagging), the
// user metadata x-amz-meta-forwarder-sha256 (the hex SHA-256 of the
// object's bytes, see Conditional writes) and x-amz-meta-forwarder-records
// (its records, one a line), and
// an integrity checksum S3 verifies: x-amz-checksum-sha256 on PutObject
// (the same SHA-256 is the SigV4 payload hash, so the SDK does not hash the
// object again), Content-MD5 on each part of a multipart upload. Objects above
// multipart_threshold bytes (compressed) are uploaded in parts of
// max(5 MiB, size/10,000) but the last, one after the other.
//
// # Keys and partitions
//
// The key template (see package template) is rendered per record with
// markers standing for ${seq} and ${uuid}; that text is the record's
// partition. Records of one tag, one time bucket (the template's %Y to %S
// of the event time, UTC) and the same rendered fields share a partition and
// so an object; each time bucket is its own partition. A missing field or
// tag part without a default renders "unknown" and is counted in
// forwarder_s3_key_fallback_total. Control characters that a tag or field
// would put in a key become "_". A tag or field never changes the key's
// path (package template): a "/" inside it becomes "_", and a segment it
// leaves empty, "." or ".." gets "_" in place of each missing part or dot.
// Values that would make a key over 1,024 bytes are shortened
// (template.AppendFoundWithin), with a warning a minute. Each is counted
// in forwarder_s3_key_sanitised_total. Intents record the rules
// their key was rendered with (key_rules), so that an upload interrupted
// before these rules existed is finished under the key it was given. An object's key is its partition with
// ${seq} = the sequence number of its first record, 20 digits zero-padded,
// and ${uuid} = a random UUID kept in the intent. A key over 1,024 bytes
// with its values shortened as far as they go (the template's own text too
// long, which the configuration's check refuses) is refused and its batch
// dead-lettered (reason key_too_long).
//
// An object is finished (uploaded) when it holds max_object_bytes of lines
// before compression (Size counts each line with its newline; the drainer
// cuts each batch within the room the carry has left, Carry.Room, and
// finishes an object whose room is too small for the next record),
// max_object_age after its first record was read, or early when the drainer
// asks for it with a final batch: at most max_open_objects partitions
// filling at once (the one that waited longest is finished), or the
// largest once half the sink's memory share is held and carries take twice
// the memory of queued records, or when staging has no room for its next
// member. 16 sends in flight, one per partition. A stop loses the carried
// members, not their records: the cursor is before them, and they are read
// and built again at the next start.
//
// # Staging
//
// With Options.StagingDir and staging_max_bytes > 0, an open object's
// members are written to a file of its own in that directory (named by a
// hash of the partition), and the carry holds only the object's
// bookkeeping: its records per member, the length of its file and the
// SHA-256 state after its bytes. A member is written at the carry's length
// and the file cut there (open, write, truncate, close; no fsync, no
// descriptor kept), so that a send that failed after writing leaves the
// carry it was given valid. The final batch's member is not written: the
// object is uploaded from the file's first bytes followed by that member
// in memory, after the file is checked against the SHA-256 (a file found
// missing or damaged is rebuilt from the WAL with State.ReadRange, as
// Recover does). The file is removed once its object is delivered or
// refused for its content. When a member would take the files past
// staging_max_bytes or cannot be written, a staged object is finished with
// it, and a new object is held in memory. Recover removes every file in
// the directory: no object is open before the drainer reads records, and
// the cursor is before the records of those a previous run left. A carry
// the drainer gives up (it reads its records again: the WAL dropped some
// with wal.when_full: drop_oldest, or the sink refused a batch it carried)
// is discarded (sinks.Discarder): its file and its bytes leave staging.
//
// # The intent protocol
//
// Send, for an object of records first..last of partition P (its carried
// members and the batch's):
//
//  1. builds the object's bytes (the members joined) and key;
//  2. commits, durably, the intent: sink-state key "intent/<object key>" →
//     JSON {v, key, partition, first, last, records, bytes, sha256 (hex, of
//     the object), lines_bytes, lines_crc32c (of the lines before
//     compression), members (the records of each member, when there are
//     more than one), uuid, upload_id, key_template, hostname, encoding
//     {compression, level, time_key, tag_key}, match (the sink's match
//     globs: Recover rebuilds the batch from the records of those tags,
//     with State.ReadRangeAll when the sink's match changed since)};
//  3. uploads, if the key is free (If-None-Match: *, see Conditional
//     writes): PutObject, or CreateMultipartUpload, a second commit of the
//     intent with its upload_id, the parts, CompleteMultipartUpload (on a
//     failure, AbortMultipartUpload);
//  4. returns Outcome.DeleteState = [the intent's key]: the drainer deletes
//     the intent in the same WAL transaction that records P as delivered
//     up to last and moves the cursor.
//
// A failed send leaves the intent; the drainer sends the same batch again,
// which reuses it (the same key, the same ${uuid}) after aborting its
// multipart upload. Recover, which the drainer calls at start before it
// reads a record, takes every intent left by a crash or a shutdown: it
// reads first..last back from the WAL a piece at a time (State.ReadRange),
// keeping only the records whose partition (rendered with the intent's
// template and host name) is the intent's: the object of a quiet partition
// can span much of the WAL, which is never held in memory whole. It
// rebuilds the object with the intent's encoding and members, checks the
// lines against lines_bytes and lines_crc32c (a mismatch is an error naming
// the intent: the WAL and the intent disagree, and nothing is uploaded;
// the same lines compressed to other bytes, a compressor changed by an
// upgrade, rewrite the intent with the new object's bytes and sha256 and
// keep the earlier ones in was (up to four: the first and the latest),
// any of them found under the key being this object),
// aborts the recorded multipart upload and any other in progress for that
// key, uploads again under the same key (an upload that had landed before
// the crash is found there, and nothing is written), and records the
// delivery and deletes the intent in one transaction (State.Delivered).
// While S3 fails, Recover retries with backoff until it succeeds or its
// context ends.
//
// # Conditional writes
//
// Every PutObject and CompleteMultipartUpload carries If-None-Match: *:
// S3 writes the object only if the key does not exist, and answers 412
// PreconditionFailed otherwise, writing nothing (AWS S3 since 2024; in a
// versioned bucket, the current version counts). So no upload ever
// replaces an object, the sink's own or another writer's. On a 412 the sink
// reads the key's object (HeadObject) and compares it with the intent:
//
//   - the same object: an upload of an earlier attempt, or of a process that
//     crashed before it committed the delivery, landed. The batch counts as
//     delivered, the intent is deleted with the delivery as after an
//     upload, and forwarder_s3_conditional_conflicts_total{outcome="same"}
//     counts it. This is the path of every re-upload after a crash whose
//     upload had landed (Recover) and of a retry whose answer was lost.
//   - anything else: another writer renders the same keys (forwarders
//     sharing a bucket, a key without ${hostname}; or a WAL started anew,
//     whose sequence numbers begin again at 1). The send fails
//     sink-permanent (reason PreconditionFailed) with a message naming the
//     bucket, the key and the fix (put ${hostname} or another per-replica
//     field in key), counted in outcome="other"; the drainer pauses the
//     sink with one error line, and no record is dropped or dead-lettered.
//     From then on every send fails with the same error at once, until a
//     restart: keys that collide collide again until the key template
//     changes, which needs a restart, and a sink resumed by a probe of
//     another partition would only meet the collision again. At the
//     restart, Recover finds the intent whose key is taken: if the key
//     template or host name changed, it gives the intent up (nothing of it
//     is in S3) and its records, still after the cursor, are sent again
//     under the new keys; if not, the sink pauses again, and the probes of
//     the pause call Recover again, which returns the same error at once
//     (the object is not uploaded again at each).
//
// "The same object" is decided, in this order, by the object's size (it
// must be the intent's bytes), then by the metadata
// x-amz-meta-forwarder-sha256 that every upload of this sink writes (the
// intent's sha256). The metadata serves single and multipart uploads
// alike and costs one HeadObject; S3 does not verify it, but only a
// forwarder writes it, from the bytes it sends (S3 verifies those against
// x-amz-checksum-sha256 or each part's Content-MD5). The ETag is
// not used: it is the MD5 of the bytes only for a PutObject without
// SSE-KMS or SSE-C, a multipart upload's is the MD5 of its parts' MD5s and
// depends on the part size, and the sink computes no MD5 of the whole
// object. For an object without the metadata (written by a version before
// it, or by a store that drops user metadata), the whole-object SHA-256
// checksum S3 keeps for a PutObject (x-amz-checksum-sha256, HeadObject with
// ChecksumMode ENABLED; a multipart upload's is composite, "-N", and this
// sink's multipart uploads carry none) decides; without either, the object
// is read (GetObject) and hashed. Reading needs s3:GetObject: without it a
// taken key pauses the sink with a message saying to allow it. An object
// found gone between the 412 and the read is retried. An object Recover
// rebuilds into other compressed bytes (the compressor changed since the
// crash) is compared with both the rebuilt object and the one the intent
// recorded: the key may hold the latter.
//
// A 409 ConditionalRequestConflict (another conditional write of the key
// in progress) is retried; for CompleteMultipartUpload the retry, as every
// retry, aborts the upload and begins a new one, as AWS asks. A 501
// NotImplemented (a store that refuses the header) pauses the sink. A
// store that ignores the header writes as before: an upload after a crash
// rewrites the same bytes, and a collision overwrites another writer's
// object, unseen.
//
// # Guarantee
//
// With a key template without ${uuid}, every record the WAL acknowledged
// is in exactly one object and no two objects of a partition overlap,
// across crashes of the process and of the machine, restarts and S3
// outages. A crash after an upload and before its delivery was committed
// costs one refused upload (412: the object is there, nothing is written,
// no version added in a versioned bucket), or one identical upload with a
// store that ignores If-None-Match. The
// exceptions are stated where they arise: wal.when_full: drop_oldest, whose
// drops can leave a partly uploaded batch that is sent again in part;
// and ${uuid} keys, which are new at each start. A change of the key
// template, the host name or the sink's match while records wait keeps
// exactly once: the drainer reads what partitions delivered ahead of the
// cursor through the earlier key template (Partitioning, Router) and
// match (queue.Options.MatchGlobs).
//
// # Errors
//
// Classified for the drainer (package sinks):
//
//   - throttled: SlowDown, any 503 or 429 and *Throttling* codes, with the
//     wait from x-amz-retry-after or Retry-After when S3 gives one;
//   - retryable: other 5xx, RequestTimeout, InternalError, OperationAborted,
//     409s (ConditionalRequestConflict among them), BadDigest and other
//     corruptions in transit, NoSuchUpload (an
//     upload aborted under us), RequestTimeTooSkewed and other clock skew,
//     ExpiredToken (the credentials fetched again), KMS failing for a
//     moment, InvalidPart, network errors and timeouts (a minute per call
//     plus a second per MiB);
//   - record-permanent: KeyTooLongError, EntityTooLarge;
//   - sink-permanent: NoSuchBucket, AccessDenied, InvalidAccessKeyId,
//     SignatureDoesNotMatch, InvalidToken, other KMS.* and *Disabled KMS codes, a
//     bucket in another region, InvalidStorageClass,
//     AccessControlListNotSupported, InvalidTag, NotImplemented, a key that
//     holds another writer's object (PreconditionFailed, see Conditional
//     writes), missing credentials, and any other 4xx; each with a message
//     that says what to fix, such as
//     "bucket my-logs does not exist (NoSuchBucket): create it or fix
//     sinks[archive].bucket".
//
// The SDK client retries nothing itself: the drainer owns retries.
//
// # Metrics
//
// Labelled by sink only: forwarder_s3_objects_uploaded_total,
// forwarder_s3_uploaded_bytes_total (as stored),
// forwarder_s3_uncompressed_bytes_total, forwarder_s3_recovered_intents_total,
// forwarder_s3_multipart_uploads_total, forwarder_s3_key_fallback_total,
// forwarder_s3_key_sanitised_total; and by sink and outcome ("same",
// "other"), forwarder_s3_conditional_conflicts_total.
//
// # Usage
//
//	sink, err := s3sink.New(ctx, s.Name, *s.S3, s3sink.Options{Hostname: host, Logger: log, Registerer: reg})
//	defer sink.Close()
//	d := queue.New(w, s.Name, sink, queue.Options{Match: match, Fingerprint: sink.Fingerprint()})
//	err = d.Run(ctx) // calls sink.Recover, then Send per object
package s3sink
