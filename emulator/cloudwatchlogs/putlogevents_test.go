package cloudwatchlogs

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	cwl "github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs/types"
)

func newStream(t *testing.T, opts Options) *env {
	t.Helper()
	e := newEnv(t, opts)
	e.mustGroup(t, "g")
	e.mustStream(t, "g", "s")
	return e
}

func TestPutLogEventsCount(t *testing.T) {
	e := newStream(t, Options{})
	// The SDK refuses a nil list itself; an empty one reaches the service.
	_, err := e.cl.PutLogEvents(context.Background(), &cwl.PutLogEventsInput{
		LogGroupName: aws.String("g"), LogStreamName: aws.String("s"), LogEvents: []types.InputLogEvent{},
	})
	wantIPE(t, err, "Value '[]' at 'logEvents' failed to satisfy constraint: Member must have length greater than or equal to 1")

	batch := make([]types.InputLogEvent, 10_001)
	for i := range batch {
		batch[i] = ev(fixedNow, fmt.Sprint(i))
	}
	_, err = e.put("g", "s", batch...)
	wantIPE(t, err, "Member must have length less than or equal to 10000")
	if n := len(e.srv.Events("g", "s")); n != 0 {
		t.Fatalf("%d events stored after a refused batch", n)
	}
	e.mustPut(t, "g", "s", batch[:10_000]...)
	if n := len(e.srv.Events("g", "s")); n != 10_000 {
		t.Errorf("%d events stored, want 10000", n)
	}
}

func TestPutLogEventsSizes(t *testing.T) {
	e := newStream(t, Options{})
	half := MaxBatchBytes/2 - EventOverhead // two of these fill a batch exactly
	e.mustPut(t, "g", "s", ev(fixedNow, strings.Repeat("a", half)), ev(fixedNow, strings.Repeat("b", half)))
	_, err := e.put("g", "s", ev(fixedNow, strings.Repeat("a", half)), ev(fixedNow, strings.Repeat("b", half+1)))
	wantIPE(t, err, "Upload too large: 1048577 bytes exceeds limit of 1048576")

	// The 26 bytes of one event count against the 1 MiB event limit.
	e.mustPut(t, "g", "s", ev(fixedNow, strings.Repeat("c", MaxEventBytes-EventOverhead)))
	_, err = e.put("g", "s", ev(fixedNow, strings.Repeat("c", MaxEventBytes-EventOverhead+1)))
	wantIPE(t, err, "Log event too large: 1048577 bytes exceeds limit of 1048576")

	// Sizes are UTF-8 bytes, not characters: 'é' is two bytes.
	e.mustPut(t, "g", "s", ev(fixedNow, strings.Repeat("é", (MaxEventBytes-EventOverhead)/2)))
	_, err = e.put("g", "s", ev(fixedNow, strings.Repeat("é", (MaxEventBytes-EventOverhead)/2+1)))
	wantIPE(t, err, "Log event too large: 1048578 bytes")

	_, err = e.put("g", "s", ev(fixedNow, "ok"), ev(fixedNow, ""))
	wantIPE(t, err, "Value '' at 'logEvents.2.member.message' failed to satisfy constraint: Member must have length greater than or equal to 1")

	if n := len(e.srv.Events("g", "s")); n != 4 {
		t.Errorf("%d events stored, want 4", n)
	}
	gi := e.srv.Groups()[0]
	wantBytes := int64(2*half + MaxEventBytes - EventOverhead + 2*((MaxEventBytes-EventOverhead)/2))
	if gi.StoredBytes != wantBytes || gi.Streams[0].StoredBytes != wantBytes || gi.Streams[0].Events != 4 {
		t.Errorf("Groups() = %+v, want %d stored bytes in 4 events", gi, wantBytes)
	}
}

func TestPutLogEventsOrder(t *testing.T) {
	e := newStream(t, Options{})
	_, err := e.put("g", "s", ev(fixedNow, "b"), ev(fixedNow-1, "a"))
	wantIPE(t, err, "Log events in a single PutLogEvents request must be in chronological order.")
	if n := len(e.srv.Events("g", "s")); n != 0 {
		t.Fatalf("%d events stored after an unordered batch", n)
	}
	// Equal timestamps are in order.
	e.mustPut(t, "g", "s", ev(fixedNow-5, "1"), ev(fixedNow-5, "2"), ev(fixedNow, "3"))
	// A later batch may go back in time: the stream stays sorted by timestamp,
	// arrival order breaking ties.
	e.mustPut(t, "g", "s", ev(fixedNow-5, "4"), ev(fixedNow-2, "5"))
	want := []string{"1", "2", "4", "5", "3"}
	if got := messages(e.srv.Events("g", "s")); !reflect.DeepEqual(got, want) {
		t.Errorf("stored %v, want %v", got, want)
	}
}

func TestPutLogEventsSpan(t *testing.T) {
	e := newStream(t, Options{})
	// Exactly 24 h between the first and the last event is allowed.
	e.mustPut(t, "g", "s", ev(fixedNow-22*hourMs, "first"), ev(fixedNow+2*hourMs, "last"))
	_, err := e.put("g", "s", ev(fixedNow-22*hourMs-1, "first"), ev(fixedNow+2*hourMs, "last"))
	wantIPE(t, err, "The batch of log events in a single PutLogEvents request cannot span more than 24 hours.")
	_, err = e.put("g", "s", ev(fixedNow-10*day, "old but valid"), ev(fixedNow, "now"))
	wantIPE(t, err, "cannot span more than 24 hours")
	// Only the events that are not rejected count: a too-old first event
	// does not stretch the span.
	out := e.mustPut(t, "g", "s", ev(fixedNow-20*day, "too old"), ev(fixedNow-hourMs, "a"), ev(fixedNow, "b"))
	if info := out.RejectedLogEventsInfo; info == nil || aws.ToInt32(info.TooOldLogEventEndIndex) != 1 {
		t.Errorf("RejectedLogEventsInfo = %+v, want tooOldLogEventEndIndex 1", info)
	}
	if n := len(e.srv.Events("g", "s")); n != 4 {
		t.Errorf("%d events stored, want 4", n)
	}
}

func TestPutLogEventsRejectedIndexes(t *testing.T) {
	e := newStream(t, Options{})
	// A too-old prefix and a too-new suffix around valid events.
	out := e.mustPut(t, "g", "s",
		ev(fixedNow-15*day, "0 too old"),
		ev(fixedNow-14*day-1, "1 too old by 1 ms"),
		ev(fixedNow-hourMs, "2 an hour ago"),
		ev(fixedNow, "3 now"),
		ev(fixedNow+2*hourMs, "4 exactly 2 h ahead"),
		ev(fixedNow+2*hourMs+1, "5 too new by 1 ms"),
		ev(fixedNow+3*hourMs, "6 too new"),
	)
	info := out.RejectedLogEventsInfo
	if info == nil {
		t.Fatal("no rejectedLogEventsInfo")
	}
	if got := aws.ToInt32(info.TooOldLogEventEndIndex); got != 2 || info.TooOldLogEventEndIndex == nil {
		t.Errorf("tooOldLogEventEndIndex = %v, want 2 (exclusive)", got)
	}
	if got := aws.ToInt32(info.TooNewLogEventStartIndex); got != 5 || info.TooNewLogEventStartIndex == nil {
		t.Errorf("tooNewLogEventStartIndex = %v, want 5 (inclusive)", got)
	}
	if info.ExpiredLogEventEndIndex != nil {
		t.Errorf("expiredLogEventEndIndex = %d, want none", *info.ExpiredLogEventEndIndex)
	}
	got := e.srv.Events("g", "s")
	want := []Event{
		{fixedNow - hourMs, fixedNow, "2 an hour ago"},
		{fixedNow, fixedNow, "3 now"},
		{fixedNow + 2*hourMs, fixedNow, "4 exactly 2 h ahead"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("stored %+v\nwant %+v", got, want)
	}
	// The same through GetLogEvents, with the ingestion time.
	page, err := e.cl.GetLogEvents(context.Background(), &cwl.GetLogEventsInput{LogGroupName: aws.String("g"), LogStreamName: aws.String("s"), StartFromHead: aws.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Events) != 3 || aws.ToInt64(page.Events[0].IngestionTime) != fixedNow || aws.ToString(page.Events[2].Message) != "4 exactly 2 h ahead" {
		t.Errorf("GetLogEvents = %+v", page.Events)
	}

	// An event exactly 14 days old is accepted.
	out = e.mustPut(t, "g", "s", ev(fixedNow-14*day-1, "a"), ev(fixedNow-14*day, "b"), ev(fixedNow-14*day+hourMs, "c"))
	if info := out.RejectedLogEventsInfo; info == nil || aws.ToInt32(info.TooOldLogEventEndIndex) != 1 || info.TooNewLogEventStartIndex != nil {
		t.Errorf("14-day boundary: RejectedLogEventsInfo = %+v, want tooOldLogEventEndIndex 1 only", info)
	}

	// Nothing accepted is still a success.
	out = e.mustPut(t, "g", "s", ev(fixedNow+3*hourMs, "a"), ev(fixedNow+4*hourMs, "b"))
	if info := out.RejectedLogEventsInfo; info == nil || info.TooNewLogEventStartIndex == nil || *info.TooNewLogEventStartIndex != 0 || info.TooOldLogEventEndIndex != nil {
		t.Errorf("all too new: RejectedLogEventsInfo = %+v, want tooNewLogEventStartIndex 0 only", info)
	}
	out = e.mustPut(t, "g", "s", ev(fixedNow-30*day, "a"))
	if info := out.RejectedLogEventsInfo; info == nil || aws.ToInt32(info.TooOldLogEventEndIndex) != 1 || info.TooNewLogEventStartIndex != nil {
		t.Errorf("all too old: RejectedLogEventsInfo = %+v, want tooOldLogEventEndIndex 1 only", info)
	}
	// An accepted batch has no rejectedLogEventsInfo.
	if out := e.mustPut(t, "g", "s", ev(fixedNow, "fine")); out.RejectedLogEventsInfo != nil {
		t.Errorf("RejectedLogEventsInfo = %+v for a valid batch", out.RejectedLogEventsInfo)
	}
	if n := len(e.srv.Events("g", "s")); n != 6 {
		t.Errorf("%d events stored, want 6", n)
	}
}

func TestPutLogEventsExpired(t *testing.T) {
	e := newStream(t, Options{})
	ctx := context.Background()
	if _, err := e.cl.PutRetentionPolicy(ctx, &cwl.PutRetentionPolicyInput{LogGroupName: aws.String("g"), RetentionInDays: aws.Int32(1)}); err != nil {
		t.Fatal(err)
	}
	out := e.mustPut(t, "g", "s",
		ev(fixedNow-20*day, "older than 14 days"),
		ev(fixedNow-3*day, "older than the retention"),
		ev(fixedNow-day-1, "older than the retention by 1 ms"),
		ev(fixedNow-day, "exactly one day old"),
		ev(fixedNow, "now"),
	)
	info := out.RejectedLogEventsInfo
	if info == nil || aws.ToInt32(info.TooOldLogEventEndIndex) != 1 || aws.ToInt32(info.ExpiredLogEventEndIndex) != 3 || info.TooNewLogEventStartIndex != nil {
		t.Fatalf("RejectedLogEventsInfo = %+v, want tooOld 1, expired 3", info)
	}
	if got := messages(e.srv.Events("g", "s")); !reflect.DeepEqual(got, []string{"exactly one day old", "now"}) {
		t.Errorf("stored %v", got)
	}

	// With a retention longer than 14 days the 14-day rule decides alone.
	if _, err := e.cl.PutRetentionPolicy(ctx, &cwl.PutRetentionPolicyInput{LogGroupName: aws.String("g"), RetentionInDays: aws.Int32(30)}); err != nil {
		t.Fatal(err)
	}
	out = e.mustPut(t, "g", "s", ev(fixedNow-40*day, "a"), ev(fixedNow-20*day, "b"), ev(fixedNow-10*day, "c"))
	info = out.RejectedLogEventsInfo
	if info == nil || aws.ToInt32(info.TooOldLogEventEndIndex) != 2 || info.ExpiredLogEventEndIndex != nil {
		t.Errorf("retention 30: RejectedLogEventsInfo = %+v, want tooOld 2 only", info)
	}
}

// The clock moves: a batch is judged against Options.Now at the time of the
// call.
func TestPutLogEventsUsesClock(t *testing.T) {
	e := newStream(t, Options{})
	e.clock.ms.Store(fixedNow + 10*day)
	out := e.mustPut(t, "g", "s", ev(fixedNow, "ten days old"), ev(fixedNow+10*day+3*hourMs, "too new"))
	if info := out.RejectedLogEventsInfo; info == nil || info.TooOldLogEventEndIndex != nil || aws.ToInt32(info.TooNewLogEventStartIndex) != 1 {
		t.Errorf("RejectedLogEventsInfo = %+v", info)
	}
	if got := e.srv.Events("g", "s"); len(got) != 1 || got[0].IngestionTime != fixedNow+10*day {
		t.Errorf("stored %+v", got)
	}
}

func TestPutLogEventsUTF8(t *testing.T) {
	e := newStream(t, Options{})
	put := func(msgJSON string) rawResponse {
		body := fmt.Sprintf(`{"logGroupName":"g","logStreamName":"s","logEvents":[{"timestamp":%d,"message":%s}]}`, fixedNow, msgJSON)
		return raw(t, e.url, "Logs_20140328.PutLogEvents", "application/x-amz-json-1.1", body, true)
	}
	for name, msg := range map[string]string{
		"raw invalid bytes":   "\"a\xff\xfeb\"",
		"truncated sequence":  "\"a\xe2\x82\"",
		"lone high surrogate": `"a\ud800b"`,
		"lone low surrogate":  `"a\udc00b"`,
		"reversed pair":       `"\ude00\ud83d"`,
	} {
		r := put(msg)
		if r.status != 400 || r.body["__type"] != "InvalidParameterException" || !strings.Contains(fmt.Sprint(r.body["message"]), "UTF-8") {
			t.Errorf("%s: %d %s, want 400 InvalidParameterException about UTF-8", name, r.status, r.text)
		}
	}
	if r := put(`"smile \ud83d\ude00 caf\u00e9"`); r.status != 200 {
		t.Fatalf("valid escapes: %d %s", r.status, r.text)
	}
	if r := put(`"literal 😀"`); r.status != 200 {
		t.Fatalf("valid UTF-8: %d %s", r.status, r.text)
	}
	want := []string{"smile 😀 café", "literal 😀"}
	if got := messages(e.srv.Events("g", "s")); !reflect.DeepEqual(got, want) {
		t.Errorf("stored %q, want %q", got, want)
	}
	// The Go SDK never sends invalid UTF-8: it writes U+FFFD in its place.
	e.mustPut(t, "g", "s", ev(fixedNow, "a\xffb"))
	if got := e.srv.Events("g", "s"); got[len(got)-1].Message != "a\uFFFDb" {
		t.Errorf("SDK-sent invalid UTF-8 stored as %q", got[len(got)-1].Message)
	}
}

func TestPutLogEventsMissingMembers(t *testing.T) {
	e := newStream(t, Options{})
	for body, msg := range map[string]string{
		`{"logGroupName":"g","logStreamName":"s"}`:                                               "Value null at 'logEvents'",
		`{"logGroupName":"g","logStreamName":"s","logEvents":[{"message":"x"}]}`:                 "Value null at 'logEvents.1.member.timestamp'",
		`{"logGroupName":"g","logStreamName":"s","logEvents":[{"timestamp":1,"message":null}]}`:  "Value null at 'logEvents.1.member.message'",
		`{"logStreamName":"s","logEvents":[{"timestamp":1,"message":"x"}]}`:                      "Value null at 'logGroupName'",
		`{"logGroupName":"g","logEvents":[{"timestamp":1,"message":"x"}]}`:                       "Value null at 'logStreamName'",
		`{"logGroupName":"g:x","logStreamName":"s","logEvents":[{"timestamp":1,"message":"x"}]}`: "at 'logGroupName' failed to satisfy constraint",
	} {
		r := raw(t, e.url, "Logs_20140328.PutLogEvents", "application/x-amz-json-1.1", body, true)
		if r.status != 400 || r.body["__type"] != "InvalidParameterException" || !strings.Contains(fmt.Sprint(r.body["message"]), msg) {
			t.Errorf("%s: %d %s, want InvalidParameterException with %q", body, r.status, r.text, msg)
		}
	}
}
