package awserr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

func TestClean(t *testing.T) {
	api := &smithy.GenericAPIError{Code: "AccessDenied", Message: "Access Denied"}
	network := errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
	for _, c := range []struct {
		err  error
		want string
	}{
		{&smithy.OperationError{ServiceID: "S3", OperationName: "PutObject", Err: api}, "PutObject: AccessDenied: Access Denied"},
		{&smithy.OperationError{ServiceID: "S3", OperationName: "PutObject", Err: &retry.MaxAttemptsError{Attempt: 1, Err: network}}, "PutObject: " + network.Error()},
		{io.EOF, "EOF"},
	} {
		got := Clean(c.err)
		if got.Error() != c.want || !errors.Is(got, c.err) {
			t.Errorf("Clean(%q) = %q, want %q (wrapping the original)", c.err, got, c.want)
		}
		if Clean(got) != got {
			t.Errorf("Clean of a cleaned error changed it")
		}
	}
	var ae smithy.APIError
	if !errors.As(Clean(&smithy.OperationError{OperationName: "X", Err: api}), &ae) || ae.ErrorCode() != "AccessDenied" {
		t.Error("the service's error is not found through a cleaned one")
	}
	if Clean(nil) != nil {
		t.Error("Clean(nil) is not nil")
	}
}

func TestNoCredentials(t *testing.T) {
	creds := &smithy.OperationError{OperationName: "PutLogEvents", Err: errors.New("get identity: get credentials: failed to refresh cached credentials, no EC2 IMDS role found")}
	if !NoCredentials(creds) {
		t.Error("a failure to get credentials is not seen as one")
	}
	if NoCredentials(&smithy.OperationError{OperationName: "PutLogEvents", Err: &smithy.GenericAPIError{Code: "ExpiredTokenException", Message: "get identity: "}}) {
		t.Error("an answer of the service is taken for missing credentials")
	}
	if NoCredentials(errors.New("connection refused")) || NoCredentials(nil) {
		t.Error("a network error is taken for missing credentials")
	}
}

// stsFailure is what a call gets when the web identity provider's
// AssumeRoleWithWebIdentity failed: STS's answer inside the signing step's
// "get identity: " wrapping, inside the call's operation error.
func stsFailure(code string, status int) error {
	answer := &smithyhttp.ResponseError{Response: &smithyhttp.Response{Response: &http.Response{StatusCode: status}},
		Err: &smithy.GenericAPIError{Code: code, Message: "from STS"}}
	sts := &smithy.OperationError{ServiceID: "STS", OperationName: "AssumeRoleWithWebIdentity", Err: answer}
	return &smithy.OperationError{ServiceID: "CloudWatch Logs", OperationName: "PutLogEvents",
		Err: fmt.Errorf("get identity: get credentials: failed to refresh cached credentials, %w", sts)}
}

func TestCredentialsFromSTS(t *testing.T) {
	for _, c := range []struct {
		code      string
		status    int
		transient bool
	}{
		{"AccessDenied", 403, false},
		{"InvalidIdentityToken", 400, false},
		{"ExpiredTokenException", 400, false},
		{"IDPCommunicationError", 400, true},
		{"Throttling", 400, true},
		{"InternalFailure", 500, true},
		{"ServiceUnavailable", 503, true},
	} {
		err := stsFailure(c.code, c.status)
		if !NoCredentials(err) {
			t.Errorf("%s from STS: not seen as a failure to get credentials", c.code)
		}
		if got := CredentialsTransient(err); got != c.transient {
			t.Errorf("%s from STS: transient %v, want %v", c.code, got, c.transient)
		}
	}
	// No endpoint reached: also what no credentials anywhere look like (the
	// instance metadata service, the chain's last resort, is not there).
	imds := &smithy.OperationError{OperationName: "GetMetadata", Err: &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}}
	if err := fmt.Errorf("get identity: get credentials: failed to refresh cached credentials, no EC2 IMDS role found, %w", imds); !NoCredentials(err) || CredentialsTransient(err) {
		t.Error("no credential endpoint reached: taken for a failure that passes, or not for missing credentials")
	}
}

// skewed is the SDK's mark on an answer a clock too far from the service's
// may have caused (aws/retry's retryableClockSkewError).
type skewed struct{ error }

func (e skewed) RetryableError() bool { return true }
func (e skewed) Unwrap() error        { return e.error }

func TestClockSkew(t *testing.T) {
	sig := &smithy.GenericAPIError{Code: "InvalidSignatureException", Message: "Signature expired"}
	if !ClockSkew(&smithy.OperationError{OperationName: "PutLogEvents", Err: skewed{sig}}) {
		t.Error("a signature refused for the clock, marked by the SDK, is not clock skew")
	}
	if ClockSkew(&smithy.OperationError{OperationName: "PutLogEvents", Err: sig}) {
		t.Error("a signature refused without the SDK's mark (no skew seen) is taken for clock skew")
	}
	if ClockSkew(skewed{&smithy.GenericAPIError{Code: "ThrottlingException"}}) {
		t.Error("another retryable error is taken for clock skew")
	}
}

func TestRefetch(t *testing.T) {
	expired := &smithy.OperationError{OperationName: "PutObject", Err: &smithy.GenericAPIError{Code: "ExpiredToken", Message: "expired"}}
	var n atomic.Int32
	renewing := aws.NewCredentialsCache(aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
		return aws.Credentials{AccessKeyID: "ASIA", SecretAccessKey: "s", SessionToken: fmt.Sprint("t", n.Add(1))}, nil
	}))
	static := aws.NewCredentialsCache(aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
		return aws.Credentials{AccessKeyID: "ASIA", SecretAccessKey: "s", SessionToken: "t"}, nil
	}))
	other := &smithy.GenericAPIError{Code: "AccessDenied"}
	for _, c := range []struct {
		name  string
		p     aws.CredentialsProvider
		err   error
		stale bool
	}{
		{"renewed", renewing, expired, false},
		{"the same again", static, expired, true},
		{"not an expiry", static, other, false},
		{"no provider", nil, expired, false},
	} {
		got := Refetch(context.Background(), c.p, c.err)
		if NotRenewed(got) != c.stale || !errors.Is(got, c.err) {
			t.Errorf("%s: %v, NotRenewed %v, want %v and the error kept", c.name, got, NotRenewed(got), c.stale)
		}
	}
	if n.Load() < 2 {
		t.Errorf("the renewing provider was asked %d times, want again after the expiry", n.Load())
	}
}

// A cache whose credentials expired by its own clock fetches the new ones
// at the first Retrieve; a role's source hands out the same new ones again:
// that is a renewal, not credentials nothing renews.
func TestRefetchRotatedCredentials(t *testing.T) {
	var n atomic.Int32
	provider := aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
		if n.Add(1) == 1 {
			return aws.Credentials{AccessKeyID: "ASIAOLD", SecretAccessKey: "s", SessionToken: "old", CanExpire: true, Expires: time.Now().Add(50 * time.Millisecond)}, nil
		}
		return aws.Credentials{AccessKeyID: "ASIANEW", SecretAccessKey: "s", SessionToken: "new", CanExpire: true, Expires: time.Now().Add(6 * time.Hour)}, nil
	})
	cache := aws.NewCredentialsCache(provider)
	if _, err := cache.Retrieve(context.Background()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	expired := &smithy.OperationError{OperationName: "PutObject", Err: &smithy.GenericAPIError{Code: "ExpiredToken", Message: "expired"}}
	if got := Refetch(context.Background(), cache, expired); NotRenewed(got) {
		t.Errorf("renewing credentials (fetched %d times, new ones valid 6h) taken for ones nothing renews", n.Load())
	}
}

// Session credentials whose source gives the same ones, expired by their
// own time, are ones nothing renews.
func TestRefetchExpiredAndTheSame(t *testing.T) {
	expired := &smithy.OperationError{OperationName: "PutObject", Err: &smithy.GenericAPIError{Code: "ExpiredToken", Message: "expired"}}
	cache := aws.NewCredentialsCache(aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
		return aws.Credentials{AccessKeyID: "ASIA", SecretAccessKey: "s", SessionToken: "t", CanExpire: true, Expires: time.Now().Add(-time.Minute)}, nil
	}))
	if got := Refetch(context.Background(), cache, expired); !NotRenewed(got) {
		t.Errorf("the same expired credentials again: %v, want NotRenewed", got)
	}
}
