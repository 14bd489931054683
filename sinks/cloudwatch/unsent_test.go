package cloudwatch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/logfwd/forwarder/emulator/cloudwatchlogs"
	"github.com/logfwd/forwarder/internal/nettest"
	"github.com/logfwd/forwarder/internal/syncbuf"
	"github.com/logfwd/forwarder/queue"
	"github.com/logfwd/forwarder/sinks"
)

// A call that never got a connection (the endpoint refuses them) and is
// given up by the stop, while its retries wait, did not land: its intent
// goes, so that the next start does not read its stream back for nothing.
// The SDK's canceled retry hides the dial error: what says it is that no
// attempt got a connection.
func TestCallWithoutConnectionLeavesNoIntent(t *testing.T) {
	cfg := baseCfg("http://" + nettest.ClosedAddr(t))
	cfg.CreateGroup, cfg.CreateStream = false, false // straight to PutLogEvents
	var logs syncbuf.Buffer
	s, err := New(context.Background(), "cw", cfg, Options{Hostname: "host1", AWS: staticAWS(), Registerer: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	st := &memState{m: map[string][]byte{}}
	r := podRecord("shop", "web-0", time.Now(), "line")
	rec := sinks.Record{Seq: 1, Time: r.Time, Tag: r.Tag, Body: r.Body}
	b := &sinks.Batch{Partition: s.Partition(&rec), Records: []sinks.Record{rec}, State: st, Final: true}
	// Long enough for the first attempt's refused dial and a retry's wait.
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	if _, err := s.Send(ctx, b); err == nil {
		t.Fatal("a Send to a refused endpoint succeeded")
	} else {
		t.Logf("Send: %v", err)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	for k := range st.m {
		t.Errorf("state key %q left by a call that never connected", k)
	}
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("errors logged:\n%s", logs.String())
	}
}

// A call whose dial the stop cancels (a dial that hangs: packets dropped
// on the way) never left either, though its error says only that it was
// cancelled: what says it is that no attempt got a connection, once the
// sink's client was seen to report connections.
func TestCallCancelledWhileDialingLeavesNoIntent(t *testing.T) {
	emu := cloudwatchlogs.New(cloudwatchlogs.Options{})
	srv := httptest.NewServer(emu)
	defer srv.Close()
	var hang atomic.Bool
	var d net.Dialer
	unhang := make(chan struct{}) // the transport's dial outlives the request that began it
	defer close(unhang)
	tr := &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		if hang.Load() {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-unhang:
				return nil, errors.New("dial given up by the test")
			}
		}
		return d.DialContext(ctx, network, addr)
	}}
	awsCfg := staticAWS()
	awsCfg.HTTPClient = &http.Client{Transport: tr}
	s, err := New(context.Background(), "cw", baseCfg(srv.URL), Options{Hostname: "host1", AWS: awsCfg, Registerer: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	st := &memState{m: map[string][]byte{}}
	send := func(ctx context.Context, seq uint64) error {
		r := podRecord("shop", "web-0", time.Now(), fmt.Sprint("line ", seq))
		rec := sinks.Record{Seq: seq, Time: r.Time, Tag: r.Tag, Body: r.Body}
		out, err := s.Send(ctx, &sinks.Batch{Partition: s.Partition(&rec), Records: []sinks.Record{rec}, State: st, Final: true})
		for _, k := range out.DeleteState { // as the drainer does, with the delivery
			_ = st.Delete(ctx, k)
		}
		return err
	}
	if err := send(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	hang.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := send(ctx, 2); err == nil {
		t.Fatal("a Send whose dial hangs succeeded")
	}
	st.mu.Lock()
	for k := range st.m {
		t.Errorf("state key %q left by a call that never connected", k)
	}
	st.mu.Unlock()
	// The records were not sent: the batch is sent again, once.
	hang.Store(false)
	if err := send(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	if evs := emu.Events("/eks/shop", "web-0-host1"); len(evs) != 2 {
		t.Errorf("%d events, want 2: %v", len(evs), evs)
	}
}

// An outage in which the endpoint refuses connections leaves no call in
// doubt: once it is back, each stream sends at once, with no read back of
// what never left (which would wait until the call is settle old, and
// spend GetLogEvents' low quota, stream by stream).
func TestRefusedConnectionsLeaveNothingToReadBack(t *testing.T) {
	e := newEnv(t, nil)
	closed := nettest.ClosedAddr(t)
	var down atomic.Bool
	down.Store(true)
	var d net.Dialer
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		if down.Load() {
			addr = closed
		}
		return d.DialContext(ctx, network, addr)
	}}
	defer tr.CloseIdleConnections()
	awsCfg := staticAWS()
	awsCfg.HTTPClient = &http.Client{Transport: tr}
	var err error
	if e.sink, err = New(context.Background(), "cw", baseCfg(e.url), Options{Hostname: "host1", AWS: awsCfg, Registerer: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}); err != nil {
		t.Fatal(err)
	}
	const pods = 20
	now := time.Now()
	for i := range pods {
		e.append(podRecord("shop", fmt.Sprint("web-", i), now, fmt.Sprint("line ", i)))
	}
	time.AfterFunc(time.Second, func() { down.Store(false) })
	start := time.Now()
	e.run(queue.Options{})
	if took := time.Since(start); took > 8*time.Second {
		t.Errorf("delivered %s after the start, the endpoint back after 1s: calls that never left were waited on", took)
	}
	if n := e.emu.Calls("GetLogEvents"); n != 0 {
		t.Errorf("%d GetLogEvents calls: calls that never left were read back", n)
	}
	for i := range pods {
		if evs := e.emu.Events("/eks/shop", fmt.Sprint("web-", i, "-host1")); len(evs) != 1 {
			t.Errorf("stream web-%d: %d events, want 1", i, len(evs))
		}
	}
}

// untraced is an HTTP client that sends each request with a context of its
// own: its connections are not reported to the call.
type untraced struct{ c *http.Client }

func (u untraced) Do(r *http.Request) (*http.Response, error) {
	return u.c.Do(r.Clone(context.Background()))
}

// A call whose answer is lost (stored, then the connection closed) keeps
// its intent, to be read back before its batch is sent again (the recover
// tests check what the read back does), whatever the HTTP client: also one that does not report connections to the call,
// when the credentials are fetched over HTTP with the call's context.
func TestLostAnswerKeepsItsIntent(t *testing.T) {
	for _, c := range []struct {
		name   string
		client func() aws.HTTPClient
	}{
		{"net/http client", func() aws.HTTPClient { return &http.Client{Transport: &http.Transport{}} }},
		{"client that does not report connections", func() aws.HTTPClient { return untraced{&http.Client{Transport: &http.Transport{}}} }},
	} {
		t.Run(c.name, func(t *testing.T) {
			credSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
			defer credSrv.Close()
			emu := cloudwatchlogs.New(cloudwatchlogs.Options{})
			srv := httptest.NewServer(emu)
			defer srv.Close()
			awsCfg := staticAWS()
			awsCfg.Credentials = aws.NewCredentialsCache(aws.CredentialsProviderFunc(func(ctx context.Context) (aws.Credentials, error) {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, credSrv.URL, nil)
				if resp, err := http.DefaultClient.Do(req); err == nil {
					resp.Body.Close()
				}
				return aws.Credentials{AccessKeyID: "AKIDTEST", SecretAccessKey: "secret"}, nil
			}))
			awsCfg.HTTPClient = c.client()
			s, err := New(context.Background(), "cw", baseCfg(srv.URL), Options{Hostname: "host1", AWS: awsCfg,
				Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			st := &memState{m: map[string][]byte{}}
			send := func(seq uint64) error {
				r := podRecord("shop", "web-1", time.Now(), fmt.Sprint("line ", seq))
				rec := sinks.Record{Seq: seq, Time: r.Time, Tag: r.Tag, Body: r.Body}
				out, err := s.Send(context.Background(), &sinks.Batch{Partition: s.Partition(&rec), Records: []sinks.Record{rec}, State: st, Final: true})
				for _, k := range out.DeleteState {
					_ = st.Delete(context.Background(), k)
				}
				return err
			}
			if err := send(1); err != nil { // the credentials fetched
				t.Fatal(err)
			}
			emu.SetDropResponses(1) // stored, then the connection closed
			if err := send(2); err == nil {
				t.Fatal("a call whose answer was dropped succeeded")
			}
			st.mu.Lock()
			n := len(st.m)
			st.mu.Unlock()
			if n != 1 {
				t.Errorf("%d intents after a call whose answer was lost, want its own (the call landed: sent again without a read back, it would land twice)", n)
			}
			if evs := emu.Events("/eks/shop", "web-1-host1"); len(evs) != 2 {
				t.Errorf("%d events, want 2: the call whose answer was lost landed", len(evs))
			}
		})
	}
}
