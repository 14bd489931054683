package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestRestartWithChangedConfig stops the forwarder with records still in
// its WAL and starts it with another CloudWatch stream template and a second
// S3 sink:
//   - phase 1a: sent and delivered by both sinks;
//   - phase 1b: sent while S3 and CloudWatch Logs refuse every request, so
//     they are still in the WAL at the stop;
//   - phase 2: sent after the restart, with log_stream "${record.pod}-${hostname}-v2" and
//     a new sink "archive2" (another bucket).
//
// Everything acknowledged is in the first bucket exactly once and in
// CloudWatch at least once: phase 1a in the old streams, phase 1b and 2 in
// the new ones (a record is named by the configuration that delivers it).
// archive2 starts its cursor at the oldest record still in the WAL: it gets
// phase 1b and phase 2, exactly once, and whatever of phase 1a retention had
// not deleted yet.
func TestRestartWithChangedConfig(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: several restarts of the binary; make test runs it")
	}
	t.Parallel()
	const bucket2 = "e2e-archive2"
	e := newEnv(t, nil)
	if err := e.s3.CreateBucket(bucket2); err != nil {
		t.Fatal(err)
	}
	e.f.start()
	send := func(prefix string, batches int) {
		ld := startLoad(t, e.f.cfg, e.led, 1, 1, clientOpts{Prefix: prefix, Batch: 50, Batches: batches, Pause: 10 * time.Millisecond})
		ld.wait()
		fwd, http := ld.stats()
		for _, err := range append(fwd.Errors, http.Errors...) {
			t.Errorf("client: %s", err)
		}
	}
	send("r1a", 20)
	e.f.waitDrained(time.Minute)
	e.s3.SetDenyAll(true)
	e.cw.SetDenyAll("AccessDeniedException")
	send("r1b", 20)
	var st1 status
	// CloudWatch pauses once every group that sends has been refused (one
	// refused while another still takes events is only retried).
	paused := waitFor(30*time.Second, func() bool {
		var err error
		st1, err = e.f.status()
		return err == nil && len(st1.Sinks) == 2 && st1.Sinks[0].State == "paused" && st1.Sinks[1].State == "paused"
	})
	if !paused {
		t.Errorf("the sinks did not pause on the refusals: %s", sinkLags(st1))
	}
	e.f.stop()
	e.s3.SetDenyAll(false)
	e.cw.SetDenyAll("")

	cfg := e.f.cfg
	cfg.Sinks = []string{
		s3Sink("archive", e.s3URL, bucket),
		cwSink("cloudwatch", e.cwURL, podStream+"-v2"),
		s3Sink("archive2", e.s3URL, bucket2),
	}
	e.f.setConfig(cfg)
	e.f.start()
	stRestart, _ := e.f.status()
	send("r2", 20)
	dead := e.settle(time.Minute)

	led := e.led.snapshot()
	s3r, s3r2, cw := readS3(t, e.s3URL, bucket), readS3(t, e.s3URL, bucket2), readCW(t, e.cwURL)
	placed := func(id string, c cwCopy) bool {
		stream := c.Pod + "-" + e2eHost() + "-v2"
		if strings.HasPrefix(id, "r1a") {
			stream = c.Pod + "-" + e2eHost()
		}
		return c.Group == "/e2e/"+c.NS && c.Stream == stream
	}
	tl := account(led, s3r, cw, dead, "archive", "cloudwatch", placed)
	check(t, tl, 0)

	// archive2: phase 1b and 2 exactly once; phase 1a as retention left it.
	var phase1a, want2, got1a, missing2, dup2, unknown2 int
	for id, acked := range led {
		if !acked {
			continue
		}
		n := s3r2.Counts[id]
		if strings.HasPrefix(id, "r1a") {
			phase1a++
			if n > 0 {
				got1a++
			}
		} else {
			want2++
			if n == 0 {
				missing2++
			}
		}
		if n > 1 {
			dup2 += n - 1
		}
	}
	for id := range s3r2.Counts {
		if _, ok := led[id]; !ok {
			unknown2++
		}
	}
	if missing2 != 0 || dup2 != 0 || unknown2 != 0 || len(s3r2.Bad) != 0 {
		t.Errorf("archive2: %d of the %d records of phases 1b and 2 missing, %d duplicate copies, %d unknown, bad %v",
			missing2, want2, dup2, unknown2, s3r2.Bad)
	}
	if got1a != 0 && got1a != phase1a {
		t.Logf("archive2 got part of phase 1a: %d of %d", got1a, phase1a)
	}
	t.Logf("at the stop the WAL held %d records (sinks: %s); at the restart %d; archive2 got %d of phase 1b+2's %d and %d of phase 1a's %d",
		st1.WAL.Records, sinkLags(st1), stRestart.WAL.Records, want2-missing2, want2, got1a, phase1a)
	t.Logf("%v", tl)
	var oldStreams, newStreams, oldEvents, newEvents int
	for place, n := range cw.Streams {
		if strings.HasSuffix(place, "-v2") {
			newStreams, newEvents = newStreams+1, newEvents+n
		} else {
			oldStreams, oldEvents = oldStreams+1, oldEvents+n
		}
	}
	t.Logf("CloudWatch: %d events in %d streams named by the old template, %d in %d named by the new one", oldEvents, oldStreams, newEvents, newStreams)
	t.Logf("forwarder log: %s", e.f.logSummary())
}

// sinkLags is each sink's state and lag, on one line.
func sinkLags(st status) string {
	var parts []string
	for _, s := range st.Sinks {
		parts = append(parts, fmt.Sprintf("%s %s lag %d", s.Sink, s.State, s.LagRecords))
	}
	return strings.Join(parts, ", ")
}
