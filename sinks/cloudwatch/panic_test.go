package cloudwatch

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/logfwd/forwarder/emulator/cloudwatchlogs"
	"github.com/logfwd/forwarder/sinks"
)

// panicOnce is an HTTP client that panics on the first CreateLogGroup.
type panicOnce struct {
	c      *http.Client
	panics atomic.Int32
}

func (p *panicOnce) Do(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.Header.Get("X-Amz-Target"), ".CreateLogGroup") && p.panics.Add(-1) >= 0 {
		panic("a bug met creating a group")
	}
	return p.c.Do(r)
}

// The drainer recovers a panic of Send into the batch's failure, and the
// sink goes on: a panic while a log group is made does not leave its
// creation in flight for good, every later Send for the group waiting on
// it.
func TestPanicCreatingAGroupLetsItsSendsGo(t *testing.T) {
	emu := cloudwatchlogs.New(cloudwatchlogs.Options{})
	srv := httptest.NewServer(emu)
	defer srv.Close()
	awsCfg := staticAWS()
	hc := &panicOnce{c: &http.Client{}}
	hc.panics.Store(1)
	awsCfg.HTTPClient = hc
	s, err := New(context.Background(), "cw", baseCfg(srv.URL), Options{Hostname: "host1", AWS: awsCfg, Registerer: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	st := &memState{m: map[string][]byte{}}
	send := func(ctx context.Context, pod string, seq uint64) (err error) {
		defer func() { // as queue.Drainer.send
			if r := recover(); r != nil {
				err = fmt.Errorf("panic: %v", r)
			}
		}()
		r := podRecord("shop", pod, time.Now(), fmt.Sprint("line ", seq))
		rec := sinks.Record{Seq: seq, Time: r.Time, Tag: r.Tag, Body: r.Body}
		_, err = s.Send(ctx, &sinks.Batch{Partition: s.Partition(&rec), Records: []sinks.Record{rec}, State: st, Final: true})
		return err
	}
	t.Logf("first Send: %v", send(context.Background(), "web-0", 1))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	err = send(ctx, "web-1", 2) // another stream of the same group
	t.Logf("second Send after %s: %v", time.Since(start), err)
	if err != nil {
		t.Fatalf("the retry of the batch did not land: %v (took %s)", err, time.Since(start))
	}
}
