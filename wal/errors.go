package wal

import (
	"errors"
	"fmt"
)

// Errors returned by the WAL. Wrapped errors keep these as their cause, so
// callers test them with errors.Is.
var (
	// ErrClosed is returned by every call made after Close.
	ErrClosed = errors.New("wal: closed")

	// ErrFatal is the cause of every error after a commit failed in a way
	// that leaves durability unknown (a failed fsync, an I/O error). The WAL
	// stops accepting appends for good; the process must exit and be restarted.
	ErrFatal = errors.New("wal: fatal write error, not accepting appends")

	// ErrNoSpace is returned by Append when the file system had no room for
	// the transaction. Nothing of that transaction was stored and the WAL is
	// still usable: the caller may retry once space is available.
	ErrNoSpace = errors.New("wal: no space left on device")

	// ErrFull is returned, with the context's error, by an Append whose
	// context ended while it waited for room (wal.max_bytes with
	// WhenFull Block, or the disk's floor): nothing of it was stored.
	ErrFull = errors.New("wal: full")

	// ErrTooLarge is returned by Append for a request that could never fit
	// under max_bytes, even with the WAL empty.
	ErrTooLarge = errors.New("wal: append larger than max_bytes")

	// ErrChunkID is returned by Append for a chunk id over MaxChunkID bytes,
	// or a digest over MaxChunkDigest bytes (or without an id).
	ErrChunkID = errors.New("wal: chunk id too long")

	// ErrChunkConflict is returned by Append for a chunk id seen within the
	// dedup window with another digest: the id was reused for another
	// request. Nothing of the append is stored.
	ErrChunkConflict = errors.New("wal: chunk id already used for another request")

	// ErrLocked is returned by Open when another process holds the file.
	ErrLocked = errors.New("wal: file is locked by another process")

	// ErrFormat is returned by Open for a file written in another format version.
	ErrFormat = errors.New("wal: unsupported format version")

	// ErrCursorAhead is returned when a cursor is set past the last record.
	ErrCursorAhead = errors.New("wal: cursor beyond the last record")

	// ErrUnknownCursor is returned for a cursor that was never registered.
	ErrUnknownCursor = errors.New("wal: unknown cursor")

	// ErrReadOnly is returned by writes on a WAL opened read-only.
	ErrReadOnly = errors.New("wal: opened read-only")
)

// CorruptionError reports damaged data: an entry whose checksum or framing
// does not match, or a file whose pages do not fit what its meta page says.
// It never comes with partial data; the reader stops at the damaged entry.
type CorruptionError struct {
	Path     string // the WAL file
	FirstSeq uint64 // first sequence number of the damaged entry; 0 when not about an entry
	LastSeq  uint64 // last one, when known (0: unknown)
	Offset   int64  // byte offset in the file, for file-level damage; -1 when not known
	Err      error
}

func (e *CorruptionError) Error() string {
	switch {
	case e.FirstSeq != 0 && e.LastSeq != 0:
		return fmt.Sprintf("wal: corruption in %s, entry with records %d-%d: %v", e.Path, e.FirstSeq, e.LastSeq, e.Err)
	case e.FirstSeq != 0:
		return fmt.Sprintf("wal: corruption in %s, entry starting at record %d: %v", e.Path, e.FirstSeq, e.Err)
	case e.Offset >= 0:
		return fmt.Sprintf("wal: corruption in %s at byte %d: %v", e.Path, e.Offset, e.Err)
	default:
		return fmt.Sprintf("wal: corruption in %s: %v", e.Path, e.Err)
	}
}

func (e *CorruptionError) Unwrap() error { return e.Err }
