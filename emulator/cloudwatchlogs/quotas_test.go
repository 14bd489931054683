package cloudwatchlogs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	cwl "github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs/types"
)

func TestAWSQuotas(t *testing.T) {
	e := newEnv(t, Options{AWSQuotas: true, Quotas: map[string]int{"DeleteLogStream": 0, "GetLogEvents": 7}})
	want := AWSQuotas("us-east-1")
	delete(want, "DeleteLogStream")
	want["GetLogEvents"] = 7
	if got := e.srv.Quotas(); !maps.Equal(got, want) {
		t.Errorf("Quotas() = %v, want %v", got, want)
	}
	for op, n := range map[string]int{"CreateLogStream": 50, "CreateLogGroup": 10, "PutRetentionPolicy": 5, "PutLogEvents": 5000, "FilterLogEvents": 25} {
		if want[op] != n {
			t.Errorf("AWS quota of %s = %d, want %d", op, want[op], n)
		}
	}
	if n := AWSQuota("GetLogEvents", "eu-west-1"); n != 10 {
		t.Errorf("GetLogEvents in eu-west-1: %d, want 10", n)
	}
	if q := New(Options{}).Quotas(); len(q) != 0 {
		t.Errorf("zero Options have quotas %v", q)
	}
}

// A create above its quota is answered as AWS answers it, does nothing, and
// is counted; other operations are not limited by it.
func TestCreateLogStreamQuota(t *testing.T) {
	e := newEnv(t, Options{Quotas: map[string]int{"CreateLogStream": 5}})
	e.mustGroup(t, "g")
	ctx := context.Background()
	ok, throttled := 0, 0
	start := time.Now()
	for i := range 20 {
		_, err := e.cl.CreateLogStream(ctx, &cwl.CreateLogStreamInput{LogGroupName: aws.String("g"), LogStreamName: aws.String(fmt.Sprint("s", i))})
		var te *types.ThrottlingException
		switch {
		case err == nil:
			ok++
		case errors.As(err, &te):
			throttled++
			if status(err) != http.StatusBadRequest || te.ErrorMessage() != "Rate exceeded" || te.ErrorCode() != "ThrottlingException" {
				t.Errorf("throttled with %d %q %q, want 400 ThrottlingException \"Rate exceeded\"", status(err), te.ErrorCode(), te.ErrorMessage())
			}
		default:
			t.Fatalf("unexpected error %v", err)
		}
	}
	if most := 5 + int(5*time.Since(start).Seconds()) + 1; ok < 5 || ok > most || throttled == 0 {
		t.Errorf("%d accepted (at most %d), %d throttled of 20 at 5/s in %v", ok, most, throttled, time.Since(start))
	}
	if n := e.srv.Throttled("CreateLogStream"); n != throttled {
		t.Errorf("Throttled(CreateLogStream) = %d, the client saw %d", n, throttled)
	}
	if g := e.srv.Groups(); len(g) != 1 || len(g[0].Streams) != ok {
		t.Errorf("groups %+v after %d streams were accepted", g, ok)
	}
	// The wire shape, as the SDK's awsJson1.1 deserializer reads it.
	r := raw(t, e.url, "Logs_20140328.CreateLogStream", jsonType, `{"logGroupName":"g","logStreamName":"raw"}`, true)
	for r.status == http.StatusOK { // a token came back meanwhile
		r = raw(t, e.url, "Logs_20140328.CreateLogStream", jsonType, fmt.Sprintf(`{"logGroupName":"g","logStreamName":"raw%d"}`, e.srv.Calls("CreateLogStream")), true)
	}
	if r.status != 400 || r.header.Get("x-amzn-ErrorType") != "ThrottlingException" || len(r.body) != 2 ||
		r.body["__type"] != "ThrottlingException" || r.body["message"] != "Rate exceeded" {
		t.Errorf("throttled answer %d %v %s", r.status, r.header, r.text)
	}
	for range 20 {
		if _, err := e.cl.DescribeLogStreams(ctx, &cwl.DescribeLogStreamsInput{LogGroupName: aws.String("g")}); err != nil {
			t.Fatal(err)
		}
	}
	if n := e.srv.Throttled("DescribeLogStreams"); n != 0 {
		t.Errorf("DescribeLogStreams throttled %d times without a quota", n)
	}
	e.srv.SetQuota("CreateLogStream", 0)
	for i := range 20 {
		e.mustStream(t, "g", fmt.Sprint("after", i))
	}
}
