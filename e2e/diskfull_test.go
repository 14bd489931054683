package e2e

import (
	"crypto/rand"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDiskFull runs the forwarder on an 8 MiB tmpfs, partly taken by a
// ballast file, while S3 fails every request so that nothing leaves the WAL:
// the inputs fill the disk until the forwarder answers 503 (and stops
// acknowledging forward chunks), and the process goes on (/healthz 200: a
// full disk is not fatal). Deleting the ballast gives space back: the inputs
// are acknowledged again, and everything acknowledged arrives.
//
// Mounting needs root (or CAP_SYS_ADMIN); without it the test skips.
func TestDiskFull(t *testing.T) {
	mnt := t.TempDir()
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=8m"); err != nil {
		t.Skipf("TestDiskFull mounts a tmpfs as the forwarder's data_dir, which needs root or CAP_SYS_ADMIN (euid %d): %v", os.Geteuid(), err)
	}
	// Registered before the forwarder's cleanup, so it runs after the child is gone.
	t.Cleanup(func() {
		if err := syscall.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
			_ = syscall.Unmount(mnt, syscall.MNT_DETACH)
		}
	})
	ballast := filepath.Join(mnt, "ballast")
	b := make([]byte, 3<<20)
	rand.Read(b)
	if err := os.WriteFile(ballast, b, 0o600); err != nil {
		t.Fatal(err)
	}

	e := newEnv(t, func(c *fwdConfig) { c.DataDir = filepath.Join(mnt, "data") })
	e.s3.SetFailures(1)
	e.f.start()
	ld := startLoad(e.f.cfg, e.led, 1, 2, clientOpts{Prefix: "s", Batch: 100, LogBytes: 400, AckTimeout: 3 * time.Minute})
	full := waitFor(90*time.Second, func() bool {
		_, h := ld.stats()
		return h.Status[http.StatusServiceUnavailable] > 0
	})
	_, httpFull := ld.stats()
	if !full {
		t.Fatalf("no 503 within 90s of filling an 8 MiB disk: %v; free %d bytes\n%s", httpFull, freeBytes(t, mnt), e.f.tail(20))
	}
	_, ackedFull := e.led.counts()
	time.Sleep(2 * time.Second)
	_, ackedHeld := e.led.counts()
	free := freeBytes(t, mnt)
	healthz, healthBody, err := e.f.adminGet("/healthz")
	if err != nil || healthz != http.StatusOK {
		t.Errorf("/healthz with a full disk: %d %s %v", healthz, healthBody, err)
	}
	if !e.f.running() {
		t.Fatalf("the forwarder exited on a full disk:\n%s", e.f.tail(30))
	}
	m := e.f.mustMetrics()
	if m["forwarder_wal_failed"] != 0 {
		t.Errorf("forwarder_wal_failed is %v on a full disk, want 0 (a full disk is not a failed WAL)", m["forwarder_wal_failed"])
	}
	body503 := httpFull.LastBody[http.StatusServiceUnavailable]
	if !strings.Contains(body503, "no space") {
		t.Errorf("the 503 says %q, want it to name the full disk", body503)
	}

	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	resumed := waitFor(60*time.Second, func() bool { _, a := e.led.counts(); return a >= ackedHeld+500 })
	resumeAfter := time.Since(freed)
	if !resumed {
		t.Errorf("the inputs were not acknowledged again within 60s of freeing space\n%s", e.f.tail(20))
	}
	e.s3.SetFailures(0)
	time.Sleep(500 * time.Millisecond)
	ld.halt()
	fwd, httpSt := ld.stats()
	dead := e.settle(2 * time.Minute)
	tl := e.account(dead)
	t.Logf("disk full after %d acknowledged records (free %d bytes); %d more acknowledged in the 2s held; /healthz %d; HTTP 503 %q",
		ackedFull, free, ackedHeld-ackedFull, healthz, body503)
	t.Logf("ballast removed: acknowledged again %v later", resumeAfter.Round(100*time.Millisecond))
	t.Logf("%v", tl)
	t.Logf("forward: %v; http: %v", fwd, httpSt)
	t.Logf("forwarder log: %s", e.f.logSummary())
	check(t, tl, 0)
	for _, err := range append(fwd.Errors, httpSt.Errors...) {
		t.Errorf("client: %s", err)
	}
}

// freeBytes is the space left on the file system at path.
func freeBytes(t *testing.T, path string) int64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}
