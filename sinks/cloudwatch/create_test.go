package cloudwatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	cwl "github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/emulator/cloudwatchlogs"
	"github.com/logfwd/forwarder/internal/nettest"
	"github.com/logfwd/forwarder/internal/syncbuf"
	"github.com/logfwd/forwarder/sinks"
)

// memState is a sink state in memory: Send only puts and deletes intents.
// A put or delete with a cancelled context fails, as a commit of the WAL
// may.
type memState struct {
	mu sync.Mutex
	m  map[string][]byte
}

func (st *memState) Get(key []byte) ([]byte, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.m[string(key)], nil
}

func (st *memState) Scan(prefix []byte, fn func(key, value []byte) error) error {
	st.mu.Lock()
	var keys []string
	for k := range st.m {
		if strings.HasPrefix(k, string(prefix)) {
			keys = append(keys, k)
		}
	}
	st.mu.Unlock()
	sort.Strings(keys)
	for _, k := range keys {
		v, _ := st.Get([]byte(k))
		if err := fn([]byte(k), v); err != nil {
			return err
		}
	}
	return nil
}

func (st *memState) Put(ctx context.Context, key, value []byte) error {
	if err := ctx.Err(); err != nil { // as the WAL's commit may refuse it
		return err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.m[string(key)] = append([]byte(nil), value...)
	return nil
}

func (st *memState) Delete(ctx context.Context, key []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	delete(st.m, string(key))
	return nil
}

func (st *memState) ReadRange(first, last uint64, keep func(*sinks.Record) bool) ([]sinks.Record, error) {
	return nil, errors.New("memState: ReadRange is not for Send")
}

func (st *memState) ReadRangeAll(first, last uint64, keep func(*sinks.Record) bool) ([]sinks.Record, error) {
	return nil, errors.New("memState: ReadRangeAll is not for Send")
}

func (st *memState) Admitted(string, uint64) bool { return true }

func (st *memState) Partitioning() []byte { return nil }

func (st *memState) Delivered(context.Context, string, uint64, [][]byte) error {
	return errors.New("memState: Delivered is not for Send")
}

// arrivals records when the emulator received each request, by operation.
type arrivals struct {
	h  http.Handler
	mu sync.Mutex
	at map[string][]time.Time
}

func (a *arrivals) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	op := strings.TrimPrefix(r.Header.Get("X-Amz-Target"), "Logs_20140328.")
	a.mu.Lock()
	a.at[op] = append(a.at[op], time.Now())
	a.mu.Unlock()
	a.h.ServeHTTP(w, r)
}

// mostInOneSecond is the largest number of op's requests that arrived
// within one second.
func (a *arrivals) mostInOneSecond(op string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	at := a.at[op]
	most := 0
	for i, j := 0, 0; j < len(at); j++ {
		for at[j].Sub(at[i]) >= time.Second {
			i++
		}
		most = max(most, j-i+1)
	}
	return most
}

// createEnv is a sink and an emulator with AWS's default quotas in one
// synctest bubble, over in-memory connections: the bubble's clock paces
// both, so that rates are measured exactly and minutes pass at once.
type createEnv struct {
	emu  *cloudwatchlogs.Server
	arr  *arrivals
	sink *Sink
	reg  *prometheus.Registry
	logs *syncbuf.Buffer
	stop func()
}

func newCreateEnv(t *testing.T, mod func(*config.CloudWatch)) *createEnv {
	e := &createEnv{emu: cloudwatchlogs.New(cloudwatchlogs.Options{AWSQuotas: true}), reg: prometheus.NewRegistry(), logs: &syncbuf.Buffer{}}
	e.arr = &arrivals{h: e.emu, at: map[string][]time.Time{}}
	ln := nettest.NewPipeListener()
	srv := &http.Server{Handler: e.arr}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(ln)
	}()
	tr := &http.Transport{DialContext: ln.Dial, MaxIdleConnsPerHost: 256}
	awsCfg := staticAWS()
	awsCfg.HTTPClient = &http.Client{Transport: tr}
	cfg := baseCfg("http://cloudwatch.test")
	cfg.CreateRate, cfg.GroupCreateRate = 10, 1 // config's defaults
	if mod != nil {
		mod(&cfg)
	}
	var err error
	e.sink, err = New(context.Background(), "cw", cfg, Options{Hostname: "host1", AWS: awsCfg, Registerer: e.reg,
		Logger: slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	if err != nil {
		t.Fatal(err)
	}
	e.stop = func() {
		tr.CloseIdleConnections()
		srv.Close()
		<-served
		e.emu.Close()
	}
	return e
}

// sendNewStreams sends one record to each of n new streams of two groups
// at once, one Send per stream, and fails the test on any error.
func (e *createEnv) sendNewStreams(t *testing.T, n int) { e.sendNewStreamsFrom(t, 0, n) }

// sendNewStreamsFrom is sendNewStreams of the pods from on.
func (e *createEnv) sendNewStreamsFrom(t *testing.T, from, n int) {
	st := &memState{m: map[string][]byte{}}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	now := time.Now()
	for i := from; i < from+n; i++ {
		r := podRecord(fmt.Sprint("ns", i%2), fmt.Sprint("pod-", i), now, fmt.Sprint("line ", i))
		rec := sinks.Record{Seq: uint64(i + 1), Time: r.Time, Tag: r.Tag, Body: r.Body}
		b := &sinks.Batch{Partition: e.sink.Partition(&rec), Records: []sinks.Record{rec}, State: st, Final: true}
		wg.Go(func() {
			if _, err := e.sink.Send(context.Background(), b); err != nil {
				errs <- fmt.Errorf("stream %d: %w", i, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	failed := 0
	for err := range errs {
		if failed++; failed <= 3 {
			t.Error(err)
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d Sends failed", failed, n)
	}
}

// expectEachOnce checks that every stream holds its one event, once.
func (e *createEnv) expectEachOnce(t *testing.T, n int) {
	seen := 0
	for _, g := range e.emu.Groups() {
		for _, s := range g.Streams {
			evs := e.emu.Events(g.Name, s.Name)
			pod := strings.TrimSuffix(s.Name, "-host1")
			if len(evs) != 1 || !strings.Contains(evs[0].Message, `"line `+strings.TrimPrefix(pod, "pod-")+`"`) {
				t.Errorf("stream %s of %s: %d events %v", s.Name, g.Name, len(evs), evs)
			}
			seen++
		}
	}
	if seen != n {
		t.Errorf("%d streams, want %d", seen, n)
	}
}

func (e *createEnv) creations(kind, outcome string) float64 {
	return testutil.ToFloat64(e.sink.m.creations.WithLabelValues(kind, outcome))
}

// 1,000 pods start at once: their streams are created at create_rate, not
// in a burst the account's quota throttles; each event lands once.
func TestNewStreamsCreatedAtCreateRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 1000
		e := newCreateEnv(t, nil)
		defer e.stop()
		start := time.Now()
		done := make(chan struct{})
		go func() {
			defer close(done)
			e.sendNewStreams(t, n)
		}()
		time.Sleep(30 * time.Second)
		if w := testutil.ToFloat64(e.sink.m.waiting); w < n/2 {
			t.Errorf("after 30s, %v streams waiting for creation, want most of %d", w, n)
		}
		<-done
		took := time.Since(start)
		e.expectEachOnce(t, n)
		if got := e.emu.Throttled("CreateLogStream") + e.emu.Throttled("CreateLogGroup") + e.emu.Throttled("PutRetentionPolicy"); got != 0 {
			t.Errorf("%d creation calls throttled at the default rates", got)
		}
		if most := e.arr.mostInOneSecond("CreateLogStream"); most > 10 {
			t.Errorf("%d CreateLogStream calls arrived within one second, create_rate is 10", most)
		}
		if most := e.arr.mostInOneSecond("CreateLogGroup") + e.arr.mostInOneSecond("PutRetentionPolicy"); most > 2 {
			t.Errorf("%d group calls arrived within one second, group_create_rate is 1", most)
		}
		if c := e.emu.Calls("CreateLogStream"); c != n {
			t.Errorf("%d CreateLogStream calls for %d streams", c, n)
		}
		if c := e.emu.Calls("CreateLogGroup"); c != 2 {
			t.Errorf("%d CreateLogGroup calls for 2 groups", c)
		}
		if got := e.creations(kindStream, outcomeCreated); got != n {
			t.Errorf("creations{stream,created} = %v, want %d", got, n)
		}
		if got := e.creations(kindGroup, outcomeCreated) + e.creations(kindRetention, outcomeCreated); got != 4 {
			t.Errorf("creations{group and retention,created} = %v, want 4", got)
		}
		if w := testutil.ToFloat64(e.sink.m.waiting); w != 0 {
			t.Errorf("%v streams still waiting", w)
		}
		// 1,000 streams at 10 a second: 100 s, and no more than a second beyond.
		if took < 99*time.Second || took > 102*time.Second {
			t.Errorf("creating %d streams took %v at 10 a second", n, took)
		}
		if strings.Contains(e.logs.String(), "level=WARN") {
			t.Errorf("warnings:\n%s", e.logs)
		}
	})
}

// A stream that looked for its group while no creation was under way, and
// took the creations' lock only after another stream had made the group,
// finds the group known: one CreateLogGroup, not a second one answered
// ResourceAlreadyExistsException.
func TestGroupCreatedOnceWhenCreationEndsBetweenLooks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newCreateEnv(t, nil)
		defer e.stop()
		const group = "/eks/race"
		key := "\x00group\x00" + group
		type late struct{}
		looked, made := make(chan struct{}), make(chan struct{})
		groupCheckedHook = func(ctx context.Context) {
			if ctx.Value(late{}) != nil {
				close(looked)
				<-made
			}
		}
		defer func() { groupCheckedHook = nil }()
		errc := make(chan error, 1)
		go func() {
			errc <- e.sink.ensureGroup(context.WithValue(context.Background(), late{}, true), group, key)
		}()
		<-looked
		if err := e.sink.ensureGroup(context.Background(), group, key); err != nil {
			t.Fatal(err)
		}
		close(made)
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		if c := e.emu.Calls("CreateLogGroup"); c != 1 {
			t.Errorf("%d CreateLogGroup calls for one group, want 1", c)
		}
	})
}

// failFirst answers the first request of op with status and an error of
// type code; with made, the request is served first and only its answer
// is lost.
type failFirst struct {
	h      http.Handler
	op     string
	status int
	code   string
	made   bool
	failed atomic.Bool
}

func (f *failFirst) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !strings.HasSuffix(r.Header.Get("X-Amz-Target"), "."+f.op) || !f.failed.CompareAndSwap(false, true) {
		f.h.ServeHTTP(w, r)
		return
	}
	if f.made {
		f.h.ServeHTTP(httptest.NewRecorder(), r)
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	w.WriteHeader(f.status)
	fmt.Fprintf(w, `{"__type":%q,"message":"injected"}`, f.code)
}

// A group this sink made gets its retention once the retention call goes
// through, although CreateLogGroup then answers that the group exists:
// after PutRetentionPolicy failed, and after the answer to CreateLogGroup
// was lost, and after credentials were refused for a moment. A retention
// refused for good does not hold the group's records back: it is logged. A
// group someone else made keeps its own settings.
func TestRetentionSetAfterItFailed(t *testing.T) {
	for _, c := range []struct {
		name      string
		fail      *failFirst
		firstErr  bool  // the first ensureGroup fails
		retention int32 // days, in the end
		warned    bool
	}{
		{"retention failed", &failFirst{op: "PutRetentionPolicy", status: 500, code: "ServiceUnavailableException"}, true, 30, false},
		{"creation's answer lost", &failFirst{op: "CreateLogGroup", status: 500, code: "ServiceUnavailableException", made: true}, true, 30, false},
		{"retention limited", &failFirst{op: "PutRetentionPolicy", status: 400, code: "LimitExceededException"}, true, 30, false},
		{"retention refused", &failFirst{op: "PutRetentionPolicy", status: 400, code: "AccessDeniedException"}, false, 0, true},
		// Credentials that fail for a moment refuse nothing for good.
		{"credentials refused once", &failFirst{op: "PutRetentionPolicy", status: 400, code: "UnrecognizedClientException"}, true, 30, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newCreateEnv(t, nil)
				defer e.stop()
				c.fail.h = e.emu
				e.arr.h = c.fail
				const group = "/eks/retention"
				key := "\x00group\x00" + group
				err := e.sink.ensureGroup(context.Background(), group, key)
				if (err != nil) != c.firstErr {
					t.Fatalf("first try: %v", err)
				}
				if err != nil {
					if err := e.sink.ensureGroup(context.Background(), group, key); err != nil {
						t.Fatal(err)
					}
				}
				if got := retentionOf(e.emu, group); got != c.retention {
					t.Errorf("retention of %s: %d days, want %d", group, got, c.retention)
				}
				warned := strings.Contains(e.logs.String(), "could not set the retention of log group")
				if warned != c.warned {
					t.Errorf("warning logged %v, want %v:\n%s", warned, c.warned, e.logs)
				}
				// Made by someone else, with no retention: left as it is.
				if _, err := e.sink.api.CreateLogGroup(context.Background(), &cwl.CreateLogGroupInput{LogGroupName: aws.String("/eks/theirs")}); err != nil {
					t.Fatal(err)
				}
				if err := e.sink.ensureGroup(context.Background(), "/eks/theirs", "\x00group\x00/eks/theirs"); err != nil {
					t.Fatal(err)
				}
				if got := retentionOf(e.emu, "/eks/theirs"); got != 0 {
					t.Errorf("retention of a group made elsewhere set to %d days", got)
				}
			})
		})
	}
}

func retentionOf(emu *cloudwatchlogs.Server, group string) int32 {
	for _, g := range emu.Groups() {
		if g.Name == group {
			return g.RetentionInDays
		}
	}
	return -1
}

// With create_rate above the account's quota, the throttled creations wait
// and are made again: everything lands, and the log has one summary line a
// minute at most, not one per stream.
func TestThrottledCreationsRetriedQuietly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 1000
		e := newCreateEnv(t, func(c *config.CloudWatch) { c.CreateRate = 200 })
		defer e.stop()
		start := time.Now()
		e.sendNewStreams(t, n)
		took := time.Since(start)
		e.expectEachOnce(t, n)
		throttled := e.emu.Throttled("CreateLogStream")
		if throttled == 0 {
			t.Fatal("no CreateLogStream was throttled at 200 a second: the test tested nothing")
		}
		if got := e.creations(kindStream, outcomeThrottled); got != float64(throttled) {
			t.Errorf("creations{stream,throttled} = %v, the emulator throttled %d", got, throttled)
		}
		if got := e.creations(kindStream, outcomeCreated); got != n {
			t.Errorf("creations{stream,created} = %v, want %d", got, n)
		}
		lines := strings.Count(e.logs.String(), "CloudWatch Logs throttled creation calls")
		if most := 1 + int(took/throttleSummaryEvery); lines < 1 || lines > most {
			t.Errorf("%d summary lines in %v (at most %d), for %d throttled calls:\n%s", lines, took, most, throttled, e.logs)
		}
		if w := strings.Count(e.logs.String(), "level=WARN"); w != lines {
			t.Errorf("%d warnings besides the %d summary lines:\n%s", w-lines, lines, e.logs)
		}
		t.Logf("%d streams in %v; %d CreateLogStream calls throttled, %d summary lines", n, took, throttled, lines)
	})
}

// TestRouterRefusesAnotherTypesPartitioning: the partitioning an S3 sink
// of the same name stored is not read as a CloudWatch sink's (it would
// route no record to the S3 sink's marks, and say it did).
func TestRouterRefusesAnotherTypesPartitioning(t *testing.T) {
	s, err := New(context.Background(), "cw", baseCfg("http://127.0.0.1:1"), Options{Hostname: "h", AWS: staticAWS(), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Router([]byte(`{"key":"logs/${tag}/${seq}.json.gz","hostname":"h","key_rules":1}`), nil); err == nil || !strings.Contains(err.Error(), "not a CloudWatch sink's") {
		t.Fatalf("an S3 sink's partitioning: %v", err)
	}
	if _, err := s.Router(s.Partitioning(), nil); err != nil {
		t.Fatalf("its own: %v", err)
	}
}

// TestManyStreamsKeepTheirGroupsKnown: the sink's memory of groups that
// exist holds groups only, so that more streams than it holds do not push
// their groups out of it: a group pushed out is made again, one
// CreateLogGroup each (paced at group_create_rate, one a second).
func TestManyStreamsKeepTheirGroupsKnown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newCreateEnv(t, nil)
		defer e.stop()
		e.sink.known = newLRU(4)        // fewer than the streams
		e.sendNewStreamsFrom(t, 0, 20)  // two groups
		e.sendNewStreamsFrom(t, 20, 20) // new streams of the same groups
		e.expectEachOnce(t, 40)
		if c := e.emu.Calls("CreateLogGroup"); c != 2 {
			t.Errorf("%d CreateLogGroup calls for two groups, want 2", c)
		}
	})
}
