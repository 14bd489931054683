package cloudwatch

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	cwl "github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs/types"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/emulator/cloudwatchlogs"
	"github.com/logfwd/forwarder/internal/mototest"
	"github.com/logfwd/forwarder/internal/nettest"
	"github.com/logfwd/forwarder/internal/syncbuf"
	"github.com/logfwd/forwarder/queue"
	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"), goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"))
}

func staticAWS() *aws.Config {
	return &aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("AKIDTEST", "secret", "")}
}

func baseCfg(endpoint string) config.CloudWatch {
	return config.CloudWatch{
		Endpoint: endpoint, LogGroup: "/eks/${record.kubernetes.namespace_name}", LogStream: "${record.kubernetes.pod_name|unknown}-${hostname}",
		Fallback: "unknown", CreateGroup: true, CreateStream: true, RetentionDays: 30, LogGroupClass: "STANDARD",
		FlushInterval: config.Duration(20 * time.Millisecond), MaxConcurrentStreams: 8, ReadRate: 1000,
		CreateRate: 1000, GroupCreateRate: 1000, // creation at its own pace is create_test.go's
	}
}

type env struct {
	t    testing.TB
	emu  *cloudwatchlogs.Server
	url  string
	w    *wal.WAL
	reg  *prometheus.Registry
	qm   *queue.Metrics
	sink *Sink
	// drainLogs is what the drainers of runUntil log.
	drainLogs syncbuf.Buffer
	// shared is Options.SharedStreams of the sinks restart makes.
	shared bool
}

func newEnv(t testing.TB, mod func(*config.CloudWatch)) *env {
	t.Helper()
	e := &env{t: t, emu: cloudwatchlogs.New(cloudwatchlogs.Options{}), reg: prometheus.NewRegistry()}
	url, err := e.emu.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.url = url
	t.Cleanup(func() { e.emu.Close() })
	if e.w, err = wal.Open(t.TempDir(), wal.Options{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.w.Close() })
	cfg := baseCfg(url)
	if mod != nil {
		mod(&cfg)
	}
	if e.sink, err = New(context.Background(), "cw", cfg, Options{Hostname: "host1", AWS: staticAWS(), Registerer: e.reg}); err != nil {
		t.Fatal(err)
	}
	e.qm = queue.NewMetrics(nil)
	return e
}

// run drains until the cursor reaches the last record, or fails the test.
func (e *env) run(opts queue.Options) *queue.Drainer {
	e.t.Helper()
	opts.Metrics = e.qm
	if opts.RetryMin == 0 {
		opts.RetryMin, opts.RetryMax = 5*time.Millisecond, 50*time.Millisecond
	}
	d := queue.New(e.w, "cw", e.sink, opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	last := e.w.Stats().NextSeq - 1
	deadline := time.Now().Add(30 * time.Second)
	for {
		if pos, _ := e.w.Cursor("cw"); pos >= last {
			break
		}
		if time.Now().After(deadline) {
			pos, _ := e.w.Cursor("cw")
			cancel()
			<-done
			e.t.Fatalf("cursor at %d of %d after 30s; status %+v", pos, last, d.Status())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		e.t.Fatal(err)
	}
	return d
}

func (e *env) append(recs ...wal.Record) {
	e.t.Helper()
	if _, err := e.w.Append(context.Background(), recs, wal.AppendOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func podRecord(ns, pod string, ts time.Time, msg string) wal.Record {
	return wal.Record{Time: ts.UnixNano(), Tag: "pod." + ns,
		Body: []byte(fmt.Sprintf(`{"log":%q,"kubernetes":{"namespace_name":%q,"pod_name":%q}}`, msg, ns, pod))}
}

func TestDeliversToStreamsPerPod(t *testing.T) {
	e := newEnv(t, nil)
	now := time.Now()
	for i := 0; i < 300; i++ {
		ns, pod := fmt.Sprintf("ns%d", i%3), fmt.Sprintf("web-%d", i%5)
		e.append(podRecord(ns, pod, now.Add(time.Duration(i)*time.Millisecond), fmt.Sprint("line ", i)))
	}
	e.append(wal.Record{Time: now.UnixNano(), Tag: "pod.x", Body: []byte(`{"log":"no metadata"}`)})
	e.run(queue.Options{})
	total := 0
	for _, g := range e.emu.Groups() {
		if !strings.HasPrefix(g.Name, "/eks/") || g.RetentionInDays != 30 {
			t.Errorf("group %+v", g)
		}
		for _, s := range g.Streams {
			evs := e.emu.Events(g.Name, s.Name)
			total += len(evs)
			for i := 1; i < len(evs); i++ {
				if evs[i].Timestamp < evs[i-1].Timestamp {
					t.Fatalf("%s/%s out of order", g.Name, s.Name)
				}
			}
		}
	}
	if total != 301 {
		t.Fatalf("%d events stored, want 301", total)
	}
	evs := e.emu.Events("/eks/ns1", "web-1-host1")
	if len(evs) != 20 || !strings.Contains(evs[0].Message, `"log":"line 1"`) {
		t.Fatalf("ns1/web-1: %d events, first %+v", len(evs), evs)
	}
	// A record without the fields goes to the fallback names, counted.
	if evs := e.emu.Events("/eks/unknown", "unknown-host1"); len(evs) != 1 {
		t.Fatalf("fallback stream: %+v", e.emu.Groups())
	}
	if n := testutil.ToFloat64(e.sink.m.fallback); n != 1 {
		t.Fatalf("fallbacks counted %v", n)
	}
}

func TestMessageKeyAndSplit(t *testing.T) {
	e := newEnv(t, func(c *config.CloudWatch) { c.MessageKey = "log"; c.LogGroup = "g"; c.LogStream = "s" })
	now := time.Now()
	big := strings.Repeat("é", 700000) // 1.4 MB of UTF-8: two parts
	e.append(
		podRecord("a", "p", now, "plain message"),
		wal.Record{Time: now.Add(time.Millisecond).UnixNano(), Tag: "t", Body: []byte(`{"log":{"nested":1}}`)},
		wal.Record{Time: now.Add(2 * time.Millisecond).UnixNano(), Tag: "t", Body: []byte(`{"other":1}`)},
		wal.Record{Time: now.Add(3 * time.Millisecond).UnixNano(), Tag: "t", Body: []byte(`{"log":"` + big + `"}`)},
	)
	e.run(queue.Options{})
	evs := e.emu.Events("g", "s")
	if len(evs) != 5 {
		t.Fatalf("%d events, want 5", len(evs))
	}
	if evs[0].Message != "plain message" || evs[1].Message != `{"nested":1}` || evs[2].Message != `{"other":1}` {
		t.Fatalf("messages: %q %q %q", evs[0].Message, evs[1].Message, evs[2].Message)
	}
	if !strings.HasPrefix(evs[3].Message, "[part 1/2] é") || !strings.HasPrefix(evs[4].Message, "[part 2/2] ") {
		t.Fatalf("parts: %.20q %.20q", evs[3].Message, evs[4].Message)
	}
	joined := strings.TrimPrefix(evs[3].Message, "[part 1/2] ") + strings.TrimPrefix(evs[4].Message, "[part 2/2] ")
	if joined != big {
		t.Fatal("the parts do not join back into the message")
	}
}

func TestTooOldAndTooNewAreDeadLettered(t *testing.T) {
	e := newEnv(t, func(c *config.CloudWatch) { c.LogGroup = "g"; c.LogStream = "s"; c.RetentionDays = 1 })
	now := time.Now()
	e.append(
		podRecord("a", "p", now.Add(-15*24*time.Hour), "too old"),
		podRecord("a", "p", now.Add(-3*24*time.Hour), "older than the group's retention"),
		podRecord("a", "p", now, "fine"),
		podRecord("a", "p", now.Add(3*time.Hour), "too new"),
	)
	e.run(queue.Options{})
	if evs := e.emu.Events("g", "s"); len(evs) != 1 || !strings.Contains(evs[0].Message, "fine") {
		t.Fatalf("stored %+v", evs)
	}
	reasons := map[string]string{}
	queue.DeadLetters(e.w, "cw", func(d queue.DeadLetter) error {
		reasons[string(d.Body)] = d.Reason
		return nil
	})
	want := map[string]string{"too old": "too_old", "older than the group's retention": "expired", "too new": "too_new"}
	for msg, reason := range want {
		found := false
		for body, r := range reasons {
			if strings.Contains(body, msg) {
				found = true
				if r != reason {
					t.Errorf("%q dead-lettered as %q, want %q", msg, r, reason)
				}
			}
		}
		if !found {
			t.Errorf("%q not dead-lettered: %v", msg, reasons)
		}
	}
}

// With a service that still checks sequence tokens, one writer per stream
// that echoes the last token never sees InvalidSequenceTokenException.
func TestOnePutInFlightPerStream(t *testing.T) {
	e := newEnv(t, func(c *config.CloudWatch) { c.FlushInterval = config.Duration(time.Millisecond) })
	e.emu.SetLegacySequenceTokens(true)
	e.emu.SetLatency(2 * time.Millisecond)
	now := time.Now()
	for round := 0; round < 20; round++ {
		var recs []wal.Record
		for i := 0; i < 50; i++ {
			recs = append(recs, podRecord("ns", fmt.Sprintf("p%d", i%4), now.Add(time.Duration(round*50+i)*time.Millisecond), "x"))
		}
		e.append(recs...)
	}
	e.run(queue.Options{})
	if n := testutil.ToFloat64(e.sink.m.tokenRetries); n != 0 {
		t.Fatalf("%v InvalidSequenceTokenException: two puts raced on a stream", n)
	}
	n := 0
	for i := 0; i < 4; i++ {
		n += len(e.emu.Events("/eks/ns", fmt.Sprintf("p%d-host1", i)))
	}
	if n != 1000 {
		t.Fatalf("%d events, want 1000", n)
	}
}

// A stale token (another writer used the stream) is followed, counted and
// not an error.
func TestLegacyTokenAdopted(t *testing.T) {
	e := newEnv(t, func(c *config.CloudWatch) { c.LogGroup = "g"; c.LogStream = "s" })
	e.emu.SetLegacySequenceTokens(true)
	e.append(podRecord("a", "p", time.Now(), "one"))
	e.run(queue.Options{})
	e.sink.tokens.put("g\x00s", "stale-token")
	e.append(podRecord("a", "p", time.Now(), "two"))
	e.run(queue.Options{})
	if n := testutil.ToFloat64(e.sink.m.tokenRetries); n != 1 {
		t.Fatalf("token retries %v, want 1", n)
	}
	if evs := e.emu.Events("g", "s"); len(evs) != 2 {
		t.Fatalf("%d events", len(evs))
	}
	if n := testutil.ToFloat64(e.qm.Retries.WithLabelValues("cw", "retryable", "InvalidSequenceTokenException")); n != 0 {
		t.Fatal("a followed token was counted as a failed send")
	}
}

func TestThrottlingSlowsButLosesNothing(t *testing.T) {
	e := newEnv(t, func(c *config.CloudWatch) { c.FlushInterval = config.Duration(time.Millisecond) })
	e.emu.SetThrottle(20) // below what the sends reach even when every call waits for its intent's commit
	now := time.Now()
	var recs []wal.Record
	for i := 0; i < 2000; i++ {
		recs = append(recs, podRecord("ns", fmt.Sprintf("p%d", i%40), now.Add(time.Duration(i)*time.Millisecond), "x"))
	}
	e.append(recs...)
	e.run(queue.Options{})
	n := 0
	for _, g := range e.emu.Groups() {
		for _, s := range g.Streams {
			n += len(e.emu.Events(g.Name, s.Name))
		}
	}
	if n != 2000 {
		t.Fatalf("%d events, want 2000", n)
	}
	if testutil.ToFloat64(e.qm.Retries.WithLabelValues("cw", "throttled", "ThrottlingException")) == 0 {
		t.Fatal("no throttling happened: the test tested nothing")
	}
}

func TestAccessDeniedPausesThenResumes(t *testing.T) {
	e := newEnv(t, func(c *config.CloudWatch) { c.LogGroup = "g"; c.LogStream = "s" })
	e.emu.SetDenyAll("AccessDeniedException")
	e.append(podRecord("a", "p", time.Now(), "held"))
	go func() {
		time.Sleep(300 * time.Millisecond)
		e.emu.SetDenyAll("")
	}()
	d := e.run(queue.Options{PauseRetry: 100 * time.Millisecond})
	if evs := e.emu.Events("g", "s"); len(evs) != 1 {
		t.Fatalf("%d events after access returned", len(evs))
	}
	// What a person reads is the operation, the service's code and its
	// message, not the SDK's wrappers.
	if st := d.Status(); !strings.Contains(st.LastError, ": PutLogEvents: AccessDeniedException: ") ||
		strings.Contains(st.LastError, "operation error") || strings.Contains(st.LastError, "https response error") {
		t.Fatalf("last error %q", st.LastError)
	}
	n := 0
	queue.DeadLetters(e.w, "cw", func(queue.DeadLetter) error { n++; return nil })
	if n != 0 {
		t.Fatal("a record was dead-lettered for an access error")
	}
}

// A response lost after the events were stored ("in doubt") makes the
// drainer resend that batch only.
func TestLostResponsesResendOnlyThatBatch(t *testing.T) {
	e := newEnv(t, func(c *config.CloudWatch) {
		c.LogGroup = "g"
		c.LogStream = "s"
		c.FlushInterval = config.Duration(time.Millisecond)
	})
	e.emu.SetDropResponses(0.3)
	now := time.Now()
	for i := 0; i < 50; i++ {
		e.append(podRecord("a", "p", now.Add(time.Duration(i)*time.Millisecond), fmt.Sprint("m", i)))
	}
	e.run(queue.Options{})
	seen := map[string]int{}
	for _, ev := range e.emu.Events("g", "s") {
		seen[ev.Message]++
	}
	for i := 0; i < 50; i++ {
		if seen[fmt.Sprintf(`{"log":"m%d","kubernetes":{"namespace_name":"a","pod_name":"p"}}`, i)] == 0 {
			t.Fatalf("m%d lost", i)
		}
	}
	// Calls whose answer was lost and that were found landed count as
	// their answers would have.
	if got, stored := testutil.ToFloat64(e.sink.m.events), len(e.emu.Events("g", "s")); int(got) != stored {
		t.Errorf("forwarder_cloudwatch_events_total %v, the stream holds %d events", got, stored)
	}
}

func TestNamesSanitised(t *testing.T) {
	for in, want := range map[string]string{"/eks/a b:c": "/eks/a_b_c", "aws/x": "_aws/x", "": "fb", strings.Repeat("g", 600): strings.Repeat("g", 512)} {
		if got := groupName(in, "fb"); got != want {
			t.Errorf("group %q → %q, want %q", in, got, want)
		}
	}
	for in, want := range map[string]string{"pod:1*2": "pod_1_2", "": "fb", "ok-é": "ok-é"} {
		if got := streamName(in, "fb"); got != want {
			t.Errorf("stream %q → %q, want %q", in, got, want)
		}
	}
}

// A tag or field never adds a segment to a group or stream name, nor makes
// one "", "." or "..": its "/" renders "_". Each such record is counted.
func TestNameValuesSanitised(t *testing.T) {
	e := newEnv(t, nil) // /eks/${record.kubernetes.namespace_name}, ${record.kubernetes.pod_name|unknown}-${hostname}
	for _, c := range []struct{ ns, pod, group, stream string }{
		{"shop/../admin", "web/1", "/eks/shop_.._admin", "web_1-host1"},
		{"..", "web-1", "/eks/__", "web-1-host1"},
		{"shop", "web-1", "/eks/shop", "web-1-host1"},
	} {
		r := podRecord(c.ns, c.pod, time.Now(), "x")
		p := e.sink.Partition(&sinks.Record{Tag: r.Tag, Body: r.Body, Time: r.Time})
		if g, st := splitPartition(p); g != c.group || st != c.stream {
			t.Errorf("namespace %q, pod %q: group %q stream %q, want %q %q", c.ns, c.pod, g, st, c.group, c.stream)
		}
	}
	if n := testutil.ToFloat64(e.sink.m.sanitised); n != 2 {
		t.Errorf("sanitised counted %v, want 2", n)
	}
}

// TestNamesChangedByTheRules: a name a value makes too long keeps the
// template's own text (the host name that keeps replicas apart) and keeps
// values that differ apart; characters the service refuses are replaced.
// Each such record is counted, and one warning a minute says what was
// rendered and what is sent instead; the records are delivered.
func TestNamesChangedByTheRules(t *testing.T) {
	e := newEnv(t, nil) // /eks/${record.kubernetes.namespace_name}, ${record.kubernetes.pod_name|unknown}-${hostname}
	var buf syncbuf.Buffer
	sink, err := New(context.Background(), "cw", baseCfg(e.url), Options{Hostname: "host1", AWS: staticAWS(), Registerer: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	if err != nil {
		t.Fatal(err)
	}
	e.sink = sink
	long := strings.Repeat("p", 600)
	for i, c := range []struct{ ns, pod string }{
		{"shop", long + "-a"}, {"shop", long + "-b"}, {"shop", long + "-a"},
		{"bad name:é", "web-1"}, {"shop", "web-1"},
	} {
		e.append(podRecord(c.ns, c.pod, time.Now(), fmt.Sprint("m", i)))
	}
	e.run(queue.Options{})
	streams := map[string]int{}
	for _, g := range e.emu.Groups() {
		for _, st := range g.Streams {
			streams[g.Name+" "+st.Name] = len(e.emu.Events(g.Name, st.Name))
		}
	}
	long1, long2 := 0, 0
	for k, n := range streams {
		_, st, _ := strings.Cut(k, " ")
		if strings.HasPrefix(st, "ppp") {
			if len(st) > 512 || !strings.HasSuffix(st, "-host1") {
				t.Errorf("stream of %d bytes without the host name at its end: %q", len(st), st)
			}
			if n == 2 {
				long1++
			} else {
				long2++
			}
		}
	}
	if long1 != 1 || long2 != 1 || streams["/eks/bad_name___ web-1-host1"] != 1 || streams["/eks/shop web-1-host1"] != 1 {
		t.Errorf("streams %v: want the two long pods apart (2 and 1 events), the group's bad characters replaced", streams)
	}
	if n := testutil.ToFloat64(e.sink.m.sanitised); n != 4 {
		t.Errorf("changed names counted %v, want 4", n)
	}
	out := buf.String()
	if strings.Count(out, `msg="records render a log stream name that breaks`) != 1 || strings.Count(out, `msg="records render a log group name that breaks`) != 1 ||
		!strings.Contains(out, `template=/eks/${record.kubernetes.namespace_name} tag="pod.bad name:é" rendered="/eks/bad name:é" sent_as=/eks/bad_name___`) {
		t.Errorf("want one warning for each template, naming what was rendered and sent:\n%s", out)
	}
}

func TestMoto(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: moto_server, started for the test; make test runs it")
	}
	url := mototest.Start(t)
	e := newEnv(t, func(c *config.CloudWatch) { c.Endpoint = url; c.LogGroup = "/moto/${tag}"; c.LogStream = "s" })
	now := time.Now()
	for i := 0; i < 100; i++ {
		e.append(podRecord("a", "p", now.Add(time.Duration(i)*time.Millisecond), fmt.Sprint(i)))
	}
	e.append(podRecord("a", "p", now.Add(-20*24*time.Hour), "ancient"))
	e.run(queue.Options{})
	n := 0
	queue.DeadLetters(e.w, "cw", func(queue.DeadLetter) error { n++; return nil })
	if n != 1 {
		t.Fatalf("%d dead letters, want the ancient one", n)
	}
	if testutil.ToFloat64(e.sink.m.events) != 100 {
		t.Fatalf("%v events accepted by moto", testutil.ToFloat64(e.sink.m.events))
	}
}

var _ = os.Getenv

// Without credentials (the SDK's own chain finds none: the missing-IRSA
// case), the sink pauses with a line that says what to fix, instead of
// retrying what looks like a network error; once credentials are there, it
// delivers. The error a person reads is the SDK's cause, not its retry
// wrapper.
func TestNoCredentialsPauses(t *testing.T) {
	for k, v := range map[string]string{"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_SESSION_TOKEN": "", "AWS_PROFILE": "",
		"AWS_CONFIG_FILE": os.DevNull, "AWS_SHARED_CREDENTIALS_FILE": os.DevNull, "AWS_WEB_IDENTITY_TOKEN_FILE": "",
		"AWS_CONTAINER_CREDENTIALS_FULL_URI": "", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "", "AWS_EC2_METADATA_DISABLED": "true"} {
		t.Setenv(k, v)
	}
	e := newEnv(t, func(c *config.CloudWatch) { c.LogGroup = "g"; c.LogStream = "s" })
	cfg := baseCfg(e.url)
	cfg.LogGroup, cfg.LogStream, cfg.Region = "g", "s", "us-east-1"
	sink, err := New(context.Background(), "cw", cfg, Options{Hostname: "host1", Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	e.append(podRecord("a", "p", time.Now(), "held"))
	d := queue.New(e.w, "cw", sink, queue.Options{Metrics: e.qm, PauseRetry: 100 * time.Millisecond, RetryMin: 5 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for d.Status().State != "paused" && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	st := d.Status()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st.State != "paused" || !strings.Contains(st.LastError, "no_credentials (sink_permanent): no AWS credentials: give the service credentials") ||
		strings.Contains(st.LastError, "exceeded maximum number of attempts") || !strings.Contains(st.LastError, "PutLogEvents: get identity: ") {
		t.Fatalf("status without credentials: %+v", st)
	}
	if evs := e.emu.Events("g", "s"); len(evs) != 0 {
		t.Fatalf("%d events delivered without credentials", len(evs))
	}
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDTEST")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret")
	sink, err = New(context.Background(), "cw", cfg, Options{Hostname: "host1", Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	e.sink = sink
	e.run(queue.Options{})
	if evs := e.emu.Events("g", "s"); len(evs) != 1 {
		t.Fatalf("%d events once credentials are given", len(evs))
	}
}

// A field the records lack, without a default, sends them to the fallback
// name: said in a warning naming the template and the field, not only
// counted.
func TestFallbackWarns(t *testing.T) {
	e := newEnv(t, nil)
	var buf syncbuf.Buffer
	cfg := baseCfg(e.url)
	cfg.LogGroup = "/eks/${record.kubernetes.namespace}" // namespace_name is the field
	sink, err := New(context.Background(), "cw", cfg, Options{Hostname: "host1", AWS: staticAWS(), Registerer: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	if err != nil {
		t.Fatal(err)
	}
	e.sink = sink
	for i := range 20 {
		e.append(podRecord("shop", "web-0", time.Now(), fmt.Sprint("line ", i)))
	}
	e.run(queue.Options{})
	if evs := e.emu.Events("/eks/unknown", "web-0-host1"); len(evs) != 20 {
		t.Fatalf("%d events under the fallback group", len(evs))
	}
	if out := buf.String(); strings.Count(out, "level=WARN msg=\"records lack what the log group or stream template names") != 1 ||
		!strings.Contains(out, `sink=cw template=/eks/${record.kubernetes.namespace} missing=${record.kubernetes.namespace} tag=pod.shop`) {
		t.Fatalf("want one warning naming the template and the missing field:\n%s", out)
	}
}

// A PutLogEvents that cannot connect is unreachable (the drainer holds its
// head reader once sends in a row say so); one whose connection is closed
// under it is not: that can be one request's own.
func TestUnreachableClassified(t *testing.T) {
	for _, c := range []struct {
		name        string
		addr        string
		unreachable bool
	}{
		{"refused", nettest.ClosedAddr(t), true},
		{"hung up", nettest.HangUpAddr(t), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			api := cwl.NewFromConfig(*staticAWS(), func(o *cwl.Options) {
				o.BaseEndpoint = aws.String("http://" + c.addr)
				o.RetryMaxAttempts = 1
			})
			_, err := api.PutLogEvents(context.Background(), &cwl.PutLogEventsInput{LogGroupName: aws.String("g"), LogStreamName: aws.String("s"),
				LogEvents: []types.InputLogEvent{{Message: aws.String("m"), Timestamp: aws.Int64(1)}}})
			if err == nil {
				t.Fatal("PutLogEvents succeeded")
			}
			e := sinks.Classify(classify(err, "g", "s"))
			if e.Unreachable() != c.unreachable || e.Class != sinks.Retryable {
				t.Errorf("%v: class %v, unreachable %v, want retryable and %v", e, e.Class, e.Unreachable(), c.unreachable)
			}
		})
	}
}
