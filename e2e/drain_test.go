package e2e

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// slowSinks hold what they get: S3 objects wait 5 minutes for their age,
// CloudWatch batches a minute, far longer than the test.
func slowSinks(e *env) []string {
	return []string{
		strings.Replace(strings.Replace(s3Sink("archive", e.s3URL, bucket), "max_object_age: 1s", "max_object_age: 5m", 1), "max_object_bytes: 256KiB", "max_object_bytes: 64MiB", 1),
		strings.Replace(cwSink("cloudwatch", e.cwURL, podStream), "flush_interval: 200ms", "flush_interval: 1m", 1),
	}
}

// TestScaleInDrains stops a forwarder whose sinks hold records back for
// their age limits. Without drain_on_shutdown the stop is quick and logs,
// per sink, what it leaves in the WAL; with it, the stop delivers
// everything (S3 objects are finished, CloudWatch batches sent), says so,
// and exits 0 within shutdown_timeout: every acknowledged record is in S3
// exactly once and in CloudWatch at least once, and nothing is left.
func TestScaleInDrains(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *fwdConfig) { c.ShutdownTimeout = "20s" })
	cfg := e.f.cfg
	cfg.Sinks = slowSinks(e)
	e.f.setConfig(cfg)
	e.f.start()
	send := func(prefix string) {
		ld := startLoad(t, e.f.cfg, e.led, 1, 1, clientOpts{Prefix: prefix, Batch: 100, Batches: 20})
		ld.wait()
		fwd, http := ld.stats()
		for _, err := range append(fwd.Errors, http.Errors...) {
			t.Errorf("client: %s", err)
		}
	}
	send("keep")
	e.f.stop()
	log := e.f.runs[len(e.f.runs)-1].String()
	left := map[string]int{}
	for _, m := range regexp.MustCompile(`msg="stopping: records left in the WAL for the sink[^"]*" sink=(\S+) records=(\d+)`).FindAllStringSubmatch(log, -1) {
		left[m[1]], _ = strconv.Atoi(m[2])
	}
	// The S3 sink delivered nothing (its objects wait 5 minutes); the
	// CloudWatch sink may have sent full batches.
	if left["archive"] != 4000 || left["cloudwatch"] == 0 {
		t.Errorf("records left in the WAL at a stop without draining: %v, want archive 4000 and cloudwatch some:\n%s", left, e.f.tail(20))
	}

	cfg = e.f.cfg
	cfg.DrainOnShutdown = true
	e.f.setConfig(cfg)
	e.f.start()
	send("drain")
	began := time.Now()
	e.f.stop()
	took := time.Since(began)
	log = e.f.runs[len(e.f.runs)-1].String()
	for _, sink := range []string{"archive", "cloudwatch"} {
		if !strings.Contains(log, fmt.Sprintf(`msg="sink drained: every record delivered" sink=%s`, sink)) ||
			!strings.Contains(log, fmt.Sprintf(`msg="stopping: the sink has delivered everything in the WAL" sink=%s`, sink)) {
			t.Errorf("sink %s: no line that it drained and left nothing:\n%s", sink, e.f.tail(20))
		}
	}
	if took > 20*time.Second {
		t.Errorf("the drain took %v, longer than shutdown_timeout", took)
	}
	t.Logf("stop with drain_on_shutdown took %v", took)
	tl := e.account(e.f.deadLetters())
	check(t, tl, 0)
	if tl.Acked != 8000 {
		t.Errorf("%d records acknowledged, want 8000", tl.Acked)
	}
}
