package e2e

import (
	"fmt"
	"net/http"
	"testing"
	"time"
)

// TestOldAndFutureEvents sends, over HTTP with a time field, records 20 days
// old and 3 hours ahead among current ones: CloudWatch Logs cannot take them
// (14 days back, 2 hours ahead at most), so its sink dead-letters them with
// the reasons too_old and too_new, which `forwarder wal dead-letters` lists;
// S3 still has every record, once.
func TestOldAndFutureEvents(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.f.start()
	now := time.Now()
	kinds := []struct {
		name   string
		at     time.Time
		reason string // the cloudwatch sink's dead-letter reason; "" delivered
	}{
		{"now", now, ""},
		{"old", now.Add(-20 * 24 * time.Hour), "too_old"},
		{"new", now.Add(3 * time.Hour), "too_new"},
	}
	want := map[string]string{} // id → reason
	hc := &http.Client{Timeout: 30 * time.Second}
	n := 0
	for round := 0; round < 4; round++ {
		for _, k := range kinds {
			for _, ns := range []string{"shop", "pay"} {
				var recs []record
				var payload []byte
				for i := 0; i < 10; i++ {
					r := record{ID: fmt.Sprintf("e-%s-%07d", k.name, n), NS: ns, Pod: fmt.Sprintf("web-%d", i%3),
						Log: "event " + k.name, Time: k.at.Add(time.Duration(n) * time.Millisecond)}
					n++
					recs = append(recs, r)
					payload = append(append(payload, r.json()...), '\n')
					want[r.ID] = k.reason
				}
				e.led.sent(recs)
				code, _, body, err := postNDJSON(hc, e.f.cfg.HTTP, "pod."+ns, fmt.Sprintf("e-%d", n), payload)
				if err != nil || code != http.StatusOK {
					t.Fatalf("POST %s records: %d %s %v", k.name, code, body, err)
				}
				e.led.ack(recs)
			}
		}
	}
	dead := e.settle(time.Minute)
	tl := e.account(dead)
	cw := readCW(t, e.cwURL)

	got := map[string]int{}
	for id, reason := range want {
		dl, ok := dead["cloudwatch"][id]
		switch {
		case reason == "" && ok:
			t.Errorf("%s: dead-lettered (%s), want it delivered", id, dl)
		case reason != "" && dl != reason:
			t.Errorf("%s: dead letter reason %q, want %q", id, dl, reason)
		case reason != "" && len(cw.Places[id]) > 0:
			t.Errorf("%s: dead-lettered as %s and in CloudWatch too: %v", id, reason, cw.Places[id])
		}
		if dl == "" {
			dl = "delivered"
		}
		got[dl]++
		if _, ok := dead["archive"][id]; ok {
			t.Errorf("%s: dead-lettered by the S3 sink", id)
		}
	}
	t.Logf("%d records: in CloudWatch or dead-lettered by its sink: %v (%d in all sinks)", len(want), got, len(dead["cloudwatch"])+len(dead["archive"]))
	t.Logf("%v", tl)
	t.Logf("forwarder log: %s", e.f.logSummary())
	checkDead(t, tl, 0, 2*len(want)/3)
}
