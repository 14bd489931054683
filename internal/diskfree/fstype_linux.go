//go:build linux

package diskfree

import "syscall"

// networkFS names the file systems statfs(2) reports by magic number
// whose locks or syncs may not be a local disk's: network and FUSE file
// systems (linux/magic.h).
var networkFS = map[int64]string{
	0x6969:     "nfs",
	0xff534d42: "cifs",
	0xfe534d42: "smb2",
	0x517b:     "smb",
	0x65735546: "fuse",
	0x00c36400: "ceph",
	0x6b414653: "afs",
	0x47504653: "gpfs",
	0x0bd00bd0: "lustre",
}

// Network names the file system holding dir when it is a network or FUSE
// one (nfs, cifs, fuse, ...); "" for a local one, or when it cannot be
// told.
func Network(dir string) string {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return ""
	}
	return networkFS[int64(uint32(st.Type))]
}
