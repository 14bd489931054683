package e2e

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/logfwd/forwarder/internal/mototest"
)

// TestMoto runs the forwarder against moto_server, an independent AWS
// emulator, for both S3 and CloudWatch Logs: one short run without kills;
// every acknowledged record is delivered, in S3 exactly once.
func TestMoto(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: moto_server, started for the test; make test runs it")
	}
	t.Parallel()
	url := mototest.Start(t) // fails, saying pip install 'moto[server]', without moto_server
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := newS3Client(url).CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
		t.Fatalf("create bucket in moto: %v", err)
	}
	led := newLedger()
	f := newForwarder(t, newConfig(t, filepath.Join(t.TempDir(), "data"), url, url))
	f.start()
	run := 2 * time.Second
	if long {
		run = 20 * time.Second
	}
	ld := startLoad(t, f.cfg, led, 1, 1, clientOpts{Prefix: "m", Batch: 50, Pause: 50 * time.Millisecond})
	time.Sleep(run)
	ld.halt()
	fwd, http := ld.stats()
	f.waitDrained(time.Minute)
	f.stop()
	dead := f.deadLetters()
	tl := account(led.snapshot(), readS3(t, url, bucket), readCW(t, url), dead, "archive", "cloudwatch", inPodStream)
	t.Logf("moto: %v", tl)
	t.Logf("forward: %v; http: %v", fwd, http)
	t.Logf("forwarder log: %s", f.logSummary())
	check(t, tl, 0)
	for _, err := range append(fwd.Errors, http.Errors...) {
		t.Errorf("client: %s", err)
	}
}
