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
// ballast file, with wal.min_free_bytes at 1MiB, while S3 fails every
// request so that the archive sink falls behind: the inputs fill the disk
// until the WAL holds appends (HTTP 503 naming the disk, forward chunks not
// acknowledged), and the process goes on (/healthz 200, /readyz 503 naming
// the disk, disk_full in /status and /metrics). Deleting the ballast gives
// space back: the inputs are acknowledged again, until the disk is full
// once more. Then S3 comes back while the disk is full and the clients keep
// sending: the archive sink must commit its intents and cursor and drain,
// retention must free room and the inputs must be acknowledged again (a
// sink whose cursor commits needed the room only its cursor could free
// stayed wedged here). Everything acknowledged arrives.
//
// Mounting needs root (or CAP_SYS_ADMIN); without it the test skips.
func TestDiskFull(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: fills a tmpfs under load; make test runs it")
	}
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

	e := newEnv(t, func(c *fwdConfig) {
		c.DataDir = filepath.Join(mnt, "data")
		c.WALMinFreeBytes = "1MiB"
	})
	e.s3.SetFailures(1)
	e.f.start()
	ld := startLoad(t, e.f.cfg, e.led, 1, 2, clientOpts{Prefix: "s", Batch: 100, LogBytes: 400, AckTimeout: 3 * time.Minute})
	diskFull := func() bool {
		st, err := e.f.status()
		return err == nil && st.WAL.DiskFull
	}
	acked := func() int { _, a := e.led.counts(); return a }

	// 1. The disk fills while the archive sink is behind.
	full := waitFor(90*time.Second, func() bool {
		_, h := ld.stats()
		return h.Status[http.StatusServiceUnavailable] > 0 && diskFull()
	})
	_, httpFull := ld.stats()
	if !full {
		t.Fatalf("no 503 and disk_full within 90s of filling an 8 MiB disk: %v; free %d bytes\n%s", httpFull, freeBytes(t, mnt), e.f.tail(20))
	}
	ackedFull := acked()
	time.Sleep(2 * time.Second)
	ackedHeld := acked()
	free := freeBytes(t, mnt)
	healthz, healthBody, err := e.f.adminGet("/healthz")
	if err != nil || healthz != http.StatusOK {
		t.Errorf("/healthz with a full disk: %d %s %v", healthz, healthBody, err)
	}
	if readyz, body, err := e.f.adminGet("/readyz"); err != nil || readyz != http.StatusServiceUnavailable || !strings.Contains(string(body), "disk nearly full") {
		t.Errorf("/readyz with a full disk: %d %s %v, want 503 naming the disk", readyz, body, err)
	}
	if !e.f.running() {
		t.Fatalf("the forwarder exited on a full disk:\n%s", e.f.tail(30))
	}
	m := e.f.mustMetrics()
	if m["forwarder_wal_failed"] != 0 {
		t.Errorf("forwarder_wal_failed is %v on a full disk, want 0 (a full disk is not a failed WAL)", m["forwarder_wal_failed"])
	}
	if m["forwarder_wal_disk_full"] != 1 {
		t.Errorf("forwarder_wal_disk_full is %v on a full disk, want 1", m["forwarder_wal_disk_full"])
	}
	body503 := httpFull.LastBody[http.StatusServiceUnavailable]
	if !strings.Contains(body503, "no space") {
		t.Errorf("the 503 says %q, want it to name the full disk", body503)
	}
	if e.f.logCount("the disk is nearly full") == 0 {
		t.Errorf("no log line says that the disk is nearly full: %s", e.f.logSummary())
	}

	// 2. The operator frees space: acknowledged again, until the disk is full once more.
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	resumed := waitFor(60*time.Second, func() bool { return acked() >= ackedHeld+500 })
	resumeAfter := time.Since(freed)
	if !resumed {
		t.Fatalf("the inputs were not acknowledged again within 60s of freeing space\n%s", e.f.tail(20))
	}
	if !waitFor(90*time.Second, diskFull) {
		t.Fatalf("the disk did not fill again within 90s of freeing 3 MiB (free %d bytes)\n%s", freeBytes(t, mnt), e.f.tail(20))
	}

	// 3. S3 comes back while the disk is full and the clients keep sending.
	ackedRefull := acked()
	st0, _ := e.f.status()
	e.s3.SetFailures(0)
	back := time.Now()
	drained := waitFor(60*time.Second, func() bool { return acked() >= ackedRefull+500 })
	drainAfter := time.Since(back)
	st1, _ := e.f.status()
	if !drained {
		t.Fatalf("with S3 back on a full disk, the inputs were not acknowledged again within 60s: the archive sink is wedged?\nbefore: %+v\nafter:  %+v\n%s", st0.Sinks, st1.Sinks, e.f.tail(30))
	}
	time.Sleep(500 * time.Millisecond)
	ld.halt()
	fwd, httpSt := ld.stats()
	dead := e.settle(2 * time.Minute)
	tl := e.account(dead)
	t.Logf("disk full after %d acknowledged records (free %d bytes); %d more acknowledged in the 2s held; /healthz %d; HTTP 503 %q",
		ackedFull, free, ackedHeld-ackedFull, healthz, body503)
	t.Logf("ballast removed: acknowledged again %v later; full again at %d acknowledged", resumeAfter.Round(100*time.Millisecond), ackedRefull)
	t.Logf("S3 back on the full disk: 500 more records acknowledged %v later", drainAfter.Round(100*time.Millisecond))
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
