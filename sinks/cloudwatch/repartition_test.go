package cloudwatch

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/queue"
	"github.com/logfwd/forwarder/wal"
)

// TestNamesChangeAfterAnUndrainedStop: stream fast delivers its records
// ahead of the cursor while the call of stream slow is in doubt; the
// service stops and starts with another stream template. What fast
// delivered is not sent again to its new stream (the drainer reads its
// marks through the earlier names), and the call in doubt is resolved
// under the names it was sent with: found, it is not sent again; not
// found, it goes to the new stream.
func TestNamesChangeAfterAnUndrainedStop(t *testing.T) {
	for _, what := range []string{land, hang} {
		t.Run(what, func(t *testing.T) {
			e, p, cfg := newProxied(t, setup{mod: func(c *config.CloudWatch) { c.LogStream = "${tag}" }})
			e.prime("slow", "fast")
			p.setStream("slow", what)
			at := time.Now()
			e.append(wal.Record{Time: at.UnixNano(), Tag: "slow", Body: []byte(`{"log":"slow-0"}`)})
			var recs []wal.Record
			for i := range 50 {
				recs = append(recs, wal.Record{Time: at.Add(time.Duration(i) * time.Millisecond).UnixNano(), Tag: "fast",
					Body: fmt.Appendf(nil, `{"log":"fast-%d"}`, i)})
			}
			e.append(recs...)
			d := queue.New(e.w, "cw", e.sink, queue.Options{Metrics: e.qm, RetryMin: 5 * time.Millisecond, RetryMax: 50 * time.Millisecond,
				ShutdownTimeout: 10 * time.Millisecond, Fingerprint: e.sink.Fingerprint()})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- d.Run(ctx) }()
			if !waitUntil(10*time.Second, func() bool { return p.hanging() >= 1 && len(e.copies("g", "fast")) == 51 }) {
				cancel()
				<-done
				t.Fatalf("slow's call held %d, fast's events %d; status %+v", p.hanging(), len(e.copies("g", "fast")), d.Status())
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			p.setStream("slow", pass)

			cfg.LogStream = "new-${tag}"
			logs := e.rerun(cfg)
			for stream, want := range map[string]map[string]int{
				"fast":     {`{"log":"fast-0"}`: 1, `{"log":"fast-49"}`: 1},
				"new-fast": {`{"log":"fast-0"}`: 0, `{"log":"fast-49"}`: 0},
				"slow":     {`{"log":"slow-0"}`: map[string]int{land: 1, hang: 0}[what]},
				"new-slow": {`{"log":"slow-0"}`: map[string]int{land: 0, hang: 1}[what]},
			} {
				got := e.copies("g", stream)
				for msg, n := range want {
					if got[msg] != n {
						t.Errorf("stream %s holds %s %d times, want %d", stream, msg, got[msg], n)
					}
				}
			}
			if n := len(e.copies("g", "new-fast")); n != 0 {
				t.Errorf("stream new-fast holds %d events, want none", n)
			}
			result, skipped := resultResent, 50.0
			if what == land {
				result, skipped = resultDelivered, 51
			}
			if e.indoubt(result) != 1 {
				t.Errorf("in doubt: %s %v, want 1\n%s", result, e.indoubt(result), logs)
			}
			if n := testutil.ToFloat64(e.qm.Skipped.WithLabelValues("cw")); n != skipped {
				t.Errorf("%v records skipped as delivered, want %v", n, skipped)
			}
			if n := e.intentsLeft(); n != 0 {
				t.Errorf("%d intents left", n)
			}
		})
	}
}
