// Package tmpfstest mounts small tmpfs file systems for tests that fill a
// real file system (README.md, Tests that skip: without root or
// CAP_SYS_ADMIN they skip).
package tmpfstest

import (
	"syscall"
	"testing"
)

// Mount mounts a tmpfs of size (mount's syntax: "8m", "64k") on a new
// directory and unmounts it when the test ends. Without root (or
// CAP_SYS_ADMIN) the test skips, saying why.
func Mount(t testing.TB, size string) string {
	t.Helper()
	mnt := t.TempDir()
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size="+size); err != nil {
		t.Skipf("cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN; README: Tests that skip): %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
			_ = syscall.Unmount(mnt, syscall.MNT_DETACH)
		}
	})
	return mnt
}
