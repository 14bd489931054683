package s3sink

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/logfwd/forwarder/internal/awserr"
	"github.com/logfwd/forwarder/sinks"
)

// actionError is a sink-permanent refusal explained for the operator: what
// S3 said and what to fix. It unwraps to the SDK's error.
type actionError struct {
	msg  string // "bucket my-logs does not exist (NoSuchBucket): create it or fix sinks[archive].bucket"
	code string
	err  error
}

// Error is the advice, then S3's own message (which may name what it
// refused: a permission, a header), when it has one the advice lacks.
func (e *actionError) Error() string {
	var ae smithy.APIError
	if errors.As(e.err, &ae) && ae.ErrorMessage() != "" && !strings.Contains(e.msg, ae.ErrorMessage()) {
		return e.msg + "; S3 said: " + ae.ErrorMessage()
	}
	return e.msg
}
func (e *actionError) Unwrap() error { return e.err }

// classify turns an error of an S3 call into the drainer's classes (see the
// package documentation for the table).
func (s *Sink) classify(err error) error {
	if err == nil {
		return nil
	}
	var se *sinks.Error
	if errors.As(err, &se) {
		return err
	}
	if errors.Is(err, context.Canceled) {
		return sinks.NewRetryable("cancelled", err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return sinks.NewRetryable("timeout", err)
	}
	if awserr.NoCredentials(err) {
		if awserr.CredentialsTransient(err) { // STS or the credential endpoint failed for a moment
			return sinks.NewRetryable("credentials", awserr.Clean(err))
		}
		return sinks.NewSinkPermanent("no_credentials", awserr.NoCredentialsHelp(awserr.Clean(err)))
	}
	if awserr.ClockSkew(err) { // the next call is signed with the offset the SDK learnt
		return sinks.NewRetryable("clock_skew", awserr.Clean(err))
	}
	err = awserr.Clean(err) // what people read: the operation and S3's code and message
	var signErr *v4.SigningError
	if errors.As(err, &signErr) {
		return sinks.NewSinkPermanent("credentials", &actionError{
			msg:  fmt.Sprintf("no usable AWS credentials (%v): give the forwarder credentials through the environment, a profile or an instance or pod role", signErr.Err),
			code: "credentials", err: err,
		})
	}
	status := 0
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		status = re.HTTPStatusCode()
	}
	code := ""
	var ae smithy.APIError
	if errors.As(err, &ae) {
		code = ae.ErrorCode()
	}
	if code == "" && status == 0 {
		var send *smithyhttp.RequestSendError
		if errors.As(err, &send) {
			return sinks.NewRetryable("network", err)
		}
		var de *smithy.DeserializationError
		if errors.As(err, &de) {
			return sinks.NewRetryable("bad_response", err)
		}
		return sinks.NewRetryable("network", err)
	}
	if code == "" {
		code = http.StatusText(status)
		if code == "" {
			code = "HTTP " + strconv.Itoa(status)
		}
	}
	if code == "SlowDown" || strings.Contains(code, "Throttl") || status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests {
		return sinks.NewThrottled(code, retryAfter(re), err)
	}
	switch code {
	case "ExpiredToken", "TokenRefreshRequired":
		// Session credentials a cache kept a moment too long: fetched
		// again for the next try, unless nothing renews them.
		var creds aws.CredentialsProvider
		if c, ok := s.api.(interface{ Options() s3.Options }); ok {
			creds = c.Options().Credentials
		}
		if awserr.NotRenewed(awserr.Refetch(context.Background(), creds, err)) {
			return sinks.NewSinkPermanent("expired_credentials", awserr.NotRenewedHelp(err))
		}
		return sinks.NewRetryable(code, &actionError{
			msg:  fmt.Sprintf("the AWS credentials had expired (%s); new ones were fetched for the next try", code),
			code: code, err: err,
		})
	case "KMS.KMSInternalException", "KMS.DependencyTimeoutException", "KMS.KeyUnavailableException", "InvalidPart":
		// KMS failing for a moment behind S3; a multipart upload's part
		// S3 lost (the next attempt begins the upload again).
		return sinks.NewRetryable(code, err)
	}
	if msg := s.advice(code); msg != "" {
		return sinks.NewSinkPermanent(code, &actionError{msg: msg, code: code, err: err})
	}
	switch {
	case status >= 500, code == "RequestTimeout", code == "InternalError", code == "OperationAborted",
		code == "BadDigest", code == "XAmzContentSHA256Mismatch", code == "IncompleteBody",
		code == "NoSuchUpload", code == "RequestTimeTooSkewed":
		// Passing faults: a slow or broken connection, corruption in
		// transit, an upload aborted under us (a lifecycle rule), a clock
		// that NTP will correct.
		return sinks.NewRetryable(code, err)
	case code == "KeyTooLongError" || code == "EntityTooLarge":
		return sinks.NewRecordPermanent(code, err)
	case status == http.StatusConflict:
		return sinks.NewRetryable(code, err)
	case status >= 400:
		// Any other refusal will not change by itself: pause and say so.
		return sinks.NewSinkPermanent(code, &actionError{
			msg:  fmt.Sprintf("S3 refused uploads to bucket %s (%s, HTTP %d): check sinks[%s] against the bucket's configuration", s.bucket, code, status, s.name),
			code: code, err: err,
		})
	}
	return sinks.NewRetryable(code, err)
}

// advice is what the operator must do about an error code that stops every
// upload, or "" when the code is not one of those.
func (s *Sink) advice(code string) string {
	b, n := s.bucket, s.name
	switch {
	case code == "NoSuchBucket":
		return fmt.Sprintf("bucket %s does not exist (NoSuchBucket): create it or fix sinks[%s].bucket", b, n)
	case code == "AccessDenied" || code == "AllAccessDisabled":
		return fmt.Sprintf("access denied to bucket %s (%s): allow s3:PutObject, s3:GetObject and s3:AbortMultipartUpload on arn:aws:s3:::%s/* and s3:ListBucketMultipartUploads and s3:ListBucket on arn:aws:s3:::%s to the forwarder's credentials (and kms:GenerateDataKey and kms:Decrypt on the key with sse: aws:kms, or when the bucket encrypts with a KMS key by default)", b, code, b, b)
	case code == "InvalidAccessKeyId":
		return fmt.Sprintf("AWS does not know the access key (InvalidAccessKeyId): fix the forwarder's credentials for sinks[%s]", n)
	case code == "SignatureDoesNotMatch":
		return fmt.Sprintf("the secret key does not match the access key (SignatureDoesNotMatch): fix the forwarder's credentials for sinks[%s]", n)
	case code == "InvalidToken":
		return fmt.Sprintf("the session credentials are invalid (%s): renew them, or give the forwarder a role or profile that refreshes them", code)
	case strings.HasPrefix(code, "KMS.") || strings.HasPrefix(code, "KMS") && strings.Contains(code, "Disabled"):
		return fmt.Sprintf("KMS refused to encrypt for bucket %s (%s): enable the key and allow kms:GenerateDataKey to the forwarder, or fix sinks[%s].kms_key_id", b, code, n)
	case code == "PermanentRedirect" || code == "AuthorizationHeaderMalformed" || code == "IllegalLocationConstraintException":
		return fmt.Sprintf("bucket %s is in another region (%s): set sinks[%s].region to the bucket's region", b, code, n)
	case code == "InvalidStorageClass":
		return fmt.Sprintf("the bucket refuses storage class %q (InvalidStorageClass): fix sinks[%s].storage_class", s.cfg.StorageClass, n)
	case code == "AccessControlListNotSupported":
		return fmt.Sprintf("bucket %s does not allow ACLs (AccessControlListNotSupported): remove sinks[%s].acl", b, n)
	case code == "InvalidTag" || code == "BadRequest" && len(s.cfg.Tags) > 0:
		return fmt.Sprintf("S3 refused the object tags (%s): fix sinks[%s].tags", code, n)
	case code == "InvalidBucketName":
		return fmt.Sprintf("%q is not a valid bucket name (InvalidBucketName): fix sinks[%s].bucket", b, n)
	case code == "NotImplemented":
		return fmt.Sprintf("the service behind sinks[%s] does not implement a header the sink sends (NotImplemented): an S3-compatible store that refuses conditional writes (If-None-Match: *) cannot take this sink's uploads, nor one that refuses the x-amz-checksum-sha256 header; use one that implements or ignores both headers", n)
	case code == "AccountProblem" || code == "NotSignedUp":
		return fmt.Sprintf("the AWS account cannot use S3 (%s): see the account's status in the AWS console", code)
	}
	return ""
}

// retryAfter reads how long S3 asked to wait: x-amz-retry-after
// (milliseconds) or Retry-After (seconds or an HTTP date). 0: it did not say.
func retryAfter(re *awshttp.ResponseError) time.Duration {
	if re == nil || re.Response == nil || re.Response.Response == nil {
		return 0
	}
	h := re.Response.Header
	if v := h.Get("X-Amz-Retry-After"); v != "" {
		if ms, err := strconv.ParseInt(v, 10, 64); err == nil && ms > 0 {
			return time.Duration(ms) * time.Millisecond
		}
	}
	if v := h.Get("Retry-After"); v != "" {
		if sec, err := strconv.ParseInt(v, 10, 64); err == nil && sec > 0 {
			return time.Duration(sec) * time.Second
		}
		if t, err := http.ParseTime(v); err == nil {
			return max(time.Until(t), 0)
		}
	}
	return 0
}
