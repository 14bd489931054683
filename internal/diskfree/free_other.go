//go:build !unix

package diskfree

// Free cannot tell the free space here.
func Free(string) (int64, bool) { return 0, false }

// Size cannot tell the file system's size here.
func Size(string) (int64, bool) { return 0, false }
