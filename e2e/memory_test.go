package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"
)

// TestMemoryBound: both destinations fail every request while clients send
// as fast as their acks allow, far more than the sinks may hold. With the
// default memory_limit (128 MiB: shares of 32 MiB for S3 and 16 MiB for
// CloudWatch), the sinks hold no more than their shares, the batches waiting
// for a retry and one read of the WAL, and the forwarder's anonymous memory
// stays under 150 MB, while the
// backlog grows and then while it drains. Everything acknowledged is then
// delivered.
func TestMemoryBound(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the binary under load for about 40 s; make test runs it")
	}
	e := newEnv(t, nil)
	e.s3.SetFailures(1)
	e.cw.SetFailures(1, 503)
	e.f.start()
	peak := watchRssAnon(t, e.f.pid())

	batches := 30 // per client: 180,000 records of about 350 bytes
	if long {
		batches = 150
	}
	most := watchBuffered(e.f)
	ld := startLoad(t, e.f.cfg, e.led, 4, 2, clientOpts{Prefix: "m", Batch: 1000, Batches: batches, LogBytes: 200})
	ld.wait()
	// The shares are full: the drainers wait with what they hold.
	time.Sleep(2 * time.Second)
	st, err := e.f.status()
	if err != nil {
		t.Fatal(err)
	}
	held := most()
	const read = 10000 * 600 // one read of the WAL: 10,000 records, counted at most 600 bytes each here
	share := map[string]int64{"archive": 32 << 20, "cloudwatch": 16 << 20}
	metrics := e.f.mustMetrics()
	for _, s := range st.Sinks {
		// The share bounds what is queued and in flight; batches waiting for a
		// retry come on top, cut from no more than the share. Both are read
		// from /status every 100 ms while the load runs: once the partitions
		// waiting out their retries release what they queued beyond their
		// batches (a spill), a sink holds little, so the figure at the end
		// says nothing about the bound.
		if held[s.Sink] > 2*share[s.Sink]+read {
			t.Errorf("sink %s held up to %d bytes of records, its share is %d", s.Sink, held[s.Sink], share[s.Sink])
		}
		if held[s.Sink] < share[s.Sink]/2 {
			t.Errorf("sink %s held at most %d bytes of records: the load did not fill its share (%d), so the bound was not tested", s.Sink, held[s.Sink], share[s.Sink])
		}
		t.Logf("sink %s: held up to %d bytes, %d at the end, %v spills", s.Sink, held[s.Sink], s.Buffered,
			metrics[fmt.Sprintf("forwarder_sink_spills_total{sink=%q}", s.Sink)])
		if s.State != "retrying" && s.State != "throttled" { // S3's 503 SlowDown throttles
			t.Errorf("sink %s is %q while every request fails, want retrying or throttled", s.Sink, s.State)
		}
	}
	during := peak()
	e.s3.SetFailures(0)
	e.cw.SetFailures(0, 0)
	fwd, http := ld.stats()
	dead := e.settle(2 * time.Minute)
	after := peak()
	tl := e.account(dead)
	t.Logf("peak RssAnon %.1f MiB while %d records piled up (%d in the WAL), %.1f MiB while they drained; sinks held %v",
		float64(during)/(1<<20), tl.Acked, st.WAL.Records, float64(after)/(1<<20), buffered(st))
	t.Logf("%v", tl)
	t.Logf("forward: %v; http: %v", fwd, http)
	check(t, tl, 0)
	const target = 150_000_000
	if after > target {
		t.Errorf("peak RssAnon %d bytes, more than %d", after, target)
	}
}

// watchBuffered polls /status every 100 ms until the function it returns is
// called, which returns the most bytes each sink held at any poll.
func watchBuffered(f *forwarder) func() map[string]int64 {
	stop, done := make(chan struct{}), make(chan map[string]int64, 1)
	go func() {
		most := map[string]int64{}
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			if st, err := f.status(); err == nil {
				for _, s := range st.Sinks {
					most[s.Sink] = max(most[s.Sink], int64(s.Buffered))
				}
			}
			select {
			case <-stop:
				done <- most
				return
			case <-tick.C:
			}
		}
	}()
	return func() map[string]int64 {
		close(stop)
		return <-done
	}
}

func buffered(st status) string {
	var b bytes.Buffer
	for _, s := range st.Sinks {
		fmt.Fprintf(&b, "%s %.1f MiB; ", s.Sink, float64(s.Buffered)/(1<<20))
	}
	return b.String()
}

// watchRssAnon samples the RssAnon of process pid every 20 ms until the
// test ends; peak returns the largest value so far, in bytes.
func watchRssAnon(t *testing.T, pid int) (peak func() int64) {
	var mu sync.Mutex
	var max int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if v, ok := rssAnon(pid); ok {
				mu.Lock()
				max = maxOf(max, v)
				mu.Unlock()
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	if _, ok := rssAnon(pid); !ok {
		t.Fatalf("cannot read RssAnon of process %d from /proc", pid)
	}
	return func() int64 {
		mu.Lock()
		defer mu.Unlock()
		return max
	}
}

func maxOf(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

// rssAnon reads RssAnon (anonymous resident memory) of pid, in bytes.
func rssAnon(pid int) (int64, bool) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Bytes()
		if rest, ok := bytes.CutPrefix(line, []byte("RssAnon:")); ok {
			fields := bytes.Fields(rest)
			if len(fields) == 2 && string(fields[1]) == "kB" {
				kb, err := strconv.ParseInt(string(fields[0]), 10, 64)
				return kb << 10, err == nil
			}
		}
	}
	return 0, false
}
