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

// TestCallInDoubtInTheFirstRunAfterANamesChange: the first run after a
// change that puts two streams' records into one stream leaves out what
// the earlier streams delivered, so its call holds a range with gaps; that
// call is left in doubt. The next start reads the range back as the run
// cut it (without what was delivered before the change) and resolves the
// call: found, it is not sent again; not found, it is sent once.
func TestCallInDoubtInTheFirstRunAfterANamesChange(t *testing.T) {
	for _, what := range []string{land, hang} {
		t.Run(what, func(t *testing.T) {
			e, p, cfg := newProxied(t, setup{mod: func(c *config.CloudWatch) { c.LogStream = "${tag}" }})
			e.prime("slow", "fast", "all")
			at := time.Now()
			recs := []wal.Record{{Time: at.UnixNano(), Tag: "slow", Body: []byte(`{"log":"slow-0"}`)}}
			for i := range 50 {
				recs = append(recs, wal.Record{Time: at.Add(time.Duration(i) * time.Millisecond).UnixNano(), Tag: "fast",
					Body: fmt.Appendf(nil, `{"log":"fast-%d"}`, i)})
			}
			recs = append(recs, wal.Record{Time: at.Add(50 * time.Millisecond).UnixNano(), Tag: "slow", Body: []byte(`{"log":"slow-1"}`)})
			e.append(recs...)

			// run drains with cfg until until() holds, then stops.
			run := func(cfg config.CloudWatch, until func() bool, what string) {
				t.Helper()
				e.restart(cfg)
				d := queue.New(e.w, "cw", e.sink, queue.Options{Metrics: e.qm, RetryMin: 5 * time.Millisecond, RetryMax: 50 * time.Millisecond,
					ShutdownTimeout: 10 * time.Millisecond, Fingerprint: e.sink.Fingerprint()})
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { done <- d.Run(ctx) }()
				ok := waitUntil(10*time.Second, until)
				cancel()
				if err := <-done; err != nil {
					t.Fatal(err)
				}
				if !ok {
					t.Fatalf("%s not reached; status %+v", what, d.Status())
				}
			}
			// Run 1: slow's calls fail, fast's records are delivered ahead
			// of the cursor.
			p.setStream("slow", fail)
			run(cfg, func() bool { return len(e.copies("g", "fast")) == 51 }, "fast delivered")
			// Run 2: one stream for both; its call is in doubt.
			p.setStream("all", what)
			cfg.LogStream = "all"
			run(cfg, func() bool { return p.hanging() >= 1 }, "a call in doubt")
			p.setStream("all", pass)
			// Run 3: the call is resolved.
			logs := e.rerun(cfg)

			if got := e.copies("g", "all"); got[`{"log":"slow-0"}`] != 1 || got[`{"log":"slow-1"}`] != 1 || len(got) != 3 {
				t.Errorf("stream all holds %v, want prime's record, slow-0 and slow-1 once each\n%s", got, logs)
			}
			if got := e.copies("g", "fast"); len(got) != 51 || got[`{"log":"fast-0"}`] != 1 || got[`{"log":"fast-49"}`] != 1 {
				t.Errorf("stream fast holds %v, want its 50 records and prime's once each", got)
			}
			if got := e.copies("g", "slow"); len(got) != 1 {
				t.Errorf("stream slow holds %v, want prime's record alone", got)
			}
			result := map[string]string{land: resultDelivered, hang: resultResent}[what]
			if e.indoubt(result) != 1 {
				t.Errorf("in doubt: %s %v, want 1\n%s", result, e.indoubt(result), logs)
			}
			if n := e.intentsLeft(); n != 0 {
				t.Errorf("%d intents left", n)
			}
		})
	}
}
