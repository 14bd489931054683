//go:build unix

package wal

import "syscall"

// fsFreeBytes is the space on the file system holding dir that an
// unprivileged process may still take.
func fsFreeBytes(dir string) (int64, bool) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, false
	}
	return int64(st.Bavail) * int64(st.Bsize), true
}
