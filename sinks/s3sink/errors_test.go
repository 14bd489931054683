package s3sink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/internal/nettest"
	"github.com/logfwd/forwarder/internal/syncbuf"
	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// apiError is what the SDK returns for an S3 error answer.
func apiError(status int, code string, header http.Header) error {
	if header == nil {
		header = http.Header{}
	}
	return &smithy.OperationError{ServiceID: "S3", OperationName: "PutObject", Err: &awshttp.ResponseError{
		ResponseError: &smithyhttp.ResponseError{
			Response: &smithyhttp.Response{Response: &http.Response{StatusCode: status, Header: header}},
			Err:      &smithy.GenericAPIError{Code: code, Message: "message of " + code},
		},
		RequestID: "req",
	}}
}

func TestClassify(t *testing.T) {
	s := keySink(t, "logs/${seq}", nil)
	s.cfg.Tags = map[string]string{"a": "b"}
	tests := []struct {
		err    error
		class  sinks.Class
		reason string
		msg    string
		wait   time.Duration
	}{
		{apiError(503, "SlowDown", nil), sinks.Throttled, "SlowDown", "", 0},
		{apiError(503, "SlowDown", http.Header{"X-Amz-Retry-After": {"1500"}}), sinks.Throttled, "SlowDown", "", 1500 * time.Millisecond},
		{apiError(503, "ServiceUnavailable", http.Header{"Retry-After": {"3"}}), sinks.Throttled, "ServiceUnavailable", "", 3 * time.Second},
		{apiError(429, "TooManyRequests", nil), sinks.Throttled, "TooManyRequests", "", 0},
		{apiError(400, "KMS.ThrottlingException", nil), sinks.Throttled, "KMS.ThrottlingException", "", 0},
		{apiError(500, "InternalError", nil), sinks.Retryable, "InternalError", "", 0},
		{apiError(502, "", nil), sinks.Retryable, "Bad Gateway", "", 0},
		{apiError(400, "RequestTimeout", nil), sinks.Retryable, "RequestTimeout", "", 0},
		{apiError(400, "BadDigest", nil), sinks.Retryable, "BadDigest", "", 0},
		{apiError(404, "NoSuchUpload", nil), sinks.Retryable, "NoSuchUpload", "", 0},
		{apiError(409, "OperationAborted", nil), sinks.Retryable, "OperationAborted", "", 0},
		// A conditional write racing another for the key: S3 says to retry.
		{apiError(409, "ConditionalRequestConflict", nil), sinks.Retryable, "ConditionalRequestConflict", "", 0},
		{apiError(501, "NotImplemented", nil), sinks.SinkPermanent, "NotImplemented", "refuses conditional writes (If-None-Match: *)", 0},
		{apiError(404, "NoSuchBucket", nil), sinks.SinkPermanent, "NoSuchBucket", "bucket logs does not exist (NoSuchBucket): create it or fix sinks[archive].bucket", 0},
		{apiError(403, "AccessDenied", nil), sinks.SinkPermanent, "AccessDenied", "access denied to bucket logs (AccessDenied): allow s3:PutObject, s3:GetObject", 0},
		// S3's own message follows the advice: it may name what was refused.
		{apiError(403, "AccessDenied", nil), sinks.SinkPermanent, "AccessDenied", "kms:Decrypt on the key with sse: aws:kms, or when the bucket encrypts with a KMS key by default); S3 said: message of AccessDenied", 0},
		{apiError(400, "InvalidArgument", nil), sinks.SinkPermanent, "InvalidArgument", "check sinks[archive] against the bucket's configuration; S3 said: message of InvalidArgument", 0},
		{apiError(403, "InvalidAccessKeyId", nil), sinks.SinkPermanent, "InvalidAccessKeyId", "fix the forwarder's credentials for sinks[archive]", 0},
		{apiError(403, "SignatureDoesNotMatch", nil), sinks.SinkPermanent, "SignatureDoesNotMatch", "the secret key does not match", 0},
		// Static credentials: fetched again, the same (TestExpiredTokenRenewed has a role's).
		{apiError(400, "ExpiredToken", nil), sinks.SinkPermanent, "expired_credentials", "nothing renews them", 0},
		{apiError(400, "InvalidToken", nil), sinks.SinkPermanent, "InvalidToken", "renew them", 0},
		{apiError(400, "KMS.DisabledException", nil), sinks.SinkPermanent, "KMS.DisabledException", "enable the key", 0},
		{apiError(400, "KMS.KMSInternalException", nil), sinks.Retryable, "KMS.KMSInternalException", "", 0},
		{apiError(400, "KMS.DependencyTimeoutException", nil), sinks.Retryable, "KMS.DependencyTimeoutException", "", 0},
		{apiError(400, "KMS.KeyUnavailableException", nil), sinks.Retryable, "KMS.KeyUnavailableException", "", 0},
		{apiError(400, "InvalidPart", nil), sinks.Retryable, "InvalidPart", "", 0},
		{apiError(400, "KMSDisabledException", nil), sinks.SinkPermanent, "KMSDisabledException", "fix sinks[archive].kms_key_id", 0},
		{apiError(301, "PermanentRedirect", nil), sinks.SinkPermanent, "PermanentRedirect", "set sinks[archive].region", 0},
		{apiError(400, "AuthorizationHeaderMalformed", nil), sinks.SinkPermanent, "AuthorizationHeaderMalformed", "another region", 0},
		{apiError(400, "InvalidStorageClass", nil), sinks.SinkPermanent, "InvalidStorageClass", "storage_class", 0},
		{apiError(400, "AccessControlListNotSupported", nil), sinks.SinkPermanent, "AccessControlListNotSupported", "remove sinks[archive].acl", 0},
		{apiError(400, "InvalidTag", nil), sinks.SinkPermanent, "InvalidTag", "sinks[archive].tags", 0},
		{apiError(400, "InvalidArgument", nil), sinks.SinkPermanent, "InvalidArgument", "S3 refused uploads to bucket logs (InvalidArgument, HTTP 400)", 0},
		{apiError(400, "KeyTooLongError", nil), sinks.RecordPermanent, "KeyTooLongError", "", 0},
		{&smithy.OperationError{Err: &smithyhttp.RequestSendError{Err: &net.OpError{Op: "dial", Err: errors.New("connection refused")}}}, sinks.Retryable, "network", "", 0},
		{context.DeadlineExceeded, sinks.Retryable, "timeout", "", 0},
	}
	for _, tc := range tests {
		e := sinks.Classify(s.classify(tc.err))
		if e.Class != tc.class || e.Reason != tc.reason || e.Wait != tc.wait {
			t.Errorf("%v: %s %q wait %v, want %s %q wait %v", tc.err, e.Class, e.Reason, e.Wait, tc.class, tc.reason, tc.wait)
		}
		if tc.msg != "" && !strings.Contains(e.Err.Error(), tc.msg) {
			t.Errorf("%s: message %q, want it to contain %q", tc.reason, e.Err.Error(), tc.msg)
		}
		if !errors.Is(e, tc.err) {
			t.Errorf("%s: the classified error does not wrap the SDK's", tc.reason)
		}
	}
}

// Expired credentials that a role renews are fetched again and retried.
func TestExpiredTokenRenewed(t *testing.T) {
	var fetched atomic.Int32
	creds := aws.NewCredentialsCache(aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
		n := fetched.Add(1)
		return aws.Credentials{AccessKeyID: "ASIATEST", SecretAccessKey: "secret", SessionToken: fmt.Sprint("t", n), CanExpire: true, Expires: time.Now().Add(time.Hour)}, nil
	}))
	s, err := New(context.Background(), "archive", testConfig("http://127.0.0.1:1"), Options{Hostname: "host1", AWS: &aws.Config{Credentials: creds}, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	e := sinks.Classify(s.classify(apiError(400, "ExpiredToken", nil)))
	if e.Class != sinks.Retryable || e.Reason != "ExpiredToken" || !strings.Contains(e.Err.Error(), "new ones were fetched") {
		t.Errorf("%s %q: %v, want retryable with new credentials", e.Class, e.Reason, e.Err)
	}
	if fetched.Load() < 2 {
		t.Errorf("credentials fetched %d times, want again after ExpiredToken", fetched.Load())
	}
}

// send builds one batch for s from recs and sends it.
func send(t *testing.T, s *Sink, st *memState, recs []sinks.Record) (sinks.Outcome, error) {
	t.Helper()
	b := &sinks.Batch{Partition: s.Partition(&recs[0]), Records: recs, State: st, Final: true}
	return s.Send(context.Background(), b)
}

func TestSendErrorsThroughTheSDK(t *testing.T) {
	srv, url := startEmu(t)
	recs := sinkRecs(rec("app", "1", time.Now(), 3), rec("app", "2", time.Now(), 3))
	check := func(name string, s *Sink, class sinks.Class, reason, msg string) {
		t.Helper()
		st := newMemState(recs)
		_, err := send(t, s, st, recs)
		e := sinks.Classify(err)
		if err == nil || e.Class != class || e.Reason != reason || !strings.Contains(e.Error(), msg) {
			t.Errorf("%s: %v (%s), want %s %s with %q", name, err, e.Class, class, reason, msg)
		}
		if class != sinks.RecordPermanent && len(st.intents()) != 1 {
			t.Errorf("%s: intents %v after a failed send, want the one", name, st.intents())
		}
	}

	cfg := testConfig(url)
	cfg.Bucket = "missing-bucket"
	check("missing bucket", newTestSink(t, cfg), sinks.SinkPermanent, "NoSuchBucket",
		"bucket missing-bucket does not exist (NoSuchBucket): create it or fix sinks[archive].bucket")

	s := newTestSink(t, testConfig(url))
	srv.SetDenyAll(true)
	check("denied", s, sinks.SinkPermanent, "AccessDenied", "access denied to bucket logs (AccessDenied)")
	check("denied, S3's words", s, sinks.SinkPermanent, "AccessDenied", "; S3 said: Access Denied")
	srv.SetDenyAll(false)
	srv.SetFailures(1)
	check("failing", s, sinks.Throttled, "SlowDown", "SlowDown")
	srv.SetFailures(0)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()
	check("nothing listening", newTestSink(t, testConfig(closed)), sinks.Retryable, "network", "connection refused")

	cfg = testConfig(url)
	cfg.Key = "${record.msg}/${seq}"
	long := newTestSink(t, cfg)
	// A value that would make the partition over the limit, and one that
	// would make only its keys so: shortened to fit, delivered, apart.
	keys := map[string]bool{}
	for _, n := range []int{1100, 1010} {
		recs := sinkRecs(wal.Record{Tag: "a", Body: []byte(`{"msg":"` + strings.Repeat("k", n) + `"}`)})
		p := long.Partition(&recs[0])
		if k := objectKey(p, 1, ""); len(k) > maxKeyLen || !strings.HasSuffix(k, "/00000000000000000001") {
			t.Errorf("key of %d bytes for a value of %d: %.40q...", len(k), n, k)
		}
		keys[p] = true
		st := newMemState(recs)
		if _, err = send(t, long, st, recs); err != nil {
			t.Errorf("long value: %v", err)
		}
	}
	// Counted at each Partition: here and in send.
	if len(keys) != 2 || testutil.ToFloat64(long.m.sanitised) != 4 {
		t.Errorf("%d keys for two values, %v counted: want 2 and 4", len(keys), testutil.ToFloat64(long.m.sanitised))
	}
	// A key whose template's own text is too long is refused.
	cfg.Key = strings.Repeat("k", 1010) + "/${tag}/${seq}"
	longer := newTestSink(t, cfg)
	tooLongRecs := sinkRecs(wal.Record{Tag: "a", Body: []byte(`{}`)})
	tooLongSt := newMemState(tooLongRecs)
	_, err = send(t, longer, tooLongSt, tooLongRecs)
	if e := sinks.Classify(err); e.Class != sinks.RecordPermanent || e.Reason != "key_too_long" {
		t.Errorf("long key: %v", err)
	}
	if len(tooLongSt.intents()) != 0 {
		t.Errorf("intents %v after a refused key", tooLongSt.intents())
	}

	// And a send that works hands its intent back for deletion.
	st := newMemState(recs)
	out, err := send(t, s, st, recs)
	if err != nil {
		t.Fatal(err)
	}
	if in := st.intents(); len(in) != 1 || len(out.DeleteState) != 1 || string(out.DeleteState[0]) != in[0] ||
		!strings.HasPrefix(in[0], "intent/logs/app/") {
		t.Errorf("intents %v, outcome %+v", in, out)
	}
}

func TestSinkConfigDefaults(t *testing.T) {
	s, err := New(context.Background(), "x", config.S3{Bucket: "b", Region: "r", Key: "${seq}"}, Options{Hostname: "h", AWS: &aws.Config{Credentials: testCreds}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l := s.Limits()
	if l.MaxBytes != 8<<20 || l.MaxFinalBytes != 64<<20 || s.maxBytes != 64<<20 || l.MaxAge != 5*time.Minute || l.MaxOpen != 10_000 || l.Concurrency != 16 || l.MaxRecords != 1_000_000 ||
		s.threshold != 16<<20 || s.enc.enc.Compression != "gzip" || s.enc.enc.Level != 1 {
		t.Errorf("limits %+v, threshold %d, encoding %+v", l, s.threshold, s.enc.enc)
	}
	if got := s.partBounds(30 << 20); len(got) != 6 || got[5] != [2]int64{25 << 20, 30 << 20} {
		t.Errorf("parts of 30 MiB: %v", got)
	}
	if got := s.partBounds(100 << 30); len(got) > maxParts || got[0][1] < 5<<20 {
		t.Errorf("parts of 100 GiB: %d of %d", len(got), got[0][1])
	}
}

// Without credentials (the SDK's own chain finds none: the missing-IRSA
// case) a send pauses the sink with what to fix, instead of being retried
// as a network error; what a person reads is the SDK's cause, not its
// retry wrapper.
func TestNoCredentialsIsSinkPermanent(t *testing.T) {
	for k, v := range map[string]string{"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_SESSION_TOKEN": "", "AWS_PROFILE": "",
		"AWS_CONFIG_FILE": os.DevNull, "AWS_SHARED_CREDENTIALS_FILE": os.DevNull, "AWS_WEB_IDENTITY_TOKEN_FILE": "",
		"AWS_CONTAINER_CREDENTIALS_FULL_URI": "", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "", "AWS_EC2_METADATA_DISABLED": "true"} {
		t.Setenv(k, v)
	}
	_, url := startEmu(t)
	s, err := New(context.Background(), "archive", testConfig(url), Options{Hostname: "host1", Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	recs := sinkRecs(rec("app", "1", time.Now(), 3))
	_, err = send(t, s, newMemState(recs), recs)
	e := sinks.Classify(err)
	if e.Class != sinks.SinkPermanent || e.Reason != "no_credentials" || !strings.Contains(e.Error(), "no AWS credentials: give the service credentials") ||
		strings.Contains(e.Error(), "exceeded maximum number of attempts") || !strings.Contains(e.Error(), "PutObject: get identity: ") {
		t.Fatalf("send without credentials: %v (%s %s)", err, e.Class, e.Reason)
	}
}

// A PutObject that cannot connect is unreachable (the drainer holds its
// head reader once sends in a row say so); one whose connection is closed
// under it is not: that can be one request's own.
func TestUnreachableClassified(t *testing.T) {
	s := keySink(t, "logs/${seq}", nil)
	for _, c := range []struct {
		name        string
		addr        string
		unreachable bool
	}{
		{"refused", nettest.ClosedAddr(t), true},
		{"hung up", nettest.HangUpAddr(t), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := newReader(t, "http://"+c.addr).PutObject(context.Background(), &s3.PutObjectInput{
				Bucket: aws.String("b"), Key: aws.String("k"), Body: strings.NewReader("line\n")})
			if err == nil {
				t.Fatal("PutObject succeeded")
			}
			e := sinks.Classify(s.classify(err))
			if e.Unreachable() != c.unreachable || e.Class != sinks.Retryable {
				t.Errorf("%v: class %v, unreachable %v, want retryable and %v", e, e.Class, e.Unreachable(), c.unreachable)
			}
		})
	}
}

// The SDK's own lines (its warning that the instance metadata service
// refused a token, say) go to the sink's logger, in the service's format,
// not to stderr in the SDK's.
func TestSDKLogsThroughTheLogger(t *testing.T) {
	imds := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut { // IMDSv2's token: refused
			w.WriteHeader(http.StatusForbidden)
			return
		}
		w.WriteHeader(http.StatusNotFound) // no role
	}))
	defer imds.Close()
	for k, v := range map[string]string{"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_SESSION_TOKEN": "", "AWS_PROFILE": "",
		"AWS_CONFIG_FILE": os.DevNull, "AWS_SHARED_CREDENTIALS_FILE": os.DevNull, "AWS_WEB_IDENTITY_TOKEN_FILE": "",
		"AWS_CONTAINER_CREDENTIALS_FULL_URI": "", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "", "AWS_EC2_METADATA_DISABLED": "false",
		"AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.URL} {
		t.Setenv(k, v)
	}
	_, url := startEmu(t)
	var logs syncbuf.Buffer
	s, err := New(context.Background(), "archive", testConfig(url), Options{Hostname: "host1", Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	recs := sinkRecs(rec("app", "1", time.Now(), 3))
	if _, err = send(t, s, newMemState(recs), recs); err == nil {
		t.Fatal("a send without credentials succeeded")
	}
	if out := logs.String(); !strings.Contains(out, `"level":"WARN","msg":"AWS SDK: falling back to IMDSv1`) || !strings.Contains(out, `"sink":"archive"`) {
		t.Errorf("the SDK's warning is not in the sink's log:\n%s", out)
	}
}
