package wal

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/logfwd/forwarder/internal/diskfree"
)

// FileName is the WAL's file inside the data directory.
const FileName = "wal.db"

// formatVersion is stored in the meta bucket; Open refuses other versions.
const formatVersion = 1

// Bucket names. See doc.go for what each holds.
var (
	bucketMeta       = []byte("meta")
	bucketEntries    = []byte("entries")
	bucketCursors    = []byte("cursors")
	bucketDropped    = []byte("dropped")
	bucketState      = []byte("state")
	bucketChunks     = []byte("chunks")
	bucketChunkTimes = []byte("chunk_times")

	keyFormat  = []byte("format")
	keyNextSeq = []byte("next_seq")
	keyBytes   = []byte("bytes")
	// keySpaceProbe holds, for a moment, the value with which the writer
	// tries the room on a full disk (writer.probeRoom); Open deletes one a
	// crash left.
	keySpaceProbe = []byte("space_probe")
)

// SyncMode says when an append is fsynced relative to its acknowledgement.
type SyncMode int

const (
	// SyncAlways: Append returns after the transaction holding its records
	// is committed and fsynced. Nothing acknowledged is lost by a crash of
	// the process or of the machine.
	SyncAlways SyncMode = iota
	// SyncInterval: Append returns as soon as the writer has taken the
	// records; they are committed and fsynced about once per SyncInterval,
	// or earlier with a Commit, RegisterCursor, DropCursor, ReplaceDamaged
	// or Sync, which are fsynced at once, or with the deletes of retention
	// and chunk expiry.
	// THIS CAN LOSE ACKNOWLEDGED RECORDS: a crash of the process or of the
	// machine loses what was acknowledged since the last commit (up to
	// about one interval). The file itself is never left inconsistent.
	// Readers, Stats and Cursor see records once they are committed.
	SyncInterval
)

// FullPolicy says what Append does when live records would exceed MaxBytes.
type FullPolicy int

const (
	// Block makes Append wait until sinks pass enough records for
	// retention to make room (or until its context ends).
	Block FullPolicy = iota
	// DropOldest deletes the oldest entries, moves every cursor that had
	// not passed them forward, and counts what each cursor lost.
	DropOldest
)

// DefaultMinFreeBytes is the default Options.MinFreeBytes. A commit that
// frees entries needs new pages for the branches it rewrites and for the
// freelist, which bbolt writes whole on every commit (8 bytes a free page,
// in one run of pages): 64 MiB holds that for a file of up to 32 GiB with
// every page free, and the rewritten branches besides.
const DefaultMinFreeBytes = 64 << 20

// Options configure Open. The zero value is usable: no size limit,
// SyncAlways, a ten-minute dedup window.
type Options struct {
	MaxBytes     int64 // bound on live entry bytes; 0: none
	WhenFull     FullPolicy
	Sync         SyncMode
	SyncInterval time.Duration // default 1s
	DedupWindow  time.Duration // default 10m
	ReadOnly     bool          // for inspection: no writer, no changes, shared lock
	LockTimeout  time.Duration // how long Open waits for the file lock; default 100ms
	Logger       *slog.Logger

	// FirstSeq is the sequence number of a new file's first record; 0: 1.
	// The service takes it from the clock (NewFirstSeq), so that a WAL
	// started anew (a new data_dir, a volume lost) does not number its
	// records as an earlier one did: S3 keys with ${seq} stay apart.
	FirstSeq uint64

	// MinFreeBytes is the room kept on the file system for the commits
	// that are not appends: cursors, sink state, retention. Appends wait
	// (see Full and DiskFull) while they would leave less than this free,
	// counting the free space of the file system and the free pages inside
	// the file. Default DefaultMinFreeBytes.
	MinFreeBytes int64

	// HoldFor is how long after an append waited for room (under MaxBytes,
	// or on the disk) Full stays true while an append of its size would
	// not fit, its client gone: its retry would wait again, and /readyz
	// would flap with every retry. Default 10s.
	HoldFor time.Duration

	// CursorTags says, by cursor name, which records a cursor's sink
	// takes (its match globs); a cursor not in it takes every record. It
	// only counts what DropOldest drops: a cursor loses the records of the
	// dropped entries its sink would have taken, not the others.
	CursorTags map[string]func(tag string) bool

	// Sinks names the configured sinks, whose cursors their deliveries
	// move; nil: not known (the wal tools, tests). A cursor not in it is
	// one no delivery moves: the max_bytes warning names it as such, and
	// the cursors level with it do not hold the WAL (Holding).
	Sinks []string

	// Compaction at Open: when the file is at least CompactMinFileBytes and
	// live entries take less than CompactRatio of it, the file is rewritten
	// to its live size. Defaults 64 MiB and 0.25; a negative ratio disables it.
	CompactMinFileBytes int64
	CompactRatio        float64
}

func (o *Options) setDefaults() {
	if o.SyncInterval <= 0 {
		o.SyncInterval = time.Second
	}
	if o.DedupWindow <= 0 {
		o.DedupWindow = 10 * time.Minute
	}
	if o.LockTimeout <= 0 {
		o.LockTimeout = 100 * time.Millisecond
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.MinFreeBytes <= 0 {
		o.MinFreeBytes = DefaultMinFreeBytes
	}
	if o.HoldFor <= 0 {
		o.HoldFor = heldFor
	}
	if o.CompactMinFileBytes <= 0 {
		o.CompactMinFileBytes = 64 << 20
	}
	if o.CompactRatio == 0 {
		o.CompactRatio = 0.25
	}
}

// WAL is the write-ahead log. All methods are safe for concurrent use.
type WAL struct {
	path     string
	db       *bolt.DB
	pageSize int64 // the file's page size, read at open (Info races with the writer)
	opts     Options
	log      *slog.Logger

	appendCh chan *appendReq
	commitCh chan *commitReq
	kick     chan struct{}
	quit     chan struct{}
	done     chan struct{}
	fatal    chan struct{}
	closeMu  sync.Mutex
	closed   bool

	recent   recent        // the entries committed last, uncompressed
	appended appendTimes   // when the records appended since Open were committed
	opened   time.Time     // when Open returned
	commits  atomic.Uint64 // transactions committed since Open
	damaged  atomic.Uint64 // records ReplaceDamaged replaced since Open
	// commitNanos sums the time commits took since Open (writing and
	// fsyncing); commitSince is when the writer's work on the disk under
	// way began (writer.atDisk; Unix nanoseconds; 0: none).
	commitNanos atomic.Int64
	commitSince atomic.Int64
	full        atomic.Bool // appends are waiting for room under max_bytes
	diskFull    atomic.Bool // appends are waiting for room on the disk (MinFreeBytes)

	mu       sync.Mutex
	st       state         // committed state, published by the writer
	notify   chan struct{} // closed when records are committed
	fatalErr error
	paused   map[string]bool // cursors of paused sinks (SetPaused)
}

// state is what the writer knows about the file; the writer owns a working
// copy and publishes it after each successful commit.
type state struct {
	nextSeq   uint64 // sequence number the next record gets; the first is 1
	firstSeq  uint64 // oldest live record; == nextSeq when there is none
	liveBytes int64  // sum of stored entry values
	cursors   map[string]uint64
	dropped   map[string]uint64 // records each cursor lost to DropOldest, ever
}

func (s state) clone() state {
	c := s
	c.cursors = make(map[string]uint64, len(s.cursors))
	for k, v := range s.cursors {
		c.cursors[k] = v
	}
	c.dropped = make(map[string]uint64, len(s.dropped))
	for k, v := range s.dropped {
		c.dropped[k] = v
	}
	return c
}

// NewFirstSeq is a first sequence number for a new WAL from the clock:
// seconds since 1970 times a million (about 1.8e15, under 2^53: exact in
// JSON and in a float). A WAL that appended fewer than a million records a
// second on average, since it began, ends below the first number of any
// WAL begun after it.
func NewFirstSeq(now time.Time) uint64 {
	return uint64(max(now.Unix(), 1)) * 1_000_000
}

// Open opens or creates the WAL file in dir. A file that another process
// holds open gives ErrLocked; a damaged file gives a *CorruptionError.
func Open(dir string, opts Options) (*WAL, error) {
	opts.setDefaults()
	path := filepath.Join(dir, FileName)
	_, statErr := os.Stat(path)
	existed := statErr == nil
	switch {
	case existed:
		damaged, err := checkFile(path)
		if err != nil && !(opts.ReadOnly && errors.Is(err, errDamagedFreelist)) {
			return nil, err
		}
		if damaged != nil {
			opts.Logger.Warn("wal: a meta page is damaged; bbolt falls back to the other one, which loses at most the transaction the damaged page recorded (a power loss during a commit leaves this behind)", "error", damaged)
		}
	case !errors.Is(statErr, os.ErrNotExist):
		return nil, fmt.Errorf("open wal: %w", statErr)
	case opts.ReadOnly:
		return nil, fmt.Errorf("open wal: %s does not exist", path)
	default:
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, fmt.Errorf("create data directory: %w", err)
		}
		if err := createFile(path, opts.FirstSeq); err != nil {
			return nil, err
		}
	}

	w := &WAL{path: path, opts: opts, log: opts.Logger}
	if err := w.openDB(); err != nil {
		return nil, err
	}
	st, err := w.load()
	if err != nil {
		w.db.Close()
		return nil, err
	}
	if !opts.ReadOnly && w.shouldCompact(st) {
		if err := w.compact(st.liveBytes); err != nil {
			w.db.Close()
			return nil, err
		}
	} else if !opts.ReadOnly {
		// A copy left by a compaction a stop or a crash cut short (the
		// file is locked: no other process makes one now).
		if err := os.Remove(path + compactSuffix); err == nil {
			w.log.Info("wal: removed the copy a compaction cut short left", "path", path+compactSuffix)
		}
	}
	if !existed {
		w.log.Info("wal: created a new WAL (there was none in data_dir): records in another data_dir or on a lost volume are not read", "path", path, "first_seq", st.nextSeq)
	}
	w.st = st
	w.appended.reset(st.nextSeq)
	w.opened = time.Now()
	w.notify = make(chan struct{})
	w.fatal = make(chan struct{})
	w.done = make(chan struct{})
	if opts.ReadOnly {
		close(w.done)
		return w, nil
	}
	w.appendCh = make(chan *appendReq)
	w.commitCh = make(chan *commitReq)
	w.kick = make(chan struct{}, 1)
	w.quit = make(chan struct{})
	wr := newWriter(w, st)
	wr.openRoom() // before Open returns: /readyz reads DiskFull at once
	go func() {
		defer close(w.done)
		wr.run()
	}()
	return w, nil
}

func (w *WAL) openDB() error {
	db, err := bolt.Open(w.path, 0o600, &bolt.Options{
		Timeout:      w.opts.LockTimeout,
		ReadOnly:     w.opts.ReadOnly,
		FreelistType: bolt.FreelistMapType,
	})
	if errors.Is(err, berrors.ErrTimeout) {
		return fmt.Errorf("open %s: %w (is the service running? inspect it through the admin /status endpoint)", w.path, ErrLocked)
	}
	if err != nil {
		return fmt.Errorf("open %s: %w", w.path, err)
	}
	w.db = db
	w.pageSize = int64(db.Info().PageSize)
	return nil
}

// load creates the buckets of a new file and reads the state of an existing one.
func (w *WAL) load() (state, error) {
	st := state{nextSeq: 1, cursors: map[string]uint64{}, dropped: map[string]uint64{}}
	fn := func(tx *bolt.Tx) error {
		if !w.opts.ReadOnly {
			if err := createBuckets(tx); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bucketMeta)
		if meta == nil {
			return fmt.Errorf("%w: no meta bucket in %s", ErrFormat, w.path)
		}
		switch v := meta.Get(keyFormat); {
		case v == nil && w.opts.ReadOnly:
			return fmt.Errorf("%w: no format version in %s", ErrFormat, w.path)
		case v == nil:
			if err := meta.Put(keyFormat, u64(formatVersion)); err != nil {
				return err
			}
		case len(v) != 8 || binary.BigEndian.Uint64(v) != formatVersion:
			return fmt.Errorf("%w: %s has format %x, this build reads %d", ErrFormat, w.path, v, formatVersion)
		}
		if !w.opts.ReadOnly && meta.Get(keySpaceProbe) != nil {
			if err := meta.Delete(keySpaceProbe); err != nil {
				return err
			}
		}
		// A value of another length, or a cursor past the records, is
		// damage: read as it stands it would panic, or let retention
		// delete records no sink passed.
		damaged := func(what string, k, v []byte) error {
			return &CorruptionError{Path: w.path, Offset: -1, Err: fmt.Errorf("%s %q holds %x: damaged; forwarder wal dump saves the records", what, k, v)}
		}
		if v := meta.Get(keyNextSeq); v != nil {
			if len(v) != 8 {
				return damaged("meta", keyNextSeq, v)
			}
			st.nextSeq = binary.BigEndian.Uint64(v)
		}
		if v := meta.Get(keyBytes); v != nil {
			if len(v) != 8 {
				return damaged("meta", keyBytes, v)
			}
			st.liveBytes = int64(binary.BigEndian.Uint64(v))
		}
		st.firstSeq = st.nextSeq
		if k, _ := tx.Bucket(bucketEntries).Cursor().First(); k != nil {
			if len(k) != 8 {
				return damaged("entry key", k, nil)
			}
			st.firstSeq = binary.BigEndian.Uint64(k)
		}
		if err := tx.Bucket(bucketCursors).ForEach(func(k, v []byte) error {
			if len(v) != 8 || binary.BigEndian.Uint64(v) >= st.nextSeq {
				return damaged(fmt.Sprintf("cursor (next_seq %d)", st.nextSeq), k, v)
			}
			st.cursors[string(k)] = binary.BigEndian.Uint64(v)
			return nil
		}); err != nil {
			return err
		}
		return tx.Bucket(bucketDropped).ForEach(func(k, v []byte) error {
			if len(v) != 8 {
				return damaged("dropped count", k, v)
			}
			st.dropped[string(k)] = binary.BigEndian.Uint64(v)
			return nil
		})
	}
	err := damagedPage(w.path, func() error {
		if w.opts.ReadOnly {
			return w.db.View(fn)
		}
		return w.db.Update(fn)
	})
	if err != nil {
		return st, fmt.Errorf("load wal state: %w", err)
	}
	return st, nil
}

// createFile makes a new WAL file at path, whole or not at all: bbolt
// writes a new file's first pages after it has created it, so a power cut
// in between can leave a file that has its name but not its pages (empty,
// or torn), which Open must refuse as damaged. So the file is made under
// another name, with its buckets (and its first sequence number when it
// is not 1), fsynced, renamed into place, and the
// directory fsynced.
func createFile(path string, firstSeq uint64) error {
	tmp := path + ".new"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("create wal: %w", err)
	}
	db, err := bolt.Open(tmp, 0o600, &bolt.Options{FreelistType: bolt.FreelistMapType})
	if err != nil {
		return fmt.Errorf("create wal: %w", err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		if err := createBuckets(tx); err != nil {
			return err
		}
		if firstSeq > 1 {
			return tx.Bucket(bucketMeta).Put(keyNextSeq, u64(firstSeq))
		}
		return nil
	}); err != nil {
		db.Close()
		return fmt.Errorf("create wal: %w", err)
	}
	if err := db.Close(); err != nil {
		return fmt.Errorf("create wal: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("create wal: %w", err)
	}
	return syncDir(filepath.Dir(path))
}

// createBuckets creates the buckets and the format version of a new file
// (those it lacks, in a file of an older version).
func createBuckets(tx *bolt.Tx) error {
	for _, b := range [][]byte{bucketMeta, bucketEntries, bucketCursors, bucketDropped, bucketState, bucketChunks, bucketChunkTimes} {
		if _, err := tx.CreateBucketIfNotExists(b); err != nil {
			return fmt.Errorf("create bucket %s: %w", b, err)
		}
	}
	if meta := tx.Bucket(bucketMeta); meta.Get(keyFormat) == nil {
		return meta.Put(keyFormat, u64(formatVersion))
	}
	return nil
}

// compactSuffix names, after the WAL file's name, the copy a compaction
// makes.
const compactSuffix = ".compact"

func (w *WAL) shouldCompact(st state) bool {
	if w.opts.CompactRatio < 0 {
		return false
	}
	fi, err := os.Stat(w.path)
	if err != nil || fi.Size() < w.opts.CompactMinFileBytes {
		return false
	}
	return float64(st.liveBytes) < w.opts.CompactRatio*float64(fi.Size())
}

// compact rewrites the file with only its live pages: bbolt reuses freed
// pages but never gives them back to the file system.
func (w *WAL) compact(liveBytes int64) error {
	start := time.Now()
	before, _ := os.Stat(w.path)
	if before != nil {
		w.log.Info("wal: compacting the file, mostly free pages, before the service starts; the inputs listen once it is done (a stop meanwhile leaves the file as it was)",
			"path", w.path, "bytes", before.Size(), "live_bytes", liveBytes)
	}
	tmp := w.path + compactSuffix
	_ = os.Remove(tmp)
	// Until the file is closed for the rename, a copy that cannot be made
	// (no room on the disk for it, say) leaves the file as it is, in use:
	// compaction only gives space back.
	skip := func(err error) error {
		_ = os.Remove(tmp)
		w.log.Warn("wal: could not compact the file; going on with it as it is (it is compacted at a later start with room for a copy of its live records)",
			"path", w.path, "error", err)
		return nil
	}
	dst, err := bolt.Open(tmp, 0o600, &bolt.Options{NoSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		return skip(err)
	}
	// A damaged page met on the way (the copy walks every page) is said,
	// and the file kept as it is: reads meet it where they did before.
	if err := damagedPage(w.path, func() error { return bolt.Compact(dst, w.db, 64<<20) }); err != nil {
		dst.Close()
		return skip(err)
	}
	if err := dst.Sync(); err != nil {
		dst.Close()
		return skip(fmt.Errorf("fsync: %w", err))
	}
	if err := dst.Close(); err != nil {
		return skip(err)
	}
	if err := w.db.Close(); err != nil {
		return fmt.Errorf("compact wal: %w", err)
	}
	if err := os.Rename(tmp, w.path); err != nil {
		return fmt.Errorf("compact wal: %w", err)
	}
	if err := syncDir(filepath.Dir(w.path)); err != nil {
		return err
	}
	if err := w.openDB(); err != nil {
		return err
	}
	after, _ := os.Stat(w.path)
	if before != nil && after != nil {
		w.log.Info("wal compacted", "path", w.path, "bytes_before", before.Size(), "bytes_after", after.Size(), "took", time.Since(start).Round(time.Millisecond))
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}

// Close stops the writer, commits what it holds, and closes the file.
// Appends still waiting for room fail with ErrClosed. It returns the
// failure of that last commit (wrapping ErrFatal): with SyncInterval, it
// held acknowledged records.
func (w *WAL) Close() error {
	w.closeMu.Lock()
	if w.closed {
		w.closeMu.Unlock()
		return nil
	}
	w.closed = true
	w.closeMu.Unlock()
	failedBefore := w.Err() != nil
	if w.quit != nil {
		close(w.quit)
	}
	<-w.done
	w.recent.committed(nil, true, 0) // reads fail from now on, as the file's do
	closeErr := w.db.Close()
	if err := w.Err(); err != nil && !failedBefore {
		// The last commit (what SyncInterval held) failed: records were
		// acknowledged and are not stored, which the caller must say.
		return errors.Join(err, closeErr)
	}
	return closeErr
}

// Path is the WAL file's path.
func (w *WAL) Path() string { return w.path }

// Fatal is closed when the WAL hit an error after which it cannot promise
// durability (a failed fsync or write). The process should exit non-zero.
func (w *WAL) Fatal() <-chan struct{} { return w.fatal }

// Full reports whether appends are waiting for room right now, under
// MaxBytes (WhenFull: Block) or on the disk (see DiskFull), or the next
// one would under MaxBytes (live bytes at or over it). Inputs use it to
// push back on clients early.
func (w *WAL) Full() bool { return w.full.Load() || w.diskFull.Load() }

// Holding reports whether appends wait for room (Full) while cursor name is
// the furthest behind of the WAL's cursors, or level with the others that
// are, and what its sink delivers moves it: its sink is not paused, and
// no cursor level with it is of a paused sink or of one no longer
// configured (Options.Sinks), which no delivery moves: retention frees
// nothing until they do.
func (w *WAL) Holding(name string) bool {
	if !w.Full() {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	pos, ok := w.st.cursors[name]
	if !ok || w.paused[name] {
		return false
	}
	for n, p := range w.st.cursors {
		if p < pos {
			return false
		}
		if p == pos && (w.paused[n] || !w.configured(n)) {
			return false
		}
	}
	return true
}

// configured reports whether cursor name is a configured sink's (Options.Sinks;
// every cursor is when they are not known).
func (w *WAL) configured(name string) bool {
	return w.opts.Sinks == nil || slices.Contains(w.opts.Sinks, name)
}

// SetPaused records whether cursor name's sink is paused (a sink-permanent
// error): it delivers nothing, so that the cursors level with its own do
// not hold the WAL (Holding).
func (w *WAL) SetPaused(name string, paused bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.paused == nil {
		w.paused = map[string]bool{}
	}
	if paused {
		w.paused[name] = true
	} else {
		delete(w.paused, name)
	}
}

// DiskFull reports whether appends are waiting because storing them would
// leave less than MinFreeBytes free (whatever WhenFull says). Commits that
// are not appends go on, so that sinks can move their cursors and
// retention can free room.
func (w *WAL) DiskFull() bool { return w.diskFull.Load() }

// MinFreeBytes is the room kept free for commits that are not appends.
func (w *WAL) MinFreeBytes() int64 { return w.opts.MinFreeBytes }

// DropsOldest reports whether a full WAL drops its oldest records
// (DropOldest) rather than holding appends.
func (w *WAL) DropsOldest() bool { return w.opts.WhenFull == DropOldest }

// freeBytes is diskfree.Free (the space an unprivileged process may still
// take; false where it cannot be told: appends are not held for it); tests
// replace it.
var freeBytes = diskfree.Free

// space is the room the WAL has for new pages: disk, the space the file
// system gives an unprivileged writer (what the file grows into), and
// file, the pages free inside the file (bbolt reuses them first). ok is
// false when the file system cannot say.
func (w *WAL) space() (disk, file int64, ok bool) {
	disk, ok = freeBytes(filepath.Dir(w.path))
	st := w.db.Stats()
	return disk, int64(st.FreePageN+st.PendingPageN) * w.pageSize, ok
}

// Err returns the fatal error, if any.
// Age is how long the record seq has been in the WAL: since its commit (to
// the second) for a record appended since Open, which no client's clock
// can shift; for an older one, since its event time, but at least since
// Open. 0 for a record not there.
func (w *WAL) Age(seq uint64) time.Duration {
	if at, ok := w.appended.at(seq); ok {
		return max(time.Since(at), 0)
	}
	recs, err := w.Read(seq, 1, 0)
	if err != nil || len(recs) == 0 || recs[0].Seq != seq {
		return 0
	}
	return max(time.Since(w.opened), time.Since(time.Unix(0, recs[0].Time)))
}

// StallAfter is how long a commit may run before the WAL counts as
// stalled (Stalled): far beyond a slow disk's fsync under load. A variable
// for tests.
var StallAfter = 2 * time.Minute

// Stalled reports whether the commit under way has run for StallAfter: the
// disk does not answer, and nothing can be acknowledged meanwhile.
func (w *WAL) Stalled() bool { return w.CommitPending() >= StallAfter }

// CommitPending is how long the writer's work on the disk under way has
// been running (a transaction's page reads and writes, its commit and
// fsyncs), or 0 when none is: a disk that stalls shows here long before
// anything fails.
func (w *WAL) CommitPending() time.Duration {
	since := w.commitSince.Load()
	if since == 0 {
		return 0
	}
	return max(time.Duration(time.Now().UnixNano()-since), 0)
}

func (w *WAL) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fatalErr
}

func u64(v uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, v)
	return b
}

// MaxChunkID is the longest chunk id Append takes, in bytes: a client's id
// of 1,024 bytes and room for the prefix an input puts before it to keep
// its ids apart from another input's.
const MaxChunkID = 1024 + 64

// MaxChunkDigest is the longest digest Append takes, in bytes (SHA-256's).
const MaxChunkDigest = 32

// AppendOptions carry what an input knows about a request besides its records.
type AppendOptions struct {
	// ChunkID is the client's id for this request (a forward chunk id, an
	// HTTP Idempotency-Key). It is stored in the same transaction as the
	// records; an id seen within the dedup window is not stored again.
	ChunkID string
	// ChunkDigest, when set, is a digest of the request ChunkID names,
	// stored with the id. The same id again within the dedup window with
	// another digest is refused (ErrChunkConflict), and nothing is stored:
	// the client reused an id for another request. An id stored without a
	// digest matches any.
	ChunkDigest []byte
}

// Result says where an Append's records are.
type Result struct {
	First, Last uint64 // sequence numbers of the first and last record
	Duplicate   bool   // the chunk id was seen; First and Last are the earlier append's
}

// Append stores records and returns once they are durable (SyncAlways) or
// taken by the writer (SyncInterval). Concurrent appends share one
// transaction and one fsync. When the WAL is full and WhenFull is Block,
// Append waits until ctx ends, and stores nothing then. Once the records
// are in a transaction, the end of ctx no longer ends Append: it returns
// that transaction's outcome, so that records are never stored while
// their caller is told they were not.
func (w *WAL) Append(ctx context.Context, recs []Record, opts AppendOptions) (Result, error) {
	if w.opts.ReadOnly {
		return Result{}, ErrReadOnly
	}
	if len(recs) == 0 {
		return Result{}, nil
	}
	if err := w.Err(); err != nil {
		return Result{}, err
	}
	if len(opts.ChunkID) > MaxChunkID {
		return Result{}, fmt.Errorf("%w: %d bytes, at most %d", ErrChunkID, len(opts.ChunkID), MaxChunkID)
	}
	if len(opts.ChunkDigest) > MaxChunkDigest || opts.ChunkID == "" && len(opts.ChunkDigest) > 0 {
		return Result{}, fmt.Errorf("%w: a digest of %d bytes for chunk id %q, at most %d with an id", ErrChunkID, len(opts.ChunkDigest), opts.ChunkID, MaxChunkDigest)
	}
	req := &appendReq{ctx: ctx, entries: encodeEntries(recs, &w.recent), n: uint64(len(recs)), chunk: opts.ChunkID,
		digest: opts.ChunkDigest, done: make(chan appendResult, 1), recent: &w.recent}
	for _, e := range req.entries {
		req.bytes += int64(len(e.value))
	}
	select {
	case w.appendCh <- req:
	case <-ctx.Done():
		w.recent.releaseAll(req)
		return Result{}, w.givenUp(ctx, false)
	case <-w.done:
		w.recent.releaseAll(req)
		return Result{}, w.closedErr()
	}
	select {
	case res := <-req.done:
		return res.Result, res.err
	case <-ctx.Done():
		if req.state.CompareAndSwap(reqPending, reqAbandoned) {
			w.wake()
			return Result{}, w.givenUp(ctx, req.held.Load())
		}
	}
	// The records are in a transaction: its outcome is the answer, not the
	// end of ctx, or they could be stored with their caller told otherwise
	// (a client retrying them would store them twice).
	select {
	case res := <-req.done:
		return res.Result, res.err
	case <-w.done:
		select {
		case res := <-req.done: // answered as the writer ended
			return res.Result, res.err
		default:
			return Result{}, w.closedErr()
		}
	}
}

// givenUp is the error of an append whose ctx ended before its records
// were taken into a transaction: ErrFull (with ctx's error) when it was
// held for room, or when the WAL holds appends for room (Full) and the
// writer had not come to this one yet, so that an input tells its client
// the WAL is full rather than slow; ctx's error otherwise.
func (w *WAL) givenUp(ctx context.Context, held bool) error {
	if held || w.Full() {
		return fmt.Errorf("%w: %w", ErrFull, ctx.Err())
	}
	return ctx.Err()
}

func (w *WAL) closedErr() error {
	if err := w.Err(); err != nil {
		return err
	}
	return ErrClosed
}

func (w *WAL) wake() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// Batch is a set of changes to cursors and sink state that commit together,
// in one transaction, atomically.
type Batch struct {
	ops []op
}

type opKind int

const (
	opSetCursor opKind = iota
	opRegister
	opDropCursor
	opPut
	opDelete
	opReplaceDamaged
)

type op struct {
	kind  opKind
	name  string // cursor or sink state bucket
	seq   uint64
	key   []byte
	value []byte
	// repaired, for opReplaceDamaged: set when the entry was written again
	// from the records recent held, not replaced by placeholders.
	repaired *bool
}

// SetCursor moves cursor name to seq: every record up to and including seq
// is done for that sink. A cursor never moves back; a lower seq is ignored.
func (b *Batch) SetCursor(name string, seq uint64) {
	b.ops = append(b.ops, op{kind: opSetCursor, name: name, seq: seq})
}

// Put sets key in sink's state bucket.
func (b *Batch) Put(sink string, key, value []byte) {
	b.ops = append(b.ops, op{kind: opPut, name: sink, key: append([]byte(nil), key...), value: append([]byte(nil), value...)})
}

// Delete removes key from sink's state bucket.
func (b *Batch) Delete(sink string, key []byte) {
	b.ops = append(b.ops, op{kind: opDelete, name: sink, key: append([]byte(nil), key...)})
}

// Append adds o's changes after b's.
func (b *Batch) Append(o *Batch) { b.ops = append(b.ops, o.ops...) }

// Len is the number of changes in the batch.
func (b *Batch) Len() int { return len(b.ops) }

// Sync commits what the open transaction holds (with SyncInterval, the
// appends acknowledged since the last commit) and returns once it is
// durable, and so seen by Stats and the readers. With nothing to commit
// (always with SyncAlways), it writes nothing.
func (w *WAL) Sync(ctx context.Context) error {
	_, err := w.commit(ctx, nil)
	return err
}

// Commit applies b in one transaction, shared with concurrent appends, and
// returns once it is durable. Either all of b applies or none of it.
func (w *WAL) Commit(ctx context.Context, b *Batch) error {
	_, err := w.commit(ctx, b.ops)
	return err
}

// RegisterCursor creates cursor name, if it does not exist, just before the
// oldest live record, and returns its position. Registered cursors pin
// retention until they pass records or are dropped.
func (w *WAL) RegisterCursor(ctx context.Context, name string) (uint64, error) {
	if err := w.Err(); err != nil {
		return 0, err
	}
	if pos, ok := w.Cursor(name); ok {
		// Registered and committed: nothing to write, which a full disk
		// would refuse (a sink's start must not fail on it).
		return pos, nil
	}
	return w.commit(ctx, []op{{kind: opRegister, name: name}})
}

// DropCursor removes cursor name, its state bucket and its counters, so it
// no longer pins retention.
func (w *WAL) DropCursor(ctx context.Context, name string) error {
	_, err := w.commit(ctx, []op{{kind: opDropCursor, name: name}})
	return err
}

// DamagedTag is the tag of the records ReplaceDamaged puts in place of
// those of a damaged entry it cannot write again from memory: no input takes it (it holds a control
// character), and the drainer and sinks pass such records without
// delivering them.
const DamagedTag = "\x00damaged"

// ReplaceDamaged replaces the entry whose first record is first, if it is
// damaged (its checksum or framing does not match, as a CorruptionError
// from a read says), by entries of as many records of DamagedTag, empty,
// with the same sequence numbers, and returns the last of them. Readers
// then go on past it, and retention can delete it. The records' count is
// taken from where the next entry begins (or the WAL's next sequence
// number), not from the damaged header. When the entries committed last,
// kept in memory, still hold those records, the entry is written again
// from them instead: nothing is lost. An entry that is whole, or gone, is
// left as it is (last 0): whoever saw the damage first replaced it.
func (w *WAL) ReplaceDamaged(ctx context.Context, first uint64) (last uint64, err error) {
	var repaired bool
	last, err = w.commit(ctx, []op{{kind: opReplaceDamaged, name: "wal", seq: first, repaired: &repaired}})
	switch {
	case err != nil || last == 0:
	case repaired:
		w.log.Warn("wal: a damaged entry was written again from the copy of its records still in memory: nothing is lost; check the disk (kernel log, SMART)",
			"path", w.path, "first_seq", first, "last_seq", last, "records", last-first+1)
	default:
		w.damaged.Add(last - first + 1)
		w.log.Error("wal: a damaged entry was replaced by placeholders, so that the sinks go on past it: its records are lost; check the disk (kernel log, SMART)",
			"path", w.path, "first_seq", first, "last_seq", last, "records", last-first+1)
	}
	return last, err
}

func (w *WAL) commit(ctx context.Context, ops []op) (uint64, error) {
	if w.opts.ReadOnly {
		return 0, ErrReadOnly
	}
	for _, o := range ops {
		if o.name == "" {
			return 0, errors.New("wal: empty cursor or state name")
		}
		if len(o.name) > bolt.MaxKeySize { // refused alone, not a failure of the WAL
			return 0, fmt.Errorf("wal: cursor or state name of %d bytes", len(o.name))
		}
		if (o.kind == opPut || o.kind == opDelete) && (len(o.key) == 0 || len(o.key) > bolt.MaxKeySize) {
			return 0, fmt.Errorf("wal: state key of %d bytes for %q", len(o.key), o.name)
		}
	}
	req := &commitReq{ops: ops, done: make(chan commitResult, 1)}
	select {
	case w.commitCh <- req:
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-w.done:
		return 0, w.closedErr()
	}
	// Once taken, a commit is not abandoned: it is short and its caller
	// must know whether it applied.
	res := <-req.done
	return res.seq, res.err
}
