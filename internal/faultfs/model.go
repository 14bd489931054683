package faultfs

import (
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// blockSize is the unit in which pending writes are kept and space is
// counted: the page size of the kernel's page cache.
const blockSize = 4096

// stagingName is the directory, at the root of the backing directory,
// that holds the data of files whose name is not durable yet (created
// since the last fsync of their directory, or unlinked with their
// directory not fsynced). It is never shown through the mount and Cut
// removes it, as a file system's recovery frees such orphans.
const stagingName = ".faultfs-staging"

// model is the daemon's state: the volatile tree the mounted file system
// shows, over the backing directory that holds what is durable. One mutex
// guards it all; faultfs is for tests, not for speed.
type model struct {
	mu      sync.Mutex
	backing string
	nextIno uint64
	root    *dir
	files   map[uint64]*file // files with data in the backing directory
	last    *lastWrite       // the newest write not yet fsynced, for Cut's tear
	dead    bool             // cut: every operation fails with EIO
	frozen  bool             // FreezeAtSync reached: every operation waits for Cut
	thaw    chan struct{}    // closed by Cut to release frozen operations
	froze   FreezeReport

	syncFailAt int64 // fsyncs fail with EIO once written reaches it; -1: off
	noSpaceAt  int64 // writes needing new blocks fail with ENOSPC past it; -1: off
	statfsRoom bool  // statfs reports the room left before noSpaceAt
	freezeAt   int64 // the freezeAt-th fsync from syncs freezes; 0: off
	stats      Stats
}

type lastWrite struct {
	f    *file
	off  int64
	data []byte
}

// dir is a directory. Directories are created and removed in the backing
// directory at once (see doc.go); their entries are modelled.
type dir struct {
	ino     uint64
	rel     string // path relative to the backing directory; "" for the root
	mode    uint32
	entries map[string]any // name → *dir or *file; nil until read from the backing directory
	log     []dirOp        // changes to entries since the last fsync of the directory
}

type dirOpKind int

const (
	opCreate dirOpKind = iota // name now names f
	opUnlink                  // name no longer names f
	opRename                  // f moves from name to to, replacing replaced
)

type dirOp struct {
	kind     dirOpKind
	name, to string
	f        *file
	replaced *file
}

// file is a regular file: its durable content is the backing file at loc
// (opened as fd); pages hold the blocks written since its last fsync, as
// the process sees them.
type file struct {
	ino        uint64
	mode       uint32
	uid, gid   uint32
	mtime      time.Time
	loc        string   // backing path of its data, relative; "" once it has none
	fd         *os.File // open on loc (nil until needed)
	size       int64    // size as the process sees it
	low        int64    // backing bytes at or past low read as zeros (a truncate since the last fsync)
	bsize      int64    // size of the backing file
	pages      map[int64][]byte
	allocBelow int64          // blocks below this were allocated before the mount
	alloc      map[int64]bool // blocks at or past allocBelow written since the mount
	links      int            // names in the volatile tree
	opens      int            // open handles
	pendingOps int            // directory log entries that name it
}

func newModel(backing string) (*model, error) {
	st, err := os.Stat(backing)
	if err != nil {
		return nil, fmt.Errorf("stat backing directory: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("backing %s is not a directory", backing)
	}
	m := &model{backing: backing, nextIno: 2, files: map[uint64]*file{},
		syncFailAt: -1, noSpaceAt: -1, thaw: make(chan struct{})}
	// What a previous mount left here is garbage: those files had no
	// durable name.
	if err := os.RemoveAll(m.abs(stagingName)); err != nil {
		return nil, fmt.Errorf("remove stale staging directory: %w", err)
	}
	if err := os.Mkdir(m.abs(stagingName), 0o700); err != nil {
		return nil, fmt.Errorf("create staging directory: %w", err)
	}
	m.root = &dir{ino: 1, mode: uint32(st.Mode().Perm())}
	return m, nil
}

func (m *model) abs(rel string) string { return filepath.Join(m.backing, rel) }

// lock takes the model's mutex for an operation: it fails with EIO after a
// cut, and waits while the model is frozen (FreezeAtSync), as a process
// waits on a machine that stopped.
func (m *model) lock() syscall.Errno {
	m.mu.Lock()
	for m.frozen && !m.dead {
		ch := m.thaw
		m.mu.Unlock()
		<-ch
		m.mu.Lock()
	}
	if m.dead {
		m.mu.Unlock()
		return syscall.EIO
	}
	return 0
}

func (m *model) ino() uint64 {
	m.nextIno++
	return m.nextIno
}

// load reads d's entries from the backing directory on first use.
func (m *model) load(d *dir) syscall.Errno {
	if d.entries != nil {
		return 0
	}
	ents, err := os.ReadDir(m.abs(d.rel))
	if err != nil {
		return errnoOf(err)
	}
	d.entries = make(map[string]any, len(ents))
	for _, e := range ents {
		if d.rel == "" && e.Name() == stagingName {
			continue
		}
		rel := filepath.Join(d.rel, e.Name())
		var st syscall.Stat_t
		if err := syscall.Lstat(m.abs(rel), &st); err != nil {
			return errnoOf(err)
		}
		switch st.Mode & syscall.S_IFMT {
		case syscall.S_IFDIR:
			d.entries[e.Name()] = &dir{ino: m.ino(), rel: rel, mode: st.Mode & 0o7777}
		case syscall.S_IFREG:
			f := &file{ino: m.ino(), mode: st.Mode & 0o7777, uid: st.Uid, gid: st.Gid,
				mtime: time.Unix(st.Mtim.Unix()), loc: rel, size: st.Size, low: st.Size, bsize: st.Size,
				pages: map[int64][]byte{}, allocBelow: blocks(st.Size), alloc: map[int64]bool{}, links: 1}
			d.entries[e.Name()] = f
			m.files[f.ino] = f
		default:
			// Symlinks, devices, sockets: not modelled, not shown.
		}
	}
	return 0
}

func blocks(size int64) int64 { return (size + blockSize - 1) / blockSize }

// open opens f's backing file once.
func (m *model) open(f *file) syscall.Errno {
	if f.fd != nil {
		return 0
	}
	if f.loc == "" {
		return syscall.EIO
	}
	fd, err := os.OpenFile(m.abs(f.loc), os.O_RDWR, 0)
	if err != nil {
		return errnoOf(err)
	}
	f.fd = fd
	return 0
}

// create makes a new file named name in d; its data lives in the staging
// directory until d is fsynced.
func (m *model) create(d *dir, name string, mode uint32) (*file, syscall.Errno) {
	f := &file{ino: m.ino(), mode: mode & 0o7777, mtime: time.Now(), pages: map[int64][]byte{}, alloc: map[int64]bool{}}
	f.loc = filepath.Join(stagingName, strconv.FormatUint(f.ino, 10))
	fd, err := os.OpenFile(m.abs(f.loc), os.O_RDWR|os.O_CREATE|os.O_EXCL, os.FileMode(f.mode))
	if err != nil {
		return nil, errnoOf(err)
	}
	f.fd = fd
	f.links = 1
	d.entries[name] = f
	m.files[f.ino] = f
	m.logOp(d, dirOp{kind: opCreate, name: name, f: f})
	return f, 0
}

func (m *model) logOp(d *dir, op dirOp) {
	d.log = append(d.log, op)
	op.f.pendingOps++
	if op.replaced != nil {
		op.replaced.pendingOps++
	}
	m.stats.DirOps++
}

func (m *model) unlink(d *dir, name string) syscall.Errno {
	switch e := d.entries[name].(type) {
	case nil:
		return syscall.ENOENT
	case *dir:
		return syscall.EISDIR
	case *file:
		delete(d.entries, name)
		e.links--
		m.logOp(d, dirOp{kind: opUnlink, name: name, f: e})
	}
	return 0
}

// rename moves a file within d, replacing a file at to. Directories do not
// move (see doc.go).
func (m *model) rename(d *dir, name, to string, noReplace bool) syscall.Errno {
	f, ok := d.entries[name].(*file)
	if !ok {
		if d.entries[name] == nil {
			return syscall.ENOENT
		}
		return syscall.EXDEV
	}
	if name == to {
		return 0
	}
	var replaced *file
	switch e := d.entries[to].(type) {
	case *dir:
		return syscall.EISDIR
	case *file:
		if noReplace {
			return syscall.EEXIST
		}
		replaced = e
		e.links--
	}
	delete(d.entries, name)
	d.entries[to] = f
	m.logOp(d, dirOp{kind: opRename, name: name, to: to, f: f, replaced: replaced})
	return 0
}

// applyDirOps makes d's first n logged changes durable in the backing
// directory, in order, and drops them from the log.
func (m *model) applyDirOps(d *dir, n int) error {
	for _, op := range d.log[:n] {
		if err := m.applyDirOp(d, op); err != nil {
			return err
		}
	}
	d.log = append([]dirOp(nil), d.log[n:]...)
	return nil
}

func (m *model) applyDirOp(d *dir, op dirOp) error {
	op.f.pendingOps--
	defer m.reap(op.f)
	switch op.kind {
	case opCreate:
		to := filepath.Join(d.rel, op.name)
		if err := os.Rename(m.abs(op.f.loc), m.abs(to)); err != nil {
			return fmt.Errorf("apply create of %s: %w", to, err)
		}
		op.f.loc = to
	case opUnlink:
		path := filepath.Join(d.rel, op.name)
		if op.f.loc != path {
			return fmt.Errorf("apply unlink of %s: its data is at %s", path, op.f.loc)
		}
		if op.f.opens > 0 {
			if errno := m.open(op.f); errno != 0 {
				return fmt.Errorf("open %s before unlinking it: %w", path, errno)
			}
		}
		if err := os.Remove(m.abs(path)); err != nil {
			return fmt.Errorf("apply unlink of %s: %w", path, err)
		}
		op.f.loc = ""
	case opRename:
		from, to := filepath.Join(d.rel, op.name), filepath.Join(d.rel, op.to)
		if op.f.loc != from {
			return fmt.Errorf("apply rename of %s: its data is at %s", from, op.f.loc)
		}
		if r := op.replaced; r != nil {
			r.pendingOps--
			if r.opens > 0 {
				if errno := m.open(r); errno != 0 {
					return fmt.Errorf("open %s before replacing it: %w", to, errno)
				}
			}
			r.loc = ""
			defer m.reap(r)
		}
		if err := os.Rename(m.abs(from), m.abs(to)); err != nil {
			return fmt.Errorf("apply rename of %s to %s: %w", from, to, err)
		}
		op.f.loc = to
	}
	return nil
}

// reap forgets a file that nothing can reach any more: no name, no open
// handle, no logged change that could still give it a durable name.
func (m *model) reap(f *file) {
	if f.links > 0 || f.opens > 0 || f.pendingOps > 0 {
		return
	}
	if f.fd != nil {
		f.fd.Close()
		f.fd = nil
	}
	if f.loc != "" {
		os.Remove(m.abs(f.loc))
		f.loc = ""
	}
	delete(m.files, f.ino)
	if m.last != nil && m.last.f == f {
		m.last = nil
	}
}

// readBacking fills p with f's durable bytes at off (zeros past them).
func (m *model) readBacking(f *file, p []byte, off int64) syscall.Errno {
	clear(p)
	lim := min(f.low, f.bsize)
	if off >= lim {
		return 0
	}
	if errno := m.open(f); errno != 0 {
		return errno
	}
	n := min(int64(len(p)), lim-off)
	if _, err := f.fd.ReadAt(p[:n], off); err != nil && !errors.Is(err, io.EOF) {
		return errnoOf(err)
	}
	return 0
}

// read fills p with what the process sees of f at off.
func (m *model) read(f *file, p []byte, off int64) (int, syscall.Errno) {
	if off >= f.size {
		return 0, 0
	}
	n := int(min(int64(len(p)), f.size-off))
	p = p[:n]
	for i := 0; i < n; {
		pos := off + int64(i)
		b, in := pos/blockSize, int(pos%blockSize)
		if pg, ok := f.pages[b]; ok {
			i += copy(p[i:], pg[in:])
			continue
		}
		// A run of blocks without pending writes: one read of the backing file.
		j := i + min(blockSize-in, n-i)
		for j < n {
			if _, ok := f.pages[(off+int64(j))/blockSize]; ok {
				break
			}
			j = min(n, j+blockSize)
		}
		if errno := m.readBacking(f, p[i:j], pos); errno != 0 {
			return 0, errno
		}
		i = j
	}
	return n, 0
}

// page returns block b of f as the process sees it, keeping it pending.
func (m *model) page(f *file, b int64) ([]byte, syscall.Errno) {
	if pg, ok := f.pages[b]; ok {
		return pg, 0
	}
	pg := make([]byte, blockSize)
	start := b * blockSize
	if end := min(start+blockSize, f.size); end > start {
		if errno := m.readBacking(f, pg[:end-start], start); errno != 0 {
			return nil, errno
		}
	}
	f.pages[b] = pg
	return pg, 0
}

// newBlocks counts the blocks a write at off of n bytes allocates.
func newBlocks(f *file, off, n int64) int64 {
	var c int64
	for b := off / blockSize; b*blockSize < off+n; b++ {
		if b >= f.allocBelow && !f.alloc[b] {
			c++
		}
	}
	return c
}

func (m *model) write(f *file, data []byte, off int64) (int, syscall.Errno) {
	n := int64(len(data))
	if n == 0 {
		return 0, 0
	}
	nb := newBlocks(f, off, n)
	if m.noSpaceAt >= 0 && nb > 0 && m.stats.Allocated+nb*blockSize > m.noSpaceAt {
		m.stats.FailedWrites++
		return 0, syscall.ENOSPC
	}
	for i := int64(0); i < n; {
		pos := off + i
		b, in := pos/blockSize, pos%blockSize
		pg, errno := m.page(f, b)
		if errno != 0 {
			return 0, errno
		}
		i += int64(copy(pg[in:], data[i:]))
		if b >= f.allocBelow {
			f.alloc[b] = true
		}
	}
	m.stats.Allocated += nb * blockSize
	f.size = max(f.size, off+n)
	f.mtime = time.Now()
	m.stats.Written += n
	m.last = &lastWrite{f: f, off: off, data: append([]byte(nil), data...)}
	return len(data), 0
}

// truncate sets f's size, as a pending change like a write.
func (m *model) truncate(f *file, size int64) {
	if size < f.size {
		for b := range f.pages {
			if b*blockSize >= size {
				delete(f.pages, b)
			}
		}
		if pg, ok := f.pages[size/blockSize]; ok {
			clear(pg[size%blockSize:])
		}
		f.low = min(f.low, size)
		keep := blocks(size)
		f.allocBelow = min(f.allocBelow, keep)
		for b := range f.alloc {
			if b >= keep {
				delete(f.alloc, b)
				m.stats.Allocated -= blockSize
			}
		}
	}
	f.size = size
	f.mtime = time.Now()
}

// syncFile makes f's pending writes and size durable in its backing file.
// The backing file itself is not fsynced: the backing directory stands
// for the disk, and the test machine keeps its page cache.
func (m *model) syncFile(f *file) syscall.Errno {
	if f.loc == "" {
		return 0 // no durable data to update: the file is gone after a cut
	}
	if errno := m.open(f); errno != 0 {
		return errno
	}
	if f.low < f.bsize {
		if err := f.fd.Truncate(f.low); err != nil {
			return errnoOf(err)
		}
		f.bsize = f.low
	}
	idx := make([]int64, 0, len(f.pages))
	for b := range f.pages {
		idx = append(idx, b)
	}
	slices.Sort(idx)
	for i := 0; i < len(idx); {
		// Consecutive blocks in one write.
		j := i + 1
		for j < len(idx) && idx[j] == idx[j-1]+1 {
			j++
		}
		start := idx[i] * blockSize
		end := min((idx[j-1]+1)*blockSize, f.size)
		if end > start {
			buf := make([]byte, 0, end-start)
			for k := i; k < j; k++ {
				buf = append(buf, f.pages[idx[k]]...)
			}
			if _, err := f.fd.WriteAt(buf[:end-start], start); err != nil {
				return errnoOf(err)
			}
			f.bsize = max(f.bsize, end)
		}
		i = j
	}
	if f.bsize != f.size {
		if err := f.fd.Truncate(f.size); err != nil {
			return errnoOf(err)
		}
		f.bsize = f.size
	}
	f.pages = map[int64][]byte{}
	f.low = f.size
	if m.last != nil && m.last.f == f {
		m.last = nil
	}
	return 0
}

// fsync is the common part of a file's and a directory's fsync: it counts,
// freezes (FreezeAtSync) and fails (FailSyncs) as the switches say. It is
// called with the mutex held and returns with it held, unless it returns
// an error after freezing (the mutex then is released).
func (m *model) fsync(what string, isDir bool) (syscall.Errno, bool) {
	m.stats.Syncs++
	if m.freezeAt > 0 && m.stats.Syncs >= m.freezeAt {
		m.freezeAt = 0
		m.frozen = true
		m.froze = FreezeReport{Frozen: true, Sync: m.stats.Syncs, Path: what, Dir: isDir}
		m.mu.Unlock()
		return m.lock(), true // waits for Cut, then EIO
	}
	if m.syncFailAt >= 0 && m.stats.Written >= m.syncFailAt {
		m.stats.FailedSyncs++
		return syscall.EIO, false
	}
	return 0, false
}

// cut drops everything that is not durable, as a power cut would, and
// keeps, if o says so, a torn prefix of the newest unsynced write and a
// prefix of each directory's unsynced changes.
func (m *model) cut(o CutOptions) (CutReport, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var rep CutReport
	if m.dead {
		return rep, errors.New("already cut")
	}
	rng := rand.New(rand.NewSource(o.Seed))
	for _, f := range m.files {
		rep.DroppedBytes += int64(len(f.pages)) * blockSize
	}
	if w := m.last; o.Tear > 0 && w != nil && w.f.loc != "" {
		rep.Torn = &TornWrite{Path: w.f.loc, Off: w.off, Len: len(w.data)}
		var cuts []int64
		for b := (w.off/o.Tear + 1) * o.Tear; b < w.off+int64(len(w.data)); b += o.Tear {
			cuts = append(cuts, b)
		}
		if len(cuts) > 0 {
			at := cuts[rng.Intn(len(cuts))]
			rep.Torn.Kept = int(at - w.off)
			if errno := m.open(w.f); errno != 0 {
				return rep, fmt.Errorf("open %s to tear a write: %w", w.f.loc, errno)
			}
			if _, err := w.f.fd.WriteAt(w.data[:rep.Torn.Kept], w.off); err != nil {
				return rep, fmt.Errorf("tear a write of %s: %w", w.f.loc, err)
			}
		}
	}
	var walk func(d *dir) error
	walk = func(d *dir) error {
		rep.DroppedDirOps += len(d.log)
		if o.DirOps != DropDirOps && len(d.log) > 0 {
			k := len(d.log)
			if o.DirOps == SomeDirOps {
				k = rng.Intn(len(d.log) + 1)
			}
			if err := m.applyDirOps(d, k); err != nil {
				return err
			}
			rep.KeptDirOps += k
			rep.DroppedDirOps -= k
		}
		for _, e := range d.entries {
			if sub, ok := e.(*dir); ok {
				if err := walk(sub); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(m.root); err != nil {
		return rep, err
	}
	m.dead = true
	close(m.thaw)
	for _, f := range m.files {
		if f.fd != nil {
			f.fd.Close()
			f.fd = nil
		}
	}
	if err := os.RemoveAll(m.abs(stagingName)); err != nil {
		return rep, fmt.Errorf("remove staging directory: %w", err)
	}
	return rep, nil
}

// syncAll makes everything durable: a clean unmount.
func (m *model) syncAll() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.dead {
		return nil
	}
	for _, f := range m.files {
		if errno := m.syncFile(f); errno != 0 {
			return fmt.Errorf("sync %s: %w", f.loc, errno)
		}
	}
	var walk func(d *dir) error
	walk = func(d *dir) error {
		if err := m.applyDirOps(d, len(d.log)); err != nil {
			return err
		}
		for _, e := range d.entries {
			if sub, ok := e.(*dir); ok {
				if err := walk(sub); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(m.root); err != nil {
		return err
	}
	m.dead = true
	close(m.thaw)
	for _, f := range m.files {
		if f.fd != nil {
			f.fd.Close()
			f.fd = nil
		}
	}
	return os.RemoveAll(m.abs(stagingName))
}

func errnoOf(err error) syscall.Errno {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return syscall.EIO
}
