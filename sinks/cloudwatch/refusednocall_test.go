package cloudwatch

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/logfwd/forwarder/sinks"
)

// A batch that makes no call (its one record too old, dropped before any)
// while the sink counts records refused alone up to a pause is no refusal:
// its record is dead-lettered as too old, and Send does not fail on the
// refusal it does not have.
func TestBatchWithoutCallsAfterRefusals(t *testing.T) {
	e := newEnv(t, nil)
	srv := refusePoison(t, e)
	s, err := New(context.Background(), "cw", streamCfg(srv.URL), Options{Hostname: "host1", AWS: staticAWS(), Registerer: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	st := &memState{m: map[string][]byte{}}
	send := func(seq uint64, at time.Time, msg string) (out sinks.Outcome, err error) {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("Send of record %d panicked: %v", seq, r)
			}
		}()
		rec := sinks.Record{Seq: seq, Time: at.UnixNano(), Tag: "t", Body: []byte(fmt.Sprintf(`{"log":%q}`, msg))}
		return s.Send(context.Background(), &sinks.Batch{Partition: s.Partition(&rec), Records: []sinks.Record{rec}, State: st, Final: true})
	}
	for i := 1; i <= refusedToPause; i++ {
		send(uint64(i), time.Now(), fmt.Sprint("POISON-", i))
	}
	out, err := send(100, time.Now().Add(-15*24*time.Hour), "old but fine")
	if err != nil || len(out.Rejected) != 1 || out.Rejected[0].Reason != "too_old" {
		t.Fatalf("got %+v, %v; want the record dead-lettered too_old", out, err)
	}
}
