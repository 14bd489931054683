package faultfs

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// The daemon runs in a process of its own (the test binary, started again
// by Start with daemonEnv set), never in the process that uses the mount:
// a process that serves a FUSE file system and reads it through mmap, as
// bbolt does, can deadlock, since a page fault waiting on the daemon
// cannot be stopped by the Go runtime's garbage collector, which in turn
// stops the goroutines that would answer it.
const (
	daemonEnv  = "FAULTFS_DAEMON"  // the backing directory
	mountEnv   = "FAULTFS_MOUNT"   // the mount point
	debugEnv   = "FAULTFS_DEBUG"   // set: go-fuse logs every request on stderr
	readyLine  = "faultfs ready"   // the daemon's first line once mounted
	deadPrefix = "faultfs failed:" // or this, with why
)

func init() {
	// A binary that imports faultfs serves the mount when started as its
	// daemon; it never runs its own main (or tests) then.
	if backing := os.Getenv(daemonEnv); backing != "" {
		os.Exit(daemon(backing, os.Getenv(mountEnv)))
	}
}

// request is one command on the daemon's standard input, one JSON object a line.
type request struct {
	Op     string      `json:"op"` // cut, unmount, fail_syncs, no_space, heal, freeze, stats
	After  int64       `json:"after,omitempty"`
	Statfs bool        `json:"statfs,omitempty"`
	Cut    *CutOptions `json:"cut,omitempty"`
}

// response answers one request on the daemon's standard output.
type response struct {
	Err    string        `json:"err,omitempty"`
	Stats  *Stats        `json:"stats,omitempty"`
	Cut    *CutReport    `json:"cut,omitempty"`
	Freeze *FreezeReport `json:"freeze,omitempty"`
}

func daemon(backing, mnt string) int {
	out := bufio.NewWriter(os.Stdout)
	say := func(v any) {
		b, _ := json.Marshal(v)
		out.Write(append(b, '\n'))
		out.Flush()
	}
	m, err := newModel(backing)
	if err != nil {
		fmt.Fprintln(out, deadPrefix, err)
		out.Flush()
		return 1
	}
	opts := mountOptions()
	if os.Getenv(debugEnv) != "" {
		opts.Debug = true
	}
	server, err := fs.Mount(mnt, &dirNode{m: m, d: m.root}, opts)
	if err != nil {
		fmt.Fprintln(out, deadPrefix, fmt.Errorf("mount %s: %w", mnt, err))
		out.Flush()
		return 1
	}
	fmt.Fprintln(out, readyLine)
	out.Flush()

	// Standard input closes when the test process is gone (or done with
	// the mount): unmount then, so that no mount outlives its test.
	reqs := make(chan request)
	go func() {
		dec := json.NewDecoder(os.Stdin)
		for {
			var r request
			if err := dec.Decode(&r); err != nil {
				close(reqs)
				return
			}
			reqs <- r
		}
	}()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	for {
		select {
		case <-sigs:
			unmount(server, mnt)
			return 1
		case r, ok := <-reqs:
			if !ok {
				unmount(server, mnt)
				return 0
			}
			var resp response
			switch r.Op {
			case "cut":
				rep, err := m.cut(*r.Cut)
				resp.Cut = &rep
				if err != nil {
					resp.Err = err.Error()
				}
				if err := unmount(server, mnt); err != nil && resp.Err == "" {
					resp.Err = err.Error()
				}
				say(resp)
				return 0
			case "unmount":
				if err := m.syncAll(); err != nil {
					resp.Err = err.Error()
				}
				if err := unmount(server, mnt); err != nil && resp.Err == "" {
					resp.Err = err.Error()
				}
				say(resp)
				return 0
			case "fail_syncs":
				m.mu.Lock()
				m.syncFailAt = m.stats.Written + r.After
				m.mu.Unlock()
			case "no_space":
				m.mu.Lock()
				m.noSpaceAt = m.stats.Allocated + r.After
				m.statfsRoom = r.Statfs
				m.mu.Unlock()
			case "heal":
				m.mu.Lock()
				m.syncFailAt, m.noSpaceAt, m.statfsRoom = -1, -1, false
				m.mu.Unlock()
			case "freeze":
				m.mu.Lock()
				m.freezeAt = m.stats.Syncs + r.After
				m.mu.Unlock()
			case "stats":
			default:
				resp.Err = fmt.Sprintf("unknown request %q", r.Op)
			}
			m.mu.Lock()
			st, fr := m.stats, m.froze
			for _, f := range m.files {
				st.PendingBytes += int64(len(f.pages)) * blockSize
			}
			m.mu.Unlock()
			resp.Stats, resp.Freeze = &st, &fr
			say(resp)
		}
	}
}

// unmount unmounts mnt, lazily if it is still busy (a process holds a
// file open on it), and waits for the server's loops to end.
func unmount(server *fuse.Server, mnt string) error {
	err := server.Unmount()
	if err == nil {
		return nil
	}
	if derr := syscall.Unmount(mnt, syscall.MNT_DETACH); derr != nil {
		return fmt.Errorf("unmount %s: %v; lazily: %w", mnt, err, derr)
	}
	// Files still open on the detached mount fail once this process
	// exits and the kernel aborts the connection.
	return nil
}
