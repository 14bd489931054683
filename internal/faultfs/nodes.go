package faultfs

import (
	"context"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// The mounted tree: go-fuse nodes over the model, in the manner of go-fuse's
// loopback nodes, but every change goes to the model rather than straight
// to the backing directory. File handles carry nothing: every operation is
// on the node. No handle offers a passthrough descriptor, so the kernel
// sends every read and write to the daemon.

type dirNode struct {
	fs.Inode
	m *model
	d *dir
}

type fileNode struct {
	fs.Inode
	m *model
	f *file
}

type handle struct{}

var (
	_ fs.NodeLookuper  = (*dirNode)(nil)
	_ fs.NodeReaddirer = (*dirNode)(nil)
	_ fs.NodeCreater   = (*dirNode)(nil)
	_ fs.NodeMkdirer   = (*dirNode)(nil)
	_ fs.NodeRmdirer   = (*dirNode)(nil)
	_ fs.NodeUnlinker  = (*dirNode)(nil)
	_ fs.NodeRenamer   = (*dirNode)(nil)
	_ fs.NodeGetattrer = (*dirNode)(nil)
	_ fs.NodeSetattrer = (*dirNode)(nil)
	_ fs.NodeFsyncer   = (*dirNode)(nil)
	_ fs.NodeStatfser  = (*dirNode)(nil)

	_ fs.NodeGetattrer = (*fileNode)(nil)
	_ fs.NodeSetattrer = (*fileNode)(nil)
	_ fs.NodeOpener    = (*fileNode)(nil)
	_ fs.NodeReader    = (*fileNode)(nil)
	_ fs.NodeWritever  = (*fileNode)(nil)
	_ fs.NodeFsyncer   = (*fileNode)(nil)
	_ fs.NodeFlusher   = (*fileNode)(nil)
	_ fs.NodeReleaser  = (*fileNode)(nil)
	_ fs.NodeStatfser  = (*fileNode)(nil)
)

func (m *model) dirAttr(d *dir, out *fuse.Attr) {
	out.Ino = d.ino
	out.Mode = syscall.S_IFDIR | d.mode
	out.Nlink = 2
	out.Blksize = blockSize
}

func (m *model) fileAttr(f *file, out *fuse.Attr) {
	out.Ino = f.ino
	out.Mode = syscall.S_IFREG | f.mode
	out.Size = uint64(f.size)
	out.Blocks = uint64(blocks(f.size) * blockSize / 512)
	out.Blksize = blockSize
	out.Nlink = uint32(max(f.links, 0))
	out.Uid, out.Gid = f.uid, f.gid
	t := f.mtime
	out.SetTimes(&t, &t, &t)
}

func (n *dirNode) child(ctx context.Context, e any, out *fuse.EntryOut) *fs.Inode {
	switch c := e.(type) {
	case *dir:
		n.m.dirAttr(c, &out.Attr)
		return n.NewInode(ctx, &dirNode{m: n.m, d: c}, fs.StableAttr{Mode: syscall.S_IFDIR, Ino: c.ino})
	case *file:
		n.m.fileAttr(c, &out.Attr)
		return n.NewInode(ctx, &fileNode{m: n.m, f: c}, fs.StableAttr{Mode: syscall.S_IFREG, Ino: c.ino})
	}
	return nil
}

func (n *dirNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := n.m.lock(); errno != 0 {
		return nil, errno
	}
	defer n.m.mu.Unlock()
	if errno := n.m.load(n.d); errno != 0 {
		return nil, errno
	}
	e := n.d.entries[name]
	if e == nil {
		return nil, syscall.ENOENT
	}
	return n.child(ctx, e, out), 0
}

func (n *dirNode) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	if errno := n.m.lock(); errno != 0 {
		return nil, errno
	}
	defer n.m.mu.Unlock()
	if errno := n.m.load(n.d); errno != 0 {
		return nil, errno
	}
	names := make([]string, 0, len(n.d.entries))
	for name := range n.d.entries {
		names = append(names, name)
	}
	slices.Sort(names)
	list := make([]fuse.DirEntry, 0, len(names))
	for _, name := range names {
		switch c := n.d.entries[name].(type) {
		case *dir:
			list = append(list, fuse.DirEntry{Name: name, Mode: syscall.S_IFDIR, Ino: c.ino})
		case *file:
			list = append(list, fuse.DirEntry{Name: name, Mode: syscall.S_IFREG, Ino: c.ino})
		}
	}
	return fs.NewListDirStream(list), 0
}

func (n *dirNode) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if errno := n.m.lock(); errno != 0 {
		return nil, nil, 0, errno
	}
	defer n.m.mu.Unlock()
	if errno := n.m.load(n.d); errno != 0 {
		return nil, nil, 0, errno
	}
	var f *file
	switch e := n.d.entries[name].(type) {
	case *dir:
		return nil, nil, 0, syscall.EISDIR
	case *file:
		if flags&syscall.O_EXCL != 0 {
			return nil, nil, 0, syscall.EEXIST
		}
		f = e
		if flags&syscall.O_TRUNC != 0 {
			n.m.truncate(f, 0)
		}
	default:
		var errno syscall.Errno
		if f, errno = n.m.create(n.d, name, mode); errno != 0 {
			return nil, nil, 0, errno
		}
	}
	if errno := n.m.open(f); errno != 0 {
		return nil, nil, 0, errno
	}
	f.opens++
	return n.child(ctx, f, out), handle{}, 0, 0
}

func (n *dirNode) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := n.m.lock(); errno != 0 {
		return nil, errno
	}
	defer n.m.mu.Unlock()
	if errno := n.m.load(n.d); errno != 0 {
		return nil, errno
	}
	if n.d.entries[name] != nil {
		return nil, syscall.EEXIST
	}
	rel := filepath.Join(n.d.rel, name)
	if err := syscall.Mkdir(n.m.abs(rel), mode); err != nil {
		return nil, errnoOf(err)
	}
	d := &dir{ino: n.m.ino(), rel: rel, mode: mode & 0o7777, entries: map[string]any{}}
	n.d.entries[name] = d
	return n.child(ctx, d, out), 0
}

func (n *dirNode) Rmdir(ctx context.Context, name string) syscall.Errno {
	if errno := n.m.lock(); errno != 0 {
		return errno
	}
	defer n.m.mu.Unlock()
	if errno := n.m.load(n.d); errno != 0 {
		return errno
	}
	d, ok := n.d.entries[name].(*dir)
	if !ok {
		if n.d.entries[name] == nil {
			return syscall.ENOENT
		}
		return syscall.ENOTDIR
	}
	if errno := n.m.load(d); errno != 0 {
		return errno
	}
	if len(d.entries) > 0 {
		return syscall.ENOTEMPTY
	}
	// Its unlinks become durable first: rmdir takes effect at once.
	if err := n.m.applyDirOps(d, len(d.log)); err != nil {
		return syscall.EIO
	}
	if err := syscall.Rmdir(n.m.abs(d.rel)); err != nil {
		return errnoOf(err)
	}
	delete(n.d.entries, name)
	return 0
}

func (n *dirNode) Unlink(ctx context.Context, name string) syscall.Errno {
	if errno := n.m.lock(); errno != 0 {
		return errno
	}
	defer n.m.mu.Unlock()
	if errno := n.m.load(n.d); errno != 0 {
		return errno
	}
	return n.m.unlink(n.d, name)
}

func (n *dirNode) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	np, ok := newParent.(*dirNode)
	if !ok || np.d != n.d {
		return syscall.EXDEV // renames across directories are not modelled (doc.go)
	}
	if flags&^renameNoReplace != 0 {
		return syscall.EINVAL
	}
	if errno := n.m.lock(); errno != 0 {
		return errno
	}
	defer n.m.mu.Unlock()
	if errno := n.m.load(n.d); errno != 0 {
		return errno
	}
	return n.m.rename(n.d, name, newName, flags&renameNoReplace != 0)
}

func (n *dirNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if errno := n.m.lock(); errno != 0 {
		return errno
	}
	defer n.m.mu.Unlock()
	n.m.dirAttr(n.d, &out.Attr)
	return 0
}

func (n *dirNode) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if errno := n.m.lock(); errno != 0 {
		return errno
	}
	defer n.m.mu.Unlock()
	if mode, ok := in.GetMode(); ok {
		if err := syscall.Chmod(n.m.abs(n.d.rel), mode); err != nil {
			return errnoOf(err)
		}
		n.d.mode = mode & 0o7777
	}
	n.m.dirAttr(n.d, &out.Attr)
	return 0
}

// Fsync of a directory makes its logged changes durable.
func (n *dirNode) Fsync(ctx context.Context, fh fs.FileHandle, flags uint32) syscall.Errno {
	if errno := n.m.lock(); errno != 0 {
		return errno
	}
	errno, released := n.m.fsync(n.d.rel, true)
	if released {
		return errno
	}
	defer n.m.mu.Unlock()
	if errno != 0 {
		return errno
	}
	n.m.stats.DirSyncs++
	if err := n.m.applyDirOps(n.d, len(n.d.log)); err != nil {
		return syscall.EIO
	}
	return 0
}

func (n *dirNode) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	return n.m.statfs(out)
}

func (m *model) statfs(out *fuse.StatfsOut) syscall.Errno {
	if errno := m.lock(); errno != 0 {
		return errno
	}
	defer m.mu.Unlock()
	var st syscall.Statfs_t
	if err := syscall.Statfs(m.backing, &st); err != nil {
		return errnoOf(err)
	}
	out.FromStatfsT(&st)
	if m.noSpaceAt >= 0 && m.statfsRoom {
		room := max(0, m.noSpaceAt-m.stats.Allocated) / int64(out.Bsize)
		out.Bfree = min(out.Bfree, uint64(room))
		out.Bavail = min(out.Bavail, uint64(room))
	}
	return 0
}

func (n *fileNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if errno := n.m.lock(); errno != 0 {
		return errno
	}
	defer n.m.mu.Unlock()
	n.m.fileAttr(n.f, &out.Attr)
	return 0
}

func (n *fileNode) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if errno := n.m.lock(); errno != 0 {
		return errno
	}
	defer n.m.mu.Unlock()
	f := n.f
	if size, ok := in.GetSize(); ok {
		n.m.truncate(f, int64(size))
	}
	if mode, ok := in.GetMode(); ok {
		f.mode = mode & 0o7777
	}
	if uid, ok := in.GetUID(); ok {
		f.uid = uid
	}
	if gid, ok := in.GetGID(); ok {
		f.gid = gid
	}
	if mtime, ok := in.GetMTime(); ok {
		f.mtime = mtime
	}
	n.m.fileAttr(f, &out.Attr)
	return 0
}

func (n *fileNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if errno := n.m.lock(); errno != 0 {
		return nil, 0, errno
	}
	defer n.m.mu.Unlock()
	if errno := n.m.open(n.f); errno != 0 {
		return nil, 0, errno
	}
	if flags&syscall.O_TRUNC != 0 {
		n.m.truncate(n.f, 0)
	}
	n.f.opens++
	return handle{}, 0, 0
}

func (n *fileNode) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if errno := n.m.lock(); errno != 0 {
		return nil, errno
	}
	defer n.m.mu.Unlock()
	k, errno := n.m.read(n.f, dest, off)
	if errno != 0 {
		return nil, errno
	}
	return fuse.ReadResultData(dest[:k]), 0
}

func (n *fileNode) Writev(ctx context.Context, fh fs.FileHandle, data [][]byte, off int64) (uint32, syscall.Errno) {
	if errno := n.m.lock(); errno != 0 {
		return 0, errno
	}
	defer n.m.mu.Unlock()
	buf := data[0]
	if len(data) > 1 {
		buf = nil
		for _, d := range data {
			buf = append(buf, d...)
		}
	}
	k, errno := n.m.write(n.f, buf, off)
	return uint32(k), errno
}

func (n *fileNode) Fsync(ctx context.Context, fh fs.FileHandle, flags uint32) syscall.Errno {
	if errno := n.m.lock(); errno != 0 {
		return errno
	}
	errno, released := n.m.fsync(n.f.loc, false)
	if released {
		return errno
	}
	defer n.m.mu.Unlock()
	if errno != 0 {
		return errno
	}
	return n.m.syncFile(n.f)
}

func (n *fileNode) Flush(ctx context.Context, fh fs.FileHandle) syscall.Errno { return 0 }

func (n *fileNode) Release(ctx context.Context, fh fs.FileHandle) syscall.Errno {
	if errno := n.m.lock(); errno != 0 {
		return errno
	}
	defer n.m.mu.Unlock()
	n.f.opens--
	n.m.reap(n.f)
	return 0
}

func (n *fileNode) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	return n.m.statfs(out)
}

// mountOptions: no kernel caching of entries or attributes (the model is
// the one truth), no writeback cache (every write reaches the daemon
// before write(2) returns), no direct I/O (bbolt maps the file: its mmap
// reads go through the page cache, which FUSE fills from the daemon).
func mountOptions() *fs.Options {
	var zero time.Duration
	return &fs.Options{
		EntryTimeout:    &zero,
		AttrTimeout:     &zero,
		NegativeTimeout: &zero,
		MountOptions: fuse.MountOptions{
			FsName:        "faultfs",
			Name:          "faultfs",
			DirectMount:   true,
			DisableXAttrs: true,
			MaxBackground: 64,
		},
	}
}

// renameNoReplace is renameat2's RENAME_NOREPLACE.
const renameNoReplace = 0x1
