package faultfs

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// CutOptions say what a power cut keeps besides what was fsynced.
type CutOptions struct {
	// Tear, 512 or 4096 (0: off), keeps a prefix of the newest write that
	// was not fsynced, cut at a random multiple of Tear inside it, as a
	// disk that lost power in the middle of a write leaves it. A write
	// that crosses no such boundary is dropped whole.
	Tear int64 `json:"tear,omitempty"`
	// DirOps says which directory changes since the directory's last
	// fsync reach the disk (a journal may commit them on its own).
	DirOps DirOps `json:"dir_ops,omitempty"`
	// Seed picks the tear point and the prefixes.
	Seed int64 `json:"seed,omitempty"`
}

// DirOps says what a cut does with unsynced directory changes.
type DirOps int

const (
	DropDirOps DirOps = iota // none of them reached the disk
	KeepDirOps               // all of them did
	SomeDirOps               // a random prefix of each directory's did
)

// CutReport says what a cut dropped and kept.
type CutReport struct {
	DroppedBytes  int64      `json:"dropped_bytes"`   // pending bytes dropped, in whole blocks
	DroppedDirOps int        `json:"dropped_dir_ops"` // directory changes dropped
	KeptDirOps    int        `json:"kept_dir_ops"`    // directory changes kept (KeepDirOps, SomeDirOps)
	Torn          *TornWrite `json:"torn,omitempty"`  // the write Tear applied to, if any
}

// TornWrite is the newest unsynced write at a cut and how much of it was kept.
type TornWrite struct {
	Path string `json:"path"` // in the backing directory
	Off  int64  `json:"off"`
	Len  int    `json:"len"`
	Kept int    `json:"kept"` // bytes kept from Off; 0: dropped whole
}

// Stats count what the mount saw.
type Stats struct {
	Written      int64 `json:"written"`       // bytes written
	Allocated    int64 `json:"allocated"`     // bytes of blocks the writes allocated, less those truncated away
	Syncs        int64 `json:"syncs"`         // fsyncs and fdatasyncs of files and directories
	DirSyncs     int64 `json:"dir_syncs"`     // fsyncs of directories that went through
	DirOps       int64 `json:"dir_ops"`       // creates, unlinks and renames
	FailedSyncs  int64 `json:"failed_syncs"`  // fsyncs answered EIO (FailSyncs)
	FailedWrites int64 `json:"failed_writes"` // writes answered ENOSPC (NoSpace)
	PendingBytes int64 `json:"pending_bytes"` // not fsynced now, in whole blocks
}

// FreezeReport says where FreezeAtSync stopped the file system.
type FreezeReport struct {
	Frozen bool   `json:"frozen"`
	Sync   int64  `json:"sync"` // the fsync's number since the mount
	Path   string `json:"path"` // what it was for, in the backing directory
	Dir    bool   `json:"dir"`
}

// Mount is a faultfs mounted over a backing directory, served by a daemon
// process of its own.
type Mount struct {
	Dir     string // the mount point
	Backing string

	t    testing.TB
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
	done bool // cut or unmounted
}

// Unavailable says why faultfs cannot mount here ("" when it can): it
// needs root (for mount(2)) and /dev/fuse.
func Unavailable() string {
	if os.Geteuid() != 0 {
		return "faultfs needs root to mount a FUSE file system"
	}
	f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		return fmt.Sprintf("faultfs needs /dev/fuse: %v", err)
	}
	f.Close()
	return ""
}

// Start mounts a faultfs over backing on a new directory. The test skips
// when faultfs cannot run here (see Unavailable) and fails if the mount
// does not come up. t.Cleanup unmounts it (lazily if it is busy) unless
// it was cut or unmounted.
func Start(t testing.TB, backing string) *Mount {
	t.Helper()
	if why := Unavailable(); why != "" {
		t.Skipf("%s (README: Tests that skip)", why)
	}
	return StartAt(t, backing, t.TempDir())
}

// StartAt is Start on the empty directory mnt: after a cut, the same
// directory can be mounted again, so that a process's configuration
// names the same path.
func StartAt(t testing.TB, backing, mnt string) *Mount {
	t.Helper()
	if why := Unavailable(); why != "" {
		t.Skipf("%s (README: Tests that skip)", why)
	}
	cleanStale(t)
	if mounted(mnt) {
		t.Fatalf("faultfs: %s is mounted already", mnt)
	}
	m := &Mount{Dir: mnt, Backing: backing, t: t}
	cmd := exec.Command(os.Args[0])
	// Under the race detector a process sleeps a second before it exits
	// unless told not to; the daemon exits at every cut.
	cmd.Env = append(os.Environ(), daemonEnv+"="+backing, mountEnv+"="+mnt,
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	cmd.Stderr = os.Stderr
	// Should the test process die, the daemon gets SIGTERM and unmounts.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatalf("faultfs: %v", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("faultfs: %v", err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("faultfs: start daemon: %v", err)
	}
	m.cmd, m.in, m.out = cmd, in, bufio.NewReader(stdout)
	t.Cleanup(m.cleanup)
	line, err := m.out.ReadString('\n')
	if strings.TrimSpace(line) != readyLine {
		t.Fatalf("faultfs: mount %s over %s: %s %v", mnt, backing, strings.TrimSpace(line), err)
	}
	return m
}

func (m *Mount) do(r request) response {
	m.t.Helper()
	if m.done {
		m.t.Fatalf("faultfs: %s on %s after it was cut or unmounted", r.Op, m.Dir)
	}
	b, _ := json.Marshal(r)
	if _, err := m.in.Write(append(b, '\n')); err != nil {
		m.t.Fatalf("faultfs: send %s: %v", r.Op, err)
	}
	line, err := m.out.ReadString('\n')
	if err != nil {
		m.t.Fatalf("faultfs: %s: no answer from the daemon: %v", r.Op, err)
	}
	var resp response
	if err := json.Unmarshal([]byte(line), &resp); err != nil {
		m.t.Fatalf("faultfs: %s: answer %q: %v", r.Op, line, err)
	}
	if resp.Err != "" {
		m.t.Fatalf("faultfs: %s: %s", r.Op, resp.Err)
	}
	return resp
}

// Cut cuts the power: everything not fsynced is dropped (but what o keeps),
// and the file system is unmounted, leaving in the backing directory what
// a power cut would. Every process using the mount must have been stopped
// before (SIGKILL): a process still running would see its own writes vanish,
// which no process sees after a real power cut.
func (m *Mount) Cut(o CutOptions) CutReport {
	m.t.Helper()
	resp := m.do(request{Op: "cut", Cut: &o})
	m.finish()
	return *resp.Cut
}

// Unmount unmounts cleanly: everything pending is made durable first.
func (m *Mount) Unmount() {
	m.t.Helper()
	m.do(request{Op: "unmount"})
	m.finish()
}

// FailSyncs makes every fsync fail with EIO once after more bytes have
// been written (0: from now on).
func (m *Mount) FailSyncs(after int64) { m.do(request{Op: "fail_syncs", After: after}) }

// NoSpace makes every write that needs a new block fail with ENOSPC once
// after more bytes of blocks have been allocated (0: from now on).
// Overwrites of allocated blocks go on, as on a real full disk. With
// statfs, statfs reports only the room left; else it reports the backing
// file system's room (a disk another process fills, or that lies).
func (m *Mount) NoSpace(after int64, statfs bool) {
	m.do(request{Op: "no_space", After: after, Statfs: statfs})
}

// Heal turns FailSyncs and NoSpace off.
func (m *Mount) Heal() { m.do(request{Op: "heal"}) }

// FreezeAtSync stops the file system at the n-th fsync from now (1: the
// next), before that fsync takes effect: it and every later operation
// wait, as on a machine that stopped, until Cut.
func (m *Mount) FreezeAtSync(n int64) { m.do(request{Op: "freeze", After: n}) }

// Frozen reports where FreezeAtSync stopped the file system, if it has.
func (m *Mount) Frozen() FreezeReport { return *m.do(request{Op: "stats"}).Freeze }

// Stats counts what the mount saw.
func (m *Mount) Stats() Stats { return *m.do(request{Op: "stats"}).Stats }

// finish waits for the daemon, which exits after a cut or an unmount.
func (m *Mount) finish() {
	m.t.Helper()
	m.done = true
	m.in.Close()
	if err := waitTimeout(m.cmd, 30*time.Second); err != nil {
		m.t.Fatalf("faultfs: daemon for %s: %v", m.Dir, err)
	}
	if mounted(m.Dir) {
		m.t.Fatalf("faultfs: %s is still mounted after the daemon exited", m.Dir)
	}
}

// cleanup ends the daemon of a mount the test left mounted: closing its
// input makes it unmount (lazily if busy) and exit; should it not, it is
// killed and the mount detached from here.
func (m *Mount) cleanup() {
	if m.done {
		return
	}
	m.done = true
	m.in.Close()
	if err := waitTimeout(m.cmd, 10*time.Second); err != nil {
		m.t.Logf("faultfs: daemon for %s: %v", m.Dir, err)
	}
	if mounted(m.Dir) {
		if err := syscall.Unmount(m.Dir, syscall.MNT_DETACH); err != nil {
			m.t.Errorf("faultfs: detach %s: %v", m.Dir, err)
		}
	}
}

func waitTimeout(cmd *exec.Cmd, d time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		cmd.Process.Kill()
		<-done
		return fmt.Errorf("did not exit within %v: killed", d)
	}
}

// mounts lists the mount points of faultfs file systems.
func mounts() []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS ... - FSTYPE SOURCE SUPEROPTS
		fields := strings.Fields(line)
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(fields) || len(fields) < 5 || fields[sep+1] != "fuse.faultfs" {
			continue
		}
		out = append(out, unescapeMount(fields[4]))
	}
	return out
}

func unescapeMount(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

func mounted(dir string) bool {
	for _, p := range mounts() {
		if p == dir {
			return true
		}
	}
	return false
}

// cleanStale detaches faultfs mounts whose daemon is gone (a test binary
// killed before its cleanup ran): their mount points answer ENOTCONN.
// Live mounts of tests running in parallel answer and are left alone.
func cleanStale(t testing.TB) {
	for _, p := range mounts() {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); errors.Is(err, syscall.ENOTCONN) {
			if err := syscall.Unmount(p, syscall.MNT_DETACH); err == nil {
				t.Logf("faultfs: detached the stale mount %s", p)
			}
		}
	}
}
