// Package faultfs is a FUSE file system for tests that shows what a power
// cut leaves on a disk. It mounts a directory over a backing directory,
// keeps in its daemon every change that was not fsynced, serves reads from
// those changes (so a process sees its own writes, through read(2) and
// through mmap alike), and on Cut drops them and unmounts: the backing
// directory then holds what the disk would hold after the power came back.
//
// # The model
//
// Kept in the daemon, not in the backing directory, until an fsync:
//
//   - a file's writes since its last fsync or fdatasync of that file, in
//     4 KiB blocks, and its size changes (a truncate, or a write past the
//     end, is a change like a write);
//   - a directory's changes since its last fsync of that directory:
//     creates, renames within it and unlinks. Until then a new file's data
//     lives in a staging directory of the backing directory, which the
//     mount never shows; fsyncing a file does not make its name durable.
//
// An fsync is a barrier: what it covers reaches the backing directory
// whole, before the fsync returns. So writes that an fsync covered can
// never be lost or reordered against later ones, and that is not modelled
// either.
//
// Cut keeps what was fsynced and drops the rest, with two options
// (CutOptions): Tear keeps a prefix of the newest write that no fsync
// covered, cut at a multiple of 512 bytes or 4 KiB inside it (a disk that
// lost power in the middle of a write); DirOps keeps all, or a random
// prefix, of each directory's unsynced changes (a journal that committed
// them on its own). A rename is one change: it is kept or dropped whole.
// The "newest write" is the newest write request the daemon received: the
// kernel sends a large write(2) as several requests (of at most 128 KiB,
// and split where a partial page starts).
//
// Not modelled: unsynced writes that reach the disk on their own (other
// than a torn last write), directories themselves (mkdir and rmdir take
// effect in the backing directory at once; rmdir first applies the
// directory's own changes), renames across directories and of directories
// (EXDEV), hard links, symlinks, extended attributes, and file modes,
// owners and times beyond the daemon's memory. After a failed fsync the
// writes stay pending (and visible): a later fsync, once healed, applies
// them, where Linux may have dropped them; a WAL must not retry an fsync
// either way. The backing files are written but not fsynced: the test
// machine itself keeps its page cache.
//
// # Faults
//
// FailSyncs makes every fsync return EIO once a number of bytes have been
// written. NoSpace makes every write that needs a new block return ENOSPC
// once a number of bytes of blocks have been allocated (overwrites of
// allocated blocks go on, as on a full disk; blocks of the files that were
// there at the mount count as allocated; truncating gives room back,
// unlinking does not), and can make statfs report only the room left.
// Overwrites must go on: the kernel copies a write into the page cache
// before it asks the daemon, so a refused overwrite of a page that a
// process maps (bbolt's meta pages) could leave the mapping showing what
// the file does not hold.
// FreezeAtSync stops the file system at a chosen fsync, before it takes
// effect: that fsync and every later operation wait until Cut, which
// leaves what a power cut at that instant would.
//
// # The daemon and the kernel
//
// The daemon is the test binary itself, started again by Start: a package
// that imports faultfs serves a mount when the FAULTFS_DAEMON variable is
// set, from an init function, and never runs its tests then. It must be
// another process than the one that uses the mount: a page fault on a
// mapping of a FUSE file waits for the daemon and cannot be stopped by
// the Go runtime, whose garbage collector may meanwhile have stopped the
// goroutines that would answer it. The mount has no writeback cache (every
// write reaches the daemon before write(2) returns), no direct I/O (so
// mmap works and reads through the page cache, which FUSE fills from the
// daemon and updates on every write), no passthrough, and no kernel
// caching of entries or attributes. Processes must be stopped before Cut:
// one still running would see its own writes vanish.
//
// Start skips the test without root or /dev/fuse. t.Cleanup unmounts a
// mount the test did not cut (lazily when a file is still open on it);
// the daemon unmounts when the test process closes its standard input or
// dies (SIGTERM by Pdeathsig), and Start detaches mounts whose daemon was
// killed (their mount point answers ENOTCONN).
//
// # Usage
//
//	m := faultfs.Start(t, backing) // mounted at m.Dir
//	// run the process under test on m.Dir, then SIGKILL it
//	m.Cut(faultfs.CutOptions{Tear: 512, Seed: seed})
//	// backing holds what a power cut leaves; faultfs.Start(t, backing) again
package faultfs
