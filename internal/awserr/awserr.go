// Package awserr makes errors of the AWS SDK readable for people: the
// operation and the service's own code and message, without the SDK's
// operation and retry wrappers ("exceeded maximum number of attempts, 1"
// reads as "gave up" where the caller retries on its own), and tells a
// call that failed for want of credentials from one the network failed.
package awserr

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/smithy-go"
)

// Error is an SDK error with a shorter text; errors.As and errors.Is see
// the error it was made from.
type Error struct {
	text string
	err  error
}

func (e *Error) Error() string { return e.text }
func (e *Error) Unwrap() error { return e.err }

// Clean returns err with a text a person can act on: "Operation: Code:
// message" for an answer of the service, "Operation: what failed" for
// others (the network, credentials). nil stays nil.
func Clean(err error) error {
	if err == nil {
		return nil
	}
	var c *Error
	if errors.As(err, &c) {
		return err
	}
	inner := err
	op := ""
	var oe *smithy.OperationError
	if errors.As(err, &oe) {
		op, inner = oe.OperationName, oe.Err
	}
	var me *retry.MaxAttemptsError
	if errors.As(inner, &me) {
		inner = me.Err
	}
	text := inner.Error()
	var ae smithy.APIError
	if errors.As(inner, &ae) {
		text = ae.ErrorCode()
		if msg := ae.ErrorMessage(); msg != "" {
			text += ": " + msg
		}
	}
	if op != "" {
		text = op + ": " + text
	}
	return &Error{text: text, err: err}
}

// NoCredentials reports whether err is the SDK failing to find, load or
// refresh credentials before it could send the request: no source in the
// chain had any, or the one it uses (a web identity token, a container or
// instance endpoint) failed to give them.
//
// The signing step wraps every failure to resolve credentials in "get
// identity: ", also when the credential service answered (STS refusing a
// web identity token, say: its answer is in the chain then); an answer of
// the service called, whose message would say so, is not such a failure.
func NoCredentials(err error) bool {
	if err == nil {
		return false
	}
	text := err.Error()
	var ae smithy.APIError
	if errors.As(err, &ae) {
		if i := strings.Index(text, ae.Error()); i >= 0 {
			text = text[:i] // what wraps the answer, not the answer's message
		}
	}
	return strings.Contains(text, "get identity: ")
}

// CredentialsTransient reports whether a NoCredentials error is one that
// passes: the credential service (STS, the container endpoint) answered
// that it throttled or failed (5xx, IDPCommunicationError). Those are
// retried; the others need a fix: a token or role refused, and an endpoint
// that cannot be reached, which is also what no credentials anywhere look
// like (the chain's last resort, the instance metadata service, is not
// there off EC2).
func CredentialsTransient(err error) bool {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "IDPCommunicationError", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequestsException",
			"ServiceUnavailable", "ServiceUnavailableException", "InternalFailure", "InternalError":
			return true
		}
	}
	var re interface{ HTTPStatusCode() int }
	return errors.As(err, &re) && (re.HTTPStatusCode() >= 500 || re.HTTPStatusCode() == 429)
}

// ClockSkew reports whether err is the service refusing a signature made
// with a clock too far from its own: the SDK marks such an answer
// retryable (it learnt the offset, and signs the next call with it).
func ClockSkew(err error) bool {
	var r interface{ RetryableError() bool }
	var ae smithy.APIError
	if !errors.As(err, &r) || !r.RetryableError() || !errors.As(err, &ae) {
		return false
	}
	switch ae.ErrorCode() {
	case "InvalidSignatureException", "SignatureDoesNotMatch", "AuthFailure", "RequestTimeTooSkewed", "AccessDeniedException":
		return true
	}
	return false
}

// NoCredentialsHelp says what to fix when NoCredentials holds.
func NoCredentialsHelp(err error) error {
	return fmt.Errorf("no AWS credentials: give the service credentials (on EKS, the ServiceAccount's IAM role annotation eks.amazonaws.com/role-arn or an EKS Pod Identity association; elsewhere AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a shared config profile, or an instance role); `forwarder check` says which source it finds: %w", err)
}

// Expired reports whether err is the service refusing credentials that
// expired: session credentials a cache kept a moment too long (the clock
// behind, a refresh at the edge), or ones nothing refreshes.
func Expired(err error) bool {
	var ae smithy.APIError
	if !errors.As(err, &ae) {
		return false
	}
	switch ae.ErrorCode() {
	case "ExpiredToken", "ExpiredTokenException", "TokenRefreshRequired":
		return true
	}
	return false
}

// Invalidate makes a credentials cache (the SDK's aws.CredentialsCache)
// fetch its credentials again at the next call; other providers are left.
func Invalidate(p any) {
	if c, ok := p.(interface{ Invalidate() }); ok {
		c.Invalidate()
	}
}

// refetchTimeout bounds fetching the credentials again (STS, the instance's
// or the container's credential endpoint).
const refetchTimeout = 10 * time.Second

// Refetch deals with err when it is the service's answer that the
// credentials expired (Expired): p, the client's credentials, fetches them
// again. When it gets the very ones it held, nothing renews them (session
// credentials set in the environment or a file, which the process read
// once): waiting will not help, and err comes back marked so (NotRenewed).
// Any other err comes back as it is.
func Refetch(ctx context.Context, p aws.CredentialsProvider, err error) error {
	if p == nil || !Expired(err) {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), refetchTimeout)
	defer cancel()
	before, berr := p.Retrieve(ctx)
	Invalidate(p)
	after, aerr := p.Retrieve(ctx)
	if berr != nil || aerr != nil {
		return err // the next call says what fetching them met
	}
	// The same ones again, which their source does not say are good for
	// longer (static ones cannot expire; a role's say until when): the
	// first fetch may itself have been the renewal, when the cache found
	// its credentials expired by its own clock, and a role's source hands
	// out the same new ones until it rotates them.
	same := before.AccessKeyID == after.AccessKeyID && before.SessionToken == after.SessionToken
	if same && (!after.CanExpire || !after.Expires.After(time.Now())) {
		return &notRenewed{err}
	}
	return err
}

type notRenewed struct{ err error }

func (e *notRenewed) Error() string { return e.err.Error() }
func (e *notRenewed) Unwrap() error { return e.err }

// NotRenewed reports whether Refetch found that nothing renews the
// credentials that expired.
func NotRenewed(err error) bool {
	var nr *notRenewed
	return errors.As(err, &nr)
}

// NotRenewedHelp says what to do when NotRenewed holds.
func NotRenewedHelp(err error) error {
	return fmt.Errorf("the AWS credentials expired, and fetching them again gave the same ones: nothing renews them (session credentials set in the environment or a credentials file are read once, at start); give the service a role or profile that refreshes them (on EKS, IRSA or EKS Pod Identity; on EC2, an instance role), or renew them and restart it: %w", err)
}
