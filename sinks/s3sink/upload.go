package s3sink

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/sinks"
)

const contentType = "application/x-ndjson"

// abortAfterStop bounds an abort made once the send was cancelled.
const abortAfterStop = 500 * time.Millisecond

// callTimeout bounds one upload call: a minute, plus a second per MiB (a
// connection slower than 1 MiB/s is treated as broken and retried).
func callTimeout(n int64) time.Duration {
	return time.Minute + time.Duration(n>>20)*time.Second
}

// upload stores body under in.Key, if the key is free: one PutObject, or
// a multipart upload above multipart_threshold whose id is committed in
// the intent before any part is sent, written with If-None-Match: *. A
// multipart upload begun by an earlier attempt is aborted first.
//
// When the key is taken (412), already reports that it holds this very
// object (an earlier attempt's or process's upload landed): nothing is
// written and the object counts as delivered. Another writer's object
// under the key is a sink-permanent error (see settle).
func (s *Sink) upload(ctx context.Context, st sinks.State, ik []byte, in *intent, body *io.SectionReader) (already bool, err error) {
	if in.UploadID != "" {
		// Best effort, as below: an upload left open costs storage until
		// the bucket's lifecycle rule ends it, and stops nothing. One that
		// could not be aborted is looked for among the key's open uploads
		// before the next is created (its id is forgotten here, and the
		// next one's replaces it in the intent).
		if err := s.abort(ctx, s.bucketOf(in), in.Key, in.UploadID); err != nil {
			in.createLost = true
		}
		in.UploadID = ""
	}
	if body.Size() > s.threshold {
		err = s.uploadParts(ctx, st, ik, in, body)
	} else {
		err = s.putObject(ctx, in, body)
	}
	if err == nil || !preconditionFailed(err) {
		return false, err
	}
	if err := s.settle(ctx, in, err); err != nil {
		return false, err
	}
	return true, nil
}

func (s *Sink) putObject(ctx context.Context, in *intent, body *io.SectionReader) error {
	sum, err := hex.DecodeString(in.SHA256)
	if err != nil {
		return fmt.Errorf("intent of %q: bad sha256: %w", in.Key, err)
	}
	n := body.Size()
	cctx, cancel := context.WithTimeout(ctx, callTimeout(n))
	defer cancel()
	put := &s3.PutObjectInput{
		Bucket:         aws.String(s.bucketOf(in)),
		Key:            aws.String(in.Key),
		Body:           io.NewSectionReader(body, 0, n), // seekable: the SDK rewinds it to sign and to retry
		ContentLength:  aws.Int64(n),
		ChecksumSHA256: aws.String(base64.StdEncoding.EncodeToString(sum)),
		IfNoneMatch:    aws.String("*"),
		Metadata:       objectMetadata(in),
	}
	s.objectHeaders(in, &put.ContentType, &put.ContentEncoding, &put.ServerSideEncryption, &put.SSEKMSKeyId,
		&put.StorageClass, &put.ACL, &put.Tagging)
	if _, err := s.api.PutObject(cctx, put, withPayloadHash(in.SHA256)); err != nil {
		return fmt.Errorf("put object %q: %w", in.Key, err)
	}
	s.m.objects.Inc()
	s.m.bytes.Add(float64(n))
	return nil
}

// withPayloadHash hands the SDK the object's SHA-256 (hex), which build
// computed already, as the SigV4 payload hash. Without it the SDK hashes
// the body a second time over plain HTTP (local and S3-compatible
// endpoints); over HTTPS it would send UNSIGNED-PAYLOAD, and with it S3
// checks the body against the signed hash as well.
func withPayloadHash(hexSum string) func(*s3.Options) {
	return func(o *s3.Options) {
		o.APIOptions = append(o.APIOptions, func(st *middleware.Stack) error {
			return st.Finalize.Add(middleware.FinalizeMiddlewareFunc("PayloadHashFromIntent",
				func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
					return next.HandleFinalize(v4.SetPayloadHash(ctx, hexSum), in)
				}), middleware.Before)
		})
	}
}

// objectHeaders fills what every object carries: type, encoding (the
// intent's: an interrupted upload finished after the sink's compression
// changed is of the compression it was built with), encryption, storage
// class, ACL, tags.
func (s *Sink) objectHeaders(in *intent, ctype, cenc **string, sse *types.ServerSideEncryption, kms **string,
	class *types.StorageClass, acl *types.ObjectCannedACL, tagging **string) {
	*ctype = aws.String(contentType)
	if e := in.Encoding.Compression; e != "" && e != config.CompressionNone {
		*cenc = aws.String(e)
	}
	*sse = types.ServerSideEncryption(s.cfg.SSE)
	if s.cfg.KMSKeyID != "" {
		*kms = aws.String(s.cfg.KMSKeyID)
	}
	*class = types.StorageClass(s.cfg.StorageClass)
	*acl = types.ObjectCannedACL(s.cfg.ACL)
	if t := s.tagging(); t != "" {
		*tagging = aws.String(t)
	}
}

// tagging is the x-amz-tagging header: the tags URL-encoded, sorted by key.
func (s *Sink) tagging() string {
	if len(s.cfg.Tags) == 0 {
		return ""
	}
	keys := make([]string, 0, len(s.cfg.Tags))
	for k := range s.cfg.Tags {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte('&')
		}
		b.WriteString(url.QueryEscape(k))
		b.WriteByte('=')
		b.WriteString(url.QueryEscape(s.cfg.Tags[k]))
	}
	return b.String()
}

// partBounds cuts n bytes into parts: max(5 MiB, n/10,000 rounded up) each
// but the last.
func (s *Sink) partBounds(n int64) [][2]int64 {
	size := max(s.partSize, (n+maxParts-1)/maxParts)
	var parts [][2]int64
	for off := int64(0); off < n; off += size {
		parts = append(parts, [2]int64{off, min(off+size, n)})
	}
	return parts
}

func (s *Sink) uploadParts(ctx context.Context, st sinks.State, ik []byte, in *intent, body *io.SectionReader) error {
	create := &s3.CreateMultipartUploadInput{Bucket: aws.String(s.bucketOf(in)), Key: aws.String(in.Key), Metadata: objectMetadata(in)}
	s.objectHeaders(in, &create.ContentType, &create.ContentEncoding, &create.ServerSideEncryption, &create.SSEKMSKeyId,
		&create.StorageClass, &create.ACL, &create.Tagging)
	if in.createLost {
		// An earlier attempt's creation may have landed with its answer
		// lost: its upload, whose id no intent holds, would stay open.
		s.abortOrphans(ctx, s.bucketOf(in), in.Key)
		in.createLost = false
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout(0))
	out, err := s.api.CreateMultipartUpload(cctx, create)
	cancel()
	if err != nil {
		var re *awshttp.ResponseError
		if !errors.As(err, &re) || re.HTTPStatusCode() == 0 || re.HTTPStatusCode() >= 500 {
			in.createLost = true // no answer (status 0: sent, or not, and its answer lost), or a 5xx: S3 may have created it
		}
		return fmt.Errorf("create multipart upload of %q: %w", in.Key, err)
	}
	in.UploadID = aws.ToString(out.UploadId)
	if err := putIntent(ctx, st, ik, in); err != nil {
		_ = s.abort(ctx, s.bucketOf(in), in.Key, in.UploadID)
		return sinks.NewRetryable("state", fmt.Errorf("record upload id of %q: %w", in.Key, err))
	}
	if err := s.sendParts(ctx, in, body); err != nil {
		// Best effort: the intent keeps the id, and the next attempt or
		// Recover aborts it again.
		_ = s.abort(ctx, s.bucketOf(in), in.Key, in.UploadID)
		return err
	}
	s.m.objects.Inc()
	s.m.multipart.Inc()
	s.m.bytes.Add(float64(body.Size()))
	return nil
}

func (s *Sink) sendParts(ctx context.Context, in *intent, body *io.SectionReader) error {
	bounds := s.partBounds(body.Size())
	done := make([]types.CompletedPart, 0, len(bounds))
	// The parts' bytes as their MD5s were taken, which S3 checks each part
	// against (BadDigest): a staged file changed after it was checked, while
	// its parts are sent, must not complete an object of other bytes.
	whole := sha256.New()
	for i, b := range bounds {
		// A part is read from the object where it lies (a staged file or
		// memory): once for its MD5, again by the SDK to send it.
		n := b[1] - b[0]
		h := md5.New()
		if _, err := io.Copy(io.MultiWriter(h, whole), io.NewSectionReader(body, b[0], n)); err != nil {
			return fmt.Errorf("read part %d of %q: %w", i+1, in.Key, err)
		}
		cctx, cancel := context.WithTimeout(ctx, callTimeout(n))
		out, err := s.api.UploadPart(cctx, &s3.UploadPartInput{
			Bucket: aws.String(s.bucketOf(in)), Key: aws.String(in.Key), UploadId: aws.String(in.UploadID),
			PartNumber: aws.Int32(int32(i + 1)), Body: io.NewSectionReader(body, b[0], n), ContentLength: aws.Int64(n),
			ContentMD5: aws.String(base64.StdEncoding.EncodeToString(h.Sum(nil))),
		})
		cancel()
		if err != nil {
			return fmt.Errorf("upload part %d of %d of %q: %w", i+1, len(bounds), in.Key, err)
		}
		done = append(done, types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(int32(i + 1))})
	}
	if sum := hex.EncodeToString(whole.Sum(nil)); in.SHA256 != "" && sum != in.SHA256 {
		// Sent again, the object is checked and rebuilt from the WAL.
		return sinks.NewRetryable("staging", fmt.Errorf("the parts sent of %q are not the object its intent names (sha256 %s, want %s): its staged file changed while they were sent; the upload is aborted", in.Key, sum, in.SHA256))
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout(body.Size()))
	defer cancel()
	if _, err := s.api.CompleteMultipartUpload(cctx, &s3.CompleteMultipartUploadInput{
		Bucket: aws.String(s.bucketOf(in)), Key: aws.String(in.Key), UploadId: aws.String(in.UploadID),
		MultipartUpload: &types.CompletedMultipartUpload{Parts: done}, IfNoneMatch: aws.String("*"),
	}); err != nil {
		return fmt.Errorf("complete multipart upload of %q: %w", in.Key, err)
	}
	return nil
}

// abort aborts a multipart upload. One that no longer exists (completed,
// aborted, expired) is not an error. It runs even when ctx has ended (a
// send cancelled by the stop), for half a second then (abortAfterStop):
// the stop's deadline is near, and what an abort leaves undone the next
// start's Recover or attempt aborts, or the bucket's lifecycle rule.
func (s *Sink) abort(ctx context.Context, bucket, key, uploadID string) error {
	limit := 10 * time.Second
	if ctx.Err() != nil {
		limit = abortAfterStop
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), limit)
	defer cancel()
	_, err := s.api.AbortMultipartUpload(cctx, &s3.AbortMultipartUploadInput{
		Bucket: aws.String(bucket), Key: aws.String(key), UploadId: aws.String(uploadID),
	})
	var ae smithy.APIError
	if err == nil || errors.As(err, &ae) && ae.ErrorCode() == "NoSuchUpload" {
		return nil
	}
	return fmt.Errorf("abort multipart upload %s of %q: %w", uploadID, key, err)
}

// abortOrphans aborts every multipart upload in progress for exactly key:
// one a crash left between its creation and the commit of its id. Best
// effort: listing needs s3:ListBucketMultipartUploads, and a bucket
// lifecycle rule (AbortIncompleteMultipartUpload) is the safety net.
func (s *Sink) abortOrphans(ctx context.Context, bucket, key string) {
	cctx, cancel := context.WithTimeout(ctx, callTimeout(0))
	defer cancel()
	out, err := s.api.ListMultipartUploads(cctx, &s3.ListMultipartUploadsInput{Bucket: aws.String(bucket), Prefix: aws.String(key)})
	if err != nil {
		s.log.Debug("list multipart uploads to abort left-over ones", "key", key, "error", err)
		return
	}
	for _, u := range out.Uploads {
		if aws.ToString(u.Key) == key {
			if err := s.abort(ctx, bucket, key, aws.ToString(u.UploadId)); err != nil {
				s.log.Debug("abort left-over multipart upload", "key", key, "error", err)
			}
		}
	}
}

// bodyOf is an object's bytes to upload: those held in memory (its body,
// or its parts one after the other), or a staged file's first bytes (head,
// n of them) followed by tail.
func bodyOf(obj *object, head io.ReaderAt, n int64) *io.SectionReader {
	if head == nil && obj.parts != nil {
		return io.NewSectionReader(newPartsReader(obj.parts), 0, obj.size)
	}
	if head == nil {
		return io.NewSectionReader(bytes.NewReader(obj.body), 0, obj.size)
	}
	return io.NewSectionReader(&tailReader{head: head, n: n, tail: obj.tail}, 0, n+int64(len(obj.tail)))
}

// tailReader reads n bytes of head, then tail.
type tailReader struct {
	head io.ReaderAt
	n    int64
	tail []byte
}

func (r *tailReader) ReadAt(p []byte, off int64) (int, error) {
	read := 0
	if off < r.n {
		k := int(min(int64(len(p)), r.n-off))
		m, err := r.head.ReadAt(p[:k], off)
		if m < k {
			if err == nil || err == io.EOF {
				err = io.ErrUnexpectedEOF // the file is shorter than its object
			}
			return m, err
		}
		read, p, off = k, p[k:], r.n
	}
	if len(p) == 0 {
		return read, nil
	}
	t := off - r.n
	if t >= int64(len(r.tail)) {
		return read, io.EOF
	}
	m := copy(p, r.tail[t:])
	if m < len(p) {
		return read + m, io.EOF
	}
	return read + m, nil
}

// partsReader reads byte slices one after the other.
type partsReader struct {
	parts [][]byte
	ends  []int64 // where each part ends
}

func newPartsReader(parts [][]byte) *partsReader {
	r := &partsReader{parts: parts, ends: make([]int64, len(parts))}
	n := int64(0)
	for i, p := range parts {
		n += int64(len(p))
		r.ends[i] = n
	}
	return r
}

func (r *partsReader) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, errors.New("partsReader: negative offset")
	}
	read := 0
	// The first part that ends after off.
	for i := sort.Search(len(r.ends), func(i int) bool { return r.ends[i] > off }); i < len(r.parts) && len(p) > 0; i++ {
		start := r.ends[i] - int64(len(r.parts[i]))
		m := copy(p, r.parts[i][off-start:])
		read, p, off = read+m, p[m:], off+int64(m)
	}
	if len(p) > 0 {
		return read, io.EOF
	}
	return read, nil
}
