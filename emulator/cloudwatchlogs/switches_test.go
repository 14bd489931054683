package cloudwatchlogs

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	cwl "github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

func TestThrottle(t *testing.T) {
	e := newStream(t, Options{ThrottlePerSecond: 5})
	ok, throttled := 0, 0
	start := time.Now()
	for i := range 20 {
		_, err := e.put("g", "s", ev(fixedNow, fmt.Sprint(i)))
		switch {
		case err == nil:
			ok++
		case code(err) == "ThrottlingException":
			throttled++
			if status(err) != http.StatusBadRequest {
				t.Errorf("ThrottlingException with status %d, want 400", status(err))
			}
		default:
			t.Fatalf("unexpected error %v", err)
		}
	}
	// A burst of one second's worth passes; the bucket refills at 5/s while
	// the loop runs.
	if most := 5 + int(5*time.Since(start).Seconds()) + 1; ok < 5 || ok > most || throttled == 0 {
		t.Errorf("%d accepted (at most %d), %d throttled of 20 at 5/s in %v", ok, most, throttled, time.Since(start))
	}
	if n := len(e.srv.Events("g", "s")); n != ok {
		t.Errorf("%d events stored, %d calls accepted", n, ok)
	}
	if n := e.srv.Calls("PutLogEvents"); n != 20 {
		t.Errorf("Calls(PutLogEvents) = %d, want 20", n)
	}
	// Other operations are not throttled.
	for range 20 {
		if _, err := e.cl.DescribeLogGroups(context.Background(), &cwl.DescribeLogGroupsInput{}); err != nil {
			t.Fatal(err)
		}
	}
	e.srv.SetThrottle(0)
	for i := range 20 {
		e.mustPut(t, "g", "s", ev(fixedNow, fmt.Sprint(i)))
	}
}

func TestFailures(t *testing.T) {
	e := newStream(t, Options{Seed: 42})
	e.srv.SetFailures(1, 503)
	_, err := e.put("g", "s", ev(fixedNow, "x"))
	var unavailable *types.ServiceUnavailableException
	if !errors.As(err, &unavailable) || status(err) != 503 {
		t.Errorf("error %v (status %d), want ServiceUnavailableException 503", err, status(err))
	}
	e.srv.SetFailures(1, 500)
	_, err = e.cl.CreateLogStream(context.Background(), &cwl.CreateLogStreamInput{LogGroupName: aws.String("g"), LogStreamName: aws.String("t")})
	var ae smithy.APIError
	if !errors.As(err, &ae) || ae.ErrorCode() != "InternalFailure" || status(err) != 500 {
		t.Errorf("error %v (status %d), want InternalFailure 500", err, status(err))
	}
	if n := len(e.srv.Events("g", "s")); n != 0 {
		t.Errorf("a failed call stored %d events", n)
	}
	if len(e.srv.Groups()[0].Streams) != 1 {
		t.Error("a failed CreateLogStream created the stream")
	}

	// The SDK's standard retryer retries these.
	retrying := newClient(t, e.url, retry.NewStandard(func(o *retry.StandardOptions) {
		o.MaxAttempts = 3
		o.RateLimiter = ratelimit.None
		o.Backoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return time.Millisecond, nil })
	}))
	before := e.srv.Calls("PutLogEvents")
	_, err = retrying.PutLogEvents(context.Background(), &cwl.PutLogEventsInput{LogGroupName: aws.String("g"), LogStreamName: aws.String("s"), LogEvents: []types.InputLogEvent{ev(fixedNow, "x")}})
	if code(err) != "InternalFailure" || e.srv.Calls("PutLogEvents")-before != 3 {
		t.Errorf("retrying client: %v after %d calls, want InternalFailure after 3", err, e.srv.Calls("PutLogEvents")-before)
	}

	e.srv.SetFailures(0.3, 503)
	failed := 0
	for range 200 {
		if _, err := e.cl.DescribeLogGroups(context.Background(), &cwl.DescribeLogGroupsInput{}); err != nil {
			if code(err) != "ServiceUnavailableException" {
				t.Fatal(err)
			}
			failed++
		}
	}
	if failed < 30 || failed > 100 {
		t.Errorf("%d of 200 calls failed at rate 0.3", failed)
	}
	if n := e.srv.Calls("DescribeLogGroups"); n != 200 {
		t.Errorf("Calls(DescribeLogGroups) = %d, want 200", n)
	}
	e.srv.SetFailures(0, 0)
	e.mustPut(t, "g", "s", ev(fixedNow, "x"))
}

func TestLatency(t *testing.T) {
	e := newStream(t, Options{Latency: 150 * time.Millisecond})
	start := time.Now()
	e.mustPut(t, "g", "s", ev(fixedNow, "slow"))
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Errorf("call took %v with 150ms latency", d)
	}

	// A client that gives up does not wait for the latency.
	e.srv.SetLatency(10 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := e.cl.PutLogEvents(ctx, &cwl.PutLogEventsInput{LogGroupName: aws.String("g"), LogStreamName: aws.String("s"), LogEvents: []types.InputLogEvent{ev(fixedNow, "x")}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v, want the deadline", err)
	}
	// Off again: well within a deadline the 10 s latency would miss.
	e.srv.SetLatency(0)
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := e.cl.PutLogEvents(ctx, &cwl.PutLogEventsInput{LogGroupName: aws.String("g"), LogStreamName: aws.String("s"), LogEvents: []types.InputLogEvent{ev(fixedNow, "fast")}}); err != nil {
		t.Errorf("without latency: %v", err)
	}

	// Close wakes requests that sleep in the latency.
	e.srv.SetLatency(10 * time.Second)
	go func() {
		time.Sleep(50 * time.Millisecond)
		e.srv.Close()
	}()
	start = time.Now()
	_, err = e.put("g", "s", ev(fixedNow, "y"))
	if err == nil || time.Since(start) > 5*time.Second {
		t.Errorf("put during Close: %v after %v", err, time.Since(start))
	}
	if got := messages(e.srv.Events("g", "s")); len(got) != 2 {
		t.Errorf("stored %q, want slow and fast", got)
	}
}

func TestDropResponses(t *testing.T) {
	e := newStream(t, Options{})
	e.srv.SetDropResponses(1)
	_, err := e.put("g", "s", ev(fixedNow, "in doubt"))
	var sendErr *smithyhttp.RequestSendError
	if err == nil || code(err) != "" || !errors.As(err, &sendErr) {
		t.Fatalf("error %v (%T), want a transport error", err, err)
	}
	if got := messages(e.srv.Events("g", "s")); len(got) != 1 || got[0] != "in doubt" {
		t.Errorf("stored %q, want the dropped batch", got)
	}
	// Only PutLogEvents is dropped.
	if _, err := e.cl.DescribeLogStreams(context.Background(), &cwl.DescribeLogStreamsInput{LogGroupName: aws.String("g")}); err != nil {
		t.Errorf("DescribeLogStreams with drops on: %v", err)
	}
	// A resend after a drop stores the batch again, as AWS would.
	e.srv.SetDropResponses(0)
	e.mustPut(t, "g", "s", ev(fixedNow, "in doubt"))
	if n := len(e.srv.Events("g", "s")); n != 2 {
		t.Errorf("%d events, want 2", n)
	}
	if n := e.srv.Calls("PutLogEvents"); n != 2 {
		t.Errorf("Calls(PutLogEvents) = %d, want 2", n)
	}
}

func TestLegacySequenceTokens(t *testing.T) {
	e := newStream(t, Options{LegacySequenceTokens: true})
	putTok := func(stream string, token *string, msgs ...string) (*cwl.PutLogEventsOutput, error) {
		var evs []types.InputLogEvent
		for _, m := range msgs {
			evs = append(evs, ev(fixedNow, m))
		}
		return e.cl.PutLogEvents(context.Background(), &cwl.PutLogEventsInput{
			LogGroupName: aws.String("g"), LogStreamName: aws.String(stream), LogEvents: evs, SequenceToken: token,
		})
	}
	// The first put on a new stream needs no token.
	out, err := putTok("s", nil, "1")
	if err != nil {
		t.Fatal(err)
	}
	t1 := aws.ToString(out.NextSequenceToken)
	if !regexp.MustCompile(`^[0-9]{56}$`).MatchString(t1) {
		t.Fatalf("nextSequenceToken %q", t1)
	}
	// Without the token, a new batch is refused with the expected token.
	_, err = putTok("s", nil, "2")
	ist := wantErr[*types.InvalidSequenceTokenException](t, err, "The given sequenceToken is invalid. The next expected sequenceToken is: "+t1)
	if aws.ToString(ist.ExpectedSequenceToken) != t1 {
		t.Errorf("expectedSequenceToken = %q, want %q", aws.ToString(ist.ExpectedSequenceToken), t1)
	}
	// ... and the first batch resent without a token was already accepted.
	_, err = putTok("s", nil, "1")
	daa := wantErr[*types.DataAlreadyAcceptedException](t, err, "The next batch can be sent with sequenceToken: "+t1)
	if aws.ToString(daa.ExpectedSequenceToken) != t1 {
		t.Errorf("DataAlreadyAccepted expectedSequenceToken = %q", aws.ToString(daa.ExpectedSequenceToken))
	}
	out, err = putTok("s", &t1, "2", "3")
	if err != nil {
		t.Fatal(err)
	}
	t2 := aws.ToString(out.NextSequenceToken)
	if t2 == t1 {
		t.Fatal("token did not advance")
	}
	_, err = putTok("s", &t1, "2", "3")
	daa = wantErr[*types.DataAlreadyAcceptedException](t, err, t2)
	if aws.ToString(daa.ExpectedSequenceToken) != t2 {
		t.Errorf("DataAlreadyAccepted expectedSequenceToken = %q, want %q", aws.ToString(daa.ExpectedSequenceToken), t2)
	}
	_, err = putTok("s", &t1, "other")
	ist = wantErr[*types.InvalidSequenceTokenException](t, err, t2)
	if aws.ToString(ist.ExpectedSequenceToken) != t2 {
		t.Errorf("expectedSequenceToken = %q, want %q", aws.ToString(ist.ExpectedSequenceToken), t2)
	}
	if got := messages(e.srv.Events("g", "s")); len(got) != 3 {
		t.Errorf("stored %q, want 1, 2, 3", got)
	}
	// The token is also in DescribeLogStreams.
	ds, err := e.cl.DescribeLogStreams(context.Background(), &cwl.DescribeLogStreamsInput{LogGroupName: aws.String("g")})
	if err != nil || aws.ToString(ds.LogStreams[0].UploadSequenceToken) != t2 {
		t.Errorf("uploadSequenceToken: %v %+v", err, ds)
	}

	// A token on a stream that never had a put: expected is null.
	e.mustStream(t, "g", "fresh")
	_, err = putTok("fresh", aws.String(t1), "x")
	ist = wantErr[*types.InvalidSequenceTokenException](t, err, "The next expected sequenceToken is: null")
	if ist.ExpectedSequenceToken != nil {
		t.Errorf("expectedSequenceToken = %q, want none", *ist.ExpectedSequenceToken)
	}

	// Today's rules: tokens are ignored, and still returned.
	e.srv.SetLegacySequenceTokens(false)
	out, err = putTok("s", aws.String("bogus"), "4")
	if err != nil || out.NextSequenceToken == nil {
		t.Errorf("token ignored: %v %+v", err, out)
	}
	if _, err = putTok("s", nil, "5"); err != nil {
		t.Error(err)
	}
}

func TestDenyAll(t *testing.T) {
	e := newStream(t, Options{})
	for _, c := range []struct {
		code   string
		status int
	}{
		{"AccessDeniedException", 400},
		{"UnrecognizedClientException", 400},
		{"ExpiredTokenException", 403},
	} {
		e.srv.SetDenyAll(c.code)
		_, err := e.put("g", "s", ev(fixedNow, "x"))
		if code(err) != c.code || status(err) != c.status {
			t.Errorf("%s: error %v (status %d), want status %d", c.code, err, status(err), c.status)
		}
		_, err = e.cl.DescribeLogGroups(context.Background(), &cwl.DescribeLogGroupsInput{})
		if code(err) != c.code {
			t.Errorf("%s: DescribeLogGroups error %v", c.code, err)
		}
	}
	e.srv.SetDenyAll("AccessDeniedException")
	_, err := e.put("g", "s", ev(fixedNow, "x"))
	var denied *types.AccessDeniedException
	if !errors.As(err, &denied) {
		t.Errorf("AccessDeniedException is modelled: %T", err)
	}
	e.srv.SetDenyAll("")
	e.mustPut(t, "g", "s", ev(fixedNow, "x"))
	if n := len(e.srv.Events("g", "s")); n != 1 {
		t.Errorf("%d events stored, want 1", n)
	}
}

func TestConcurrentClients(t *testing.T) {
	e := newEnv(t, Options{})
	e.mustGroup(t, "g")
	for i := range 4 {
		e.mustStream(t, "g", fmt.Sprint("s", i))
	}
	const writers, puts, perPut = 8, 25, 20
	var wg sync.WaitGroup
	errs := make(chan error, writers*puts)
	for w := range writers {
		cl := newClient(t, e.url, aws.NopRetryer{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			stream := fmt.Sprint("s", w%4)
			for p := range puts {
				batch := make([]types.InputLogEvent, perPut)
				for i := range batch {
					batch[i] = ev(fixedNow-int64(puts-p)*1000+int64(i), fmt.Sprintf("w%d p%d e%d", w, p, i))
				}
				if _, err := cl.PutLogEvents(context.Background(), &cwl.PutLogEventsInput{
					LogGroupName: aws.String("g"), LogStreamName: aws.String(stream), LogEvents: batch,
				}); err != nil {
					errs <- err
				}
			}
		}()
	}
	// Readers at the same time.
	done := make(chan struct{})
	var rg sync.WaitGroup
	rg.Add(1)
	go func() {
		defer rg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			e.srv.Groups()
			_, _ = e.cl.FilterLogEvents(context.Background(), &cwl.FilterLogEventsInput{LogGroupName: aws.String("g"), Limit: aws.Int32(10)})
		}
	}()
	wg.Wait()
	close(done)
	rg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	total := 0
	for i := range 4 {
		evs := e.srv.Events("g", fmt.Sprint("s", i))
		total += len(evs)
		for j := 1; j < len(evs); j++ {
			if evs[j].Timestamp < evs[j-1].Timestamp {
				t.Fatalf("stream s%d not sorted at %d", i, j)
			}
		}
		if len(evs) != 2*puts*perPut {
			t.Errorf("stream s%d has %d events, want %d", i, len(evs), 2*puts*perPut)
		}
	}
	if total != writers*puts*perPut {
		t.Errorf("%d events in all, want %d", total, writers*puts*perPut)
	}
}

func TestStartClose(t *testing.T) {
	srv := New(Options{})
	url, err := srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^http://127\.0\.0\.1:[0-9]+$`).MatchString(url) {
		t.Errorf("URL %q", url)
	}
	if _, err := srv.Start("127.0.0.1:0"); err == nil {
		t.Error("second Start succeeded")
	}
	cl := newClient(t, url, aws.NopRetryer{})
	if _, err := cl.CreateLogGroup(context.Background(), &cwl.CreateLogGroupInput{LogGroupName: aws.String("g")}); err != nil {
		t.Fatal(err)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	_, err = cl.DescribeLogGroups(context.Background(), &cwl.DescribeLogGroupsInput{})
	var sendErr *smithyhttp.RequestSendError
	if !errors.As(err, &sendErr) {
		t.Errorf("after Close: %v, want a transport error", err)
	}
	if g := srv.Groups(); len(g) != 1 {
		t.Errorf("Groups after Close = %+v", g)
	}

	wild := New(Options{})
	defer wild.Close()
	url, err = wild.Start(":0")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^http://127\.0\.0\.1:[0-9]+$`).MatchString(url) {
		t.Errorf("URL for :0 is %q", url)
	}
}

// readAll reads a stream forward from the head over [from, to) until the
// forward token comes back unchanged, and returns the messages and the pages.
func readAll(t *testing.T, e *env, from, to int64, limit int32) (msgs []string, pages []int) {
	t.Helper()
	in := &cwl.GetLogEventsInput{LogGroupName: aws.String("g"), LogStreamName: aws.String("s"),
		StartFromHead: aws.Bool(true), StartTime: aws.Int64(from), EndTime: aws.Int64(to)}
	if limit > 0 {
		in.Limit = aws.Int32(limit)
	}
	for range 1000 {
		out, err := e.cl.GetLogEvents(context.Background(), in)
		if err != nil {
			t.Fatal(err)
		}
		pages = append(pages, len(out.Events))
		msgs = append(msgs, outMessages(out.Events)...)
		if in.NextToken != nil && aws.ToString(out.NextForwardToken) == *in.NextToken {
			return msgs, pages
		}
		in.NextToken = out.NextForwardToken
	}
	t.Fatal("the forward token never came back unchanged")
	return nil, nil
}

func TestReadDelay(t *testing.T) {
	e := newStream(t, Options{ReadDelay: 2 * time.Second})
	e.mustPut(t, "g", "s", ev(fixedNow-10, "m00"), ev(fixedNow-5, "m01"))
	// Stored, not yet readable.
	if n := len(e.srv.Events("g", "s")); n != 2 {
		t.Fatalf("Events: %d, want 2 stored", n)
	}
	if got, _ := readAll(t, e, fixedNow-100, fixedNow+1, 0); len(got) != 0 {
		t.Fatalf("read %q before the delay passed", got)
	}
	out, err := e.cl.FilterLogEvents(context.Background(), &cwl.FilterLogEventsInput{LogGroupName: aws.String("g")})
	if err != nil || len(out.Events) != 0 {
		t.Fatalf("FilterLogEvents before the delay: %v, %d events", err, len(out.Events))
	}
	e.clock.ms.Add(1999)
	e.mustPut(t, "g", "s", ev(fixedNow-7, "late"))
	if got, _ := readAll(t, e, fixedNow-100, fixedNow+1, 0); len(got) != 0 {
		t.Fatalf("read %q 1.999 s after the put", got)
	}
	e.clock.ms.Add(1)
	if got, _ := readAll(t, e, fixedNow-100, fixedNow+1, 0); !reflect.DeepEqual(got, []string{"m00", "m01"}) {
		t.Fatalf("read %q once the delay passed, want the first put", got)
	}
	e.srv.SetReadDelay(0)
	if got, _ := readAll(t, e, fixedNow-100, fixedNow+1, 0); !reflect.DeepEqual(got, []string{"m00", "late", "m01"}) {
		t.Fatalf("read %q without a delay", got)
	}
}

func TestSparsePages(t *testing.T) {
	e := newStream(t, Options{SparsePages: 4})
	var batch []types.InputLogEvent
	for i := range 10 {
		batch = append(batch, ev(fixedNow-int64(100-i), fmt.Sprintf("m%02d", i)))
	}
	e.mustPut(t, "g", "s", batch...)
	got, pages := readAll(t, e, fixedNow-1000, fixedNow, 0)
	if !reflect.DeepEqual(got, seq(0, 10)) || !reflect.DeepEqual(pages, []int{0, 4, 0, 4, 0, 2, 0}) {
		t.Fatalf("read %q in pages %v", got, pages)
	}
	// The limit still holds within a page.
	if got, pages = readAll(t, e, fixedNow-1000, fixedNow, 3); !reflect.DeepEqual(got, seq(0, 10)) || !reflect.DeepEqual(pages, []int{0, 3, 0, 3, 0, 3, 0, 1, 0}) {
		t.Fatalf("limit 3: read %q in pages %v", got, pages)
	}
	// Over a window, and an empty window.
	if got, _ = readAll(t, e, fixedNow-95, fixedNow-90, 0); !reflect.DeepEqual(got, seq(5, 10)) {
		t.Fatalf("window: read %q", got)
	}
	if got, pages = readAll(t, e, fixedNow, fixedNow+10, 0); len(got) != 0 || !reflect.DeepEqual(pages, []int{0, 0}) {
		t.Fatalf("empty window: read %q in pages %v", got, pages)
	}
	// A reader that stops at the first empty page sees nothing.
	out, err := e.cl.GetLogEvents(context.Background(), &cwl.GetLogEventsInput{LogGroupName: aws.String("g"), LogStreamName: aws.String("s"), StartFromHead: aws.Bool(true)})
	if err != nil || len(out.Events) != 0 {
		t.Fatalf("first page: %v, %d events, want an empty page", err, len(out.Events))
	}
	// The SDK's paginator reads everything.
	p := cwl.NewGetLogEventsPaginator(e.cl, &cwl.GetLogEventsInput{LogGroupName: aws.String("g"), LogStreamName: aws.String("s"), StartFromHead: aws.Bool(true)},
		func(o *cwl.GetLogEventsPaginatorOptions) { o.StopOnDuplicateToken = true })
	got = nil
	for p.HasMorePages() {
		page, err := p.NextPage(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, outMessages(page.Events)...)
	}
	if !reflect.DeepEqual(got, seq(0, 10)) {
		t.Fatalf("paginator read %q", got)
	}
	// Backward reads are as before; a backward token marked as after an empty page is refused.
	back, err := e.cl.GetLogEvents(context.Background(), &cwl.GetLogEventsInput{LogGroupName: aws.String("g"), LogStreamName: aws.String("s"), Limit: aws.Int32(4)})
	if err != nil || !reflect.DeepEqual(outMessages(back.Events), seq(6, 10)) {
		t.Fatalf("backward page: %v %q", err, outMessages(back.Events))
	}
	_, err = e.cl.GetLogEvents(context.Background(), &cwl.GetLogEventsInput{LogGroupName: aws.String("g"), LogStreamName: aws.String("s"),
		NextToken: aws.String("b/1" + strings.Repeat("0", 55))})
	wantIPE(t, err, "The specified nextToken is invalid.")
}
