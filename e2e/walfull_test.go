package e2e

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestWALFullBlock fills a 1 MiB WAL (when_full: block) while S3 refuses
// every request (403 AccessDenied: the sink pauses and nothing drains):
// HTTP clients get 503 with Retry-After (a request already waiting for room
// gets it after 5 s), forward acks wait. Once S3 accepts again, everything
// acknowledged arrives.
func TestWALFullBlock(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: fills a WAL through the binary (about 30 s); make test runs it")
	}
	t.Parallel()
	hold := 3 * time.Second
	if long {
		hold = 20 * time.Second
	}
	e := newEnv(t, func(c *fwdConfig) { c.WALMaxBytes, c.WALWhenFull = "1MiB", "block" })
	e.s3.SetDenyAll(true)
	e.f.start()
	ld := startLoad(t, e.f.cfg, e.led, 1, 1, clientOpts{Prefix: "b", Batch: 100, AckTimeout: 3 * time.Minute})
	if !waitFor(30*time.Second, func() bool { st, err := e.f.status(); return err == nil && st.WAL.Full }) {
		st, _ := e.f.status()
		t.Fatalf("the WAL did not fill within 30s: %+v\n%s", st.WAL, e.f.tail(20))
	}
	fullAt := time.Now()
	_, ackedFull := e.led.counts()
	got503 := waitFor(15*time.Second, func() bool {
		_, h := ld.stats()
		return h.Status[http.StatusServiceUnavailable] > 0
	})
	if wait := hold - time.Since(fullAt); wait > 0 {
		time.Sleep(wait)
	}
	held := time.Since(fullAt)
	_, ackedHeld := e.led.counts()
	readyz, readyBody, _ := e.f.adminGet("/readyz")
	_, http503 := ld.stats()
	fwdPending := ld.fwd[0].pending()
	st, _ := e.f.status()

	if fwdPending < held {
		t.Errorf("the forward client's chunk waited %v for its ack after %v of a full WAL; want it held back", fwdPending, held)
	}
	if !got503 {
		t.Errorf("no HTTP 503 within 15s of the WAL filling: %v", http503.Status)
	}
	// An ack on its way when the WAL was seen full may land after: one batch per client.
	if ackedHeld > ackedFull+200 {
		t.Errorf("%d records acknowledged while the WAL was full and nothing drained", ackedHeld-ackedFull)
	}
	if http503.NoRetryAft > 0 {
		t.Errorf("%d HTTP 503 answers without Retry-After", http503.NoRetryAft)
	}
	if readyz != http.StatusServiceUnavailable {
		t.Errorf("/readyz answered %d while the WAL was full and S3 paused: %s", readyz, readyBody)
	}
	if st.WAL.Bytes > st.WAL.MaxBytes {
		t.Errorf("the WAL holds %d bytes, over max_bytes %d", st.WAL.Bytes, st.WAL.MaxBytes)
	}

	e.s3.SetDenyAll(false)
	restored := time.Now()
	resumed := waitFor(90*time.Second, func() bool { _, a := e.led.counts(); return a >= ackedHeld+1000 })
	resumeAfter := time.Since(restored)
	if !resumed {
		t.Errorf("the inputs acknowledged too little in the 90s after S3 came back")
	}
	ld.halt()
	fwd, httpSt := ld.stats()
	dead := e.settle(90 * time.Second)
	tl := e.account(dead)
	t.Logf("WAL full (%d of %d bytes) after %d records; %d more acknowledged in the %v it was held; forward chunk held %v; HTTP 503s %d; /readyz %d %s",
		st.WAL.Bytes, st.WAL.MaxBytes, ackedFull, ackedHeld-ackedFull, held.Round(100*time.Millisecond), fwdPending.Round(100*time.Millisecond),
		http503.Status[http.StatusServiceUnavailable], readyz, oneLine(readyBody))
	t.Logf("S3 accepting again: the inputs resumed %v later (the paused sink probes after 1 s, doubling the wait up to 30 s)", resumeAfter.Round(100*time.Millisecond))
	t.Logf("%v", tl)
	t.Logf("forward: %v; http: %v", fwd, httpSt)
	t.Logf("forwarder log: %s", e.f.logSummary())
	check(t, tl, 0)
	for _, err := range append(fwd.Errors, httpSt.Errors...) {
		t.Errorf("client: %s", err)
	}
}

// TestWALFullDropOldest overfills a 1 MiB WAL (when_full: drop_oldest)
// while S3 refuses every request: the inputs never push back, and the
// records missing from S3 at the end are exactly the ones the forwarder
// counted as dropped for it (forwarder_wal_dropped_records_total and
// `forwarder wal stats`), the oldest ones.
func TestWALFullDropOldest(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: fills a WAL through the binary (about 30 s); make test runs it")
	}
	t.Parallel()
	batches := 100
	if long {
		batches = 400
	}
	e := newEnv(t, func(c *fwdConfig) { c.WALMaxBytes, c.WALWhenFull = "1MiB", "drop_oldest" })
	e.s3.SetDenyAll(true)
	e.f.start()
	ld := startLoad(t, e.f.cfg, e.led, 1, 1, clientOpts{Prefix: "d", Batch: 100, Batches: batches})
	ld.wait()
	fwd, httpSt := ld.stats()
	const droppedS3, droppedCW = `forwarder_wal_dropped_records_total{sink="archive"}`, `forwarder_wal_dropped_records_total{sink="cloudwatch"}`
	m := e.f.mustMetrics()
	st, _ := e.f.status()
	if m[droppedS3] == 0 {
		t.Fatalf("nothing dropped after %d records into a 1 MiB WAL: %+v", fwd.Records+httpSt.Records, st.WAL)
	}
	e.s3.SetDenyAll(false)
	drained := e.f.waitDrained(90 * time.Second)
	m2 := e.f.mustMetrics()
	e.f.stop()
	stats := e.f.walStats()
	dead := e.f.deadLetters()
	led := e.led.snapshot()
	s3r, cw := readS3(t, e.s3URL, bucket), readCW(t, e.cwURL)
	tl := account(led, s3r, cw, dead, "archive", "cloudwatch", inPodStream)

	dropped := int(m[droppedS3])
	t.Logf("%d records sent, none pushed back (longest ack wait: forward %v, HTTP %v); dropped: archive %v, cloudwatch %v (/status %v; wal stats: archive %d, cloudwatch %d)",
		tl.Acked, fwd.MaxAckWait.Round(time.Millisecond), httpSt.MaxAckWait.Round(time.Millisecond), m[droppedS3], m[droppedCW], st.WAL.Dropped,
		stats["archive"].Dropped, stats["cloudwatch"].Dropped)
	t.Logf("S3 accepting again: drained %v later", drained.Round(100*time.Millisecond))
	t.Logf("%v", tl)
	t.Logf("forwarder log: %s", e.f.logSummary())
	if m2[droppedS3] != m[droppedS3] {
		t.Errorf("dropped for archive went from %v to %v after the clients stopped", m[droppedS3], m2[droppedS3])
	}
	if tl.S3Missing != dropped || int(stats["archive"].Dropped) != dropped || int(st.WAL.Dropped["archive"]) != dropped {
		t.Errorf("missing from S3: %d; dropped for archive: %d in /metrics, %d in /status, %d in wal stats: they should all agree",
			tl.S3Missing, dropped, st.WAL.Dropped["archive"], stats["archive"].Dropped)
	}
	if tl.CWMissing > int(m[droppedCW]) {
		t.Errorf("missing from CloudWatch: %d, more than the %v dropped for it", tl.CWMissing, m[droppedCW])
	}
	if tl.S3Dups != 0 || tl.S3Unknown != 0 || tl.CWMisplaced != 0 || tl.CWUnknown != 0 || tl.CWDups != 0 || len(tl.bad) != 0 {
		t.Errorf("S3 dup %d unknown %d; CloudWatch dup %d misplaced %d unknown %d; unreadable %q; want none",
			tl.S3Dups, tl.S3Unknown, tl.CWDups, tl.CWMisplaced, tl.CWUnknown, tl.bad)
	}
	if bad := notOldest(led, s3r.Counts); bad != "" {
		t.Errorf("the records missing from S3 are not the oldest ones: %s", bad)
	}
	if fwd.MaxAckWait > 10*time.Second || httpSt.Status[http.StatusServiceUnavailable] > 0 {
		t.Errorf("drop_oldest pushed back on the inputs: longest forward ack wait %v, HTTP statuses %v", fwd.MaxAckWait, httpSt.Status)
	}
	for _, err := range append(fwd.Errors, httpSt.Errors...) {
		t.Errorf("client: %s", err)
	}
}

// notOldest checks, for each client (the id's prefix), that the records
// missing from counts come before every record present; it describes the
// first client where they do not.
func notOldest(led map[string]bool, counts map[string]int) string {
	type span struct{ lastMissing, firstPresent int }
	spans := map[string]*span{}
	for id := range led {
		i := strings.LastIndexByte(id, '-')
		n, err := strconv.Atoi(id[i+1:])
		if err != nil {
			return "bad id " + id
		}
		s := spans[id[:i]]
		if s == nil {
			s = &span{lastMissing: -1, firstPresent: 1 << 62}
			spans[id[:i]] = s
		}
		if counts[id] == 0 {
			s.lastMissing = max(s.lastMissing, n)
		} else {
			s.firstPresent = min(s.firstPresent, n)
		}
	}
	for c, s := range spans {
		if s.lastMissing > s.firstPresent {
			return fmt.Sprintf("client %s: record %d missing, record %d present", c, s.lastMissing, s.firstPresent)
		}
	}
	return ""
}

// oneLine squeezes an answer's body onto one line, cut at 160 bytes.
func oneLine(b []byte) string {
	s := strings.Join(strings.Fields(string(b)), " ")
	if len(s) > 160 {
		s = s[:160] + "..."
	}
	return s
}
