package faultfs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	bolt "go.etcd.io/bbolt"
)

func writeFile(t *testing.T, path string, data []byte, sync bool) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
}

func syncDir(t *testing.T, dir string) {
	t.Helper()
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		t.Fatalf("fsync directory %s: %v", dir, err)
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func pattern(n int, c byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = c + byte(i%7)
	}
	return b
}

// TestCutKeepsOnlyWhatWasSynced: a file's writes since its last fsync,
// including a truncate, are seen through the mount and gone after a cut;
// what was fsynced stays.
func TestCutKeepsOnlyWhatWasSynced(t *testing.T) {
	b := t.TempDir()
	m := Start(t, b)
	p := filepath.Join(m.Dir, "f")
	old := pattern(3*blockSize+100, 'a')
	writeFile(t, p, old, true)
	syncDir(t, m.Dir)

	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("NEW"), blockSize-1); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(pattern(5000, 'x'), 4*blockSize); err != nil { // past the end: a hole between
		t.Fatal(err)
	}
	want := append([]byte(nil), old...)
	want = append(want, make([]byte, 4*blockSize-len(old))...)
	want = append(want, pattern(5000, 'x')...)
	copy(want[blockSize-1:], "NEW")
	if got := readFile(t, p); !bytes.Equal(got, want) {
		t.Fatalf("through the mount: %d bytes, want %d (the process's own writes)", len(got), len(want))
	}
	if got := readFile(t, filepath.Join(b, "f")); !bytes.Equal(got, old) {
		t.Fatalf("backing file changed before any fsync")
	}
	// A truncate is pending like a write.
	if err := f.Truncate(10); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(blockSize); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, p); !bytes.Equal(got, append(append([]byte(nil), old[:10]...), make([]byte, blockSize-10)...)) {
		t.Fatalf("after truncating to 10 and extending to %d the file holds %q...", blockSize, got[:20])
	}
	f.Close()
	st := m.Stats()
	if st.PendingBytes == 0 || st.Syncs != 2 {
		t.Errorf("stats %+v: want pending bytes and 2 fsyncs", st)
	}
	rep := m.Cut(CutOptions{})
	if rep.DroppedBytes == 0 {
		t.Errorf("cut dropped nothing: %+v", rep)
	}
	if got := readFile(t, filepath.Join(b, "f")); !bytes.Equal(got, old) {
		t.Fatalf("after the cut the file holds %d bytes, want the %d fsynced", len(got), len(old))
	}
	if _, err := os.Stat(filepath.Join(b, stagingName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("staging directory left after the cut: %v", err)
	}

	// A file fsynced after its writes keeps them all.
	m = Start(t, b)
	p = filepath.Join(m.Dir, "f")
	if got := readFile(t, p); !bytes.Equal(got, old) {
		t.Fatalf("remounted: %d bytes, want %d", len(got), len(old))
	}
	writeFile(t, p, []byte("synced"), true)
	if err := os.Truncate(p, 20); err != nil {
		t.Fatal(err)
	}
	fd, _ := os.OpenFile(p, os.O_RDWR, 0)
	fd.Sync()
	fd.Close()
	writeFile(t, p, []byte("lost"), false)
	m.Cut(CutOptions{})
	if got, want := readFile(t, filepath.Join(b, "f")), append([]byte("synced"), old[6:20]...); !bytes.Equal(got, want) {
		t.Fatalf("after the second cut: %q, want %q", got, want)
	}
}

// TestMmapSeesPendingWrites: a shared read-only mapping (what bbolt reads
// through) sees writes that are not fsynced, written before and after it
// was mapped, whole blocks and parts of them.
func TestMmapSeesPendingWrites(t *testing.T) {
	b := t.TempDir()
	m := Start(t, b)
	p := filepath.Join(m.Dir, "db")
	writeFile(t, p, pattern(4*blockSize, 'a'), true)
	syncDir(t, m.Dir)
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(pattern(blockSize, 'A'), blockSize); err != nil { // before the mapping
		t.Fatal(err)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, 4*blockSize, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(mem)
	if !bytes.Equal(mem[blockSize:2*blockSize], pattern(blockSize, 'A')) {
		t.Fatal("the mapping does not see a write made before it")
	}
	_ = mem[2*blockSize] // fault the page in before it is written
	if _, err := f.WriteAt([]byte("partial"), 2*blockSize+100); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(pattern(blockSize, 'Q'), 3*blockSize); err != nil {
		t.Fatal(err)
	}
	if got := string(mem[2*blockSize+100 : 2*blockSize+107]); got != "partial" {
		t.Fatalf("the mapping sees %q after a partial write to a mapped page", got)
	}
	if !bytes.Equal(mem[3*blockSize:], pattern(blockSize, 'Q')) {
		t.Fatal("the mapping does not see a whole-page write")
	}
	// A mapping made afresh (a bbolt remap) sees them too.
	mem2, err := syscall.Mmap(int(f.Fd()), 0, 4*blockSize, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(mem2)
	if !bytes.Equal(mem2, mem) {
		t.Fatal("a new mapping differs from the old one")
	}
}

// TestDirectoryChangesNeedDirectoryFsync: creates, renames and unlinks
// are durable only once their directory is fsynced; fsyncing the file
// does not make its name durable.
func TestDirectoryChangesNeedDirectoryFsync(t *testing.T) {
	b := t.TempDir()
	m := Start(t, b)
	writeFile(t, filepath.Join(m.Dir, "old"), []byte("old"), true)
	writeFile(t, filepath.Join(m.Dir, "gone"), []byte("gone"), true)
	syncDir(t, m.Dir)

	writeFile(t, filepath.Join(m.Dir, "new"), []byte("new"), true) // fsynced, its name not
	writeFile(t, filepath.Join(m.Dir, "tmp"), []byte("replacement"), true)
	if err := os.Rename(filepath.Join(m.Dir, "tmp"), filepath.Join(m.Dir, "old")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(m.Dir, "gone")); err != nil {
		t.Fatal(err)
	}
	if got := string(readFile(t, filepath.Join(m.Dir, "old"))); got != "replacement" {
		t.Fatalf("through the mount old holds %q", got)
	}
	names := func(dir string) []string {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range ents {
			if e.Name() != stagingName {
				out = append(out, e.Name())
			}
		}
		return out
	}
	if got := names(m.Dir); len(got) != 2 || got[0] != "new" || got[1] != "old" {
		t.Fatalf("through the mount: %v", got)
	}
	m.Cut(CutOptions{})
	if got := names(b); len(got) != 2 || got[0] != "gone" || got[1] != "old" {
		t.Fatalf("after the cut: %v, want [gone old]", got)
	}
	if got := string(readFile(t, filepath.Join(b, "old"))); got != "old" {
		t.Fatalf("after the cut old holds %q: the rename was not fsynced", got)
	}

	// The same with the directory fsynced: all of it stays.
	m = Start(t, b)
	writeFile(t, filepath.Join(m.Dir, "new"), []byte("new"), true)
	writeFile(t, filepath.Join(m.Dir, "tmp"), []byte("replacement"), true)
	os.Rename(filepath.Join(m.Dir, "tmp"), filepath.Join(m.Dir, "old"))
	os.Remove(filepath.Join(m.Dir, "gone"))
	writeFile(t, filepath.Join(m.Dir, "unsynced"), []byte("data"), false)
	syncDir(t, m.Dir)
	m.Cut(CutOptions{})
	if got := names(b); len(got) != 3 || got[0] != "new" || got[1] != "old" || got[2] != "unsynced" {
		t.Fatalf("after the cut with the directory fsynced: %v, want [new old unsynced]", got)
	}
	if got := string(readFile(t, filepath.Join(b, "old"))); got != "replacement" {
		t.Fatalf("old holds %q", got)
	}
	if got := readFile(t, filepath.Join(b, "unsynced")); len(got) != 0 {
		t.Fatalf("a file whose name was fsynced but not its data holds %q, want nothing", got)
	}

	// SomeDirOps keeps a prefix of the changes: a rename is one change, so
	// the name old always holds one of its two contents.
	for seed := int64(0); seed < 6; seed++ {
		m = Start(t, b)
		tmp := filepath.Join(m.Dir, fmt.Sprintf("tmp%d", seed))
		writeFile(t, tmp, []byte("third"), true)
		os.Rename(tmp, filepath.Join(m.Dir, "old"))
		rep := m.Cut(CutOptions{DirOps: SomeDirOps, Seed: seed})
		got := string(readFile(t, filepath.Join(b, "old")))
		if got != "replacement" && got != "third" {
			t.Fatalf("seed %d (%+v): old holds %q", seed, rep, got)
		}
		if rep.KeptDirOps+rep.DroppedDirOps != 2 {
			t.Fatalf("seed %d: %+v, want 2 changes", seed, rep)
		}
	}
}

// TestKeepDirOps: a cut that keeps every directory change leaves the names
// as an fsync of the directory would, with the data that was fsynced.
func TestKeepDirOps(t *testing.T) {
	b := t.TempDir()
	m := Start(t, b)
	writeFile(t, filepath.Join(m.Dir, "synced"), []byte("data"), true)
	writeFile(t, filepath.Join(m.Dir, "unsynced"), []byte("data"), false)
	rep := m.Cut(CutOptions{DirOps: KeepDirOps})
	if rep.KeptDirOps != 2 || rep.DroppedDirOps != 0 {
		t.Fatalf("%+v: want both creates kept", rep)
	}
	if got := string(readFile(t, filepath.Join(b, "synced"))); got != "data" {
		t.Fatalf("synced holds %q", got)
	}
	if got := readFile(t, filepath.Join(b, "unsynced")); len(got) != 0 {
		t.Fatalf("unsynced holds %q, want nothing", got)
	}
}

// TestTornWrite: Tear keeps a prefix of the newest unsynced write, cut at
// a multiple of the sector size, and drops the earlier unsynced writes.
func TestTornWrite(t *testing.T) {
	for _, tear := range []int64{512, 4096} {
		b := t.TempDir()
		seen := map[int]bool{}
		for seed := int64(0); seed < 8; seed++ {
			m := Start(t, b)
			p := filepath.Join(m.Dir, "f")
			old := pattern(64<<10, 'a')
			writeFile(t, p, old, true)
			syncDir(t, m.Dir)
			f, _ := os.OpenFile(p, os.O_RDWR, 0)
			f.WriteAt([]byte("earlier"), 0)
			last := pattern(20000, 'K')
			f.WriteAt(last, 1000)
			f.Close()
			rep := m.Cut(CutOptions{Tear: tear, Seed: seed})
			// The kernel may send one write(2) as several requests: the
			// torn one is the last of them.
			tw := rep.Torn
			if tw == nil || tw.Off < 1000 || tw.Off+int64(tw.Len) != 21000 {
				t.Fatalf("tear %d: report %+v, want the end of the write at 1000", tear, tw)
			}
			if tw.Kept <= 0 || tw.Kept >= tw.Len || (tw.Off+int64(tw.Kept))%tear != 0 {
				t.Fatalf("tear %d: kept %d bytes of a write at %d", tear, tw.Kept, tw.Off)
			}
			seen[tw.Kept] = true
			want := append([]byte(nil), old...)
			copy(want[tw.Off:], last[tw.Off-1000:tw.Off-1000+int64(tw.Kept)])
			if got := readFile(t, filepath.Join(b, "f")); !bytes.Equal(got, want) {
				t.Fatalf("tear %d: the file is not the old one with %d bytes of the last write", tear, tw.Kept)
			}
		}
		if len(seen) < 2 {
			t.Errorf("tear %d: every seed kept the same prefix: %v", tear, seen)
		}
	}
}

// TestFaultSwitches: fsyncs fail with EIO and writes that allocate fail
// with ENOSPC, after a number of bytes or at once, until Heal.
func TestFaultSwitches(t *testing.T) {
	b := t.TempDir()
	m := Start(t, b)
	f, err := os.OpenFile(filepath.Join(m.Dir, "f"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m.FailSyncs(10000)
	f.WriteAt(pattern(9000, 'a'), 0)
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync before the threshold: %v", err)
	}
	f.WriteAt(pattern(2000, 'b'), 9000)
	if err := f.Sync(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("fsync past the threshold: %v, want EIO", err)
	}
	m.Heal()
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync after Heal: %v", err)
	}

	m.NoSpace(2*blockSize, true)
	var st syscall.Statfs_t
	if err := syscall.Statfs(m.Dir, &st); err != nil {
		t.Fatal(err)
	}
	if free := int64(st.Bavail) * st.Bsize; free != 2*blockSize {
		t.Errorf("statfs reports %d bytes free, want %d", free, 2*blockSize)
	}
	if _, err := f.WriteAt(pattern(2*blockSize, 'c'), 3*blockSize); err != nil { // blocks 3, 4: new
		t.Fatalf("write within the room: %v", err)
	}
	if _, err := f.WriteAt([]byte("x"), 5*blockSize); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write past the room: %v, want ENOSPC", err)
	}
	if _, err := f.WriteAt(pattern(3*blockSize, 'd'), 0); err != nil {
		t.Fatalf("overwrite of allocated blocks on a full disk: %v", err)
	}
	if st := m.Stats(); st.FailedWrites != 1 || st.FailedSyncs != 1 {
		t.Errorf("stats %+v: want 1 failed write and 1 failed fsync", st)
	}
	m.Heal()
	if _, err := f.WriteAt([]byte("x"), 5*blockSize); err != nil {
		t.Fatalf("write after Heal: %v", err)
	}
}

// TestFreezeAtSync: the chosen fsync and everything after it wait until
// the cut, and the cut leaves what was durable before that fsync.
func TestFreezeAtSync(t *testing.T) {
	b := t.TempDir()
	m := Start(t, b)
	p := filepath.Join(m.Dir, "f")
	writeFile(t, p, []byte("one"), true) // fsync 1
	m.FreezeAtSync(1)
	f, _ := os.OpenFile(p, os.O_RDWR, 0)
	f.WriteAt([]byte("two"), 0)
	errc := make(chan error, 1)
	go func() { errc <- f.Sync() }() // fsync 2: freezes
	waitFor(t, func() bool { return m.Frozen().Frozen })
	if fr := m.Frozen(); fr.Sync != 2 || fr.Dir {
		t.Fatalf("frozen at %+v, want the file's second fsync", fr)
	}
	syncDir(t, b) // the backing directory itself is not frozen
	m.Cut(CutOptions{})
	if err := <-errc; err == nil {
		t.Fatal("the frozen fsync succeeded")
	}
	f.Close()
	if _, err := os.Stat(filepath.Join(b, "f")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the file's name was never fsynced, yet it is there: %v", err)
	}
}

// TestBboltOnFaultfs: bbolt works through the mount (its writes, fdatasyncs
// and mmap reads, growing the file and reopening it), and a cut keeps
// exactly the transactions it committed with a sync.
func TestBboltOnFaultfs(t *testing.T) {
	b := t.TempDir()
	m := Start(t, b)
	path := filepath.Join(m.Dir, "b.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	syncDir(t, m.Dir)
	val := pattern(3000, 'v')
	put := func(db *bolt.DB, from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			if err := db.Update(func(tx *bolt.Tx) error {
				bk, err := tx.CreateBucketIfNotExists([]byte("b"))
				if err != nil {
					return err
				}
				return bk.Put([]byte{byte(i >> 8), byte(i)}, val)
			}); err != nil {
				t.Fatalf("put %d: %v", i, err)
			}
		}
	}
	count := func(db *bolt.DB) int {
		n := 0
		db.View(func(tx *bolt.Tx) error {
			bk := tx.Bucket([]byte("b"))
			if bk == nil {
				return nil
			}
			return bk.ForEach(func(k, v []byte) error {
				if !bytes.Equal(v, val) {
					t.Fatalf("key %x holds a wrong value", k)
				}
				n++
				return nil
			})
		})
		return n
	}
	put(db, 0, 600) // grows the file past several remaps
	db.Close()
	db, err = bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := count(db); n != 600 {
		t.Fatalf("reopened through the mount: %d keys, want 600", n)
	}
	db.NoSync = true // THIS IS UNSAFE, which the cut shows
	put(db, 600, 700)
	if n := count(db); n != 700 {
		t.Fatalf("%d keys seen by the process, want 700", n)
	}
	db.Close()
	m.Cut(CutOptions{})
	db, err = bolt.Open(filepath.Join(b, "b.db"), 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if n := count(db); n != 600 {
		t.Fatalf("after the cut: %d keys, want the 600 synced", n)
	}
}

// TestCleanupUnmountsBusyMount: a mount the test leaves with a file open
// is detached by the cleanup; none is left behind.
func TestCleanupUnmountsBusyMount(t *testing.T) {
	var dir string
	var f *os.File
	t.Run("leave it busy", func(t *testing.T) {
		m := Start(t, t.TempDir())
		dir = m.Dir
		var err error
		if f, err = os.Create(filepath.Join(m.Dir, "open")); err != nil {
			t.Fatal(err)
		}
	})
	defer f.Close()
	if mounted(dir) {
		t.Fatalf("%s is still mounted after its test ended", dir)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for i := 0; i < 1000; i++ {
		if cond() {
			return
		}
		syscall.Nanosleep(&syscall.Timespec{Nsec: 5e6}, nil)
	}
	t.Fatal("condition not met within 5s")
}

// TestStaleMountDetached: a mount whose daemon was killed outright (its
// mount point answers ENOTCONN) is detached by the next Start.
func TestStaleMountDetached(t *testing.T) {
	m := Start(t, t.TempDir())
	m.cmd.Process.Signal(syscall.SIGKILL)
	m.cmd.Wait()
	m.done = true // its cleanup would detach it too: leave that to Start
	var st syscall.Stat_t
	if err := syscall.Stat(m.Dir, &st); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("stat of a mount whose daemon is gone: %v, want ENOTCONN", err)
	}
	Start(t, t.TempDir())
	if mounted(m.Dir) {
		t.Fatalf("%s is still mounted after the next Start", m.Dir)
	}
}
