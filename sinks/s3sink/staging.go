package s3sink

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/logfwd/forwarder/internal/diskfree"
)

// staging keeps the compressed members of open objects in files under one
// directory, one file per partition with an open object, so that an
// object's size is not bounded by memory (see README.md, S3 sink). The
// files are written without fsync: the WAL holds the records, and a crash
// loses only what the cursor has not passed, which the next start builds
// again (clean removes what a previous run left). No file stays open: a
// member is written with open, write, close.
type staging struct {
	dir     string
	max     int64 // bytes of all files at most
	minFree int64 // bytes left free on the file system at least (0: no bound)
	log     *slog.Logger
	m       *metrics

	mu    sync.Mutex
	sizes map[string]int64 // each file's length, by path
	total int64            // sum of sizes
	// warnedAt is when the last "staging is full" line was logged: at most
	// one a minute.
	warnedAt time.Time
}

// errStagingFull is what stage returns when a member does not fit.
var errStagingFull = errors.New("s3 staging: full")

// errStagingSmall is errStagingFull for a member larger than all of
// staging: staging_max_bytes too small for anything to be staged (a small
// wal.max_bytes, of which it is an eighth by default).
var errStagingSmall = fmt.Errorf("%w: staging_max_bytes is smaller than one piece of an object", errStagingFull)

// errStagingDisk is what stage returns when a member would leave less
// than minFree on the file system.
var errStagingDisk = errors.New("s3 staging: the disk is nearly full")

func newStaging(dir string, maxBytes, minFree int64, log *slog.Logger, m *metrics) (*staging, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create staging directory: %w", err)
	}
	return &staging{dir: dir, max: maxBytes, minFree: minFree, log: log, m: m, sizes: map[string]int64{}}, nil
}

// path is where the open object of partition is staged.
func (st *staging) path(partition string) string {
	sum := sha256.Sum256([]byte(partition))
	return filepath.Join(st.dir, hex.EncodeToString(sum[:16]))
}

// stage writes body at off in the file at path and cuts the file there:
// the file then holds its first off bytes and body. off 0 starts the file
// anew. It fails with errStagingFull, writing nothing, when the files
// would hold more than max.
func (st *staging) stage(path string, off int64, body []byte) error {
	end := off + int64(len(body))
	if st.minFree > 0 && end > off {
		if free, ok := diskfree.Free(st.dir); ok && free-(end-off) < st.minFree {
			return errStagingDisk
		}
	}
	if int64(len(body)) > st.max {
		return fmt.Errorf("%w (%d bytes)", errStagingSmall, len(body))
	}
	st.mu.Lock()
	was := st.sizes[path]
	if grow := end - was; grow > 0 && st.total+grow > st.max {
		st.mu.Unlock()
		return errStagingFull
	}
	// A file that shrinks keeps its size counted until it has shrunk: the
	// files on disk never hold more than max, not even for a moment.
	st.total += max(end-was, 0)
	st.sizes[path] = max(end, was)
	st.mu.Unlock()
	err := writeAt(path, off, body, off > 0 && was > end)
	if off == 0 && errors.Is(err, fs.ErrNotExist) && os.MkdirAll(st.dir, 0o700) == nil {
		// The directory was removed while the sink ran (by hand, or a
		// clean-up of the disk): made again, rather than staging nothing
		// until a restart.
		st.log.Warn("the S3 staging directory was removed while the sink ran: made again", "dir", st.dir)
		err = writeAt(path, off, body, false)
	}
	if err == nil && end < was {
		st.mu.Lock()
		st.total -= was - end
		st.sizes[path] = end
		st.mu.Unlock()
	}
	if err != nil {
		// A piece added to an object's file (off > 0) that could not be
		// written, on a full disk say, is cut off: the file holds the
		// object's earlier pieces again, which its upload reads instead
		// of rebuilding the object from the WAL. Otherwise what the file
		// holds is unknown: it counts as empty, and starts anew next time
		// (off 0 truncates).
		keep := int64(0)
		if off > 0 && os.Truncate(path, off) == nil {
			keep = off
		}
		if keep == 0 {
			_ = os.Remove(path) // gone before its room is given to another
		}
		st.mu.Lock()
		st.total -= st.sizes[path] - keep
		if keep > 0 {
			st.sizes[path] = keep
		} else {
			delete(st.sizes, path)
		}
		st.mu.Unlock()
	}
	st.m.stagingBytes.Set(float64(st.bytes()))
	return err
}

func writeAt(path string, off int64, body []byte, truncate bool) error {
	flags := os.O_WRONLY | os.O_CREATE
	if off == 0 {
		flags |= os.O_TRUNC
	}
	f, err := os.OpenFile(path, flags, 0o600)
	if err != nil {
		return fmt.Errorf("open staging file: %w", err)
	}
	if _, err = f.WriteAt(body, off); err == nil && truncate {
		err = f.Truncate(off + int64(len(body)))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write staging file %s: %w", path, err)
	}
	return nil
}

// remove deletes the file at path, whose object is delivered or given up.
func (st *staging) remove(path string) {
	// Removed first, then no longer counted: the room goes to another
	// object only once the file is gone.
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		st.log.Warn("could not remove a staged object's file; it is removed at the next start", "error", err)
	}
	st.mu.Lock()
	st.total -= st.sizes[path]
	delete(st.sizes, path)
	st.mu.Unlock()
	st.m.stagingBytes.Set(float64(st.bytes()))
}

func (st *staging) bytes() int64 {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.total
}

// open returns the first n bytes of the file at path to read.
func (st *staging) open(path string, n int64) (*os.File, *io.SectionReader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("open staged object: %w", err)
	}
	fi, err := f.Stat()
	if err == nil && fi.Size() < n {
		err = fmt.Errorf("staged object %s holds %d bytes, not %d", path, fi.Size(), n)
	}
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, io.NewSectionReader(f, 0, n), nil
}

// full notes a member that staging had no room for (or could not write):
// counted, and said at most once a minute.
func (st *staging) full(cause error, what string) {
	st.m.stagingFull.Inc()
	st.mu.Lock()
	now := time.Now()
	warn := now.Sub(st.warnedAt) >= time.Minute
	if warn {
		st.warnedAt = now
	}
	total := st.total
	st.mu.Unlock()
	if !warn {
		return
	}
	if errors.Is(cause, errStagingDisk) {
		free, _ := diskfree.Free(st.dir)
		st.log.Warn("S3 staging leaves the disk's last free space (twice wal.min_free_bytes) to the WAL: "+what+"; counted in forwarder_s3_staging_full_total, said at most once a minute",
			"dir", st.dir, "staged_bytes", total, "disk_free_bytes", free, "kept_free_bytes", st.minFree)
		return
	}
	if errors.Is(cause, errStagingSmall) {
		st.log.Warn("S3 staging cannot hold one piece of an object (the records of a batch, compressed): staging_max_bytes is smaller, so nothing is staged and "+what+"; raise staging_max_bytes (by default an eighth of wal.max_bytes); counted in forwarder_s3_staging_full_total, said at most once a minute",
			"dir", st.dir, "staging_max_bytes", st.max, "error", cause)
		return
	}
	if errors.Is(cause, errStagingFull) {
		st.log.Warn("S3 staging is full (staging_max_bytes): "+what+"; counted in forwarder_s3_staging_full_total, said at most once a minute",
			"dir", st.dir, "staged_bytes", total, "staging_max_bytes", st.max)
		return
	}
	if errors.Is(cause, fs.ErrNotExist) {
		// Its upload rebuilds the object from the WAL.
		st.log.Warn("a staged object's file was removed while the sink ran (by hand, or a clean-up of the disk): "+what+"; counted in forwarder_s3_staging_full_total, said at most once a minute",
			"dir", st.dir, "error", cause)
		return
	}
	st.log.Warn("could not write to S3 staging: "+what+"; counted in forwarder_s3_staging_full_total, said at most once a minute",
		"dir", st.dir, "error", cause)
}

// clean removes every file in the directory: what a previous run left of
// its open objects, whose records the WAL still holds after the cursor.
// It runs before any record is read. What it cannot remove is warned
// about and left: a stale file is never read (a new object's first piece
// truncates its file), and staging makes the directory again when it is
// gone (removed by hand to free the disk while the sink waited to start).
func (st *staging) clean() {
	// Files left count against staging_max_bytes, as they take the disk:
	// under their paths, so that an object staged there again counts once.
	leftSizes := map[string]int64{}
	defer func() {
		st.mu.Lock()
		clear(st.sizes)
		st.total = 0
		for path, n := range leftSizes {
			st.sizes[path] = n
			st.total += n
		}
		total := st.total
		st.mu.Unlock()
		st.m.stagingBytes.Set(float64(total))
	}()
	ents, err := os.ReadDir(st.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	removed, left := 0, 0
	var cause error
	for _, e := range ents {
		path := filepath.Join(st.dir, e.Name())
		if err := os.RemoveAll(path); err != nil {
			left++
			cause = err
			if info, err := os.Lstat(path); err == nil && info.Mode().IsRegular() {
				leftSizes[path] = info.Size()
			}
			continue
		}
		removed++
	}
	if removed > 0 {
		st.log.Info("removed the staged objects a previous run left; their records are read again from the WAL", "dir", st.dir, "files", removed)
	}
	if err != nil || left > 0 {
		if err != nil {
			cause = err
		}
		st.log.Warn("could not remove what a previous run left in S3 staging; the sink starts, and an object whose file is left is written over when it begins",
			"dir", st.dir, "files_left", left, "error", cause)
	}
}
