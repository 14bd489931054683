package cloudwatchlogs

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	cwl "github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs/types"
	"github.com/aws/smithy-go"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fixedNow is the emulator's clock in most tests: 2025-06-15T15:06:40Z.
const fixedNow int64 = 1_750_000_000_000

const (
	hourMs = int64(3600 * 1000)
	day    = 24 * hourMs
)

type clock struct{ ms atomic.Int64 }

func (c *clock) Now() time.Time { return time.UnixMilli(c.ms.Load()) }

type env struct {
	srv   *Server
	url   string
	cl    *cwl.Client
	clock *clock
}

// newEnv starts an emulator on a fixed clock (unless opts.Now is set) and
// returns an SDK client for it that does not retry.
func newEnv(t *testing.T, opts Options) *env {
	t.Helper()
	e := &env{}
	if opts.Now == nil {
		e.clock = &clock{}
		e.clock.ms.Store(fixedNow)
		opts.Now = e.clock.Now
	}
	e.srv = New(opts)
	url, err := e.srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.srv.Close() })
	e.url = url
	e.cl = newClient(t, url, aws.NopRetryer{})
	return e
}

// newClient is the real SDK client pointed at url with static credentials.
func newClient(t *testing.T, url string, retryer aws.Retryer) *cwl.Client {
	t.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	return cwl.New(cwl.Options{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", ""),
		BaseEndpoint: aws.String(url),
		HTTPClient:   &http.Client{Transport: tr, Timeout: 30 * time.Second},
		Retryer:      retryer,
	})
}

func ev(ts int64, msg string) types.InputLogEvent {
	return types.InputLogEvent{Timestamp: aws.Int64(ts), Message: aws.String(msg)}
}

func (e *env) mustGroup(t *testing.T, name string) {
	t.Helper()
	if _, err := e.cl.CreateLogGroup(context.Background(), &cwl.CreateLogGroupInput{LogGroupName: aws.String(name)}); err != nil {
		t.Fatalf("CreateLogGroup %q: %v", name, err)
	}
}

func (e *env) mustStream(t *testing.T, group, name string) {
	t.Helper()
	if _, err := e.cl.CreateLogStream(context.Background(), &cwl.CreateLogStreamInput{LogGroupName: aws.String(group), LogStreamName: aws.String(name)}); err != nil {
		t.Fatalf("CreateLogStream %q/%q: %v", group, name, err)
	}
}

func (e *env) put(group, stream string, events ...types.InputLogEvent) (*cwl.PutLogEventsOutput, error) {
	return e.cl.PutLogEvents(context.Background(), &cwl.PutLogEventsInput{
		LogGroupName: aws.String(group), LogStreamName: aws.String(stream), LogEvents: events,
	})
}

func (e *env) mustPut(t *testing.T, group, stream string, events ...types.InputLogEvent) *cwl.PutLogEventsOutput {
	t.Helper()
	out, err := e.put(group, stream, events...)
	if err != nil {
		t.Fatalf("PutLogEvents: %v", err)
	}
	return out
}

// code is the error code the SDK reports, "" for nil or a non-API error.
func code(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

func status(err error) int {
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

// wantErr checks that err is the modelled SDK error T, with a message
// containing msg.
func wantErr[T error](t *testing.T, err error, msg string) T {
	t.Helper()
	var target T
	if !errors.As(err, &target) {
		t.Fatalf("error = %v (%T), want %T", err, err, target)
	}
	if status(err) != http.StatusBadRequest {
		t.Errorf("HTTP status = %d, want 400", status(err))
	}
	if msg != "" {
		var ae smithy.APIError
		errors.As(err, &ae)
		if !strings.Contains(ae.ErrorMessage(), msg) {
			t.Errorf("message = %q, want it to contain %q", ae.ErrorMessage(), msg)
		}
	}
	return target
}

func wantIPE(t *testing.T, err error, msg string) {
	t.Helper()
	wantErr[*types.InvalidParameterException](t, err, msg)
}

type rawResponse struct {
	status int
	header http.Header
	body   map[string]any
	text   string
}

// raw sends one request by hand; sign adds a (meaningless) Authorization
// header, which the emulator requires but does not check.
func raw(t *testing.T, url, target, ctype, body string, sign bool) rawResponse {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if target != "" {
		req.Header.Set("X-Amz-Target", target)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if sign {
		req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20250615/us-east-1/logs/aws4_request, SignedHeaders=host;x-amz-date, Signature=0000")
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	r := rawResponse{status: resp.StatusCode, header: resp.Header, text: string(b)}
	if len(b) > 0 {
		if err := json.Unmarshal(b, &r.body); err != nil {
			t.Fatalf("response body %q is not JSON: %v", b, err)
		}
	}
	return r
}

func messages(events []Event) []string {
	out := make([]string, len(events))
	for i, e := range events {
		out[i] = e.Message
	}
	return out
}
