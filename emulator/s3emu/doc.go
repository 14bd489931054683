// Package s3emu is a local Amazon S3 service for tests and the forwarder's
// dev mode: github.com/johannesboyne/gofakes3 behind a handler that adds
// test switches, checksum verification and request counts. The real
// aws-sdk-go-v2/service/s3 client talks to it unchanged: o.BaseEndpoint = the
// URL from Start, o.UsePathStyle = true, static credentials, any region.
//
// # Storage
//
// In memory by default (gofakes3's s3mem backend). With Options.Dir, buckets
// and objects live in one bbolt file, Dir/s3.db, and survive restarts:
//
//	_buckets            bucket name → JSON {"created": time}
//	<bucket>/meta       object key → JSON {metadata, size, modified, md5}
//	<bucket>/data       object key → the object's bytes
//
// A PUT is one bbolt transaction, fsynced before the answer. Multipart
// uploads in progress are held in memory (gofakes3's uploader) and are lost
// by a restart, as if a lifecycle rule had aborted them; completed ones are
// ordinary objects.
//
// # What it checks
//
// gofakes3 answers the REST protocol: PutObject, GetObject, HeadObject,
// DeleteObject(s), CopyObject, ListObjects (v1 and v2), CreateBucket,
// multipart uploads (create, upload part, complete, abort, list), with
// Content-MD5 verified (400 BadDigest or InvalidDigest). In front of it this
// package verifies x-amz-checksum-sha256, -sha1, -crc32 and -crc32c on PUT
// bodies as S3 does (400 BadDigest), which gofakes3 only stores.
// Signatures are not verified; any credentials work. Objects keep the
// headers they were written with (Content-Type, Content-Encoding and every
// x-amz-* header: storage class, server-side encryption, KMS key id, ACL,
// tagging, checksums, x-amz-meta-*), and GetObject and HeadObject answer
// them back (the checksums only with x-amz-checksum-mode: ENABLED, as S3
// does). Nothing is encrypted and no KMS key is checked. One difference
// from S3 is gofakes3's: in memory, an object written over another keeps
// the x-amz-meta-* keys of the one it replaced that it does not set itself
// (S3 and the bbolt store replace the metadata whole); tests that overwrite
// an object to see what the sink makes of it delete it first.
//
// # Conditional writes
//
// PutObject and CompleteMultipartUpload honour If-None-Match as AWS
// documents it: "*" writes the object only if the key does not exist, and
// answers 412 PreconditionFailed otherwise ("At least one of the
// pre-conditions you specified did not hold", with
// <Condition>If-None-Match</Condition>), storing nothing; a refused
// CompleteMultipartUpload leaves its upload open, to be aborted. Any other
// value is 501 NotImplemented (<Header>If-None-Match</Header>). A missing
// bucket or upload is answered as such, not with 412. Writes of one key
// (PutObject, CompleteMultipartUpload, CopyObject) are serialised, so that
// of conditional writes racing for a key exactly one wins. gofakes3 checks
// "*" on PutObject only, with its own message; CopyObject's If-None-Match
// is not implemented.
//
// # Test switches
//
// Safe to call at any time from any goroutine; a request meets them in this
// order, before anything else happens:
//  1. SetDenyAll(true): every request fails with 403 AccessDenied;
//  2. SetFailures(rate): that fraction of requests, drawn at random
//     (Options.Seed), fails with 503 SlowDown;
//  3. SetNoListBucket(true): a GetObject or HeadObject of a key that does
//     not exist, in a bucket that does, fails with 403 AccessDenied, as S3
//     answers credentials without s3:ListBucket.
//
// A refused request's body is read and discarded first, so that the client
// sees the answer rather than a reset connection.
//
// # Inspection
//
// Buckets, Objects and Get read the store directly, without HTTP: each
// object's key, size, ETag, content type and encoding, storage class,
// server-side encryption, ACL, tagging, SHA-256 checksum and user metadata,
// and its bytes. Calls counts the requests per operation (PutObject,
// UploadPart, CreateMultipartUpload, CompleteMultipartUpload,
// AbortMultipartUpload, ...), refused ones included.
package s3emu
