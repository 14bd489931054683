package cloudwatch

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	cwl "github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/emulator/cloudwatchlogs"
	"github.com/logfwd/forwarder/queue"
	"github.com/logfwd/forwarder/sinks"
)

// A PutLogEvents answered ResourceNotFoundException did not land, whatever
// the creation after it met: its intent must go, with nothing to read back.
func TestFailedCreationLeavesNoIntent(t *testing.T) {
	for _, c := range []struct {
		name string
		mod  func(*config.CloudWatch)
		fail string // op the proxy answers 500 to
	}{
		{"create_stream false", func(c *config.CloudWatch) { c.CreateStream = false }, ""},
		{"CreateLogStream 500", nil, "CreateLogStream"},
	} {
		t.Run(c.name, func(t *testing.T) {
			emu := cloudwatchlogs.New(cloudwatchlogs.Options{})
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if c.fail != "" && strings.HasSuffix(r.Header.Get("X-Amz-Target"), "."+c.fail) {
					w.Header().Set("Content-Type", "application/x-amz-json-1.1")
					w.WriteHeader(500)
					io.WriteString(w, `{"__type":"InternalFailure","message":"boom"}`)
					return
				}
				emu.ServeHTTP(w, r)
			}))
			defer srv.Close()
			cfg := baseCfg(srv.URL)
			cfg.Settle = config.Duration(2 * time.Second)
			if c.mod != nil {
				c.mod(&cfg)
			}
			reg := prometheus.NewRegistry()
			s, err := New(context.Background(), "cw", cfg, Options{Hostname: "host1", AWS: staticAWS(), Registerer: reg,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			st := &memState{m: map[string][]byte{}}
			send := func(seq uint64) error {
				r := podRecord("shop", "web-0", time.Now(), fmt.Sprint("line ", seq))
				rec := sinks.Record{Seq: seq, Time: r.Time, Tag: r.Tag, Body: r.Body}
				_, err := s.Send(context.Background(), &sinks.Batch{Partition: s.Partition(&rec), Records: []sinks.Record{rec}, State: st, Final: true})
				return err
			}
			err = send(1)
			t.Logf("first Send: %v", err)
			st.mu.Lock()
			n := len(st.m)
			for k := range st.m {
				t.Logf("state key %q", k)
			}
			st.mu.Unlock()
			start := time.Now()
			err = send(1)
			t.Logf("second Send after %s: %v", time.Since(start), err)
			if n != 0 {
				t.Errorf("%d intents left by a PutLogEvents answered ResourceNotFoundException (it did not land)", n)
			}
			if g := emu.Calls("GetLogEvents"); g != 0 {
				t.Errorf("%d GetLogEvents of a call that did not land; second Send waited %s", g, time.Since(start))
			}
			if v := testutil.ToFloat64(s.m.indoubt.WithLabelValues(resultResent)); v != 0 {
				t.Errorf("indoubt_calls_total{result=resent} = %v for a call whose answer was not lost", v)
			}
		})
	}
}

// With create_stream false, a missing stream's records wait; each retry of
// the drainer should be a PutLogEvents, not a settle wait and a read back.
func TestMissingStreamIsNotReadBack(t *testing.T) {
	e := newEnv(t, func(c *config.CloudWatch) { c.CreateStream = false; c.Settle = config.Duration(3 * time.Second) })
	e.append(podRecord("shop", "web-0", time.Now(), "line"))
	cl := cwl.New(cwl.Options{Region: "us-east-1", BaseEndpoint: aws.String(e.url), Credentials: staticAWS().Credentials})
	created := make(chan time.Time, 1)
	time.AfterFunc(time.Second, func() {
		_, err := cl.CreateLogStream(context.Background(), &cwl.CreateLogStreamInput{LogGroupName: aws.String("/eks/shop"), LogStreamName: aws.String("web-0-host1")})
		if err != nil {
			t.Error(err)
		}
		created <- time.Now()
	})
	e.run(queue.Options{})
	at := <-created
	t.Logf("delivered %s after the stream was made; GetLogEvents %d, PutLogEvents %d, indoubt resent %v",
		time.Since(at), e.emu.Calls("GetLogEvents"), e.emu.Calls("PutLogEvents"), testutil.ToFloat64(e.sink.m.indoubt.WithLabelValues(resultResent)))
	if e.emu.Calls("GetLogEvents") != 0 {
		t.Errorf("a missing stream's PutLogEvents, answered ResourceNotFoundException, were read back")
	}
}

// refuseOp answers a dial error for requests of one operation, as a refused
// connection would; others go to the emulator.
type refuseOp struct {
	c  *http.Client
	op string
	on *atomic.Bool
}

func (r refuseOp) Do(req *http.Request) (*http.Response, error) {
	if r.on.Load() && strings.HasSuffix(req.Header.Get("X-Amz-Target"), "."+r.op) {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}
	return r.c.Do(req)
}

// A CreateLogGroup that never left (connection refused) made no group and
// leaves no debt (README): a group made meanwhile by someone else keeps its
// settings.
func TestRefusedCreateLogGroupLeavesNoDebt(t *testing.T) {
	emu := cloudwatchlogs.New(cloudwatchlogs.Options{})
	srv := httptest.NewServer(emu)
	defer srv.Close()
	var on atomic.Bool
	on.Store(true)
	awsCfg := staticAWS()
	awsCfg.HTTPClient = refuseOp{c: srv.Client(), op: "CreateLogGroup", on: &on}
	cfg := baseCfg(srv.URL) // retention_days 30
	s, err := New(context.Background(), "cw", cfg, Options{Hostname: "host1", AWS: awsCfg, Registerer: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	st := &memState{m: map[string][]byte{}}
	if err := s.loadOwed(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	err = s.create(context.Background(), "/eks/shop", "web-0-host1")
	t.Logf("create: %v", err)
	st.mu.Lock()
	for k := range st.m {
		t.Errorf("state key %q left by a CreateLogGroup that never connected", k)
	}
	st.mu.Unlock()
	// Terraform makes the group with its own retention.
	cl := cwl.New(cwl.Options{Region: "us-east-1", BaseEndpoint: aws.String(srv.URL), Credentials: staticAWS().Credentials})
	if _, err := cl.CreateLogGroup(context.Background(), &cwl.CreateLogGroupInput{LogGroupName: aws.String("/eks/shop")}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.PutRetentionPolicy(context.Background(), &cwl.PutRetentionPolicyInput{LogGroupName: aws.String("/eks/shop"), RetentionInDays: aws.Int32(7)}); err != nil {
		t.Fatal(err)
	}
	on.Store(false)
	if err := s.create(context.Background(), "/eks/shop", "web-0-host1"); err != nil {
		t.Fatal(err)
	}
	for _, g := range emu.Groups() {
		if g.Name == "/eks/shop" && g.RetentionInDays != 7 {
			t.Errorf("the group another made has retention %d, want its own 7", g.RetentionInDays)
		}
	}
}
