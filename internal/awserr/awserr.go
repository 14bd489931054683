// Package awserr makes errors of the AWS SDK readable for people: the
// operation and the service's own code and message, without the SDK's
// operation and retry wrappers ("exceeded maximum number of attempts, 1"
// reads as "gave up" where the caller retries on its own), and tells a
// call that failed for want of credentials from one the network failed.
package awserr

import (
	"errors"
	"fmt"
	"strings"

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
func NoCredentials(err error) bool {
	var ae smithy.APIError
	if err == nil || errors.As(err, &ae) {
		return false // the service answered: the request was signed
	}
	// The SDK's signing step wraps every failure to resolve credentials so.
	return strings.Contains(err.Error(), "get identity: ")
}

// NoCredentialsHelp says what to fix when NoCredentials holds.
func NoCredentialsHelp(err error) error {
	return fmt.Errorf("no AWS credentials: give the service credentials (on EKS, the ServiceAccount's IAM role annotation eks.amazonaws.com/role-arn or an EKS Pod Identity association; elsewhere AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a shared config profile, or an instance role); `forwarder check` says which source it finds: %w", err)
}
