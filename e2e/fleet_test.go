package e2e

import (
	"fmt"
	"maps"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestFleet runs three replicas behind one bucket and one CloudWatch Logs,
// each with its own data_dir and its replica's name in its keys, and
// forward clients with acks that fail over between them as Fluent Bit's
// upstreams do. One replica is SIGKILLed and started again, one is scaled
// in (SIGTERM with drain_on_shutdown) and never comes back. Every
// acknowledged record is in S3 exactly once and in CloudWatch at least
// once; the scaled-in replica left nothing in its WAL.
func TestFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: three replicas, a kill and a scale-in (about 15 s); make test runs it")
	}
	t.Parallel()
	_, s3URL := startS3(t)
	_, cwURL := startCW(t)
	const replicas = 3
	var fleet []*forwarder
	var addrs []string
	for i := range replicas {
		name := fmt.Sprintf("forwarder-%d", i)
		s3 := strings.Replace(s3Sink("archive", s3URL, bucket), "max_object_age: 1s", "max_object_age: 2s", 1) +
			"    key: \"logs/${tag}/%Y/%m/%d/${env.REPLICA}-${seq}.json.gz\"\n"
		f := newForwarder(t, fwdConfig{DataDir: filepath.Join(t.TempDir(), name), Forward: freeAddr(t), HTTP: freeAddr(t), Admin: freeAddr(t),
			ShutdownTimeout: "20s", DrainOnShutdown: true, Sinks: []string{s3, cwSink("cloudwatch", cwURL, "${record.pod}-${env.REPLICA}")}})
		// A pod's name from the downward API holds its host name; here the
		// replicas share one, and REPLICA tells them apart beside it.
		f.env = []string{"REPLICA=" + e2eHost() + "-" + name}
		f.start()
		fleet = append(fleet, f)
		addrs = append(addrs, f.cfg.Forward)
	}
	led := newLedger()
	opts := clientOpts{Prefix: "fleet", Batch: 50, Pause: 20 * time.Millisecond, Sticky: 3 * time.Second, AckTimeout: 5 * time.Second}
	opts.setDefaults()
	ld := &load{stopCh: make(chan struct{})}
	for i := range 2 * replicas {
		o := opts
		o.Prefix = fmt.Sprintf("%sf%d", opts.Prefix, i)
		// Each client starts at one replica and fails over to the next.
		order := append(append([]string(nil), addrs[i%replicas:]...), addrs[:i%replicas]...)
		ld.fwd = append(ld.fwd, newForwardClient(order, led, o, uint64(i+1), ld.stopCh))
	}
	for _, c := range ld.fwd {
		ld.wg.Add(1)
		go func() {
			defer ld.wg.Done()
			c.run()
		}()
	}

	time.Sleep(2 * time.Second)
	fleet[0].kill()
	time.Sleep(500 * time.Millisecond)
	fleet[0].start()
	time.Sleep(2 * time.Second)
	// Scale-in: the last replica drains and leaves.
	scaledIn := fleet[2]
	scaledIn.stop()
	log := scaledIn.runs[len(scaledIn.runs)-1].String()
	for _, sink := range []string{"archive", "cloudwatch"} {
		if !strings.Contains(log, fmt.Sprintf(`msg="stopping: the sink has delivered everything in the WAL" sink=%s`, sink)) {
			t.Errorf("the scaled-in replica left records of %s in its WAL:\n%s", sink, scaledIn.tail(20))
		}
	}
	time.Sleep(4 * time.Second) // clients of the scaled-in replica fail over
	ld.halt()
	fwd, _ := ld.stats()
	dead := map[string]map[string]string{}
	for _, f := range fleet[:2] {
		f.waitDrained(time.Minute)
		f.stop()
	}
	for _, f := range fleet {
		for sink, m := range f.deadLetters() {
			if dead[sink] == nil {
				dead[sink] = map[string]string{}
			}
			maps.Copy(dead[sink], m)
		}
	}
	// A stream per pod and replica: ${env.REPLICA} keeps them apart, as
	// ${hostname} would on machines of their own.
	inReplicaStream := func(id string, c cwCopy) bool {
		return c.Group == "/e2e/"+c.NS && strings.HasPrefix(c.Stream, c.Pod+"-"+e2eHost()+"-forwarder-")
	}
	tl := account(led.snapshot(), readS3(t, s3URL, bucket), readCW(t, cwURL), dead, "archive", "cloudwatch", inReplicaStream)
	t.Logf("3 replicas, one killed, one scaled in: %v; clients: %v", tl, fwd)
	check(t, tl, 1)
	if fwd.Failovers == 0 {
		t.Error("no client failed over: the scale-in tested nothing")
	}
	if fwd.Abandoned != 0 || len(fwd.Errors) != 0 {
		t.Errorf("clients abandoned %d batches, errors %v", fwd.Abandoned, fwd.Errors)
	}
}
