package s3sink

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"

	"github.com/logfwd/forwarder/sinks"
)

// metaSHA256 is the user metadata (x-amz-meta-forwarder-sha256) every
// object is written with: the hex SHA-256 of its bytes, the intent's
// sha256. It tells this sink's object from another writer's under the
// same key, for single and multipart uploads alike (see doc.go).
const metaSHA256 = "forwarder-sha256"

// codeKeyTaken is the reason of the sink-permanent error of a key that
// holds another writer's object.
const codeKeyTaken = "PreconditionFailed"

// metaRecords is the user metadata (x-amz-meta-forwarder-records) that
// says how many records, one a line, the object holds: what a reader of
// the object must count (a reader that stops after the first gzip member
// counts fewer).
const metaRecords = "forwarder-records"

func objectMetadata(in *intent) map[string]string {
	return map[string]string{metaSHA256: in.SHA256, metaRecords: strconv.Itoa(in.Records)}
}

// preconditionFailed reports whether err is S3's refusal of
// If-None-Match: *: the key exists.
func preconditionFailed(err error) bool {
	var ae smithy.APIError
	if errors.As(err, &ae) && ae.ErrorCode() == "PreconditionFailed" {
		return true
	}
	return httpStatus(err) == http.StatusPreconditionFailed
}

func httpStatus(err error) int {
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

// settle decides about a key that If-None-Match: * found taken. Holding
// exactly in's object, the key needs nothing more (nil): an earlier
// attempt's upload, or a crashed process's, landed and its delivery was
// not recorded. Holding anything else, it is another writer's: a
// sink-permanent error that says so, and nothing is written.
func (s *Sink) settle(ctx context.Context, in *intent, refused error) error {
	same, err := s.holdsObject(ctx, in)
	if err != nil {
		return err
	}
	if same {
		s.m.conflictSame.Inc()
		return nil
	}
	s.m.conflictOther.Inc()
	return sinks.NewSinkPermanent(codeKeyTaken, &actionError{
		msg: fmt.Sprintf("bucket %s already holds another writer's object under key %q (PreconditionFailed: the key exists, with other bytes than this sink's): "+
			"forwarders sharing the bucket render the same keys; put ${hostname} or another per-replica field in sinks[%s].key and restart "+
			"(replicas number their records from the second their WALs began, one a record: their numbers meet sooner or later; if this sink was renamed, it started over from the oldest record of the WAL and meets what it wrote under its old name: give it back that name, or change the key; two sinks of one configuration whose matches overlap must not share a bucket and key); "+
			"nothing was overwritten, and the records wait in the WAL", s.bucketOf(in), in.Key, s.name),
		code: codeKeyTaken, err: refused,
	})
}

// keyTaken reports whether err is settle's refusal of another writer's key.
func keyTaken(err error) bool {
	var ae *actionError
	return errors.As(err, &ae) && ae.code == codeKeyTaken
}

// landed reports whether in.Key holds exactly in's object, false when
// the key holds nothing (or another object).
// S3 answers 403, not 404, for a key that does not exist to credentials
// without s3:ListBucket on the bucket: the sink cannot tell the object
// missing from not allowed, and waits (paused) until it may.
func (s *Sink) landed(ctx context.Context, in *intent) (bool, error) {
	same, err := s.holdsObject(ctx, in)
	b := s.bucketOf(in)
	switch {
	case err != nil && sinks.Classify(err).Reason == "NoSuchKey":
		return false, nil
	case err != nil && httpStatus(err) == http.StatusForbidden:
		return false, sinks.NewSinkPermanent("AccessDenied", &actionError{
			msg: fmt.Sprintf("the sink cannot tell whether key %q in bucket %s holds an earlier attempt's upload (HTTP 403; S3 answers 403 for a key that does not exist when the credentials lack s3:ListBucket): "+
				"allow s3:ListBucket on arn:aws:s3:::%s and s3:GetObject on arn:aws:s3:::%s/* to the forwarder's credentials", in.Key, b, b, b),
			code: "AccessDenied", err: err,
		})
	}
	return same, err
}

// head is a HeadObject of key, asking S3's checksum with mode ENABLED.
func (s *Sink) head(ctx context.Context, bucket, key string, mode types.ChecksumMode) (*s3.HeadObjectOutput, error) {
	cctx, cancel := context.WithTimeout(ctx, callTimeout(0))
	defer cancel()
	return s.api.HeadObject(cctx, &s3.HeadObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), ChecksumMode: mode})
}

func hasMetaSHA256(head *s3.HeadObjectOutput) bool {
	for k := range head.Metadata {
		if strings.EqualFold(k, metaSHA256) {
			return true
		}
	}
	return false
}

// holdsObject reports whether in.Key holds exactly in's object (or the
// ones in.Was names): its size, then the SHA-256 in its metadata (every
// object this sink writes has it), or else, for an object written without
// it, its SHA-256 checksum when S3 kept one for the whole object (a
// PutObject's), or else its bytes, read and hashed.
func (s *Sink) holdsObject(ctx context.Context, in *intent) (bool, error) {
	var sums []objectSum
	sums = append(sums, objectSum{bytes: in.Bytes, sha256: in.SHA256})
	for _, o := range in.Was {
		sums = append(sums, objectSum{bytes: o.Bytes, sha256: o.SHA256})
	}
	// The sink's own objects carry their SHA-256 in metadata, which a plain
	// HEAD returns; asking for S3's checksum as well would need
	// kms:Decrypt on an object encrypted with KMS, so it is asked only for
	// an object without the metadata.
	b := s.bucketOf(in)
	head, err := s.head(ctx, b, in.Key, "")
	if err == nil && !hasMetaSHA256(head) {
		head, err = s.head(ctx, b, in.Key, types.ChecksumModeEnabled)
	}
	if err != nil {
		if httpStatus(err) == http.StatusBadRequest {
			// An answer to HEAD has no body, so a 400 does not say why
			// (expired credentials among other reasons): a GET says it,
			// and is the comparison when it succeeds.
			return s.hashMatches(ctx, b, in.Key, -1, sums)
		}
		return false, s.readError("head", b, in.Key, err)
	}
	size := aws.ToInt64(head.ContentLength)
	var sized []objectSum
	for _, o := range sums {
		if o.bytes == size {
			sized = append(sized, o)
		}
	}
	if len(sized) == 0 {
		return false, nil
	}
	for k, v := range head.Metadata {
		if strings.EqualFold(k, metaSHA256) {
			return matches(sized, v), nil
		}
	}
	if sum := aws.ToString(head.ChecksumSHA256); sum != "" && head.ChecksumType != types.ChecksumTypeComposite && !strings.Contains(sum, "-") {
		raw, err := base64.StdEncoding.DecodeString(sum)
		return err == nil && matches(sized, hex.EncodeToString(raw)), nil
	}
	return s.hashMatches(ctx, b, in.Key, size, sized)
}

func matches(sums []objectSum, sha string) bool {
	for _, o := range sums {
		if o.sha256 == sha {
			return true
		}
	}
	return false
}

// hashMatches reads key, of size bytes (-1: not known), and compares its
// size and SHA-256 with sums.
func (s *Sink) hashMatches(ctx context.Context, bucket, key string, size int64, sums []objectSum) (bool, error) {
	limit := size
	for _, o := range sums {
		limit = max(limit, o.bytes)
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout(limit))
	defer cancel()
	out, err := s.api.GetObject(cctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	if err != nil {
		return false, s.readError("get", bucket, key, err)
	}
	defer out.Body.Close()
	h := sha256.New()
	n, err := io.Copy(h, io.LimitReader(out.Body, limit+1))
	if err != nil {
		return false, sinks.NewRetryable("read", fmt.Errorf("read object %q to compare it with the one to upload: %w", key, err))
	}
	if size >= 0 && n != size {
		return false, nil
	}
	sum := hex.EncodeToString(h.Sum(nil))
	for _, o := range sums {
		if o.bytes == n && o.sha256 == sum {
			return true, nil
		}
	}
	return false, nil
}

// readError explains a failed read of a key that was found taken: gone
// since (retry: the key may be free), not allowed (say what to allow), or
// anything else (classified as any call).
func (s *Sink) readError(verb, bucket, key string, err error) error {
	var nf *types.NotFound
	var nk *types.NoSuchKey
	switch {
	case errors.As(err, &nf), errors.As(err, &nk), httpStatus(err) == http.StatusNotFound:
		return sinks.NewRetryable("NoSuchKey", fmt.Errorf("%s object %q, which was there a moment ago (PreconditionFailed): %w", verb, key, err))
	case httpStatus(err) == http.StatusForbidden:
		return sinks.NewSinkPermanent("AccessDenied", &actionError{
			msg: fmt.Sprintf("key %q in bucket %s is taken (PreconditionFailed), and the sink may not read it to tell its own object from another writer's (%s object: HTTP 403): "+
				"allow s3:GetObject on arn:aws:s3:::%s/* to the forwarder's credentials (and kms:Decrypt on the key of an object encrypted with KMS; and s3:ListBucket on arn:aws:s3:::%s, without which S3 answers 403 for a key deleted since)", key, bucket, verb, bucket, bucket),
			code: "AccessDenied", err: err,
		})
	}
	return fmt.Errorf("%s object %q, which was found taken: %w", verb, key, err)
}
