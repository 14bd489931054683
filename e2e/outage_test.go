package e2e

import (
	"strings"
	"testing"
	"time"
)

// TestSinkOutage fails every S3 request (503 SlowDown) for a while under
// load: CloudWatch Logs keeps receiving and the inputs keep acknowledging
// (one sink's outage holds back neither the other nor the inputs); once S3
// answers again, everything acknowledged is delivered.
func TestSinkOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: an S3 outage of several seconds; make test runs it")
	}
	outage := 5 * time.Second
	if long {
		outage = 30 * time.Second
	}
	e := newEnv(t, nil)
	e.f.start()
	ld := startLoad(t, e.f.cfg, e.led, 1, 1, clientOpts{Prefix: "o", Batch: 50, Pause: 25 * time.Millisecond})
	time.Sleep(time.Second)

	const cwDelivered = `forwarder_sink_delivered_records_total{sink="cloudwatch"}`
	const s3Delivered = `forwarder_sink_delivered_records_total{sink="archive"}`
	e.s3.SetFailures(1)
	time.Sleep(time.Second) // the uploads in flight when it began finish
	m0 := e.f.mustMetrics()
	_, acked0 := e.led.counts()
	time.Sleep(outage)
	m1 := e.f.mustMetrics()
	_, acked1 := e.led.counts()
	e.s3.SetFailures(0)
	restored := time.Now()

	if m1[cwDelivered] <= m0[cwDelivered] {
		t.Errorf("CloudWatch delivered %v records before the S3 outage and %v at its end: it stalled", m0[cwDelivered], m1[cwDelivered])
	}
	if acked1 <= acked0 {
		t.Errorf("the inputs acknowledged nothing during the S3 outage (%d records before and after)", acked0)
	}
	if s3d := m1[s3Delivered] - m0[s3Delivered]; s3d != 0 {
		t.Errorf("S3 delivered %v records while every request failed", s3d)
	}
	s3Retries := sumMetric(m1, `forwarder_sink_retries_total{`, `sink="archive"`)
	if s3Retries == 0 {
		t.Errorf("no S3 send was retried during the outage: %v", sumMetric(m1, "forwarder_sink_retries_total{", ""))
	}

	time.Sleep(time.Second)
	ld.halt()
	fwd, http := ld.stats()
	drain := e.f.waitDrained(90 * time.Second)
	catchUp := time.Since(restored)
	dead := e.settle(time.Minute)
	tl := e.account(dead)
	t.Logf("S3 outage of %v (%v S3 sends retried): CloudWatch delivered %v records and the inputs acknowledged %d during it; S3 caught up %v after it ended (drained %v after the clients stopped)",
		outage, s3Retries, m1[cwDelivered]-m0[cwDelivered], acked1-acked0, catchUp.Round(100*time.Millisecond), drain.Round(100*time.Millisecond))
	t.Logf("%v", tl)
	t.Logf("forward: %v; http: %v", fwd, http)
	t.Logf("forwarder log: %s", e.f.logSummary())
	check(t, tl, 0)
	for _, err := range append(fwd.Errors, http.Errors...) {
		t.Errorf("client: %s", err)
	}
}

// sumMetric sums the series whose key starts with prefix and contains label.
func sumMetric(m map[string]float64, prefix, label string) float64 {
	var sum float64
	for k, v := range m {
		if strings.HasPrefix(k, prefix) && strings.Contains(k, label) {
			sum += v
		}
	}
	return sum
}
