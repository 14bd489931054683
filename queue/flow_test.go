package queue

import (
	"fmt"
	"testing"
	"time"

	"github.com/logfwd/forwarder/sinks"
)

func testFlow() flow {
	return newFlow(8, 100*time.Millisecond, 3*time.Second, 30*time.Second)
}

// The backoff doubles from RetryMin with each failure, stops at RetryMax,
// and is jittered to between half and all of that.
func TestBackoffGrowsToItsCap(t *testing.T) {
	f := testFlow()
	for _, c := range []struct {
		attempts int
		full     time.Duration
	}{
		{1, 100 * time.Millisecond},
		{2, 200 * time.Millisecond},
		{3, 400 * time.Millisecond},
		{5, 1600 * time.Millisecond},
		{6, 3 * time.Second}, // 3.2s, capped
		{7, 3 * time.Second},
		{30, 3 * time.Second},  // the shift stops at 20 doublings
		{100, 3 * time.Second}, // and never overflows
	} {
		lo, hi := c.full, time.Duration(0)
		for range 2000 {
			d := f.backoff(c.attempts)
			lo, hi = min(lo, d), max(hi, d)
		}
		if lo < c.full/2 || hi > c.full {
			t.Errorf("attempt %d: backoff from %v to %v, want within [%v, %v]", c.attempts, lo, hi, c.full/2, c.full)
		}
		// 2000 draws spread over the range: jitter, not a constant.
		if hi-lo < c.full/4 {
			t.Errorf("attempt %d: backoff from %v to %v: no jitter over half of %v", c.attempts, lo, hi, c.full)
		}
	}
}

// Throttling halves the concurrency limit down to 1 and makes everything
// wait at least what the destination asked; each delivery made durable
// raises the limit by one, up to Limits.Concurrency (AIMD).
func TestThrottleAIMD(t *testing.T) {
	f := testFlow()
	now := time.Unix(1000, 0)
	steps := []struct {
		do        string
		wait      time.Duration // asked for by a throttle
		wantLimit int
	}{
		{"throttle", 0, 4},
		{"throttle", 0, 2},
		{"throttle", 0, 1},
		{"throttle", 0, 1}, // never below 1
		{"commit", 0, 2},
		{"commit", 0, 3},
		{"throttle", 10 * time.Second, 1},
		{"commit", 0, 2},
		{"commit", 0, 3}, {"commit", 0, 4}, {"commit", 0, 5}, {"commit", 0, 6}, {"commit", 0, 7}, {"commit", 0, 8},
		{"commit", 0, 8}, // never above Concurrency
	}
	for i, s := range steps {
		switch s.do {
		case "throttle":
			until := f.throttled(s.wait, now)
			if until.Sub(now) < s.wait {
				t.Fatalf("step %d: throttled for %v, asked for %v", i, until.Sub(now), s.wait)
			}
			if !f.holds(now, 0) || !f.holds(until.Add(-time.Nanosecond), 0) || f.holds(until, 0) {
				t.Fatalf("step %d: throttled until %v, but holds sends at the wrong times", i, until)
			}
			if w := f.wake(now, 0); w != until.Sub(now) {
				t.Fatalf("step %d: wakes in %v, throttled for %v", i, w, until.Sub(now))
			}
		case "commit":
			f.committed()
		}
		if f.limit != s.wantLimit {
			t.Fatalf("step %d (%s): limit %d, want %d", i, s.do, f.limit, s.wantLimit)
		}
	}
}

// Throttles in a row back off further; a delivery starts them over.
func TestThrottleBackoffStartsOverAfterDelivery(t *testing.T) {
	f := testFlow()
	now := time.Unix(1000, 0)
	for i := 1; i <= 5; i++ {
		f.throttled(0, now)
	}
	if f.throttles != 5 {
		t.Fatalf("%d throttles counted, want 5", f.throttles)
	}
	// The fifth waits at least half of 1.6s.
	if w := f.throttleUntil.Sub(now); w < 800*time.Millisecond {
		t.Fatalf("fifth throttle waits %v, want at least 800ms", w)
	}
	f.delivered()
	if until := f.throttled(0, now); until.Sub(now) > 100*time.Millisecond {
		t.Fatalf("first throttle after a delivery waits %v, want at most RetryMin", until.Sub(now))
	}
}

// One partition failing again and again is its own affair; failures of
// two or more in a row make the sink retry one batch at a time, with a
// sink-wide wait that only a failed probe lengthens; a success ends it.
func TestRetryingAndProbe(t *testing.T) {
	now := time.Unix(1000, 0)
	a, b := &partition{key: "a"}, &partition{key: "b"}
	steps := []struct {
		fail         *partition
		wantRetrying bool
		wantLimit    int
		wantProbes   int // probeFails
	}{
		{a, false, 8, 0},
		{a, false, 8, 0},
		{a, false, 8, 0}, // three failures, but of one partition
		{b, true, 1, 0},  // two partitions: the sink retries, one at a time
		{a, true, 1, 0},  // not the probe: the wait is not lengthened
	}
	f := testFlow()
	for i, s := range steps {
		at := f.failed(s.fail, 1, now)
		if d := at.Sub(now); d < 50*time.Millisecond || d > 100*time.Millisecond {
			t.Fatalf("step %d: retried in %v, want the first attempt's backoff", i, d)
		}
		if f.retrying() != s.wantRetrying || f.limit != s.wantLimit || f.probeFails != s.wantProbes {
			t.Fatalf("step %d: retrying %v, limit %d, failed probes %d; want %v, %d, %d",
				i, f.retrying(), f.limit, f.probeFails, s.wantRetrying, s.wantLimit, s.wantProbes)
		}
	}
	if !f.holds(now, 0) || f.holds(f.retryUntil, 0) {
		t.Fatalf("retrying until %v: sends held at the wrong times", f.retryUntil)
	}
	// The next send is the probe; its failures lengthen the sink-wide wait.
	for i := 1; i <= 4; i++ {
		if probe := f.sending(b, now); probe {
			t.Fatal("a send while retrying is reported as a pause's probe")
		}
		if f.probe != b {
			t.Fatalf("probe %v, want b", f.probe)
		}
		f.failed(b, i, now)
		if f.probeFails != i || f.probe != nil {
			t.Fatalf("after failed probe %d: %d failed probes, probe %v", i, f.probeFails, f.probe)
		}
		full := min(100*time.Millisecond<<i, 3*time.Second)
		if w := f.retryUntil.Sub(now); w < full/2 || w > full {
			t.Fatalf("after failed probe %d: sink-wide wait %v, want within [%v, %v]", i, w, full/2, full)
		}
	}
	lifted, retryNow := f.succeeded(false, now)
	if lifted != nil || !retryNow {
		t.Fatalf("success while retrying: lifted %v, retry now %v; want nil, true", lifted, retryNow)
	}
	if f.retrying() || f.failStreak != 0 || f.probeFails != 0 || !f.retryUntil.IsZero() || f.holds(now, 0) {
		t.Fatalf("after a success: retrying %v, streak %d, failed probes %d, retry until %v",
			f.retrying(), f.failStreak, f.probeFails, f.retryUntil)
	}
	// A success with no streak asks for nothing.
	if _, retryNow := f.succeeded(false, now); retryNow {
		t.Fatal("a success with no failures before it retries every partition")
	}
}

// A pause holds every send but one probe, the first after pauseFirst and
// each refused one doubling the wait up to PauseRetry; only a probe's
// success lifts it.
func TestPauseAndProbe(t *testing.T) {
	f := testFlow()
	now := time.Unix(1000, 0)
	e := &sinks.Error{Class: sinks.SinkPermanent, Reason: "access_denied"}
	first, probeAt := f.pause(e, false, now)
	if !first || !probeAt.Equal(now.Add(time.Second)) {
		t.Fatalf("pause: first %v, probe at %v; want true, %v", first, probeAt, now.Add(time.Second))
	}
	// Sends in flight when the pause began are refused too: not probes,
	// they do not lengthen the wait.
	if first, probeAt := f.pause(e, false, now); first || !probeAt.Equal(now.Add(time.Second)) {
		t.Fatalf("a second send's refusal: first %v, probe at %v; want false, %v", first, probeAt, now.Add(time.Second))
	}
	for _, c := range []struct {
		at       time.Duration
		inflight int
		want     bool
	}{
		{0, 0, true},
		{999 * time.Millisecond, 0, true},
		{time.Second, 1, true}, // a send in flight: one probe at a time
		{time.Second, 0, false},
	} {
		if got := f.holds(now.Add(c.at), c.inflight); got != c.want {
			t.Errorf("paused, at +%v with %d in flight: holds %v, want %v", c.at, c.inflight, got, c.want)
		}
	}
	if w := f.wake(now, 10*time.Millisecond); w != time.Second {
		t.Fatalf("paused: wakes in %v, want at the probe, 1s", w)
	}
	// Each refused probe doubles the wait, up to PauseRetry (30s).
	at := now
	for _, want := range []time.Duration{2, 4, 8, 16, 30, 30} {
		at = probeAt
		if probe := f.sending(&partition{key: "a"}, at); !probe {
			t.Fatal("a send while paused is not a probe")
		}
		if !f.holds(at, 1) {
			t.Fatal("a second send goes while the probe is out")
		}
		_, probeAt = f.pause(e, true, at.Add(100*time.Millisecond))
		if got := probeAt.Sub(at.Add(100 * time.Millisecond)); got != want*time.Second {
			t.Fatalf("after a refused probe: the next in %v, want %v", got, want*time.Second)
		}
	}
	probeTime := probeAt
	if probe := f.sending(&partition{key: "a"}, probeTime); !probe {
		t.Fatal("a send while paused is not a probe")
	}
	if f.holds(probeTime.Add(29*time.Second), 0) != true {
		t.Fatal("the next probe may go before PauseRetry has passed")
	}
	// A send begun before the pause succeeds: the pause stays.
	if lifted, _ := f.succeeded(false, now); lifted != nil || f.paused == nil {
		t.Fatal("a success that was not a probe lifted the pause")
	}
	lifted, retryNow := f.succeeded(true, probeTime)
	if lifted != e || !retryNow || f.paused != nil {
		t.Fatalf("a probe's success: lifted %v, retry now %v, paused %v; want the error, true, nil", lifted, retryNow, f.paused)
	}
	if f.holds(probeTime, 0) {
		t.Fatal("sends held after the pause was lifted")
	}
	// Paused again for the same reason within PauseRetry of the lift
	// (some partitions refused, the others' probes lift it): each such
	// pause's first wait is twice the one before, whatever the waits of the
	// long pause before it had reached.
	at = probeTime
	for _, want := range []time.Duration{2, 4, 8} {
		at = at.Add(time.Second)
		first, next := f.pause(e, false, at)
		if !first || next.Sub(at) != want*time.Second {
			t.Fatalf("paused again 1s after a lift: first %v, probe in %v; want true, %v", first, next.Sub(at), want*time.Second)
		}
		at = next
		f.succeeded(true, at)
	}
	// Another reason soon after a lift is a new pause: 1s.
	other := &sinks.Error{Class: sinks.SinkPermanent, Reason: "NoSuchBucket"}
	at = at.Add(time.Second)
	if first, probeAt := f.pause(other, false, at); !first || probeAt.Sub(at) != time.Second {
		t.Fatalf("another reason 1s after a lift: first %v, probe in %v; want true, 1s", first, probeAt.Sub(at))
	}
	f.succeeded(true, at)
	// A pause longer after the lift starts again at pauseFirst.
	later := at.Add(time.Minute)
	if first, probeAt := f.pause(e, false, later); !first || !probeAt.Equal(later.Add(time.Second)) {
		t.Fatalf("a new pause: first %v, probe in %v; want true, 1s", first, probeAt.Sub(later))
	}
}

// Two partitions refused for different reasons (a log group the role may
// not write, another that is missing) while the others deliver: each lift
// is followed by both refusals, in the same order. The re-pauses' first
// waits must grow, or every lift and pause costs requests each second.
func TestRepauseOfTwoReasons(t *testing.T) {
	f := newFlow(4, 200*time.Millisecond, 30*time.Second, 30*time.Second)
	a := &sinks.Error{Class: sinks.SinkPermanent, Reason: "AccessDeniedException"}
	b := &sinks.Error{Class: sinks.SinkPermanent, Reason: "ResourceNotFoundException"}
	now := time.Unix(1000, 0)
	var waits []time.Duration
	for i := 0; i < 5; i++ {
		first, probeAt := f.pause(a, false, now) // P1, sent after the lift
		if !first {
			t.Fatal("not a new pause")
		}
		waits = append(waits, probeAt.Sub(now))
		f.pause(b, false, now.Add(10*time.Millisecond)) // P2, sent with it
		now = probeAt
		f.sending(&partition{key: "ok"}, now)
		if lifted, _ := f.succeeded(true, now); lifted == nil { // P3's probe lifts it
			t.Fatal("not lifted")
		}
		now = now.Add(50 * time.Millisecond)
	}
	for i := 1; i < len(waits); i++ {
		if waits[i] <= waits[i-1] && waits[i] < 30*time.Second {
			t.Fatalf("first waits of the re-pauses %v: do not grow", waits)
		}
	}
}

// A streak of failures over many partitions (an outage, a partition per
// pod) holds two of them at most: the streak only asks whether more than
// one failed, and forgotten partitions are not kept alive by it.
func TestFailStreakHoldsTwoPartitions(t *testing.T) {
	var f flow
	now := time.Now()
	for i := range 1000 {
		f.failed(&partition{key: fmt.Sprint(i)}, 1, now)
	}
	if !f.retrying() || len(f.failParts) != 2 {
		t.Fatalf("retrying %v, %d partitions held", f.retrying(), len(f.failParts))
	}
}
