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

func outMessages(events []types.OutputLogEvent) []string {
	out := make([]string, len(events))
	for i, e := range events {
		out[i] = aws.ToString(e.Message)
	}
	return out
}

func seq(from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("m%02d", i))
	}
	return out
}

func TestGetLogEventsPaging(t *testing.T) {
	e := newStream(t, Options{})
	ctx := context.Background()
	var batch []types.InputLogEvent
	for i := range 25 {
		batch = append(batch, ev(fixedNow-int64(100-i), fmt.Sprintf("m%02d", i)))
	}
	e.mustPut(t, "g", "s", batch...)
	get := func(in cwl.GetLogEventsInput) *cwl.GetLogEventsOutput {
		t.Helper()
		in.LogGroupName, in.LogStreamName = aws.String("g"), aws.String("s")
		out, err := e.cl.GetLogEvents(ctx, &in)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}

	// Forward from the head.
	var got []string
	var token *string
	var pages []int
	for {
		out := get(cwl.GetLogEventsInput{StartFromHead: aws.Bool(true), Limit: aws.Int32(10), NextToken: token})
		pages = append(pages, len(out.Events))
		got = append(got, outMessages(out.Events)...)
		if token != nil && aws.ToString(out.NextForwardToken) == *token {
			break // the end: the same token comes back
		}
		token = out.NextForwardToken
	}
	if !reflect.DeepEqual(pages, []int{10, 10, 5, 0}) || !reflect.DeepEqual(got, seq(0, 25)) {
		t.Errorf("forward pages %v: %v", pages, got)
	}

	// Backward from the tail (startFromHead false is the default).
	out := get(cwl.GetLogEventsInput{Limit: aws.Int32(10)})
	if !reflect.DeepEqual(outMessages(out.Events), seq(15, 25)) {
		t.Errorf("last page = %v", outMessages(out.Events))
	}
	back := out.NextBackwardToken
	out = get(cwl.GetLogEventsInput{Limit: aws.Int32(10), NextToken: back})
	if !reflect.DeepEqual(outMessages(out.Events), seq(5, 15)) {
		t.Errorf("second page back = %v", outMessages(out.Events))
	}
	out = get(cwl.GetLogEventsInput{Limit: aws.Int32(10), NextToken: out.NextBackwardToken})
	if !reflect.DeepEqual(outMessages(out.Events), seq(0, 5)) {
		t.Errorf("third page back = %v", outMessages(out.Events))
	}
	end := out.NextBackwardToken
	out = get(cwl.GetLogEventsInput{Limit: aws.Int32(10), NextToken: end})
	if len(out.Events) != 0 || aws.ToString(out.NextBackwardToken) != aws.ToString(end) {
		t.Errorf("past the head: %v events, token %q, want none and %q", len(out.Events), aws.ToString(out.NextBackwardToken), aws.ToString(end))
	}
	// Forward again from a backward page.
	out = get(cwl.GetLogEventsInput{Limit: aws.Int32(3), NextToken: out.NextForwardToken})
	if !reflect.DeepEqual(outMessages(out.Events), seq(0, 3)) {
		t.Errorf("forward from the head token = %v", outMessages(out.Events))
	}

	// The SDK paginator reads everything and stops on the repeated token.
	p := cwl.NewGetLogEventsPaginator(e.cl, &cwl.GetLogEventsInput{
		LogGroupName: aws.String("g"), LogStreamName: aws.String("s"), StartFromHead: aws.Bool(true), Limit: aws.Int32(7),
	}, func(o *cwl.GetLogEventsPaginatorOptions) { o.StopOnDuplicateToken = true })
	got = nil
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, outMessages(page.Events)...)
	}
	if !reflect.DeepEqual(got, seq(0, 25)) {
		t.Errorf("paginator read %v", got)
	}

	// Time range: startTime inclusive, endTime exclusive.
	out = get(cwl.GetLogEventsInput{StartFromHead: aws.Bool(true), StartTime: aws.Int64(fixedNow - 95), EndTime: aws.Int64(fixedNow - 90)})
	if !reflect.DeepEqual(outMessages(out.Events), seq(5, 10)) {
		t.Errorf("time range = %v", outMessages(out.Events))
	}

	for _, lim := range []int32{0, 10_001} {
		_, err := e.cl.GetLogEvents(ctx, &cwl.GetLogEventsInput{LogGroupName: aws.String("g"), LogStreamName: aws.String("s"), Limit: aws.Int32(lim)})
		wantIPE(t, err, "at 'limit'")
	}
	_, err := e.cl.GetLogEvents(ctx, &cwl.GetLogEventsInput{LogGroupName: aws.String("g"), LogStreamName: aws.String("s"), NextToken: aws.String("garbage")})
	wantIPE(t, err, "The specified nextToken is invalid.")

	// By ARN.
	in := cwl.GetLogEventsInput{LogGroupIdentifier: aws.String("arn:aws:logs:us-east-1:123456789012:log-group:g"), LogStreamName: aws.String("s"), Limit: aws.Int32(1)}
	byArn, err := e.cl.GetLogEvents(ctx, &in)
	if err != nil || len(byArn.Events) != 1 || aws.ToString(byArn.Events[0].Message) != "m24" {
		t.Errorf("by ARN: %v %+v", err, byArn)
	}
	// The identifier's pattern has no '*': the ARN form ending in ":*" is refused.
	in.LogGroupIdentifier = aws.String("arn:aws:logs:us-east-1:123456789012:log-group:g:*")
	_, err = e.cl.GetLogEvents(ctx, &in)
	wantIPE(t, err, "logGroupIdentifier")
}

func TestGetLogEventsResponseSize(t *testing.T) {
	e := newStream(t, Options{})
	big := strings.Repeat("x", 500_000)
	for i := range 3 {
		e.mustPut(t, "g", "s", ev(fixedNow+int64(i), big))
	}
	out, err := e.cl.GetLogEvents(context.Background(), &cwl.GetLogEventsInput{LogGroupName: aws.String("g"), LogStreamName: aws.String("s"), StartFromHead: aws.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Events) != 2 {
		t.Errorf("a 1 MB page holds %d events of 500 kB, want 2", len(out.Events))
	}
}

func TestFilterLogEvents(t *testing.T) {
	e := newEnv(t, Options{})
	ctx := context.Background()
	e.mustGroup(t, "g")
	for _, s := range []string{"a", "b", "other"} {
		e.mustStream(t, "g", s)
	}
	e.mustPut(t, "g", "a", ev(fixedNow+1, "a1 INFO start"), ev(fixedNow+3, "a3 ERROR disk full"), ev(fixedNow+5, "a5 INFO done"))
	e.mustPut(t, "g", "b", ev(fixedNow+2, "b2 ERROR timeout"), ev(fixedNow+3, "b3 INFO ok"), ev(fixedNow+4, `b4 WARN "quoted" path=/x`))
	e.mustPut(t, "g", "other", ev(fixedNow, "o0 ERROR elsewhere"))

	filter := func(in cwl.FilterLogEventsInput) []string {
		t.Helper()
		in.LogGroupName = aws.String("g")
		var got []string
		p := cwl.NewFilterLogEventsPaginator(e.cl, &in)
		for p.HasMorePages() {
			page, err := p.NextPage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, fe := range page.Events {
				got = append(got, aws.ToString(fe.LogStreamName)+":"+aws.ToString(fe.Message))
				if aws.ToString(fe.EventId) == "" || aws.ToInt64(fe.IngestionTime) != fixedNow {
					t.Errorf("event %+v", fe)
				}
			}
		}
		return got
	}
	check := func(name string, got []string, want ...string) {
		t.Helper()
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s:\n got %q\nwant %q", name, got, want)
		}
	}
	check("all, interleaved by time then stream", filter(cwl.FilterLogEventsInput{}),
		"other:o0 ERROR elsewhere", "a:a1 INFO start", "b:b2 ERROR timeout", "a:a3 ERROR disk full", "b:b3 INFO ok", "b:b4 WARN \"quoted\" path=/x", "a:a5 INFO done")
	check("paged by 2", filter(cwl.FilterLogEventsInput{Limit: aws.Int32(2), LogStreamNames: []string{"a", "b"}}),
		"a:a1 INFO start", "b:b2 ERROR timeout", "a:a3 ERROR disk full", "b:b3 INFO ok", "b:b4 WARN \"quoted\" path=/x", "a:a5 INFO done")
	check("time range, both ends inclusive", filter(cwl.FilterLogEventsInput{StartTime: aws.Int64(fixedNow + 2), EndTime: aws.Int64(fixedNow + 3)}),
		"b:b2 ERROR timeout", "a:a3 ERROR disk full", "b:b3 INFO ok")
	check("term", filter(cwl.FilterLogEventsInput{FilterPattern: aws.String("ERROR")}),
		"other:o0 ERROR elsewhere", "b:b2 ERROR timeout", "a:a3 ERROR disk full")
	check("two terms", filter(cwl.FilterLogEventsInput{FilterPattern: aws.String("ERROR disk")}), "a:a3 ERROR disk full")
	check("case sensitive", filter(cwl.FilterLogEventsInput{FilterPattern: aws.String("error")}))
	check("quoted term", filter(cwl.FilterLogEventsInput{FilterPattern: aws.String(`"path=/x"`)}), "b:b4 WARN \"quoted\" path=/x")
	check("quoted term with escapes", filter(cwl.FilterLogEventsInput{FilterPattern: aws.String(`"\"quoted\" path"`)}), "b:b4 WARN \"quoted\" path=/x")
	check("stream prefix", filter(cwl.FilterLogEventsInput{LogStreamNamePrefix: aws.String("oth")}), "other:o0 ERROR elsewhere")
	check("empty pattern", filter(cwl.FilterLogEventsInput{FilterPattern: aws.String(""), LogStreamNames: []string{"other"}}), "other:o0 ERROR elsewhere")

	for _, pat := range []string{`{ $.level = "ERROR" }`, `[ip, user]`, `?ERROR ?WARN`, `-INFO`, `%ERR.*%`} {
		_, err := e.cl.FilterLogEvents(ctx, &cwl.FilterLogEventsInput{LogGroupName: aws.String("g"), FilterPattern: aws.String(pat)})
		wantIPE(t, err, "not supported by this emulator")
	}
	_, err := e.cl.FilterLogEvents(ctx, &cwl.FilterLogEventsInput{LogGroupName: aws.String("g"), FilterPattern: aws.String("path=/x")})
	wantIPE(t, err, "Invalid character(s) in term")
	_, err = e.cl.FilterLogEvents(ctx, &cwl.FilterLogEventsInput{LogGroupName: aws.String("g"), LogStreamNames: []string{"a"}, LogStreamNamePrefix: aws.String("a")})
	wantIPE(t, err, "mutually exclusive")
	_, err = e.cl.FilterLogEvents(ctx, &cwl.FilterLogEventsInput{LogGroupName: aws.String("g"), NextToken: aws.String("!!")})
	wantIPE(t, err, "The specified nextToken is invalid.")
	_, err = e.cl.FilterLogEvents(ctx, &cwl.FilterLogEventsInput{LogGroupName: aws.String("g"), Limit: aws.Int32(10_001)})
	wantIPE(t, err, "at 'limit'")
}

func TestDescribeLogGroups(t *testing.T) {
	e := newEnv(t, Options{})
	ctx := context.Background()
	for i := range 7 {
		e.mustGroup(t, fmt.Sprintf("/app/%d", 6-i))
	}
	e.mustGroup(t, "/other")
	e.mustGroup(t, "zzz")
	if _, err := e.cl.CreateLogGroup(ctx, &cwl.CreateLogGroupInput{LogGroupName: aws.String("/app/ia"), LogGroupClass: types.LogGroupClassInfrequentAccess}); err != nil {
		t.Fatal(err)
	}

	var pages [][]string
	var token *string
	for {
		out, err := e.cl.DescribeLogGroups(ctx, &cwl.DescribeLogGroupsInput{LogGroupNamePrefix: aws.String("/app/"), Limit: aws.Int32(3), NextToken: token})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, g := range out.LogGroups {
			names = append(names, aws.ToString(g.LogGroupName))
		}
		pages = append(pages, names)
		if token = out.NextToken; token == nil {
			break
		}
	}
	want := [][]string{{"/app/0", "/app/1", "/app/2"}, {"/app/3", "/app/4", "/app/5"}, {"/app/6", "/app/ia"}}
	if !reflect.DeepEqual(pages, want) {
		t.Errorf("pages = %q, want %q", pages, want)
	}

	p := cwl.NewDescribeLogGroupsPaginator(e.cl, &cwl.DescribeLogGroupsInput{Limit: aws.Int32(4)})
	n := 0
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n += len(page.LogGroups)
	}
	if n != 10 {
		t.Errorf("paginator saw %d groups, want 10", n)
	}

	out, err := e.cl.DescribeLogGroups(ctx, &cwl.DescribeLogGroupsInput{LogGroupClass: types.LogGroupClassInfrequentAccess})
	if err != nil || len(out.LogGroups) != 1 || aws.ToString(out.LogGroups[0].LogGroupName) != "/app/ia" {
		t.Errorf("by class: %v %+v", err, out)
	}
	for _, lim := range []int32{0, 51} {
		_, err := e.cl.DescribeLogGroups(ctx, &cwl.DescribeLogGroupsInput{Limit: aws.Int32(lim)})
		wantIPE(t, err, "at 'limit'")
	}
	_, err = e.cl.DescribeLogGroups(ctx, &cwl.DescribeLogGroupsInput{NextToken: aws.String("bogus")})
	wantIPE(t, err, "The specified nextToken is invalid.")
	_, err = e.cl.DescribeLogGroups(ctx, &cwl.DescribeLogGroupsInput{LogGroupNamePrefix: aws.String("bad prefix")})
	wantIPE(t, err, "logGroupNamePrefix")
}

func TestDescribeLogStreams(t *testing.T) {
	e := newEnv(t, Options{})
	ctx := context.Background()
	e.mustGroup(t, "g")
	for _, s := range []string{"pod-c", "pod-a", "pod-b", "node-1", "empty"} {
		e.mustStream(t, "g", s)
	}
	e.mustPut(t, "g", "pod-a", ev(fixedNow-30, "x"), ev(fixedNow-10, "y"))
	e.mustPut(t, "g", "pod-b", ev(fixedNow-5, "x"))
	e.mustPut(t, "g", "pod-c", ev(fixedNow-20, "x"))
	e.mustPut(t, "g", "node-1", ev(fixedNow-1, "x"))

	list := func(in cwl.DescribeLogStreamsInput) []string {
		t.Helper()
		in.LogGroupName = aws.String("g")
		var names []string
		p := cwl.NewDescribeLogStreamsPaginator(e.cl, &in)
		for p.HasMorePages() {
			page, err := p.NextPage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if in.Limit != nil && len(page.LogStreams) > int(*in.Limit) {
				t.Errorf("page of %d streams, limit %d", len(page.LogStreams), *in.Limit)
			}
			for _, s := range page.LogStreams {
				names = append(names, aws.ToString(s.LogStreamName))
			}
		}
		return names
	}
	check := func(name string, got []string, want ...string) {
		t.Helper()
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: got %q, want %q", name, got, want)
		}
	}
	check("by name", list(cwl.DescribeLogStreamsInput{Limit: aws.Int32(2)}), "empty", "node-1", "pod-a", "pod-b", "pod-c")
	check("by name, descending", list(cwl.DescribeLogStreamsInput{Limit: aws.Int32(2), Descending: aws.Bool(true)}), "pod-c", "pod-b", "pod-a", "node-1", "empty")
	check("prefix", list(cwl.DescribeLogStreamsInput{LogStreamNamePrefix: aws.String("pod-"), Limit: aws.Int32(1)}), "pod-a", "pod-b", "pod-c")
	check("by last event time", list(cwl.DescribeLogStreamsInput{OrderBy: types.OrderByLastEventTime, Limit: aws.Int32(2)}), "empty", "pod-c", "pod-a", "pod-b", "node-1")
	check("by last event time, descending", list(cwl.DescribeLogStreamsInput{OrderBy: types.OrderByLastEventTime, Descending: aws.Bool(true)}), "node-1", "pod-b", "pod-a", "pod-c", "empty")

	_, err := e.cl.DescribeLogStreams(ctx, &cwl.DescribeLogStreamsInput{LogGroupName: aws.String("g"), OrderBy: types.OrderByLastEventTime, LogStreamNamePrefix: aws.String("pod")})
	wantIPE(t, err, "Cannot order by LastEventTime with a logStreamNamePrefix.")
	_, err = e.cl.DescribeLogStreams(ctx, &cwl.DescribeLogStreamsInput{LogGroupName: aws.String("g"), OrderBy: "Size"})
	wantIPE(t, err, "orderBy")
	_, err = e.cl.DescribeLogStreams(ctx, &cwl.DescribeLogStreamsInput{LogGroupName: aws.String("g"), Limit: aws.Int32(51)})
	wantIPE(t, err, "at 'limit'")
	_, err = e.cl.DescribeLogStreams(ctx, &cwl.DescribeLogStreamsInput{LogGroupName: aws.String("g"), LogGroupIdentifier: aws.String("g")})
	wantIPE(t, err, "mutually exclusive")

	out, err := e.cl.DescribeLogStreams(ctx, &cwl.DescribeLogStreamsInput{LogGroupIdentifier: aws.String("arn:aws:logs:us-east-1:123456789012:log-group:g"), LogStreamNamePrefix: aws.String("pod-a")})
	if err != nil || len(out.LogStreams) != 1 {
		t.Fatalf("by ARN: %v %+v", err, out)
	}
	s := out.LogStreams[0]
	if aws.ToInt64(s.FirstEventTimestamp) != fixedNow-30 || aws.ToInt64(s.LastEventTimestamp) != fixedNow-10 ||
		aws.ToInt64(s.LastIngestionTime) != fixedNow || aws.ToInt64(s.CreationTime) != fixedNow ||
		aws.ToString(s.Arn) != "arn:aws:logs:us-east-1:123456789012:log-group:g:log-stream:pod-a" || aws.ToString(s.UploadSequenceToken) == "" {
		t.Errorf("stream = %+v", s)
	}
	out, err = e.cl.DescribeLogStreams(ctx, &cwl.DescribeLogStreamsInput{LogGroupName: aws.String("g"), LogStreamNamePrefix: aws.String("empty")})
	if err != nil || out.LogStreams[0].FirstEventTimestamp != nil || out.LogStreams[0].UploadSequenceToken != nil {
		t.Errorf("empty stream: %v %+v", err, out.LogStreams)
	}
}
