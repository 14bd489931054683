//go:build unix

package diskfree

import "syscall"

// Free is the space on the file system holding dir that an unprivileged
// process may still take; false when it cannot be told.
func Free(dir string) (int64, bool) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, false
	}
	return int64(st.Bavail) * int64(st.Bsize), true
}

// Size is the size of the file system holding dir; false when it cannot be
// told.
func Size(dir string) (int64, bool) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, false
	}
	return int64(st.Blocks) * int64(st.Bsize), true
}
