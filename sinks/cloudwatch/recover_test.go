package cloudwatch

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	cwl "github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/emulator/cloudwatchlogs"
	"github.com/logfwd/forwarder/internal/mototest"
	"github.com/logfwd/forwarder/internal/syncbuf"
	"github.com/logfwd/forwarder/queue"
	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// What the proxy does with a request.
const (
	pass = ""     // forward it
	fail = "fail" // answer 503 ServiceUnavailableException without forwarding
	hang = "hang" // never forward nor answer: the call did not land
	land = "land" // forward it, then never answer: the call landed, its answer is lost
	page = "page" // answer 502 with a proxy's HTML page, no AWS error
	bad  = "bad"  // refuse it whole (refuseEvent) without forwarding
)

// proxy stands between the sink and a CloudWatch Logs service (the
// emulator, moto): rule says, for the nth request of an operation
// (from 1), what to do with it.
type proxy struct {
	t    testing.TB
	url  string
	rp   *httputil.ReverseProxy
	stop chan struct{}

	mu       sync.Mutex
	n        map[string]int
	rule     func(op string, n int) string
	hung     int
	unmasks  int               // GetLogEvents asking unmask, while mask
	answer   map[string]string // op -> an error code to answer every request of it with
	says     map[string]string // op -> the message of answer
	byStream map[string]string // stream -> what to do with its PutLogEvents, before rule
	// mask, when set, is a group's data protection policy: GetLogEvents
	// answers messages with every "secret" masked, unless the request asks
	// unmask (then refused with the error code denyUnmask, when set: no
	// logs:Unmask, or a group that does not take it).
	mask       bool
	denyUnmask string
	// denied are groups the credentials may not touch: every call naming
	// one is refused with AccessDeniedException, as IAM refuses a policy's
	// resources.
	denied map[string]bool
}

func newProxy(t testing.TB, target string, rule func(op string, n int) string) *proxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{t: t, rp: httputil.NewSingleHostReverseProxy(u), stop: make(chan struct{}), n: map[string]int{}, rule: rule,
		answer: map[string]string{}, says: map[string]string{}, byStream: map[string]string{}}
	p.rp.ErrorLog = log.New(io.Discard, "", 0)
	srv := httptest.NewServer(p)
	t.Cleanup(func() {
		close(p.stop)
		srv.CloseClientConnections()
		srv.Close()
	})
	p.url = srv.URL
	return p
}

func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	op := strings.TrimPrefix(r.Header.Get("X-Amz-Target"), "Logs_20140328.")
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	var in struct {
		LogGroupName  string
		LogStreamName string
		Unmask        bool
	}
	_ = json.Unmarshal(body, &in)
	p.mu.Lock()
	mask, denyUnmask, denied := p.mask, p.denyUnmask, p.denied[in.LogGroupName]
	p.mu.Unlock()
	if denied {
		p.mu.Lock()
		p.n[op]++
		p.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		w.Header().Set("X-Amzn-ErrorType", "AccessDeniedException")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"__type":"AccessDeniedException","message":"User: arn:aws:sts::111122223333:assumed-role/forwarder/i-0 is not authorized to perform: logs:%s on resource: arn:aws:logs:us-east-1:111122223333:log-group:%s:log-stream:%s because no identity-based policy allows the logs:%s action"}`,
			op, in.LogGroupName, in.LogStreamName, op)
		return
	}
	if op == "GetLogEvents" && mask {
		p.mu.Lock()
		p.n[op]++
		p.unmasks += map[bool]int{true: 1}[in.Unmask]
		p.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		if in.Unmask && denyUnmask != "" {
			w.Header().Set("X-Amzn-ErrorType", denyUnmask)
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintf(w, `{"__type":%q,"message":"unmask refused by the test's proxy"}`, denyUnmask)
			return
		}
		rec := httptest.NewRecorder()
		p.rp.ServeHTTP(rec, r)
		out := rec.Body.Bytes()
		if !in.Unmask {
			out = bytes.ReplaceAll(out, []byte("secret"), []byte("******"))
		}
		w.WriteHeader(rec.Code)
		w.Write(out)
		return
	}
	p.mu.Lock()
	p.n[op]++
	what := pass
	if p.rule != nil {
		what = p.rule(op, p.n[op])
	}
	if w, ok := p.byStream[in.LogStreamName]; ok && op == "PutLogEvents" {
		what = w
	}
	code, says := p.answer[op], p.says[op]
	if what == hang || what == land {
		p.hung++
	}
	p.mu.Unlock()
	if code != "" {
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		w.Header().Set("X-Amzn-ErrorType", code)
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"__type":%q,"message":%q}`, code, says)
		return
	}
	switch what {
	case bad:
		refuseEvent(w)
		return
	case page:
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusBadGateway)
		io.WriteString(w, "<html><head><title>502 Bad Gateway</title></head><body><center><h1>502 Bad Gateway</h1></center></body></html>")
		return
	case fail:
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		w.Header().Set("X-Amzn-ErrorType", "ServiceUnavailableException")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"__type":"ServiceUnavailableException","message":"failed by the test's proxy"}`)
		return
	case land:
		p.rp.ServeHTTP(httptest.NewRecorder(), r.Clone(context.WithoutCancel(r.Context())))
		fallthrough
	case hang:
		select {
		case <-r.Context().Done():
		case <-p.stop:
		}
		return
	}
	p.rp.ServeHTTP(w, r)
}

func (p *proxy) count(op string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n[op]
}

func (p *proxy) hanging() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hung
}

// setRule replaces the rule; counts go on.
func (p *proxy) setRule(rule func(op string, n int) string) {
	p.mu.Lock()
	p.rule = rule
	p.mu.Unlock()
}

// landPuts lets every PutLogEvents land and keeps its answer.
func landPuts(op string, n int) string {
	if op == "PutLogEvents" {
		return land
	}
	return pass
}

// setStream says what to do with the PutLogEvents calls to stream.
func (p *proxy) setStream(stream, what string) {
	p.mu.Lock()
	p.byStream[stream] = what
	p.mu.Unlock()
}

// deny makes the credentials refused on group (or allowed again).
func (p *proxy) deny(group string, on bool) {
	p.mu.Lock()
	if p.denied == nil {
		p.denied = map[string]bool{}
	}
	p.denied[group] = on
	p.mu.Unlock()
}

// setMask gives the groups a data protection policy that masks "secret"
// (and, with deny, refuses unmask with that error code).
func (p *proxy) setMask(deny string) {
	p.mu.Lock()
	p.mask, p.denyUnmask = true, deny
	p.mu.Unlock()
}

func (p *proxy) setAnswer(op, code string) {
	p.setAnswerSaying(op, code, "answered by the test's proxy")
}

// setAnswerSaying answers every request of op with the error code and
// message.
func (p *proxy) setAnswerSaying(op, code, msg string) {
	p.mu.Lock()
	p.answer[op] = code
	p.says[op] = msg
	p.mu.Unlock()
}

// restart replaces the sink with a new one of the configuration cfg, as a
// new process would have, logging into the returned buffer.
func (e *env) restart(cfg config.CloudWatch) *syncbuf.Buffer {
	e.t.Helper()
	buf := &syncbuf.Buffer{}
	e.reg = prometheus.NewRegistry()
	sink, err := New(context.Background(), "cw", cfg, Options{Hostname: "host1", AWS: staticAWS(), Registerer: e.reg,
		Logger: slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})), SharedStreams: e.shared})
	if err != nil {
		e.t.Fatal(err)
	}
	e.sink = sink
	e.qm = queue.NewMetrics(nil)
	return buf
}

// rerun starts the sink again with cfg, as the next process would, and
// drains until the cursor reaches the last record; it returns the logs.
func (e *env) rerun(cfg config.CloudWatch) *syncbuf.Buffer {
	e.t.Helper()
	logs := e.restart(cfg)
	e.run(queue.Options{Fingerprint: e.sink.Fingerprint()})
	return logs
}

// putRule is a proxy rule that answers the nth PutLogEvents with answer
// and passes every other request.
func putRule(nth int, answer string) func(op string, n int) string {
	return func(op string, n int) string {
		if op == "PutLogEvents" && n == nth {
			return answer
		}
		return pass
	}
}

// runUntilHung drains until the proxy holds hung requests, then stops the
// drainer, which cancels them: what a crash during those calls leaves,
// intents committed and no answer.
func (e *env) runUntilHung(p *proxy, hung int) {
	e.t.Helper()
	d := queue.New(e.w, "cw", e.sink, queue.Options{Metrics: e.qm, RetryMin: 5 * time.Millisecond, RetryMax: 50 * time.Millisecond,
		ShutdownTimeout: 10 * time.Millisecond, Fingerprint: e.sink.Fingerprint()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	if !waitUntil(10*time.Second, func() bool { return p.hanging() >= hung }) {
		cancel()
		<-done
		e.t.Fatalf("the proxy holds %d requests, want %d; status %+v", p.hanging(), hung, d.Status())
	}
	cancel()
	if err := <-done; err != nil {
		e.t.Fatal(err)
	}
	p.setRule(nil) // the next process gets answers
}

func waitUntil(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
	return true
}

// copies counts the stored events of group/stream by message.
func (e *env) copies(group, stream string) map[string]int {
	out := map[string]int{}
	for _, ev := range e.emu.Events(group, stream) {
		out[ev.Message]++
	}
	return out
}

func (e *env) indoubt(result string) float64 {
	return testutil.ToFloat64(e.sink.m.indoubt.WithLabelValues(result))
}

func (e *env) intentsLeft() int {
	n := 0
	e.w.ScanState("cw", []byte("s/"+intentPrefix), func(k, v []byte) error { n++; return nil })
	return n
}

// prime delivers a first record to each of the streams (g/s when none is
// named, else tags whose ${tag} streams are these), so that they exist.
func (e *env) prime(streams ...string) {
	e.t.Helper()
	if len(streams) == 0 {
		e.appendLines(1, time.Now().Add(-time.Second), "first")
	}
	for _, tag := range streams {
		e.append(wal.Record{Time: time.Now().Add(-time.Second).UnixNano(), Tag: tag, Body: []byte(`{"log":"first"}`)})
	}
	e.run(queue.Options{Fingerprint: e.sink.Fingerprint()})
}

func streamCfg(url string) config.CloudWatch {
	cfg := baseCfg(url)
	cfg.LogGroup, cfg.LogStream = "g", "s"
	cfg.FlushInterval = config.Duration(time.Millisecond)
	return cfg
}

// setup is how most tests here start: an emulator, a proxy in front of it
// (or of target), and a sink of streamCfg(the proxy) started as a first
// process would be.
type setup struct {
	now    func() time.Time              // the emulator's clock; nil: the real one
	target string                        // the service behind the proxy; "": the emulator
	rule   func(op string, n int) string // the proxy's rule
	mod    func(*config.CloudWatch)      // changes to streamCfg
}

// newProxied starts what su describes and returns the environment, the
// proxy and the sink's configuration (for the restarts that follow).
func newProxied(t *testing.T, su setup) (*env, *proxy, config.CloudWatch) {
	t.Helper()
	e := newEnv(t, nil)
	if su.now != nil {
		e.emu = cloudwatchlogs.New(cloudwatchlogs.Options{Now: su.now})
		url, err := e.emu.Start("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		e.url = url
		t.Cleanup(func() { e.emu.Close() })
	}
	if su.target == "" {
		su.target = e.url
	}
	p := newProxy(t, su.target, su.rule)
	cfg := streamCfg(p.url)
	if su.mod != nil {
		su.mod(&cfg)
	}
	e.restart(cfg)
	return e, p, cfg
}

// appendLines appends n records of stream g/s, a millisecond apart, with
// messages prefix0 .. prefixN-1.
func (e *env) appendLines(n int, at time.Time, prefix string) {
	e.t.Helper()
	var recs []wal.Record
	for i := range n {
		recs = append(recs, wal.Record{Time: at.Add(time.Duration(i) * time.Millisecond).UnixNano(), Tag: "t",
			Body: fmt.Appendf(nil, `{"log":"%s%d"}`, prefix, i)})
	}
	e.append(recs...)
}

// expectOnce fails unless g/s holds each of the n lines exactly once and
// nothing else.
func (e *env) expectOnce(n int, prefix string) {
	e.t.Helper()
	got := e.copies("g", "s")
	dups := 0
	for i := range n {
		msg := fmt.Sprintf(`{"log":"%s%d"}`, prefix, i)
		switch c := got[msg]; {
		case c == 0:
			e.t.Errorf("%s lost", msg)
		case c > 1:
			dups += c - 1
		}
		delete(got, msg)
	}
	delete(got, `{"log":"first0"}`) // prime's
	if dups > 0 || len(got) > 0 {
		e.t.Errorf("%d duplicate events, %d unknown ones", dups, len(got))
	}
}

// A call that landed, and whose answer a crash lost, is found in the
// stream at the next start and not sent again: its records are skipped.
func TestRecoverCallThatLanded(t *testing.T) {
	e, p, cfg := newProxied(t, setup{})
	e.prime()
	p.setRule(landPuts)
	e.appendLines(50, time.Now(), "m")
	e.runUntilHung(p, 1)
	if n := e.intentsLeft(); n != 1 {
		t.Fatalf("%d intents after the interrupted call, want 1", n)
	}
	logs := e.rerun(cfg)
	e.expectOnce(50, "m")
	if e.indoubt(resultDelivered) != 1 || p.count("PutLogEvents") != 3 {
		t.Errorf("in doubt: delivered %v, PutLogEvents calls %d; want 1 and 3 (the first record's two, the one in doubt)\n%s", e.indoubt(resultDelivered), p.count("PutLogEvents"), logs)
	}
	if n := testutil.ToFloat64(e.qm.Skipped.WithLabelValues("cw")); n != 50 {
		t.Errorf("%v records skipped as delivered, want 50", n)
	}
	if n := e.intentsLeft(); n != 0 {
		t.Errorf("%d intents left", n)
	}
	if !strings.Contains(logs.String(), `msg="resolved PutLogEvents calls an earlier run left in doubt (a crash, or a stop that cut them short), by reading their streams back" sink=cw calls=1 delivered=1 resent=0 partial=0 unresolved=0 events_sent_again=0`) {
		t.Errorf("no summary line:\n%s", logs)
	}
}

// A call that never reached the service is sent again: nothing lost.
func TestRecoverCallThatDidNotLand(t *testing.T) {
	e, p, cfg := newProxied(t, setup{rule: putRule(1, hang)})
	e.appendLines(30, time.Now(), "m")
	e.runUntilHung(p, 1)
	e.rerun(cfg)
	e.expectOnce(30, "m")
	if e.indoubt(resultResent) != 1 {
		t.Errorf("in doubt: resent %v, want 1", e.indoubt(resultResent))
	}
	if n := e.intentsLeft(); n != 0 {
		t.Errorf("%d intents left", n)
	}
}

// partialCallInDoubt leaves a call in doubt that landed in part: of its 10
// events, the 3 oldest are older than the group's retention of a day by the
// service's clock, two minutes ahead of the sink's (by the sink's they are
// within a day: one batch with the others), and refused; its answer is lost.
func partialCallInDoubt(t *testing.T) (*env, *proxy, config.CloudWatch) {
	t.Helper()
	e, p, cfg := newProxied(t, setup{now: func() time.Time { return time.Now().Add(2 * time.Minute) }, mod: func(c *config.CloudWatch) {
		c.RetentionDays = 1
	}})
	e.prime()
	p.setRule(landPuts)
	now := time.Now()
	e.appendLines(3, now.Add(-24*time.Hour+time.Minute), "old")
	e.appendLines(7, now, "m")
	e.runUntilHung(p, 1)
	if got := len(e.emu.Events("g", "s")); got != 1+7 {
		t.Fatalf("%d events stored, want the first and the 7 the service's clock allows", got)
	}
	return e, p, cfg
}

// Events the service refused in a call whose answer was lost (older than
// the group's retention of a day by its clock, two minutes ahead of the
// sink's) are not found; only they are sent again, and dead-lettered when
// refused again. The others are not duplicated.
func TestRecoverPartialCall(t *testing.T) {
	e, _, cfg := partialCallInDoubt(t)
	e.emu.SetSparsePages(2) // what is not found is looked for to the end, past empty pages
	e.rerun(cfg)
	e.expectOnce(7, "m")
	if e.indoubt(resultPartial) != 1 {
		t.Errorf("in doubt: partial %v, want 1", e.indoubt(resultPartial))
	}
	dead := map[string]string{}
	queue.DeadLetters(e.w, "cw", func(d queue.DeadLetter) error { dead[string(d.Body)] = d.Reason; return nil })
	want := map[string]string{`{"log":"old0"}`: "expired", `{"log":"old1"}`: "expired", `{"log":"old2"}`: "expired"}
	if !reflect.DeepEqual(dead, want) {
		t.Errorf("dead letters %v, want %v", dead, want)
	}
	if n := e.intentsLeft(); n != 0 {
		t.Errorf("%d intents left", n)
	}
}

// The call that sends again what a partial call in doubt did not land
// begins at that call's first event (the service refuses the oldest ones):
// its intent is another (intent.Attempt), so the delivered one, which says
// which events landed, is not replaced. When that call fails once and is
// retried, the retry sends only the events that had not landed.
func TestRecoverPartialCallResendFailsOnce(t *testing.T) {
	e, p, cfg := partialCallInDoubt(t)
	puts := p.count("PutLogEvents")
	p.setRule(func(op string, n int) string {
		if op == "PutLogEvents" && n == puts+1 {
			return fail // 503, retried
		}
		return pass
	})
	e.rerun(cfg)
	if e.indoubt(resultPartial) != 1 {
		t.Fatalf("partial %v, want 1", e.indoubt(resultPartial))
	}
	e.expectOnce(7, "m")
	if n := e.intentsLeft(); n != 0 {
		t.Errorf("%d intents left", n)
	}
}

// The same with a crash during that call: the next start finds both
// intents, reads the stream for the second's events only, and sends again
// nothing that landed.
func TestRecoverPartialCallResendCrashes(t *testing.T) {
	e, p, cfg := partialCallInDoubt(t)
	p.setRule(func(op string, n int) string {
		if op == "PutLogEvents" {
			return hang
		}
		return pass
	})
	e.restart(cfg)
	e.runUntilHung(p, 2)
	if e.indoubt(resultPartial) != 1 {
		t.Fatalf("partial %v, want 1", e.indoubt(resultPartial))
	}
	if n := e.intentsLeft(); n != 2 {
		t.Fatalf("%d intents after the second crash, want the delivered call's and its resend's", n)
	}
	e.rerun(cfg)
	e.expectOnce(7, "m")
	if n := e.intentsLeft(); n != 0 {
		t.Errorf("%d intents left", n)
	}
}

// The read back pages until the forward token comes back unchanged: pages
// may be empty while events remain.
func TestRecoverReadsEveryPage(t *testing.T) {
	e, p, cfg := newProxied(t, setup{})
	e.prime()
	p.setRule(landPuts)
	e.appendLines(40, time.Now(), "m")
	e.runUntilHung(p, 1)
	e.emu.SetSparsePages(3)
	e.rerun(cfg)
	e.expectOnce(40, "m")
	if e.indoubt(resultDelivered) != 1 {
		t.Errorf("in doubt: delivered %v, want 1", e.indoubt(resultDelivered))
	}
	if n := p.count("GetLogEvents"); n < 27 {
		t.Errorf("%d GetLogEvents calls, want at least 27 (40 events 3 a page, an empty page before each)", n)
	}
}

// Events not yet readable when the stream is read (the service's delay
// longer than settle) make a call that landed look lost: it is sent
// again, a duplicate that is counted, never a loss.
func TestRecoverReadDelayPastSettle(t *testing.T) {
	e, p, cfg := newProxied(t, setup{mod: func(c *config.CloudWatch) {
		c.Settle = config.Duration(50 * time.Millisecond)
	}})
	e.prime()
	p.setRule(landPuts)
	e.emu.SetReadDelay(time.Hour)
	e.appendLines(20, time.Now(), "m")
	e.runUntilHung(p, 1)
	e.rerun(cfg)
	got := e.copies("g", "s")
	for i := range 20 {
		if n := got[fmt.Sprintf(`{"log":"m%d"}`, i)]; n != 2 {
			t.Errorf("m%d stored %d times, want twice (landed, not seen, sent again)", i, n)
		}
	}
	if e.indoubt(resultResent) != 1 {
		t.Errorf("in doubt: resent %v, want 1", e.indoubt(resultResent))
	}
}

// The stream is read once the call is settle old, not before: events that
// become readable within settle are found.
func TestRecoverWaitsSettle(t *testing.T) {
	e, p, cfg := newProxied(t, setup{mod: func(c *config.CloudWatch) {
		c.Settle = config.Duration(time.Second)
	}})
	e.prime()
	p.setRule(landPuts)
	e.emu.SetReadDelay(600 * time.Millisecond)
	e.appendLines(20, time.Now(), "m")
	e.runUntilHung(p, 1)
	called := time.Now()
	e.rerun(cfg)
	if d := time.Since(called); d < 900*time.Millisecond {
		t.Errorf("resolved %v after the call, before settle (1s)", d)
	}
	e.emu.SetReadDelay(0)
	e.expectOnce(20, "m")
	if e.indoubt(resultDelivered) != 1 {
		t.Errorf("in doubt: delivered %v, want 1", e.indoubt(resultDelivered))
	}
}

// threeCallsInDoubt leaves three calls in doubt, one per stream s0, s1 and
// s2 (log_stream "${tag}"), each of one event {"log":"x"} that landed and
// whose answer a crash lost.
func threeCallsInDoubt(t *testing.T) (*env, *proxy, config.CloudWatch) {
	t.Helper()
	e, p, cfg := newProxied(t, setup{mod: func(c *config.CloudWatch) {
		c.LogStream = "${tag}"
	}})
	e.prime("s0", "s1", "s2")
	p.setRule(landPuts)
	now := time.Now()
	for i := range 3 {
		e.append(wal.Record{Time: now.UnixNano(), Tag: fmt.Sprint("s", i), Body: []byte(`{"log":"x"}`)})
	}
	e.runUntilHung(p, 3)
	return e, p, cfg
}

// GetLogEvents refused: one warning naming the permission, and the calls
// in doubt are sent again (at least once, as without reads).
func TestRecoverAccessDeniedSendsAgain(t *testing.T) {
	e, p, cfg := threeCallsInDoubt(t)
	p.setAnswer("GetLogEvents", "AccessDeniedException")
	logs := e.rerun(cfg)
	for i := range 3 {
		if got := e.copiesOf(fmt.Sprint("s", i)); got[`{"log":"x"}`] != 2 {
			t.Errorf("stream s%d: %v, want x twice (landed, then sent again without knowing)", i, got)
		}
	}
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 || !strings.Contains(logs.String(), "grant logs:GetLogEvents") {
		t.Errorf("%d warnings, want one naming logs:GetLogEvents:\n%s", n, logs)
	}
	if strings.Contains(logs.String(), "logs:Unmask is not granted") {
		t.Errorf("the refusal of GetLogEvents itself said to be for want of logs:Unmask:\n%s", logs)
	}
	// Streams are resolved a few at once: those already reading when the
	// first was refused are refused too; none reads after.
	// Each is refused unmasked (logs:Unmask), then as stored.
	if e.indoubt(resultUnresolved) != 3 || p.count("GetLogEvents") > 6 {
		t.Errorf("unresolved %v, GetLogEvents calls %d; want 3 and at most 6", e.indoubt(resultUnresolved), p.count("GetLogEvents"))
	}
}

// Calls in doubt that a changed message_key keeps from being rebuilt are
// sent again (at least once) with one warning for the first, not one per
// call, and their count in the summary line, a warning then.
func TestRecoverUnbuiltCallsWarnOnce(t *testing.T) {
	e, _, cfg := threeCallsInDoubt(t)
	cfg.MessageKey = "log"
	logs := e.rerun(cfg)
	for i := range 3 {
		if got := e.copiesOf(fmt.Sprint("s", i)); got[`{"log":"x"}`] != 1 || got["x"] != 1 {
			t.Errorf("stream s%d: %v, want the call that landed and x sent again", i, got)
		}
	}
	if n := strings.Count(logs.String(), "cannot be rebuilt from the WAL"); n != 1 {
		t.Errorf("%d warnings of a call that cannot be rebuilt, want 1:\n%s", n, logs)
	}
	if !strings.Contains(logs.String(), `level=WARN msg="resolved PutLogEvents calls an earlier run left in doubt (a crash, or a stop that cut them short), by reading their streams back" sink=cw calls=3 delivered=0 resent=0 partial=0 unresolved=3 events_sent_again=3 took=`) ||
		!strings.Contains(logs.String(), " cannot_rebuild=3\n") {
		t.Errorf("no summary warning counting 3 calls that cannot be rebuilt:\n%s", logs)
	}
}

// TestRecoverMaskedEvents: in a log group with a data protection policy,
// the events of a call in doubt are read back unmasked, found, and not sent
// again. Without logs:Unmask the read is made again as stored: the masked
// events are not found and are sent again (said once, at info), the others
// are found.
func TestRecoverMaskedEvents(t *testing.T) {
	for _, deny := range []string{"", "AccessDeniedException", "InvalidParameterException"} {
		t.Run("unmask refused "+deny, func(t *testing.T) {
			e, p, cfg := newProxied(t, setup{mod: func(c *config.CloudWatch) { c.LogStream = "${tag}" }})
			e.prime("masked", "plain")
			p.setRule(landPuts)
			now := time.Now()
			e.append(wal.Record{Time: now.UnixNano(), Tag: "masked", Body: []byte(`{"log":"the secret is 42"}`)},
				wal.Record{Time: now.UnixNano(), Tag: "plain", Body: []byte(`{"log":"nothing to hide"}`)})
			e.runUntilHung(p, 2)
			p.setMask(deny)
			logs := e.rerun(cfg)
			masked, plain := 1, 1
			if deny != "" {
				masked = 2 // landed, then sent again: not recognised
			}
			if got := e.copiesOf("masked"); got[`{"log":"the secret is 42"}`] != masked {
				t.Errorf("stream masked: %v, want the event %d times\n%s", got, masked, logs)
			}
			if got := e.copiesOf("plain"); got[`{"log":"nothing to hide"}`] != plain {
				t.Errorf("stream plain: %v, want the event once\n%s", got, logs)
			}
			said := strings.Contains(logs.String(), "grant logs:Unmask")
			if said != (deny != "") || strings.Count(logs.String(), "grant logs:Unmask") > 1 {
				t.Errorf("logs:Unmask said %v times, want %v:\n%s", strings.Count(logs.String(), "grant logs:Unmask"), deny, logs)
			}
			p.mu.Lock()
			unmasks := p.unmasks
			p.mu.Unlock()
			if unmasks == 0 {
				t.Error("no read asked unmask")
			}
		})
	}
}

// ThrottlingException on a read waits and reads again; throttled three
// times in a row, Recover returns it, so that the drainer counts it, says
// it and retries, rather than the sink waiting without a sign.
func TestRecoverThrottledRead(t *testing.T) {
	e, p, cfg := newProxied(t, setup{})
	e.prime()
	p.setRule(landPuts)
	e.appendLines(10, time.Now(), "m")
	e.runUntilHung(p, 1)
	p.setAnswer("GetLogEvents", "ThrottlingException")
	e.restart(cfg) // before the watch: it reads e.qm
	counted := make(chan bool, 1)
	go func() {
		counted <- waitUntil(20*time.Second, func() bool {
			return testutil.ToFloat64(e.qm.Retries.WithLabelValues("cw", "throttled", "ThrottlingException")) >= 1
		})
		p.setAnswer("GetLogEvents", "")
	}()
	e.run(queue.Options{Fingerprint: e.sink.Fingerprint(), Logger: slog.New(slog.NewTextHandler(&e.drainLogs, nil))})
	if !<-counted {
		t.Error("reads throttled for good were not counted in forwarder_sink_retries_total")
	}
	e.expectOnce(10, "m")
	if e.indoubt(resultDelivered) != 1 || p.count("GetLogEvents") < 4 {
		t.Errorf("delivered %v after %d reads, want 1 after at least 4", e.indoubt(resultDelivered), p.count("GetLogEvents"))
	}
	if !strings.Contains(e.drainLogs.String(), "finishing interrupted work failed; retrying") {
		t.Errorf("no warning of the throttled reads:\n%s", e.drainLogs.String())
	}
}

// Reads keep read_rate: ten calls in doubt in ten streams, 5 reads a
// second, take at least 1.8 s.
func TestRecoverKeepsReadRate(t *testing.T) {
	e, p, cfg := newProxied(t, setup{mod: func(c *config.CloudWatch) {
		c.LogStream = "${tag}"
		c.ReadRate = 5
		c.MaxConcurrentStreams = 10
	}})
	var tags []string
	for i := range 10 {
		tags = append(tags, fmt.Sprint("s", i))
	}
	e.prime(tags...)
	p.setRule(landPuts)
	now := time.Now()
	for i := range 10 {
		e.append(wal.Record{Time: now.UnixNano(), Tag: fmt.Sprint("s", i), Body: []byte(`{"log":"second"}`)})
	}
	e.runUntilHung(p, 10)
	e.restart(cfg)
	start := time.Now()
	e.run(queue.Options{Fingerprint: e.sink.Fingerprint()})
	if d := time.Since(start); d < 1800*time.Millisecond {
		t.Errorf("10 reads at 5 a second took %v", d)
	}
	if e.indoubt(resultDelivered) != 10 {
		t.Errorf("delivered %v, want 10", e.indoubt(resultDelivered))
	}
	for i := range 10 {
		if got := e.copiesOf(fmt.Sprint("s", i)); got[`{"log":"second"}`] != 1 {
			t.Errorf("stream s%d: %v", i, got)
		}
	}
}

func (e *env) copiesOf(stream string) map[string]int { return e.copies("g", stream) }

// bigRecord is one record whose message is split into parts: three calls.
func bigRecord(at time.Time) (wal.Record, []string) {
	msg := strings.Repeat("abcdefghij", 250000) // 2.5 MB: three parts
	var parts []string
	for _, p := range split([]byte(msg)) {
		parts = append(parts, string(p))
	}
	return wal.Record{Time: at.UnixNano(), Tag: "t", Body: []byte(msg)}, parts
}

// A batch of several calls whose second call fails sends again the calls
// that did not land, not the first.
func TestSeveralCallsFailureResendsOnlyTheRest(t *testing.T) {
	e, p, _ := newProxied(t, setup{rule: putRule(3, fail)}) // 1: no group yet; 2: part 1; 3: part 2
	rec, parts := bigRecord(time.Now())
	if len(parts) != 3 {
		t.Fatalf("%d parts", len(parts))
	}
	e.append(rec)
	e.run(queue.Options{Fingerprint: e.sink.Fingerprint()})
	got := e.copies("g", "s")
	for i, part := range parts {
		if got[part] != 1 {
			t.Errorf("part %d stored %d times, want once", i+1, got[part])
		}
	}
	if n := p.count("PutLogEvents"); n != 5 {
		t.Errorf("%d PutLogEvents calls, want 5 (the creation's, parts 1 and 2, parts 2 and 3)", n)
	}
	if n := e.intentsLeft(); n != 0 {
		t.Errorf("%d intents left", n)
	}
}

// A crash after a batch's first call was delivered, during its second,
// sends neither the first again nor loses the rest.
func TestSeveralCallsCrashResendsOnlyTheRest(t *testing.T) {
	e, p, cfg := newProxied(t, setup{rule: putRule(3, hang)})
	rec, parts := bigRecord(time.Now())
	e.append(rec)
	e.runUntilHung(p, 1)
	if n := e.intentsLeft(); n != 2 {
		t.Fatalf("%d intents, want 2 (part 1 delivered, part 2 in doubt)", n)
	}
	e.rerun(cfg)
	got := e.copies("g", "s")
	for i, part := range parts {
		if got[part] != 1 {
			t.Errorf("part %d stored %d times, want once", i+1, got[part])
		}
	}
	if e.indoubt(resultResent) != 1 {
		t.Errorf("in doubt: resent %v, want 1 (part 2)", e.indoubt(resultResent))
	}
	if n := e.intentsLeft(); n != 0 {
		t.Errorf("%d intents left", n)
	}
}

func TestUnmatched(t *testing.T) {
	ev := func(ts int64, msg string, seq uint64) event { return event{ts: ts, msg: []byte(msg), seq: seq} }
	call := []event{ev(1, "a", 1), ev(1, "a", 2), ev(2, "b", 3), ev(3, "c", 4)}
	for _, c := range []struct {
		name    string
		found   map[eventKey]int
		missing [][2]uint64
	}{
		{"all", map[eventKey]int{{1, "a"}: 2, {2, "b"}: 1, {3, "c"}: 1}, nil},
		{"none", map[eventKey]int{}, [][2]uint64{{1, 0}, {2, 0}, {3, 0}, {4, 0}}},
		{"one of two identical events", map[eventKey]int{{1, "a"}: 1, {2, "b"}: 1, {3, "c"}: 1}, [][2]uint64{{2, 0}}},
		{"partial", map[eventKey]int{{2, "b"}: 1}, [][2]uint64{{1, 0}, {2, 0}, {4, 0}}},
		{"more copies than the call holds (another writer)", map[eventKey]int{{1, "a"}: 5, {2, "b"}: 2, {3, "c"}: 1}, nil},
		{"same message, another time", map[eventKey]int{{1, "a"}: 2, {2, "b"}: 1, {4, "c"}: 1}, [][2]uint64{{4, 0}}},
	} {
		if got := unmatched(call, c.found); !reflect.DeepEqual(got, c.missing) {
			t.Errorf("%s: missing %v, want %v", c.name, got, c.missing)
		}
	}
}

// Each event of a batch is covered by the intent of exactly the call it
// is cut into, whatever the order of times and records and however
// messages are split.
func TestIntentsCoverTheirCallsEvents(t *testing.T) {
	s := &Sink{}
	now := time.Now()
	big := strings.Repeat("x", 2_500_000)
	var recs []sinks.Record
	for i, c := range []struct {
		dt  time.Duration
		msg string
	}{{5, "a"}, {1, big}, {1, "b"}, {0, "c"}, {9, big}, {5, "d"}, {1, "e"}} {
		recs = append(recs, sinks.Record{Seq: uint64(10 + i), Time: now.Add(c.dt * time.Millisecond).UnixNano(), Body: []byte(c.msg)})
	}
	evs, _ := s.events(recs, now, nil)
	cs := calls(evs)
	if len(cs) < 5 {
		t.Fatalf("%d calls, want the parts of two big messages apart", len(cs))
	}
	var ins []*intent
	for _, call := range cs {
		ins = append(ins, newIntent("g\x00s", 10, call, newPutBody("g", "s", "", call), 0))
	}
	// A body built with a token: the intent keeps it, to build the body again.
	withTok := newIntent("g\x00s", 10, cs[0], newPutBody("g", "s", "tok-1", cs[0]), 0)
	if !withTok.matches(cs[0]) || withTok.Token != "tok-1" {
		t.Errorf("an intent with a token does not match its call")
	}
	if withTok.Token = "tok-2"; withTok.matches(cs[0]) {
		t.Errorf("an intent matches its call with another token")
	}
	for ci, call := range cs {
		for ii, in := range ins {
			if in.matches(call) != (ii == ci) {
				t.Errorf("call %d matches intent %d: %v", ci, ii, in.matches(call))
			}
			// An upgrade's intents: version 1, digestEvents.
			old := *in
			old.Version, old.SHA256 = 1, digestEvents(cs[ii])
			if old.matches(call) != (ii == ci) {
				t.Errorf("call %d matches version 1 intent %d: %v", ci, ii, old.matches(call))
			}
		}
	}
	for ci, call := range cs {
		for _, e := range call {
			for ii, in := range ins {
				if in.covers(&e) != (ii == ci) {
					t.Errorf("event of record %d part %d (call %d): covered by intent %d is %v", e.seq, e.part, ci, ii, in.covers(&e))
				}
			}
		}
		if rebuilt := s.allEvents(recs); len(rebuilt) != len(evs) {
			t.Fatalf("rebuilt %d events of %d", len(rebuilt), len(evs))
		}
	}
}

// After the stream template changed, intents of the old streams are
// forgotten at start (their records go to the new stream), not kept for
// ever: the call in doubt is resolved under its old name (not found: sent
// again), the delivered call of its batch forgotten, and the batch sent
// whole to the new stream.
func TestRecoverForgetsIntentsOfRenamedStreams(t *testing.T) {
	e, p, cfg := newProxied(t, setup{rule: putRule(3, hang)})
	rec, parts := bigRecord(time.Now())
	e.append(rec)
	e.runUntilHung(p, 1)
	if n := e.intentsLeft(); n != 2 {
		t.Fatalf("%d intents, want 2", n)
	}
	cfg.LogStream = "renamed"
	e.rerun(cfg)
	got := e.copies("g", "renamed")
	for i, part := range parts {
		if got[part] != 1 {
			t.Errorf("part %d stored %d times in the renamed stream, want once", i+1, got[part])
		}
	}
	if n := e.intentsLeft(); n != 0 {
		t.Errorf("%d intents left", n)
	}
	if e.indoubt(resultResent) != 1 || e.indoubt(resultUnresolved) != 0 {
		t.Errorf("resent %v and unresolved %v, want 1 and 0", e.indoubt(resultResent), e.indoubt(resultUnresolved))
	}
}

// serviceEvents reads group/stream from a service through the SDK, from
// the head until the forward token comes back unchanged, and counts the
// messages.
func serviceEvents(t *testing.T, url, group, stream string) map[string]int {
	t.Helper()
	cl := cwl.New(cwl.Options{Region: "us-east-1", BaseEndpoint: aws.String(url), Credentials: staticAWS().Credentials})
	in := &cwl.GetLogEventsInput{LogGroupName: aws.String(group), LogStreamName: aws.String(stream), StartFromHead: aws.Bool(true)}
	out := map[string]int{}
	for range 1000 {
		page, err := cl.GetLogEvents(context.Background(), in)
		if err != nil {
			t.Fatalf("GetLogEvents %s %s: %v", group, stream, err)
		}
		for _, e := range page.Events {
			out[aws.ToString(e.Message)]++
		}
		if in.NextToken != nil && aws.ToString(page.NextForwardToken) == *in.NextToken {
			return out
		}
		in.NextToken = page.NextForwardToken
	}
	t.Fatal("the forward token never came back unchanged")
	return nil
}

// Against moto_server: a call that landed is found with moto's
// GetLogEvents and not sent again; one that did not land is sent again.
func TestRecoverMoto(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: moto_server, started for the test; make test runs it")
	}
	motoURL := mototest.Start(t)
	e, p, cfg := newProxied(t, setup{target: motoURL, mod: func(c *config.CloudWatch) {
		c.LogStream = "${tag}"
	}})
	e.prime("landed", "lost")
	p.setStream("landed", land)
	p.setStream("lost", hang)
	now := time.Now()
	for i := range 30 {
		e.append(wal.Record{Time: now.Add(time.Duration(i) * time.Millisecond).UnixNano(), Tag: "landed", Body: fmt.Appendf(nil, `{"log":"m%d"}`, i)})
	}
	for i := range 20 {
		e.append(wal.Record{Time: now.Add(time.Duration(i) * time.Millisecond).UnixNano(), Tag: "lost", Body: fmt.Appendf(nil, `{"log":"n%d"}`, i)})
	}
	e.runUntilHung(p, 2)
	p.setStream("landed", pass)
	p.setStream("lost", pass)
	e.rerun(cfg)
	landed, lost := serviceEvents(t, motoURL, "g", "landed"), serviceEvents(t, motoURL, "g", "lost")
	for i := range 30 {
		if n := landed[fmt.Sprintf(`{"log":"m%d"}`, i)]; n != 1 {
			t.Errorf("m%d stored %d times in moto, want once", i, n)
		}
	}
	for i := range 20 {
		if n := lost[fmt.Sprintf(`{"log":"n%d"}`, i)]; n != 1 {
			t.Errorf("n%d stored %d times in moto, want once", i, n)
		}
	}
	if e.indoubt(resultDelivered) != 1 || e.indoubt(resultResent) != 1 {
		t.Errorf("in doubt: delivered %v, resent %v; want 1 and 1 (partial %v, unresolved %v)", e.indoubt(resultDelivered), e.indoubt(resultResent), e.indoubt(resultPartial), e.indoubt(resultUnresolved))
	}
}

// An event identical to one of the call in doubt (same millisecond, same
// message) that an earlier call stored is not taken for it: the call did
// not land and is sent again, and both records are in the stream.
func TestRecoverEarlierIdenticalEventIsNotTheCalls(t *testing.T) {
	e, p, cfg := newProxied(t, setup{})
	at := time.Now()
	same := wal.Record{Time: at.UnixNano(), Tag: "t", Body: []byte(`{"log":"same"}`)}
	e.append(same)
	e.run(queue.Options{Fingerprint: e.sink.Fingerprint()})
	p.setRule(func(op string, n int) string {
		if op == "PutLogEvents" {
			return hang
		}
		return pass
	})
	time.Sleep(5 * time.Millisecond) // the next call starts in a later millisecond than the first was stored
	e.append(same)
	e.runUntilHung(p, 1)
	e.rerun(cfg)
	if n := e.copies("g", "s")[`{"log":"same"}`]; n != 2 {
		t.Errorf("%d copies of the two identical records, want 2", n)
	}
	if e.indoubt(resultResent) != 1 {
		t.Errorf("resent %v, want 1", e.indoubt(resultResent))
	}
}

// With this host's clock behind the service's, an identical event an
// earlier call stored looks ingested after the call in doubt started: it
// is still not taken for the call's (the intent says how many identical
// events the earlier calls stored at that millisecond), whether the call
// did not land (sent again: both records stored, none lost) or landed
// (delivered: not sent again).
func TestRecoverIdenticalEventWithTheClockBehind(t *testing.T) {
	for _, c := range []struct {
		name   string
		answer string
		result string
	}{
		{"did not land", hang, resultResent},
		{"landed", land, resultDelivered},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, p, cfg := newProxied(t, setup{now: func() time.Time { return time.Now().Add(100 * time.Millisecond) }})
			same := wal.Record{Time: time.Now().UnixNano(), Tag: "t", Body: []byte(`{"log":"same"}`)}
			e.append(same)
			e.run(queue.Options{Fingerprint: e.sink.Fingerprint()})
			p.setRule(func(op string, n int) string {
				if op == "PutLogEvents" {
					return c.answer
				}
				return pass
			})
			time.Sleep(5 * time.Millisecond)
			e.append(same)
			e.runUntilHung(p, 1)
			e.rerun(cfg)
			if n := e.copies("g", "s")[`{"log":"same"}`]; n != 2 {
				t.Errorf("%d copies of the two identical records, want 2", n)
			}
			if e.indoubt(c.result) != 1 {
				t.Errorf("%s %v, want 1", c.result, e.indoubt(c.result))
			}
		})
	}
}

// An earlier call whose answer was lost, and that landed (found when read
// back, not sent again), counts its copy for the call in doubt after it:
// with this host's clock behind, the call that did not land is not taken
// for delivered by it.
func TestRecoverIdenticalEventAfterALostAnswer(t *testing.T) {
	old := callTimeout
	callTimeout = 300 * time.Millisecond
	t.Cleanup(func() { callTimeout = old })
	// The service's clock 2 s ahead: both earlier copies look ingested
	// after the call in doubt started.
	e, p, cfg := newProxied(t, setup{now: func() time.Time { return time.Now().Add(2 * time.Second) }})
	e.prime() // the stream exists
	puts := 0
	p.setRule(func(op string, n int) string {
		if op != "PutLogEvents" {
			return pass
		}
		if puts++; puts == 1 {
			return land // its answer lost: retried
		}
		return pass
	})
	same := wal.Record{Time: time.Now().UnixNano(), Tag: "t", Body: []byte(`{"log":"same"}`)}
	e.append(same)
	e.run(queue.Options{Fingerprint: e.sink.Fingerprint()})
	if n := e.copies("g", "s")[`{"log":"same"}`]; n != 1 || e.indoubt(resultDelivered) != 1 {
		t.Fatalf("%d copies after the lost answer and its read back (delivered %v), want 1", n, e.indoubt(resultDelivered))
	}
	p.setRule(func(op string, n int) string {
		if op == "PutLogEvents" {
			return hang
		}
		return pass
	})
	e.append(same)
	e.runUntilHung(p, 2) // the first try's, then this call's
	e.rerun(cfg)
	if n := e.copies("g", "s")[`{"log":"same"}`]; n != 2 {
		t.Errorf("%d copies, want 2: the call in doubt sent again (delivered %v, resent %v)", n, e.indoubt(resultDelivered), e.indoubt(resultResent))
	}
}

// 10,001 identical lines of one millisecond make two calls; the second
// never reaches the service, whose clock is 20 ms ahead of this host's: it
// is sent again (the first call's copies are not taken for it).
func TestRecoverRepeatedLineAcrossCalls(t *testing.T) {
	e, p, cfg := newProxied(t, setup{now: func() time.Time { return time.Now().Add(20 * time.Millisecond) }, rule: putRule(3, hang)})
	at := time.Now()
	var recs []wal.Record
	for range 10001 {
		recs = append(recs, wal.Record{Time: at.UnixNano(), Tag: "t", Body: []byte(`{"log":"same"}`)})
	}
	e.append(recs...)
	e.runUntilHung(p, 1)
	e.rerun(cfg)
	if n := e.copies("g", "s")[`{"log":"same"}`]; n != 10001 {
		t.Errorf("%d copies, want 10001 (delivered %v, resent %v)", n, e.indoubt(resultDelivered), e.indoubt(resultResent))
	}
}

// A host clock ahead of the service's makes a call that landed look
// ingested before it started: it is sent again (a duplicate, not a loss),
// with one warning that says to check the clock.
func TestRecoverClockAheadSendsAgain(t *testing.T) {
	e, p, cfg := newProxied(t, setup{now: func() time.Time { return time.Now().Add(-time.Minute) }})
	e.prime()
	p.setRule(landPuts)
	e.appendLines(10, time.Now(), "m")
	e.runUntilHung(p, 1)
	logs := e.rerun(cfg)
	got := e.copies("g", "s")
	for i := range 10 {
		if n := got[fmt.Sprintf(`{"log":"m%d"}`, i)]; n != 2 {
			t.Errorf("m%d stored %d times, want twice", i, n)
		}
	}
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 || !strings.Contains(logs.String(), "check NTP") {
		t.Errorf("%d warnings, want one about the clock:\n%s", n, logs)
	}
}

// A call to the overflow stream (max_partitions reached) that landed, and
// whose answer a crash lost, is found at the next start: Recover routes
// the records of its range as the drainer did, to the overflow stream and
// not to their own, so none is sent again.
func TestRecoverOverflowCallThatLanded(t *testing.T) {
	e, p, cfg := newProxied(t, setup{mod: func(c *config.CloudWatch) {
		c.LogStream = "${tag}"
		c.MaxPartitions = 1
	}})
	e.prime("a", "b") // stream a takes the one place; b makes the overflow stream
	p.setRule(landPuts)
	now := time.Now()
	var recs []wal.Record
	for i := range 20 {
		recs = append(recs, wal.Record{Time: now.Add(time.Duration(i) * time.Millisecond).UnixNano(), Tag: fmt.Sprintf("t%d", i%4),
			Body: fmt.Appendf(nil, `{"log":"m%d"}`, i)})
	}
	e.append(recs...)
	e.runUntilHung(p, 1)
	logs := e.rerun(cfg)
	got := e.copies("g", "unknown")
	delete(got, `{"log":"first"}`) // b's, from prime
	if len(got) != 20 {
		t.Errorf("%d other events in the overflow stream, want 20", len(got))
	}
	for i := range 20 {
		if n := got[fmt.Sprintf(`{"log":"m%d"}`, i)]; n != 1 {
			t.Errorf("m%d stored %d times in the overflow stream g/unknown", i, n)
		}
	}
	if e.indoubt(resultDelivered) != 1 {
		t.Errorf("in doubt: delivered %v, want 1\n%s", e.indoubt(resultDelivered), logs)
	}
	for _, g := range e.emu.Groups() {
		for _, s := range g.Streams {
			if s.Name != "a" && s.Name != "unknown" {
				t.Errorf("stream %s/%s made beyond max_partitions 1", g.Name, s.Name)
			}
		}
	}
}

// Overflow names the group and stream as for a record without fields, at
// the record's time; Explain names the placeholder that took a value per
// record.
func TestOverflowAndExplain(t *testing.T) {
	e := newEnv(t, func(c *config.CloudWatch) {
		c.LogGroup = "/x/${tag}"
		c.LogStream = "${record.stream}-${hostname}"
	})
	r := sinks.Record{Seq: 7, Tag: "kube.a", Time: time.Now().UnixNano(), Body: []byte(`{"stream":"s1"}`)}
	if got, want := e.sink.Overflow(&r), "/x/unknown\x00unknown-host1"; got != want {
		t.Errorf("Overflow %q, want %q", got, want)
	}
	var recs []sinks.Record
	for i := range 40 {
		recs = append(recs, sinks.Record{Tag: fmt.Sprintf("kube.%d", i%3), Body: fmt.Appendf(nil, `{"stream":"v%d"}`, i)})
	}
	want := `log_stream "${record.stream}-${hostname}": ${record.stream} took 40 values in 40 records, e.g. "v0", "v1"`
	if got := e.sink.Explain(recs); got != want {
		t.Errorf("Explain:\n%s\nwant\n%s", got, want)
	}
}

// Family leaves the time out of names that have it, and is the partition
// for names without.
func TestFamily(t *testing.T) {
	e := newEnv(t, func(c *config.CloudWatch) { c.LogGroup = "/x"; c.LogStream = "${tag}-%Y-%m-%d" })
	at := time.Date(2026, 12, 2, 3, 4, 5, 0, time.UTC)
	fam := func(s *Sink, tag string, when time.Time) string {
		r := sinks.Record{Tag: tag, Time: when.UnixNano(), Body: []byte(`{}`)}
		return s.Family(&r, s.Partition(&r))
	}
	if a, b := fam(e.sink, "web", at), fam(e.sink, "web", at.Add(48*time.Hour)); a != b {
		t.Errorf("one tag, two days: families %q and %q", a, b)
	}
	if a, b := fam(e.sink, "web", at), fam(e.sink, "db", at); a == b {
		t.Errorf("two tags, one family %q", a)
	}
	e2 := newEnv(t, func(c *config.CloudWatch) { c.LogGroup = "/x"; c.LogStream = "${tag}" })
	r := sinks.Record{Tag: "web", Time: at.UnixNano(), Body: []byte(`{}`)}
	if p := e2.sink.Partition(&r); e2.sink.Family(&r, p) != p {
		t.Errorf("family %q of partition %q", e2.sink.Family(&r, p), p)
	}
}

// A process that stops between CreateLogGroup and PutRetentionPolicy
// leaves the group owed its retention in the sink's state: the next one
// sets it when it finds the group there, and forgets the debt.
func TestRetentionOwedAcrossRestart(t *testing.T) {
	hangRetention := func(op string, n int) string {
		if op == "PutRetentionPolicy" {
			return hang
		}
		return pass
	}
	e, p, cfg := newProxied(t, setup{rule: hangRetention})
	e.appendLines(20, time.Now(), "m")
	e.runUntilHung(p, 1)
	if got := retentionOf(e.emu, "g"); got != 0 {
		t.Fatalf("retention of g after the stop: %d days, want none yet", got)
	}
	owed := func() int {
		n := 0
		e.w.ScanState("cw", []byte("s/"+retentionPrefix), func(k, v []byte) error { n++; return nil })
		return n
	}
	if n := owed(); n != 1 {
		t.Fatalf("%d groups owed their retention in the sink's state, want 1", n)
	}
	logs := e.rerun(cfg)
	e.expectOnce(20, "m")
	if got := retentionOf(e.emu, "g"); got != 30 {
		t.Errorf("retention of g after the restart: %d days, want 30\n%s", got, logs)
	}
	if n := owed(); n != 0 {
		t.Errorf("%d groups still owed their retention", n)
	}
	if !strings.Contains(logs.String(), `msg="set the retention of log group" sink=cw group=g retention_days=30`) {
		t.Errorf("no line for the retention set:\n%s", logs)
	}

	// With retention_days 0, a debt an earlier configuration left is
	// forgotten, not paid.
	var b wal.Batch
	b.Put("cw", []byte("s/"+retentionPrefix+"/eks/old"), nil)
	if err := e.w.Commit(context.Background(), &b); err != nil {
		t.Fatal(err)
	}
	if n := owed(); n != 1 {
		t.Fatalf("%d groups owed their retention, want the one put there", n)
	}
	cfg.RetentionDays = 0
	e.appendLines(1, time.Now(), "z") // the drainer recovers before it reads it
	e.rerun(cfg)
	if n := owed(); n != 0 {
		t.Errorf("%d groups owed their retention with retention_days 0", n)
	}
}

// A CreateLogGroup the service refused (AccessDenied) made no group: the
// group is not owed its retention, and one made by someone else before
// the next start keeps its own.
func TestRetentionNotOwedWhenCreationRefused(t *testing.T) {
	e, p, cfg := newProxied(t, setup{})
	p.setAnswer("CreateLogGroup", "AccessDeniedException")
	e.appendLines(5, time.Now(), "m")
	e.runUntil(func(d *queue.Drainer) bool { return p.count("CreateLogGroup") >= 1 && d.Status().State == "paused" })
	n := 0
	e.w.ScanState("cw", []byte("s/"+retentionPrefix), func(k, v []byte) error { n++; return nil })
	if n != 0 {
		t.Fatalf("%d groups owed their retention after a refused creation", n)
	}
	// Someone else makes the group, with a retention of their own.
	p.setAnswer("CreateLogGroup", "")
	cl := e.sink.api
	if _, err := cl.CreateLogGroup(context.Background(), &cwl.CreateLogGroupInput{LogGroupName: aws.String("g")}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.PutRetentionPolicy(context.Background(), &cwl.PutRetentionPolicyInput{LogGroupName: aws.String("g"), RetentionInDays: aws.Int32(365)}); err != nil {
		t.Fatal(err)
	}
	e.rerun(cfg)
	e.expectOnce(5, "m")
	if got := retentionOf(e.emu, "g"); got != 365 {
		t.Errorf("retention of a group made by someone else: %d days, want their 365", got)
	}
}

// Calls that get no answer (an endpoint that took the request and went
// quiet) end after callTimeout and are sent again: the stream does not
// wait on them for good, and nothing is lost.
func TestHungCallsTimeOut(t *testing.T) {
	old := callTimeout
	callTimeout = time.Second // the calls passed through must not take that long
	t.Cleanup(func() { callTimeout = old })
	e, p, _ := newProxied(t, setup{rule: func(op string, n int) string {
		if (op == "PutLogEvents" || op == "CreateLogStream" || op == "CreateLogGroup") && n == 1 {
			return hang
		}
		return pass
	}})
	e.appendLines(30, time.Now(), "m")
	d := e.run(queue.Options{Fingerprint: e.sink.Fingerprint()})
	e.expectOnce(30, "m")
	if st := d.Status(); !strings.Contains(st.LastError, "no answer within 1s: the call may have landed (a PutLogEvents is read back from its stream before it is sent again)") {
		t.Errorf("last error %q, want it to say the call had no answer", st.LastError)
	}
	for _, op := range []string{"PutLogEvents", "CreateLogGroup", "CreateLogStream"} {
		if p.count(op) < 2 {
			t.Errorf("%s sent %d times: the hung one was not sent again", op, p.count(op))
		}
	}
	if n := testutil.ToFloat64(e.qm.Retries.WithLabelValues("cw", "retryable", "timeout")); n < 1 {
		t.Errorf("%v retries counted as timeouts", n)
	}
}

// TestLostAnswerReadBack: a call whose answer is lost while the process
// runs (no answer within the call's timeout, or a 5xx) is read back from
// its stream before its batch is sent again: one that landed is not sent
// again, one that did not is.
func TestLostAnswerReadBack(t *testing.T) {
	old := callTimeout
	callTimeout = time.Second // a call the proxy lets through must not take that long
	t.Cleanup(func() { callTimeout = old })
	for _, c := range []struct {
		name, what string
		result     string
		puts       int // PutLogEvents made, the first record's two included
	}{
		{"landed", land, resultDelivered, 3},
		{"did not land", hang, resultResent, 4},
		{"5xx", fail, resultResent, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, p, _ := newProxied(t, setup{})
			e.prime()
			p.setRule(putRule(3, c.what))
			e.appendLines(20, time.Now(), "m")
			e.run(queue.Options{Fingerprint: e.sink.Fingerprint()})
			e.expectOnce(20, "m")
			if e.indoubt(c.result) != 1 || p.count("PutLogEvents") != c.puts {
				t.Errorf("in doubt %s: %v, want 1; PutLogEvents calls %d, want %d", c.result, e.indoubt(c.result), p.count("PutLogEvents"), c.puts)
			}
			if n := e.intentsLeft(); n != 0 {
				t.Errorf("%d intents left", n)
			}
		})
	}
}

// TestLostAnswerReadRefused: a service that refuses the read back of a
// call whose answer was lost (InvalidParameterException, with unmask and
// without) has the call sent again (at least once): its batch is not
// dead-lettered for the read's refusal, and nothing is lost.
func TestLostAnswerReadRefused(t *testing.T) {
	old := callTimeout
	callTimeout = time.Second // a call the proxy lets through must not take that long
	t.Cleanup(func() { callTimeout = old })
	for _, what := range []string{land, hang} {
		t.Run(what, func(t *testing.T) {
			e, p, _ := newProxied(t, setup{})
			e.prime()
			p.setRule(putRule(3, what))
			p.setAnswer("GetLogEvents", "InvalidParameterException")
			e.appendLines(20, time.Now(), "m")
			e.run(queue.Options{Fingerprint: e.sink.Fingerprint()})
			got := e.copies("g", "s")
			for i := range 20 {
				if n := got[fmt.Sprintf(`{"log":"m%d"}`, i)]; n < 1 {
					t.Errorf("m%d lost", i)
				}
			}
			if d := testutil.ToFloat64(e.qm.DeadLetters.WithLabelValues("cw", "InvalidParameterException")); d != 0 || e.indoubt(resultUnresolved) != 1 || e.intentsLeft() != 0 {
				t.Errorf("%v dead letters (want 0), %v unresolved (want 1), %d intents left", d, e.indoubt(resultUnresolved), e.intentsLeft())
			}
		})
	}
}

// TestLostAnswerReadBackMoto: as TestLostAnswerReadBack, against
// moto_server: a call that landed and one that did not, both without an
// answer, are each in the stream once.
func TestLostAnswerReadBackMoto(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: moto_server, started for the test; make test runs it")
	}
	old := callTimeout
	callTimeout = 2 * time.Second // a call the proxy lets through must not take that long
	t.Cleanup(func() { callTimeout = old })
	motoURL := mototest.Start(t)
	e, p, _ := newProxied(t, setup{target: motoURL})
	e.prime()
	for i, what := range []string{land, hang} {
		next := p.count("PutLogEvents") + 1
		p.setRule(putRule(next, what))
		e.appendLines(20, time.Now(), fmt.Sprintf("%s-", []string{"landed", "lost"}[i]))
		e.run(queue.Options{Fingerprint: e.sink.Fingerprint()})
	}
	got := serviceEvents(t, motoURL, "g", "s")
	for _, prefix := range []string{"landed-", "lost-"} {
		for i := range 20 {
			if n := got[fmt.Sprintf(`{"log":"%s%d"}`, prefix, i)]; n != 1 {
				t.Errorf("%s%d stored %d times in moto, want once", prefix, i, n)
			}
		}
	}
	if e.indoubt(resultDelivered) != 1 || e.indoubt(resultResent) != 1 {
		t.Errorf("in doubt: delivered %v, resent %v; want 1 and 1", e.indoubt(resultDelivered), e.indoubt(resultResent))
	}
}

// TestLostAnswerThenSplitThenCrash: a call of events of one millisecond
// fails (a 5xx, not forwarded); sent again, it is refused whole and split;
// its first half lands, its second lands but the process stops before the
// answer. The first try, read back and not found, is not counted among the
// copies earlier calls stored at that millisecond: at the next start the
// second half is found, and nothing is sent twice.
func TestLostAnswerThenSplitThenCrash(t *testing.T) {
	e, p, cfg := newProxied(t, setup{})
	e.prime()
	p.setRule(func(op string, n int) string {
		if op != "PutLogEvents" {
			return pass
		}
		return map[int]string{3: fail, 4: bad, 6: land}[n]
	})
	at := time.Now().UnixNano()
	for i := range 10 { // a millisecond's messages are counted up to 16 (maxPriorMessages)
		e.append(wal.Record{Time: at, Tag: "t", Body: fmt.Appendf(nil, `{"log":"m%d"}`, i)})
	}
	e.runUntilHung(p, 1)
	if got := p.count("PutLogEvents"); got != 6 {
		t.Fatalf("%d PutLogEvents, want 6 (the first record's two, the failed one, the refused one, its halves)", got)
	}
	e.rerun(cfg)
	e.expectOnce(10, "m")
	if e.indoubt(resultDelivered) != 1 {
		t.Errorf("in doubt delivered %v, want 1 (the second half)", e.indoubt(resultDelivered))
	}
}

// A signature the service refuses for a clock an hour off its own
// (InvalidSignatureException "Signature expired", the answer's Date an hour
// ahead) is retried, not taken for bad credentials: the SDK learnt the
// offset, and the next call, signed with it, lands.
func TestClockSkewRetried(t *testing.T) {
	e := newEnv(t, nil)
	refused := e.refuseFirstPut(t, "InvalidSignatureException", "Signature expired: 20261202T230000Z is now earlier than 20261202T230500Z", time.Hour)
	e.appendLines(10, time.Now(), "m")
	e.run(queue.Options{Fingerprint: e.sink.Fingerprint()})
	e.expectOnce(10, "m")
	if n := testutil.ToFloat64(e.qm.Retries.WithLabelValues("cw", "retryable", "clock_skew")); n != 1 || refused() != 1 {
		t.Errorf("%v retries for clock skew after %d refusals, want 1", n, refused())
	}
}

// refuseFirstPut puts a server before the emulator that answers the first
// PutLogEvents with the error code (its Date header ahead by skew) and
// passes every other request; the sink is started anew on it, and e.url
// is its URL from then on. It returns how many it refused.
func (e *env) refuseFirstPut(t *testing.T, code, msg string, skew time.Duration) (refused func() int) {
	var mu sync.Mutex
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		first := n == 0 && r.Header.Get("X-Amz-Target") == "Logs_20140328.PutLogEvents"
		if first {
			n++
		}
		mu.Unlock()
		if !first {
			e.emu.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Date", time.Now().Add(skew).UTC().Format(http.TimeFormat))
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		w.Header().Set("X-Amzn-ErrorType", code)
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"__type":%q,"message":%q}`, code, msg)
	}))
	t.Cleanup(srv.Close)
	e.url = srv.URL
	e.restart(streamCfg(srv.URL))
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		return n
	}
}

// A role without logs:CreateLogGroup writing to a group made elsewhere
// (by Terraform, say): the refused CreateLogGroup does not pause the sink,
// the streams are made in the group that is there, and the group is known
// from then on: a later new stream makes no CreateLogGroup (the first
// three, made at once, may each have tried one).
func TestGroupMadeElsewhereWithoutCreateLogGroup(t *testing.T) {
	e, p, cfg := newProxied(t, setup{mod: func(c *config.CloudWatch) { c.LogStream = "${tag}" }})
	p.setAnswer("CreateLogGroup", "AccessDeniedException")
	if _, err := e.sink.api.CreateLogGroup(context.Background(), &cwl.CreateLogGroupInput{LogGroupName: aws.String("other")}); err == nil {
		t.Fatal("the proxy let a CreateLogGroup through")
	}
	cl := cwl.New(cwl.Options{Region: "us-east-1", BaseEndpoint: aws.String(e.url), Credentials: staticAWS().Credentials})
	if _, err := cl.CreateLogGroup(context.Background(), &cwl.CreateLogGroupInput{LogGroupName: aws.String("g")}); err != nil {
		t.Fatal(err)
	}
	before := p.count("CreateLogGroup")
	for _, tag := range []string{"a", "b", "c"} {
		e.append(wal.Record{Time: time.Now().UnixNano(), Tag: tag, Body: []byte(`{"log":"` + tag + `"}`)})
	}
	e.rerun(cfg)
	if n := p.count("CreateLogGroup") - before; n < 1 || n > 3 {
		t.Errorf("%d CreateLogGroup calls for three new streams, want 1 to 3", n)
	}
	before = p.count("CreateLogGroup")
	e.append(wal.Record{Time: time.Now().UnixNano(), Tag: "d", Body: []byte(`{"log":"d"}`)})
	e.run(queue.Options{Fingerprint: e.sink.Fingerprint()}) // the same sink
	for _, tag := range []string{"a", "b", "c", "d"} {
		if got := e.copies("g", tag); got[`{"log":"`+tag+`"}`] != 1 {
			t.Errorf("stream %s holds %v", tag, got)
		}
	}
	if n := p.count("CreateLogGroup") - before; n != 0 {
		t.Errorf("%d CreateLogGroup calls for a new stream of a group known to exist, want 0", n)
	}
}

// A CreateLogGroup refused for the sink's settings (InvalidParameterException:
// a KMS key disabled, say) or for the account's quota of groups
// (LimitExceededException, no rate limit there) leaves that group's
// records in the WAL, retried, with an error that says what to check:
// none is dead-lettered, the sink is neither paused nor throttled (the
// streams of other groups go on), and once the group is made they are
// delivered.
func TestGroupRefusedRetries(t *testing.T) {
	for code, says := range map[string]string{"InvalidParameterException": "kms_key_id", "LimitExceededException": "quota"} {
		t.Run(code, func(t *testing.T) { testGroupRefusedRetries(t, code, says) })
	}
}

func testGroupRefusedRetries(t *testing.T, code, says string) {
	e, p, cfg := newProxied(t, setup{})
	p.setAnswer("CreateLogGroup", code)
	e.appendLines(5, time.Now(), "m")
	d := e.runUntil(func(d *queue.Drainer) bool {
		return testutil.ToFloat64(e.qm.Retries.WithLabelValues("cw", "retryable", code)) >= 3
	})
	if st := d.Status(); !strings.Contains(st.LastError, says) || st.DeadLettered != 0 {
		t.Errorf("status %+v: want the error to say %s, and no dead letters", st, says)
	}
	if n := testutil.ToFloat64(e.qm.Retries.WithLabelValues("cw", "throttled", code)) + testutil.ToFloat64(e.qm.Retries.WithLabelValues("cw", "sink_permanent", code)); n != 0 {
		t.Errorf("%v throttles or pauses for %s", n, code)
	}
	p.setAnswer("CreateLogGroup", "")
	e.rerun(cfg)
	e.expectOnce(5, "m")
}

// A new group's CreateLogGroup refused its KMS key (AccessDeniedException
// "The specified KMS key does not exist or is not allowed to be used with
// Arn ...", what the service answers when the key's policy does not let
// CloudWatch Logs use it) holds back that group's records alone, retried,
// with an error naming kms_key_id: the sink is not paused, the streams of
// other groups go on, and once the key is fixed the records go out.
func TestGroupKMSKeyRefused(t *testing.T) {
	e, p, cfg := newProxied(t, setup{mod: func(c *config.CloudWatch) {
		c.LogGroup, c.LogStream, c.KMSKeyID = "${tag}", "s", "arn:aws:kms:us-east-1:111122223333:key/k"
	}})
	e.append(wal.Record{Time: time.Now().UnixNano(), Tag: "good", Body: []byte(`{"log":"first"}`)})
	e.rerun(cfg) // group good exists
	p.setAnswerSaying("CreateLogGroup", "AccessDeniedException",
		"The specified KMS key does not exist or is not allowed to be used with Arn 'arn:aws:logs:us-east-1:111122223333:log-group:newgroup'")
	e.append(wal.Record{Time: time.Now().UnixNano(), Tag: "newgroup", Body: []byte(`{"log":"x"}`)})
	for i := range 5 {
		e.append(wal.Record{Time: time.Now().UnixNano(), Tag: "good", Body: fmt.Appendf(nil, `{"log":"later%d"}`, i)})
	}
	paused := false
	d := e.runUntil(func(d *queue.Drainer) bool {
		paused = paused || d.Status().State == queue.StatePaused
		return len(e.copies("good", "s")) == 6 && testutil.ToFloat64(e.qm.Retries.WithLabelValues("cw", "retryable", "AccessDeniedException")) >= 3
	})
	if st := d.Status(); !strings.Contains(st.LastError, "kms_key_id") || st.State == queue.StatePaused || st.DeadLettered != 0 {
		t.Errorf("status %+v: want an error naming kms_key_id, not paused, no dead letters", st)
	}
	if paused {
		t.Error("the sink paused")
	}
	p.setAnswer("CreateLogGroup", "")
	e.rerun(cfg)
	if got := e.copies("newgroup", "s"); got[`{"log":"x"}`] != 1 {
		t.Errorf("newgroup holds %v", got)
	}
}

// TestGroupTagsRefused: CreateLogGroup refused for want of
// logs:TagResource (a sink that sets tags) pauses the sink with an error
// naming logs:TagResource, not only logs:CreateLogGroup.
func TestGroupTagsRefused(t *testing.T) {
	e, p, cfg := newProxied(t, setup{mod: func(c *config.CloudWatch) {
		c.LogGroup, c.LogStream, c.Tags = "${tag}", "s", map[string]string{"team": "logs"}
	}})
	p.setAnswerSaying("CreateLogGroup", "AccessDeniedException",
		"User: arn:aws:sts::111122223333:assumed-role/forwarder/i-0 is not authorized to perform: logs:TagResource on resource: arn:aws:logs:us-east-1:111122223333:log-group:newgroup")
	e.append(wal.Record{Time: time.Now().UnixNano(), Tag: "newgroup", Body: []byte(`{"log":"x"}`)})
	d := e.runUntil(func(d *queue.Drainer) bool { return d.Status().State == queue.StatePaused })
	if st := d.Status(); !strings.Contains(st.LastError, "logs:TagResource") || !strings.Contains(st.LastError, `sink "cw" sets tags`) || st.DeadLettered != 0 {
		t.Errorf("status %+v: want paused, naming logs:TagResource, no dead letters", st)
	}
	p.setAnswer("CreateLogGroup", "")
	e.rerun(cfg)
	if got := e.copies("newgroup", "s"); got[`{"log":"x"}`] != 1 {
		t.Errorf("newgroup holds %v", got)
	}
}

// TestGroupDeniedWhileOthersWrite: a group the credentials may not write
// (an IAM policy allowing some groups only) while other groups take events
// holds back its own records, retried, not the whole sink: the other
// groups go on, nothing is dead-lettered, and once allowed it gets them.
func TestGroupDeniedWhileOthersWrite(t *testing.T) {
	e, p, cfg := newProxied(t, setup{mod: func(c *config.CloudWatch) {
		c.LogGroup, c.LogStream = "${tag}", "s"
	}})
	p.deny("forbidden", true)
	e.append(wal.Record{Time: time.Now().UnixNano(), Tag: "good", Body: []byte(`{"log":"first"}`)})
	appended := false
	paused := false
	d := e.runUntil(func(d *queue.Drainer) bool {
		paused = paused || d.Status().State == queue.StatePaused
		if !appended {
			// A group took events (its answer counted, not only stored in
			// the service): now the other.
			if d.Status().Delivered == 1 {
				e.append(wal.Record{Time: time.Now().UnixNano(), Tag: "forbidden", Body: []byte(`{"log":"x"}`)})
				e.append(wal.Record{Time: time.Now().UnixNano(), Tag: "good", Body: []byte(`{"log":"second"}`)})
				appended = true
			}
			return false
		}
		return len(e.copies("good", "s")) == 2 && testutil.ToFloat64(e.qm.Retries.WithLabelValues("cw", "retryable", "AccessDeniedException")) >= 3
	})
	if st := d.Status(); st.State == queue.StatePaused || st.DeadLettered != 0 || !strings.Contains(st.LastError, `log group "forbidden", though other log groups take events`) {
		t.Errorf("status %+v: want not paused, no dead letters, an error naming the group", st)
	}
	if paused {
		t.Error("the sink paused")
	}
	p.deny("forbidden", false)
	e.rerun(cfg)
	if got := e.copies("forbidden", "s"); got[`{"log":"x"}`] != 1 {
		t.Errorf("forbidden holds %v once allowed", got)
	}
}

// runUntil runs a drainer of the sink until cond holds of it (or 10 s have
// passed, which fails the test), then stops it, cancelling its sends at
// once, and returns it.
func (e *env) runUntil(cond func(*queue.Drainer) bool) *queue.Drainer {
	e.t.Helper()
	d := queue.New(e.w, "cw", e.sink, queue.Options{Metrics: e.qm, RetryMin: 5 * time.Millisecond, RetryMax: 50 * time.Millisecond,
		ShutdownTimeout: 10 * time.Millisecond, Fingerprint: e.sink.Fingerprint(), Logger: slog.New(slog.NewTextHandler(&e.drainLogs, nil))})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	if !waitUntil(10*time.Second, func() bool { return cond(d) }) {
		e.t.Errorf("the condition did not hold within 10 s; status %+v", d.Status())
	}
	cancel()
	if err := <-done; err != nil {
		e.t.Fatal(err)
	}
	return d
}

// A PutLogEvents the service refuses whole (InvalidParameterException,
// naming no event: here any call that holds one poisoned event) is sent
// again in halves until the event is alone: only it is dead-lettered, and
// each of the others is stored once.
func TestRefusedCallSplit(t *testing.T) {
	e := newEnv(t, nil)
	srv := refusePoison(t, e)
	e.restart(streamCfg(srv.URL))
	e.append(poisoned(40, 17)...)
	e.run(queue.Options{Fingerprint: e.sink.Fingerprint()})
	got := e.copies("g", "s")
	for i := range 40 {
		want := 1
		msg := fmt.Sprintf(`{"log":"m%d"}`, i)
		if i == 17 {
			msg, want = `{"log":"POISON"}`, 0
		}
		if got[msg] != want {
			t.Errorf("%s stored %d times, want %d", msg, got[msg], want)
		}
	}
	if n := testutil.ToFloat64(e.qm.DeadLetters.WithLabelValues("cw", "InvalidParameterException")); n != 1 {
		t.Errorf("%v records dead-lettered, want 1", n)
	}
	if n := testutil.ToFloat64(e.sink.m.splitCalls); n < 1 || n > 7 {
		t.Errorf("%v calls split, want about log2(40)", n)
	}
}

// Credentials the service answers have expired (ExpiredTokenException: a
// cache kept them a moment too long) are fetched again and the call is
// retried: no pause, nothing lost or doubled.
func TestExpiredCredentialsFetchedAgain(t *testing.T) {
	e := newEnv(t, nil)
	e.refuseFirstPut(t, "ExpiredTokenException", "The security token included in the request is expired", 0)
	var fetched atomic.Int32
	awsCfg := staticAWS()
	awsCfg.Credentials = aws.NewCredentialsCache(aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
		n := fetched.Add(1) // a role's credentials: a new session each time
		return aws.Credentials{AccessKeyID: "ASIATEST", SecretAccessKey: "secret", SessionToken: fmt.Sprint("t", n), CanExpire: true, Expires: time.Now().Add(time.Hour)}, nil
	}))
	var err error
	if e.sink, err = New(context.Background(), "cw", streamCfg(e.url), Options{Hostname: "host1", AWS: awsCfg, Registerer: prometheus.NewRegistry()}); err != nil {
		t.Fatal(err)
	}
	e.appendLines(10, time.Now(), "m")
	e.run(queue.Options{Fingerprint: e.sink.Fingerprint()})
	e.expectOnce(10, "m")
	if n := testutil.ToFloat64(e.qm.Retries.WithLabelValues("cw", "retryable", "ExpiredTokenException")); n != 1 {
		t.Errorf("%v retries for the expired credentials, want 1", n)
	}
	if fetched.Load() < 2 {
		t.Errorf("credentials fetched %d times: not again after the service said they expired", fetched.Load())
	}
}

// Expired credentials that come back the same when fetched again (session
// credentials set in the environment: nothing renews them) pause the sink,
// saying so, instead of retrying for ever under a retry alert at most.
func TestExpiredCredentialsNotRenewedPause(t *testing.T) {
	e := newEnv(t, nil)
	e.refuseFirstPut(t, "ExpiredTokenException", "The security token included in the request is expired", 0)
	awsCfg := staticAWS()
	awsCfg.Credentials = aws.NewCredentialsCache(credentials.NewStaticCredentialsProvider("ASIATEST", "secret", "the-only-token"))
	var err error
	if e.sink, err = New(context.Background(), "cw", streamCfg(e.url), Options{Hostname: "host1", AWS: awsCfg, Registerer: prometheus.NewRegistry()}); err != nil {
		t.Fatal(err)
	}
	e.appendLines(10, time.Now(), "m")
	d := e.runUntil(func(d *queue.Drainer) bool { return d.Status().State == "paused" })
	if st := d.Status(); !strings.Contains(st.LastError, "expired_credentials (sink_permanent)") || !strings.Contains(st.LastError, "nothing renews them") || st.Delivered != 0 {
		t.Errorf("status %+v, want paused for credentials nothing renews", st)
	}
}

// A refused event of an earlier call of the batch is dead-lettered, not
// skipped, when a crash interrupts a later call that landed: Recover finds
// that call in the stream, and keeps its intent delivered instead of
// marking the batch delivered, so the batch is read again and the event
// dead-lettered.
func TestRefusedEventSurvivesCrash(t *testing.T) {
	e := newEnv(t, nil)
	var hung atomic.Int32
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		put := r.Header.Get("X-Amz-Target") == "Logs_20140328.PutLogEvents"
		switch {
		case put && bytes.Contains(body, []byte("POISON")):
			refuseEvent(w)
		case put && bytes.Contains(body, []byte(`m9`)) && hung.Load() == 0:
			// It lands, and its answer is lost to the crash.
			e.emu.ServeHTTP(httptest.NewRecorder(), r.Clone(context.WithoutCancel(r.Context())))
			hung.Add(1)
			select {
			case <-r.Context().Done():
			case <-stop:
			}
		default:
			e.emu.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(func() { close(stop); srv.CloseClientConnections(); srv.Close() })
	cfg := streamCfg(srv.URL)
	e.restart(cfg)
	e.append(poisoned(10, 3)...)
	e.runUntil(func(*queue.Drainer) bool { return hung.Load() == 1 })
	e.rerun(cfg)
	got := e.copies("g", "s")
	for i := range 10 {
		if i == 3 {
			continue
		}
		if msg := fmt.Sprintf(`{"log":"m%d"}`, i); got[msg] != 1 {
			t.Errorf("%s stored %d times, want 1", msg, got[msg])
		}
	}
	if n := testutil.ToFloat64(e.qm.DeadLetters.WithLabelValues("cw", "InvalidParameterException")); n != 1 {
		t.Errorf("%v records dead-lettered after the crash, want 1 (the refused one)", n)
	}
}

// A service that refuses every event whole (a rule of its own, or a
// proxy) pauses the sink once refusedToPause events were refused alone
// and none of the batch taken: it is not their content, and nothing is
// dead-lettered (every record would be, and the oldest dead letters
// evicted). Once the service takes events, every one is stored once.
func TestRefusedEverythingPauses(t *testing.T) {
	e := newEnv(t, nil)
	var puts atomic.Int32
	var healed atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Amz-Target") == "Logs_20140328.PutLogEvents" && !healed.Load() {
			puts.Add(1)
			refuseEvent(w)
			return
		}
		e.emu.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	e.restart(streamCfg(srv.URL))
	e.appendLines(1000, time.Now(), "m")
	var whilePaused struct {
		puts, dead, retries float64
	}
	watched := make(chan bool, 1)
	go func() {
		paused := waitUntil(20*time.Second, func() bool { return testutil.ToFloat64(e.qm.Paused.WithLabelValues("cw")) == 1 })
		whilePaused.puts = float64(puts.Load())
		whilePaused.dead = testutil.ToFloat64(e.qm.DeadLetters.WithLabelValues("cw", "InvalidParameterException"))
		whilePaused.retries = testutil.ToFloat64(e.qm.Retries.WithLabelValues("cw", "sink_permanent", "InvalidParameterException"))
		healed.Store(true)
		watched <- paused
	}()
	e.run(queue.Options{Fingerprint: e.sink.Fingerprint(), PauseRetry: 100 * time.Millisecond})
	if !<-watched {
		t.Fatal("the sink did not pause")
	}
	if whilePaused.dead != 0 || whilePaused.retries < 1 || whilePaused.puts > 2*maxSplits+2 {
		t.Errorf("when paused: %v dead letters (want 0), %v retries counted, %v PutLogEvents (want at most %d)", whilePaused.dead, whilePaused.retries, whilePaused.puts, 2*maxSplits+2)
	}
	got := e.copies("g", "s")
	for i := range 1000 {
		if n := got[fmt.Sprintf(`{"log":"m%d"}`, i)]; n != 1 {
			t.Fatalf("m%d stored %d times, want once", i, n)
		}
	}
	if n := testutil.ToFloat64(e.qm.DeadLetters.WithLabelValues("cw", "InvalidParameterException")); n != 0 {
		t.Errorf("%v dead letters, want none", n)
	}
}

// TestRefusedEverythingAtALowRatePauses: a service that refuses every
// event, met by a stream sending one record at a time, each batch of one
// record: refusedToPause of them refused in a row, with no call taken,
// pause the sink, rather than each being dead-lettered (fewer than
// refusedToPause are, before the pause).
func TestRefusedEverythingAtALowRatePauses(t *testing.T) {
	e := newEnv(t, nil)
	var healed atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Amz-Target") == "Logs_20140328.PutLogEvents" && !healed.Load() {
			refuseEvent(w)
			return
		}
		e.emu.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	e.restart(streamCfg(srv.URL))
	stop := make(chan struct{})
	fed := make(chan int, 1)
	go func() { // one record every 20 ms: batches of one
		n := 0
		defer func() { fed <- n }()
		for ; n < 40; n++ {
			e.appendLines(1, time.Now(), fmt.Sprintf("m%d-", n))
			select {
			case <-stop:
				n++
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	paused := false
	e.runUntil(func(d *queue.Drainer) bool {
		paused = paused || d.Status().State == queue.StatePaused
		return paused
	})
	close(stop)
	n := <-fed
	dead := testutil.ToFloat64(e.qm.DeadLetters.WithLabelValues("cw", "InvalidParameterException"))
	if !paused || dead >= refusedToPause {
		t.Fatalf("paused %v, %v records dead-lettered: want paused, with fewer than %d dead letters", paused, dead, refusedToPause)
	}
	healed.Store(true)
	e.run(queue.Options{Fingerprint: e.sink.Fingerprint()})
	got := e.copies("g", "s")
	if float64(len(got))+dead != float64(n) {
		t.Errorf("%d of %d records stored, %v dead-lettered", len(got), n, dead)
	}
	for msg, c := range got {
		if c != 1 {
			t.Errorf("%s stored %d times", msg, c)
		}
	}
}

// TestBadRecordsAtALowRateSeldomPause: a stream whose records the service
// refuses for their content, a record a batch, while no stream's call is
// taken: every refusedToPause-th record looks like a service refusing
// everything and pauses the sink until it is dead-lettered as the stream's
// content (maxRefusedBatches tries); the count starts again after it, and
// a record refused at each try counts once.
func TestBadRecordsAtALowRateSeldomPause(t *testing.T) {
	e := newEnv(t, nil)
	srv := refusePoison(t, e)
	e.restart(streamCfg(srv.URL))
	const records = 12
	d := queue.New(e.w, "cw", e.sink, queue.Options{Metrics: e.qm, RetryMin: 5 * time.Millisecond, RetryMax: 50 * time.Millisecond,
		PauseRetry: 5 * time.Millisecond, ShutdownTimeout: 10 * time.Millisecond, Fingerprint: e.sink.Fingerprint()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	dead := func() float64 {
		return testutil.ToFloat64(e.qm.DeadLetters.WithLabelValues("cw", "InvalidParameterException"))
	}
	for i := range records { // one at a time: batches of one
		e.append(wal.Record{Time: time.Now().UnixNano(), Tag: "t", Body: fmt.Appendf(nil, `{"log":"POISON-%d"}`, i)})
		if !waitUntil(10*time.Second, func() bool { return dead() == float64(i+1) }) {
			break
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	pauses := testutil.ToFloat64(e.qm.Retries.WithLabelValues("cw", "sink_permanent", "InvalidParameterException"))
	if dead() != records || pauses > maxRefusedBatches-1 {
		t.Errorf("%v of %d records dead-lettered, %v pauses: want all, and at most %d pauses (one record's)", dead(), records, pauses, maxRefusedBatches-1)
	}
}

// Events the service refuses for their content, as many as would pause
// the sink, at the head of a batch: the calls after them land, so they are
// dead-lettered and the rest delivered, and the sink does not pause.
func TestRefusedEventsAtTheHeadDoNotPause(t *testing.T) {
	e := newEnv(t, nil)
	srv := refusePoison(t, e)
	e.restart(streamCfg(srv.URL))
	recs := poisoned(1000, -1)
	for i := range 2 * refusedToPause {
		recs[i].Body = fmt.Appendf(nil, `{"log":"POISON%d"}`, i)
	}
	e.append(recs...)
	e.run(queue.Options{Fingerprint: e.sink.Fingerprint()})
	if got := e.copies("g", "s"); len(got) != 1000-2*refusedToPause {
		t.Errorf("%d events stored, want %d", len(got), 1000-2*refusedToPause)
	}
	if n := testutil.ToFloat64(e.qm.DeadLetters.WithLabelValues("cw", "InvalidParameterException")); n != 2*refusedToPause {
		t.Errorf("%v dead letters, want %d", n, 2*refusedToPause)
	}
	if n := testutil.ToFloat64(e.qm.Retries.WithLabelValues("cw", "sink_permanent", "InvalidParameterException")); n != 0 {
		t.Errorf("paused %v times", n)
	}
}

// A stream whose batch the service refuses whole, every event of it,
// while another stream's calls are taken: its content, dead-lettered; the
// sink does not pause, which would hold back every stream for it.
func TestRefusedStreamAmongOthersDoesNotPause(t *testing.T) {
	e := newEnv(t, nil)
	srv := refusePoison(t, e)
	cfg := streamCfg(srv.URL)
	cfg.LogStream = "${tag}"
	e.restart(cfg)
	e.append(wal.Record{Time: time.Now().UnixNano(), Tag: "good", Body: []byte(`{"log":"first"}`)})
	e.run(queue.Options{Fingerprint: e.sink.Fingerprint()})
	var recs []wal.Record
	for i := range 20 {
		recs = append(recs, wal.Record{Time: time.Now().UnixNano(), Tag: "bad", Body: fmt.Appendf(nil, `{"log":"POISON%d"}`, i)},
			wal.Record{Time: time.Now().UnixNano(), Tag: "good", Body: fmt.Appendf(nil, `{"log":"m%d"}`, i)})
	}
	e.append(recs...)
	e.run(queue.Options{Fingerprint: e.sink.Fingerprint()})
	if n := testutil.ToFloat64(e.qm.DeadLetters.WithLabelValues("cw", "InvalidParameterException")); n != 20 {
		t.Errorf("%v dead letters, want the bad stream's 20", n)
	}
	if n := testutil.ToFloat64(e.qm.Retries.WithLabelValues("cw", "sink_permanent", "InvalidParameterException")); n != 0 {
		t.Errorf("paused %v times for one stream's content", n)
	}
	if got := e.copiesOf("good"); len(got) != 21 {
		t.Errorf("stream good holds %d events, want 21", len(got))
	}
}

// More refused records at the head of a batch than the splits held on the
// way to a pause find: the calls past them are set aside, not
// dead-lettered, and split all the way once a later call lands. Only the
// refused records are dead-lettered.
func TestManyRefusedAtTheHead(t *testing.T) {
	e := newEnv(t, nil)
	srv := refusePoison(t, e)
	e.restart(streamCfg(srv.URL))
	recs := poisoned(1000, -1)
	for i := range 100 {
		recs[i].Body = fmt.Appendf(nil, `{"log":"POISON%d"}`, i)
	}
	e.append(recs...)
	e.run(queue.Options{Fingerprint: e.sink.Fingerprint()})
	if got := e.copies("g", "s"); len(got) != 900 {
		t.Errorf("%d events stored, want 900", len(got))
	}
	if n := testutil.ToFloat64(e.qm.DeadLetters.WithLabelValues("cw", "InvalidParameterException")); n != 100 {
		t.Errorf("%v dead letters, want the 100 refused", n)
	}
}

// A record whose message is split in parts, every part refused: one
// record refused alone, not as many as its parts; it is dead-lettered and
// the sink does not pause.
func TestRefusedPartsAreOneRecord(t *testing.T) {
	e := newEnv(t, nil)
	srv := refuseAllPuts(t, e)
	e.restart(streamCfg(srv.URL))
	big := fmt.Appendf(nil, `{"log":"%s"}`, strings.Repeat("x", 9<<20)) // 9 parts
	e.append(wal.Record{Time: time.Now().UnixNano(), Tag: "t", Body: big})
	e.run(queue.Options{Fingerprint: e.sink.Fingerprint()})
	if n := testutil.ToFloat64(e.qm.DeadLetters.WithLabelValues("cw", "InvalidParameterException")); n != 1 {
		t.Errorf("%v dead letters, want the one record", n)
	}
	if n := testutil.ToFloat64(e.qm.Retries.WithLabelValues("cw", "sink_permanent", "InvalidParameterException")); n != 0 {
		t.Errorf("paused %v times for one record", n)
	}
}

// A batch refused whole, record by record, at every try while no stream's
// events are taken pauses the sink; after maxRefusedBatches tries in a row
// it is dead-lettered as its stream's content (a stream of bad records
// alone), with a warning, rather than holding the sink paused for good.
func TestRefusedBatchDeadLetteredAfterTries(t *testing.T) {
	e := newEnv(t, nil)
	srv := refuseAllPuts(t, e)
	logs := e.restart(streamCfg(srv.URL))
	e.appendLines(20, time.Now(), "m")
	e.run(queue.Options{Fingerprint: e.sink.Fingerprint(), PauseRetry: 10 * time.Millisecond})
	if n := testutil.ToFloat64(e.qm.DeadLetters.WithLabelValues("cw", "InvalidParameterException")); n != 20 {
		t.Errorf("%v dead letters, want 20", n)
	}
	if n := testutil.ToFloat64(e.qm.Retries.WithLabelValues("cw", "sink_permanent", "InvalidParameterException")); n != maxRefusedBatches-1 {
		t.Errorf("paused %v times, want %d", n, maxRefusedBatches-1)
	}
	if !strings.Contains(logs.String(), "is dead-lettered as its stream's content") {
		t.Errorf("no warning:\n%s", logs)
	}
}

// Refusals of a batch whose splitting a throttle cut short are not kept:
// the batch is sent again whole, and once the service takes events none of
// them is dead-lettered.
func TestRefusalsCutShortAreNotKept(t *testing.T) {
	e := newEnv(t, nil)
	var puts atomic.Int32
	var healed atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Amz-Target") == "Logs_20140328.PutLogEvents" && !healed.Load() {
			if puts.Add(1) == 14 {
				w.Header().Set("Content-Type", "application/x-amz-json-1.1")
				w.Header().Set("X-Amzn-ErrorType", "ThrottlingException")
				w.WriteHeader(http.StatusBadRequest)
				io.WriteString(w, `{"__type":"ThrottlingException","message":"Rate exceeded"}`)
				return
			}
			refuseEvent(w)
			return
		}
		e.emu.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	e.restart(streamCfg(srv.URL))
	e.appendLines(100, time.Now(), "m")
	watched := make(chan bool, 1)
	go func() {
		watched <- waitUntil(20*time.Second, func() bool { return testutil.ToFloat64(e.qm.Paused.WithLabelValues("cw")) == 1 })
		healed.Store(true)
	}()
	e.run(queue.Options{Fingerprint: e.sink.Fingerprint(), PauseRetry: 100 * time.Millisecond})
	if !<-watched {
		t.Fatal("the sink did not pause")
	}
	got := e.copies("g", "s")
	for i := range 100 {
		if n := got[fmt.Sprintf(`{"log":"m%d"}`, i)]; n != 1 {
			t.Errorf("m%d stored %d times, want once", i, n)
		}
	}
	if n := testutil.ToFloat64(e.qm.DeadLetters.WithLabelValues("cw", "InvalidParameterException")); n != 0 {
		t.Errorf("%v dead letters, want none", n)
	}
}

// A batch with several events the service refuses alone, among events it
// takes, finds each of them: the splits a batch may make grow with the
// refused events found (64 alone would leave 20 of them among 2,000
// unfound, their neighbours dead-lettered with them).
func TestRefusedCallSplitFindsEach(t *testing.T) {
	e := newEnv(t, nil)
	srv := refusePoison(t, e)
	e.restart(streamCfg(srv.URL))
	recs := poisoned(2000, -1)
	for i := 50; i < 2000; i += 100 { // 20 of them
		recs[i].Body = fmt.Appendf(nil, `{"log":"POISON%d"}`, i)
	}
	e.append(recs...)
	e.run(queue.Options{Fingerprint: e.sink.Fingerprint()})
	got := e.copies("g", "s")
	stored := 0
	for _, n := range got {
		stored += n
	}
	if stored != 1980 || len(got) != 1980 {
		t.Errorf("%d events stored (%d distinct), want the 1,980 the service takes, once each", stored, len(got))
	}
	if n := testutil.ToFloat64(e.qm.DeadLetters.WithLabelValues("cw", "InvalidParameterException")); n != 20 {
		t.Errorf("%v dead letters, want the 20 refused", n)
	}
	if testutil.ToFloat64(e.qm.Paused.WithLabelValues("cw")) != 0 {
		t.Error("paused: the service takes most events")
	}
}

// With create_stream false, a stream that does not exist holds back its
// own records only: they are retried, with an error that says to make the
// stream, while the streams that exist go on; once it is made, they land.
func TestMissingStreamWithoutCreateHoldsOnlyItself(t *testing.T) {
	e, _, cfg := newProxied(t, setup{mod: func(c *config.CloudWatch) { c.LogStream, c.CreateStream = "${tag}", false }})
	cl := cwl.New(cwl.Options{Region: "us-east-1", BaseEndpoint: aws.String(e.url), Credentials: staticAWS().Credentials})
	ctx := context.Background()
	if _, err := cl.CreateLogGroup(ctx, &cwl.CreateLogGroupInput{LogGroupName: aws.String("g")}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.CreateLogStream(ctx, &cwl.CreateLogStreamInput{LogGroupName: aws.String("g"), LogStreamName: aws.String("there")}); err != nil {
		t.Fatal(err)
	}
	e.append(wal.Record{Time: time.Now().UnixNano(), Tag: "missing", Body: []byte(`{"log":"m"}`)})
	e.append(wal.Record{Time: time.Now().UnixNano(), Tag: "there", Body: []byte(`{"log":"t"}`)})
	var st queue.Status // as it was while the drainer ran: the stop cancels a retry in flight
	e.runUntil(func(d *queue.Drainer) bool {
		st = d.Status()
		return len(e.emu.Events("g", "there")) == 1 && testutil.ToFloat64(e.qm.Retries.WithLabelValues("cw", "retryable", "ResourceNotFoundException")) >= 2 &&
			strings.Contains(st.LastError, "create_stream is false")
	})
	if st.State == "paused" {
		t.Errorf("status %+v: want the sink going on, the error saying create_stream is false", st)
	}
	if _, err := cl.CreateLogStream(ctx, &cwl.CreateLogStreamInput{LogGroupName: aws.String("g"), LogStreamName: aws.String("missing")}); err != nil {
		t.Fatal(err)
	}
	e.rerun(cfg)
	if got := e.copies("g", "missing"); got[`{"log":"m"}`] != 1 {
		t.Errorf("stream missing holds %v once made", got)
	}
	if got := e.copies("g", "there"); got[`{"log":"t"}`] != 1 {
		t.Errorf("stream there holds %v", got)
	}
}

// poisoned is n records of stream g/s, a millisecond apart, with messages
// m0 .. m<n-1>, but for the one at bad, whose message is POISON.
func poisoned(n, bad int) []wal.Record {
	var recs []wal.Record
	now := time.Now()
	for i := range n {
		msg := fmt.Sprintf("m%d", i)
		if i == bad {
			msg = "POISON"
		}
		recs = append(recs, wal.Record{Time: now.Add(time.Duration(i) * time.Millisecond).UnixNano(), Tag: "t", Body: fmt.Appendf(nil, `{"log":%q}`, msg)})
	}
	return recs
}

// refusePoison is a server in front of e's emulator that refuses whole
// (refuseEvent) every PutLogEvents holding POISON.
func refusePoison(t *testing.T, e *env) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		if r.Header.Get("X-Amz-Target") == "Logs_20140328.PutLogEvents" && bytes.Contains(body, []byte("POISON")) {
			refuseEvent(w)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		e.emu.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// refuseAllPuts is a server in front of e's emulator that refuses whole
// (refuseEvent) every PutLogEvents.
func refuseAllPuts(t *testing.T, e *env) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Amz-Target") == "Logs_20140328.PutLogEvents" {
			refuseEvent(w)
			return
		}
		e.emu.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// refuseEvent answers a PutLogEvents as CloudWatch Logs refuses a call
// whole, naming no event.
func refuseEvent(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	w.Header().Set("X-Amzn-ErrorType", "InvalidParameterException")
	w.WriteHeader(http.StatusBadRequest)
	io.WriteString(w, `{"__type":"InvalidParameterException","message":"Log event too large"}`)
}

// TestEveryGroupDeniedPauses: credentials refused on every group, after
// both took events, pause the sink once each group has been refused (no
// group takes events any more), rather than retrying each for good.
func TestEveryGroupDeniedPauses(t *testing.T) {
	e, p, _ := newProxied(t, setup{mod: func(c *config.CloudWatch) {
		c.LogGroup, c.LogStream = "${tag}", "s"
	}})
	for _, g := range []string{"a", "b"} {
		e.append(wal.Record{Time: time.Now().UnixNano(), Tag: g, Body: []byte(`{"log":"first"}`)})
	}
	denied := false
	d := e.runUntil(func(d *queue.Drainer) bool {
		if !denied {
			if len(e.copies("a", "s")) == 1 && len(e.copies("b", "s")) == 1 {
				p.deny("a", true)
				p.deny("b", true)
				for _, g := range []string{"a", "b"} {
					e.append(wal.Record{Time: time.Now().UnixNano(), Tag: g, Body: []byte(`{"log":"second"}`)})
				}
				denied = true
			}
			return false
		}
		return d.Status().State == queue.StatePaused // runUntil fails the test when it never is
	})
	// The refusal that paused the sink is the one no other group's success
	// scoped (a scoped retry in flight may end after it and be the last
	// error /status shows).
	paused := regexp.MustCompile(`msg="sink paused: .*`).FindString(e.drainLogs.String())
	if !strings.Contains(paused, "AccessDeniedException") || strings.Contains(paused, "though other log groups take events") {
		t.Errorf("the pause: %q, want one on an unscoped AccessDeniedException; status %+v", paused, d.Status())
	}
}

// A call the service refused outright (throttled: it did not land) leaves
// no call in doubt: a stop while it waits for its retry costs the next
// start no read back (settle, then GetLogEvents against a low quota).
func TestRefusedCallLeavesNoDoubt(t *testing.T) {
	e, p, cfg := newProxied(t, setup{})
	e.prime()
	e.appendLines(10, time.Now(), "m")
	p.setAnswer("PutLogEvents", "ThrottlingException")
	e.runUntil(func(d *queue.Drainer) bool {
		return testutil.ToFloat64(e.qm.Retries.WithLabelValues("cw", "throttled", "ThrottlingException")) >= 2
	})
	p.setAnswer("PutLogEvents", "")
	logs := e.rerun(cfg)
	e.expectOnce(10, "m")
	for _, r := range []string{resultDelivered, resultResent, resultPartial, resultUnresolved} {
		if n := e.indoubt(r); n != 0 {
			t.Errorf("%v calls in doubt resolved %s after a stop while throttled, want none", n, r)
		}
	}
	if p.count("GetLogEvents") != 0 || strings.Contains(logs.String(), "left in doubt") {
		t.Errorf("%d reads back after a stop while throttled, want none:\n%s", p.count("GetLogEvents"), logs)
	}
}

// A 5xx answered by something in front of the endpoint (a load balancer's
// HTML page, no AWS error) is retried under its status, http_502, with an
// error that says so, not as a network failure.
func TestProxyPageIsRetriedByStatus(t *testing.T) {
	e, p, _ := newProxied(t, setup{})
	e.prime()
	e.appendLines(5, time.Now(), "m")
	p.setRule(putRule(p.count("PutLogEvents")+1, page))
	d := e.run(queue.Options{Fingerprint: e.sink.Fingerprint()})
	e.expectOnce(5, "m")
	if n := testutil.ToFloat64(e.qm.Retries.WithLabelValues("cw", "retryable", "http_502")); n != 1 {
		t.Errorf("retries of reason http_502: %v, want 1", n)
	}
	if st := d.Status(); !strings.Contains(st.LastError, "answered HTTP 502 without an AWS error") {
		t.Errorf("last error %q, want it to say what answered", st.LastError)
	}
}

// A read back whose page gets no answer is retried, and says so: not the
// words of a PutLogEvents without an answer (which may have landed).
func TestRecoverReadTimeoutSaysSo(t *testing.T) {
	defer func(d time.Duration) { readTimeout = d }(readTimeout)
	readTimeout = 200 * time.Millisecond
	e, p, cfg := threeCallsInDoubt(t)
	p.setRule(func(op string, n int) string {
		if op == "GetLogEvents" && n <= 2 {
			return hang
		}
		return pass
	})
	logs := e.restart(cfg)
	var drained syncbuf.Buffer
	e.run(queue.Options{Fingerprint: e.sink.Fingerprint(), Logger: slog.New(slog.NewTextHandler(&drained, nil))})
	for i := range 3 {
		if got := e.copiesOf(fmt.Sprint("s", i)); got[`{"log":"x"}`] != 1 {
			t.Errorf("stream s%d: %v, want x once (landed, found once read)", i, got)
		}
	}
	out := logs.String() + drained.String()
	if !strings.Contains(out, "GetLogEvents of a call in doubt: no answer within 200ms") || strings.Contains(out, "a PutLogEvents is read back from its stream before it is sent again") {
		t.Errorf("the read's timeout not said as one, or said as a PutLogEvents':\n%s", out)
	}
}
