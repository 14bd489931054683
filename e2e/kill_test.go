package e2e

import (
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/logfwd/forwarder/internal/testseed"
)

// TestKillLoop sends continuously through both inputs while the forwarder is
// SIGKILLed at random moments and started again on the same data_dir; the
// clients reconnect and send again, identical, whatever was not
// acknowledged. At the end every acknowledged record is in S3 exactly once
// and in CloudWatch Logs exactly once: the PutLogEvents calls a kill left
// in doubt are resolved at the next start by reading their streams back.
func TestKillLoop(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a SIGKILL loop of the binary; make test runs it")
	}
	kills, maxGap := 10, 1500*time.Millisecond
	if long {
		kills, maxGap = 100, 3*time.Second
	}
	e := newEnv(t, nil)
	killLoop(t, e, kills, maxGap, 0)
}

// TestKillLoopReadDelay is TestKillLoop with CloudWatch Logs events
// readable only a second after the call that stored them, past settle
// (200ms): a call in doubt that landed is not seen and is sent again. The
// duplicates are counted, and bounded by the events of the calls sent
// again at each start; nothing is missing.
func TestKillLoopReadDelay(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a SIGKILL loop of the binary; make test runs it")
	}
	t.Parallel()
	kills, maxGap := 4, 1500*time.Millisecond
	if long {
		kills, maxGap = 30, 3*time.Second
	}
	e := newEnv(t, nil)
	e.cw.SetReadDelay(time.Second)
	killLoop(t, e, kills, maxGap, -1)
}

// killLoop runs the kill loop on e. cwDups is how many CloudWatch
// duplicates are allowed; -1: the events the forwarder said it sent again
// without finding them in the stream.
func killLoop(t *testing.T, e *env, kills int, maxGap time.Duration, cwDups int) {
	t.Helper()
	// Slow destinations keep uploads and PutLogEvents calls in flight long
	// enough for kills to land in them: S3 intents are then finished at the
	// next start, and CloudWatch calls resolved.
	cfg := e.f.cfg
	s3 := slowProxy(t, e.s3URL, 150*time.Millisecond)
	cfg.Sinks[0] = s3Sink("archive", s3.URL, bucket)
	e.f.setConfig(cfg)
	e.cw.SetLatency(50 * time.Millisecond)
	e.f.start()
	ld := startLoad(t, e.f.cfg, e.led, 2, 2, clientOpts{Prefix: "k", Batch: 50, Pause: 25 * time.Millisecond})
	seed := uint64(testseed.Seed(t, "E2E_KILL_SEED", "the kill times"))
	rng := rand.New(rand.NewPCG(seed, seed))
	var prev int
	stalled := 0
	for i := 0; i < kills; i++ {
		// Some kills land in the start (intents being recovered, streams
		// being created), most in full flow.
		time.Sleep(50*time.Millisecond + time.Duration(rng.Int64N(int64(maxGap))))
		if i == kills/2 {
			// This one in an upload, whatever the times drawn: its
			// intent is finished at the next start.
			// Polled often: a hold lasts 150ms.
			for deadline := time.Now().Add(10 * time.Second); s3.holding.Load() == 0; time.Sleep(2 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("no S3 upload within 10s under load")
				}
			}
		}
		e.f.kill()
		e.f.start()
		if _, acked := e.led.counts(); acked == prev {
			stalled++
		} else {
			prev = acked
		}
	}
	time.Sleep(500 * time.Millisecond)
	ld.halt()
	fwd, http := ld.stats()
	dead := e.settle(time.Minute)
	e.cw.SetLatency(0)   // for reading back
	e.cw.SetReadDelay(0) // likewise
	tl := e.account(dead)
	const resolved = `msg="resolved PutLogEvents calls an earlier run left in doubt`
	again := e.f.logSum(resolved, "events_sent_again")
	t.Logf("%d kills (seed %d; %d interrupted S3 uploads finished at a restart; CloudWatch calls in doubt: %d delivered, %d resent, %d partial, %d unresolved, %d events sent again): %v",
		e.f.kills, seed, e.f.logCount(`msg="finished an interrupted upload"`), e.f.logSum(resolved, "delivered"), e.f.logSum(resolved, "resent"),
		e.f.logSum(resolved, "partial"), e.f.logSum(resolved, "unresolved"), again, tl)
	t.Logf("forward: %v; http: %v", fwd, http)
	t.Logf("forwarder log: %s", e.f.logSummary())
	if cwDups < 0 {
		cwDups = again
		if e.f.logSum(resolved, "resent") == 0 {
			t.Errorf("no CloudWatch call in doubt was sent again: the read delay tested nothing")
		}
	}
	check(t, tl, cwDups)
	if e.f.logCount(`msg="finished an interrupted upload"`) == 0 {
		// One kill waited for an upload held by the proxy.
		t.Errorf("no interrupted S3 upload was finished at a restart in %d kills", kills)
	}
	if stalled > kills/2 {
		t.Errorf("no record was acknowledged between %d of %d kills", stalled, kills)
	}
	for _, err := range append(fwd.Errors, http.Errors...) {
		t.Errorf("client: %s", err)
	}
}

// heldProxy is a reverse proxy that holds each request that writes.
type heldProxy struct {
	URL     string
	holding atomic.Int32 // requests being held now
}

// slowProxy serves target behind a reverse proxy that holds each request
// that writes (PUT, POST) for delay first.
func slowProxy(t *testing.T, target string, delay time.Duration) *heldProxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	p := &heldProxy{}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ErrorLog = log.New(io.Discard, "", 0) // a killed client's aborted requests are expected
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut || r.Method == http.MethodPost {
			p.holding.Add(1)
			select {
			case <-time.After(delay):
				p.holding.Add(-1)
			case <-r.Context().Done():
				p.holding.Add(-1)
				return
			}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	p.URL = srv.URL
	return p
}
