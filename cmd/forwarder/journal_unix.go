//go:build unix

package main

import (
	"os"
	"strconv"
	"strings"
	"syscall"
)

// onJournal reports whether f is the stream systemd connected to the journal:
// JOURNAL_STREAM is "DEVICE:INODE" of it.
func onJournal(f *os.File) bool {
	dev, ino, ok := strings.Cut(os.Getenv("JOURNAL_STREAM"), ":")
	if !ok {
		return false
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return false
	}
	return dev == strconv.FormatUint(uint64(st.Dev), 10) && ino == strconv.FormatUint(st.Ino, 10)
}
