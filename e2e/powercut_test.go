package e2e

import (
	"math/rand/v2"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/logfwd/forwarder/internal/faultfs"
	"github.com/logfwd/forwarder/internal/testseed"
)

// powerCutEnv is an env whose forwarder keeps its data_dir on faultfs
// (internal/faultfs), mounted at the same directory after every cut.
func powerCutEnv(t *testing.T) (*env, func() *faultfs.Mount, *faultfs.Mount) {
	t.Helper()
	backing, mnt := t.TempDir(), t.TempDir()
	m := faultfs.StartAt(t, backing, mnt)
	e := newEnv(t, func(c *fwdConfig) { c.DataDir = filepath.Join(mnt, "data") })
	return e, func() *faultfs.Mount { return faultfs.StartAt(t, backing, mnt) }, m
}

// TestPowerCutLoop is TestKillLoop with the power cut: the forwarder's
// data_dir is on faultfs, and at each cut the forwarder is SIGKILLed, then
// everything it had not fsynced is dropped (the last write torn, or some
// directory changes kept, at random), and it starts again on what is
// left. The clients send with acks throughout and again what was not
// acknowledged. At the end every acknowledged record is in S3 exactly once
// and in CloudWatch Logs at least once.
func TestPowerCutLoop(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: power cuts of the binary on faultfs; make test runs it")
	}
	t.Parallel()
	cuts, maxGap := 4, 1500*time.Millisecond // 3 in the middle of a commit
	if long {
		cuts, maxGap = 30, 3*time.Second
	}
	e, remount, m := powerCutEnv(t)
	cfg := e.f.cfg
	cfg.Sinks[0] = s3Sink("archive", slowProxy(t, e.s3URL, 150*time.Millisecond).URL, bucket)
	e.f.setConfig(cfg)
	e.cw.SetLatency(50 * time.Millisecond)
	e.f.start()
	ld := startLoad(t, e.f.cfg, e.led, 2, 2, clientOpts{Prefix: "p", Batch: 50, Pause: 25 * time.Millisecond})
	seed := uint64(testseed.Seed(t, "E2E_POWERCUT_SEED", "the cut times and what each cut keeps"))
	rng := rand.New(rand.NewPCG(seed, seed))
	var dropped int64
	var torn, dirOps, inCommit int
	for i := 0; i < cuts; i++ {
		o := faultfs.CutOptions{Seed: rng.Int64(), DirOps: faultfs.DirOps(rng.IntN(3))}
		if rng.IntN(2) == 0 {
			o.Tear = 512
		}
		var rep faultfs.CutReport
		if i%3 != 1 {
			// In the middle of a commit (two cuts of three: the cuts that
			// catch an acknowledgement made before its fsync): the file system stops at one of
			// the next fsyncs, with that commit's writes pending. The
			// forwarder waits in that fsync, which the kernel does not
			// give up even for SIGKILL: the cut answers it.
			m.FreezeAtSync(1 + rng.Int64N(40))
			if !waitFor(30*time.Second, func() bool { return m.Frozen().Frozen }) {
				t.Fatal("no fsync within 30s under load")
			}
			e.f.signal(syscall.SIGKILL)
			rep = m.Cut(o)
			<-e.f.done
			e.f.kills++
			inCommit++
		} else {
			time.Sleep(50*time.Millisecond + time.Duration(rng.Int64N(int64(maxGap))))
			e.f.kill() // before the cut: a process still running would see its writes vanish
			rep = m.Cut(o)
		}
		dropped += rep.DroppedBytes
		if rep.Torn != nil && rep.Torn.Kept > 0 {
			torn++
		}
		if rep.KeptDirOps > 0 {
			dirOps++
		}
		m = remount()
		e.f.start()
	}
	time.Sleep(500 * time.Millisecond)
	ld.halt()
	fwd, http := ld.stats()
	dead := e.settle(time.Minute)
	e.cw.SetLatency(0)
	tl := e.account(dead)
	t.Logf("%d power cuts (seed %d; %d in the middle of a commit): %d KiB not fsynced dropped, %d torn writes kept, %d cuts kept directory changes; %d interrupted S3 uploads finished at a restart: %v",
		cuts, seed, inCommit, dropped>>10, torn, dirOps, e.f.logCount(`msg="finished an interrupted upload"`), tl)
	t.Logf("forward: %v; http: %v", fwd, http)
	t.Logf("forwarder log: %s", e.f.logSummary())
	check(t, tl, e.f.kills)
	for _, err := range append(fwd.Errors, http.Errors...) {
		t.Errorf("client: %s", err)
	}
}

// TestFailedFsyncStopsTheService: an fsync of the WAL that returns EIO
// (through the file system, under load) stops the service with exit status
// 1 and one error line, and nothing is acknowledged after it. The power is
// then cut; once the disk is sound and the service started again, every
// record that was acknowledged reaches both destinations.
func TestFailedFsyncStopsTheService(t *testing.T) {
	t.Parallel()
	e, remount, m := powerCutEnv(t)
	e.f.start()
	ld := startLoad(t, e.f.cfg, e.led, 1, 1, clientOpts{Prefix: "eio", Batch: 20, Pause: 10 * time.Millisecond, AckTimeout: 5 * time.Second})
	if !waitFor(30*time.Second, func() bool { _, a := e.led.counts(); return a >= 200 }) {
		t.Fatal("fewer than 200 records acknowledged within 30s")
	}
	m.FailSyncs(0)
	select {
	case <-e.f.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("the forwarder still runs 20s after its fsyncs began to fail:\n%s", e.f.tail(20))
	}
	_, ackedAtExit := e.led.counts()
	if code := e.f.cmd.ProcessState.ExitCode(); code != 1 {
		t.Errorf("exit status %d after a failed fsync, want 1:\n%s", code, e.f.tail(20))
	}
	log := e.f.runs[len(e.f.runs)-1].String()
	if n := strings.Count(log, "level=ERROR"); n != 1 || !strings.Contains(log, "can no longer guarantee durability") || !strings.Contains(log, "input/output error") {
		t.Errorf("want one error line naming the failed fsync, got %d:\n%s", n, e.f.tail(20))
	}
	st := m.Stats()
	if st.FailedSyncs == 0 {
		t.Fatalf("no fsync failed: %+v", st)
	}
	time.Sleep(300 * time.Millisecond) // clients that still send get nothing acknowledged
	if _, a := e.led.counts(); a != ackedAtExit {
		t.Errorf("%d records acknowledged after the service stopped", a-ackedAtExit)
	}
	m.Cut(faultfs.CutOptions{Tear: 512})
	remount()
	e.f.start()
	time.Sleep(300 * time.Millisecond)
	ld.halt()
	dead := e.settle(time.Minute)
	tl := e.account(dead)
	t.Logf("%d fsyncs failed (EIO); %d records acknowledged before, delivered after a power cut and a restart: %v", st.FailedSyncs, ackedAtExit, tl)
	check(t, tl, 1)
}
