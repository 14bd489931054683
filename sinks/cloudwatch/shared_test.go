package cloudwatch

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	cwl "github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs/types"

	"github.com/logfwd/forwarder/queue"
	"github.com/logfwd/forwarder/wal"
)

// putAsOtherWriter stores one event in g/s as another forwarder would.
func putAsOtherWriter(t *testing.T, url string, at time.Time, msg string) {
	t.Helper()
	other := cwl.New(cwl.Options{Region: "us-east-1", BaseEndpoint: aws.String(url), Credentials: staticAWS().Credentials})
	if _, err := other.PutLogEvents(context.Background(), &cwl.PutLogEventsInput{LogGroupName: aws.String("g"), LogStreamName: aws.String("s"),
		LogEvents: []types.InputLogEvent{{Timestamp: aws.Int64(at.UnixMilli()), Message: aws.String(msg)}}}); err != nil {
		t.Error(err)
	}
}

// With names another forwarder may share (Options.SharedStreams: no
// ${hostname}), a call in doubt is sent again, not read back: the other
// writer's identical event (a pod printing one line twice in a
// millisecond, its records spread over two replicas) would pass for the
// call's, and this record would never be sent. After a crash and after a
// lost answer while running, the stream holds both records.
func TestSharedStreamsSendCallsInDoubtAgain(t *testing.T) {
	const msg = `{"log":"same"}`
	t.Run("crash", func(t *testing.T) {
		e, p, cfg := newProxied(t, setup{})
		e.prime()
		p.setRule(func(op string, n int) string {
			if op == "PutLogEvents" {
				return hang
			}
			return pass
		})
		at := time.Now()
		e.append(wal.Record{Time: at.UnixNano(), Tag: "t", Body: []byte(msg)})
		e.runUntilHung(p, 1)
		time.Sleep(5 * time.Millisecond)
		putAsOtherWriter(t, e.url, at, msg)
		p.setRule(func(string, int) string { return pass })
		e.shared = true
		logs := e.rerun(cfg)
		if n := e.copies("g", "s")[msg]; n != 2 {
			t.Errorf("%d copies of the two writers' records, want 2; unresolved %v delivered %v\n%s", n, e.indoubt(resultUnresolved), e.indoubt(resultDelivered), logs)
		}
		if e.indoubt(resultUnresolved) != 1 || !strings.Contains(logs.String(), "a call in doubt is sent again without reading the stream back") ||
			!strings.Contains(logs.String(), "sent again, not read back (names replicas may share)") {
			t.Errorf("unresolved %v; log:\n%s", e.indoubt(resultUnresolved), logs)
		}
	})
	t.Run("lost answer", func(t *testing.T) {
		e, p, cfg := newProxied(t, setup{})
		e.shared = true
		e.restart(cfg)
		e.prime()
		at := time.Now()
		p.setRule(func(op string, n int) string {
			if op == "PutLogEvents" && n == 3 {
				putAsOtherWriter(t, e.url, at, msg)
				return fail // a 5xx: the call did not land
			}
			return pass
		})
		e.append(wal.Record{Time: at.UnixNano(), Tag: "t", Body: []byte(msg)})
		e.run(queue.Options{Fingerprint: e.sink.Fingerprint()})
		if n := e.copies("g", "s")[msg]; n != 2 {
			t.Errorf("%d copies, want 2; unresolved %v delivered %v", n, e.indoubt(resultUnresolved), e.indoubt(resultDelivered))
		}
	})
}
