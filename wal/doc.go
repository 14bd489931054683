// Package wal is the forwarder's write-ahead log: one bbolt file that holds
// every record between its acknowledgement to a client and its delivery to
// every sink, together with each sink's cursor and state and the recent
// chunk ids of the inputs.
//
// # Guarantees
//
//   - With SyncAlways (the default), Append returns only after the
//     transaction holding its records is committed and fsynced. Concurrent
//     appends, and cursor and state commits, share one transaction and one
//     fsync (group commit): one goroutine, the writer, owns every change.
//   - A commit that fails in a way that leaves durability unknown (a failed
//     fsync, an I/O error) is fatal: every later Append fails with ErrFatal,
//     Fatal() is closed, and the fsync is never retried. A commit refused
//     because the file system is full (ENOSPC while writing pages, before
//     any fsync or meta write) is not: that group gets ErrNoSpace and the
//     WAL goes on.
//   - Appends do not fill the disk: an append waits, unacknowledged (Full
//     and DiskFull report it so that inputs push back), while storing it
//     would leave less than MinFreeBytes free both on the file system and
//     in free pages inside the file. Cursor and sink state commits, and
//     retention, are never held for room: a sink that is behind can always
//     move its cursor, so that retention frees room and appends resume.
//     Should a full file system refuse a commit anyway (another process
//     took the room, or no free run of pages was long enough for a leaf
//     that retention rewrites), the appends and deletes that shared its
//     transaction are left out and the commit is made alone at once; the
//     deletes follow in transactions of half as many until one fits.
//     Should it refuse a commit of appends although the room measured was
//     enough, the appends after it wait (DiskFull) until room is gained
//     since, or until a probe of the room (a value of 128 KiB stored in
//     the meta bucket and deleted again, tried every 10 s) commits and the
//     room measured is enough again.
//   - With SyncInterval, Append returns once the writer has taken the
//     records and commits about once a second. THIS CAN LOSE ACKNOWLEDGED
//     RECORDS: a crash of the process or of the machine loses what was
//     acknowledged since the last commit. It never corrupts the file.
//     Commit, RegisterCursor, DropCursor, ReplaceDamaged and Sync are
//     committed and fsynced at once, with the appends that share their
//     transaction, and so are the deletes of retention and chunk expiry
//     (at most one transaction of them a step); readers and Stats see
//     appends once committed. A commit the full disk refuses stops the
//     WAL when it holds appends (they were acknowledged), and is tried
//     again, as with SyncAlways, when it does not.
//     (bbolt's own NoSync mode is not used: without an fsync between data
//     pages and the meta page, a power loss can leave a meta page that
//     points at unwritten pages, which loses more than a second.)
//   - Sequence numbers start at 1 and are dense and monotonic.
//   - Every entry carries a CRC32C over its payload, its key and its
//     header. A mismatch is a *CorruptionError naming the file and the
//     entry's sequence range; no partial or wrong record is ever returned.
//     ReplaceDamaged replaces such an entry by placeholders (DamagedTag)
//     for the same sequence numbers, so that readers go on past it (or by
//     the entry as it was, when recent still holds its records): the
//     drainer calls it when a read meets one.
//     Open checks bbolt's meta pages with plain reads before mapping the
//     file, so a truncated file is an error, not a fault.
//   - A cursor, the sink state changed with it, and the chunk id of an
//     append each commit in the same transaction as what they describe.
//   - Retention deletes only entries that every registered cursor has
//     passed. The one exception is DropOldest, which counts, per cursor,
//     every record it deletes before that cursor passed it. Both, and
//     reads, take an entry's records to run to the next entry's key (or to
//     next_seq), which keys being dense says, not from the count in its
//     header: a damaged count cannot move a cursor past records, nor hide
//     a damaged entry from a read.
//
// # On-disk format (format version 1)
//
// The file is data_dir/wal.db, a bbolt database with these buckets (a new
// one is made as wal.db.new, with its buckets, fsynced and renamed into
// place, the directory fsynced: a power cut while it is created leaves no
// file or a whole one, never an empty or torn one that Open would refuse):
//
//	meta         "format" → uint64 1; "next_seq" → uint64; "bytes" → uint64 live entry bytes;
//	             "space_probe" → 128 KiB of zeros, for a moment while the disk is full (Open deletes it)
//	entries      uint64 first seq (big-endian) → entry
//	cursors      sink name → uint64: every record up to it is done for that sink
//	dropped      sink name → uint64: records drop_oldest deleted before the sink passed them
//	state        sink name → bucket of the sink's own keys (S3 intents, multipart state)
//	chunks       chunk id → [uint64 unix nanos][uint64 first seq][uint64 last seq][digest]
//	chunk_times  [uint64 unix nanos][chunk id] → nil, to expire ids oldest first
//
// A chunk's digest (0 to 32 bytes, AppendOptions.ChunkDigest) names the
// request its id was stored for; files written before digests were stored
// hold the 24 bytes alone, which read as an id without a digest (it
// matches any request). A version that predates digests reads a value with
// one as no id at all: after a downgrade, an id stored with a digest does
// not dedup, and its expiry leaves its key in chunks behind.
//
// An entry is a batch of consecutive records from one Append (a large
// append is cut into entries of about 56 KiB uncompressed):
//
//	[0]      format version, 1
//	[1]      codec: 0 none, 1 s2 block (github.com/klauspost/compress/s2)
//	[2:6]    record count, uint32
//	[6:10]   uncompressed payload length, uint32
//	[10:14]  CRC32C (Castagnoli) of stored payload || key || bytes [0:10]
//	[14:]    payload, compressed with the codec; uncompressed it is, per record:
//	         varint time (unix nanos), uvarint tag length, tag,
//	         uvarint body length, body
//
// The layout was chosen by measurement on a 2-core machine (BenchmarkAppend):
// one key per record costs a B-tree insert each and is an order of
// magnitude slower; one key per multi-megabyte batch compresses slower
// (s2's large-block encoder leaves the cache). Appending goroutines encode
// and compress their own entries, in parallel, before handing them to the
// writer, which only adds keys and finishes checksums.
//
// # Reads of what was just appended
//
// Every sink reads every record, most of them a commit or two after the
// append that stored them, when the appending goroutine had them
// uncompressed a moment before. So entries keep a copy of their
// uncompressed bytes until their transaction commits, and the writer then
// keeps the entries it committed last, one run of consecutive entries of
// at most 4 MiB of buffers; a read that starts within that run
// copies from it instead of reading the file, checking the checksum and
// decompressing, for each sink. An entry joins only once its transaction
// committed (a refused commit's entries never do, and their sequence
// numbers go to the next append), leaves once retention or drop_oldest
// deletes it, and holds its buffer on the way to its commit only while
// entries on their way hold less than 4 MiB (else it is read from the file,
// like any older record). Reads return copies, whichever way they go.
// Stats counts reads by where they were served from.
//
// # Size
//
// MaxBytes bounds the sum of stored entry values (compressed), not the
// file: bbolt reuses freed pages but never returns them to the file system,
// so the file stays at its high-water mark. Open compacts the file (bbolt
// Compact into a new file, fsync, rename, fsync the directory) when live
// entries take less than a quarter of a file of at least 64 MiB.
//
// MinFreeBytes (default 64 MiB) bounds the file from the other side: the
// room a commit that is not an append may need, kept free on the file
// system or inside the file. Such a commit copies the pages it touches
// (copy-on-write: the leaves and branches of the cursor, of the sink's
// state and, for retention, of the entries it deletes) and writes bbolt's
// freelist whole, in one run of pages, 8 bytes for each free page. Free
// pages inside the file count: after a backlog drains, bbolt reuses them
// without growing the file, so appends go on although the file system
// stays full. An append is counted at twice its stored bytes plus a page
// (leaves filled in key order split half full). Once held, appends resume
// when an eighth more than MinFreeBytes is free, so that they do not flap
// at every page retention frees.
//
// # Usage
//
//	w, err := wal.Open("/var/lib/forwarder", wal.Options{MaxBytes: 10 << 30})
//	res, err := w.Append(ctx, records, wal.AppendOptions{ChunkID: chunk})
//	// res.First..res.Last are durable; acknowledge the client now.
//
//	pos, err := w.RegisterCursor(ctx, "archive")
//	r := w.NewReader(pos + 1)
//	recs, err := r.Next(ctx, 10000, 0) // waits for appends, never polls
//	// deliver recs, then:
//	var b wal.Batch
//	b.SetCursor("archive", recs[len(recs)-1].Seq)
//	b.Delete("archive", []byte("intent/..."))
//	err = w.Commit(ctx, &b) // cursor and state, one transaction
package wal
