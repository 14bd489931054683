package awserr

import (
	"errors"
	"io"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/smithy-go"
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
