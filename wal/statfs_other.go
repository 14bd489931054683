//go:build !unix

package wal

// fsFreeBytes cannot tell the free space here: appends are not held for it.
func fsFreeBytes(string) (int64, bool) { return 0, false }
