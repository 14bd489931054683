// Package diskfree tells the free space of a file system: what the WAL
// keeps free for its commits (wal.min_free_bytes) and what S3 staging
// leaves to it (README.md, S3).
package diskfree
