package wal

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"sync/atomic"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
)

type appendReq struct {
	ctx     context.Context
	entries []entry
	n       uint64 // records
	bytes   int64  // stored bytes of all entries
	chunk   string
	digest  []byte // of the request chunk names; nil: none given
	done    chan appendResult
	recent  *recent // of the WAL: see answer
	// state is reqPending until the writer puts the request into a
	// transaction (reqTaken) or Append gives it up (reqAbandoned), its
	// context ended: whichever comes first. A request taken is answered
	// with its transaction's outcome, whatever its context, so that
	// records are never stored without their caller knowing.
	state atomic.Int32
	held  atomic.Bool // it waited for room (ErrFull, should its context end)
}

const (
	reqPending int32 = iota
	reqTaken
	reqAbandoned
)

// answer answers r, once; the buffers its entries hold for recent and
// did not give it (it did not store them) go back.
func (r *appendReq) answer(res appendResult) {
	r.recent.releaseAll(r)
	r.done <- res
}

type appendResult struct {
	Result
	err error
}

type commitReq struct {
	ops  []op
	done chan commitResult
}

type commitResult struct {
	seq uint64
	err error
}

// pendingCommit is a commit applied to the open transaction, answered when
// the transaction commits.
type pendingCommit struct {
	req *commitReq
	seq uint64
}

const (
	maxGroupRequests     = 4096     // requests in one transaction
	maxGroupBytes        = 64 << 20 // stored bytes in one transaction
	maxDeletesPerTx      = 4096     // retention deletes per transaction
	intervalFlushBytes   = 32 << 20 // SyncInterval commits early above this
	chunkExpiryInterval  = 10 * time.Second
	noSpaceRetryInterval = time.Second
)

// diskLogInterval is the least time between two lines saying that appends
// wait for room (on the disk, under max_bytes): a hold that begins within
// it of the last line is logged once it is over, if the hold lasts that
// long. A variable for the tests.
var diskLogInterval = time.Minute

// noSpaceProbeInterval is how often, while appends are held after a
// refused commit (see writer.noSpace), the writer tries whether the file
// takes an append's pages again (probeRoom). A variable for tests.
var noSpaceProbeInterval = 10 * time.Second

// probeBytes is the value probeRoom stores: two entries of the largest
// size Append writes, as a leaf holds at least two (a run of 33 pages).
const probeBytes = 128 << 10

// writer is the one goroutine that changes the file. It gathers whatever
// appends and commits are waiting into one transaction (group commit),
// commits it, and answers every request of the group.
type writer struct {
	w  *WAL
	st state // working state: what the open transaction will make true

	tx        *bolt.Tx // open transaction (held across steps only in SyncInterval)
	txStart   time.Time
	txBytes   int64
	txAppends int             // appends stored in the open transaction
	txDeleted int             // keys retention and chunk expiry deleted in it
	txProbe   bool            // it deletes a probe's value (probeLeft)
	dirty     bool            // the open transaction changes something: worth a commit
	replies   []func(error)   // answers to appends due when tx commits
	commits   []pendingCommit // commits in tx, answered when it commits
	waiting   []*appendReq    // appends held back by max_bytes (Block) or the disk, FIFO
	moreWork  bool            // retention or chunk expiry stopped at its per-tx limit

	// deleteLimit bounds retention and chunk expiry deletes per
	// transaction: maxDeletesPerTx, halved after each transaction that
	// deleted and found no room (fewer deletes rewrite fewer pages),
	// doubled back after each that committed. noHousekeeping leaves them
	// out, for a commit retried alone after a full disk refused it.
	deleteLimit    int
	noHousekeeping bool

	diskHeld      bool      // the waiting appends wait for room on the disk
	maxHeldNeed   int64     // the size of the last append held by max_bytes (Block)
	maxHeldAt     time.Time // when it was held
	maxFullSince  time.Time // when the WAL became full by max_bytes, for the hold that was logged
	maxLogged     bool      // a hold was logged: log the room, once there is
	lastMaxLog    time.Time
	maxHolds      int              // times it became full not logged since lastMaxLog
	maxRecheck    <-chan time.Time // when the hold by the size last held ends
	heldNeed      int64            // what the last append held for room on the disk needs (storeCost)
	heldAt        time.Time        // when it was held
	diskHeldSince time.Time        // when the current hold began
	diskLogged    bool             // the current hold was logged: log its end
	lastDiskLog   time.Time
	diskHolds     int              // holds not logged since lastDiskLog
	diskRefused   error            // the refused commit's error of the current hold (nil: below the floor)
	holdLogDue    <-chan time.Time // set while a hold, of either kind, waits for its line (the minute since the last one)
	holdLogAt     time.Time        // when holdLogDue fires
	noStatfs      bool             // the file system cannot tell its free space (logged once)

	droppedSince map[string]uint64 // DropOldest losses not yet logged
	txDropped    map[string]uint64 // DropOldest losses of the open transaction: logged once it commits
	lastDropLog  time.Time
	dropLogDue   <-chan time.Time // set while losses wait for their line: it comes even when the writer idles
	lastExpire   time.Time
	noSpaceRetry <-chan time.Time // set after a commit refused for lack of space
	failed       error

	// noSpace is set when a commit that stored appends was refused for
	// lack of space although the room measured before them was enough:
	// the free pages in the file are scattered in runs too short for the
	// leaves and values to store, and the file cannot grow, or the file
	// system counts its free space otherwise than it allocates it. Until a
	// commit stores appends again, or a probe of the room commits
	// (probeRoom, every noSpaceProbeInterval), only the room gained since
	// counts (see room).
	noSpace *noSpaceMark

	// The open transaction's entries whose buffers recent gets when it
	// commits, and whether they do not follow what recent holds (see
	// keepRecent).
	txRecent []recentEntry
	txFresh  bool
	// probeLeft: a probe's value is in the file, its deletion refused;
	// the next transaction deletes it (apply).
	probeLeft bool
}

// noSpaceMark is the room measured just after a commit of appends was
// refused for lack of space.
type noSpaceMark struct {
	disk, file int64
	probeAt    time.Time // when probeRoom tries the room next
}

func newWriter(w *WAL, st state) *writer {
	wr := &writer{w: w, st: st.clone(), droppedSince: map[string]uint64{}, moreWork: true, deleteLimit: maxDeletesPerTx}
	wr.setFull()
	return wr
}

func (wr *writer) run() {
	var timer *time.Timer
	var timerC <-chan time.Time
	lateLog := false // a hold's deferred line is due (lateHoldLine)
	defer func() {
		wr.flush() // commit what SyncInterval holds
		wr.logDrops(true)
		for _, r := range wr.waiting {
			r.answer(appendResult{err: wr.w.closedErr()})
		}
	}()
	for {
		var appends []*appendReq
		var commits []*commitReq
		if wr.moreWork && wr.failed == nil {
			select {
			case <-wr.w.quit:
				return
			default:
			}
		} else {
			if wr.tx != nil && timerC == nil {
				timer = time.NewTimer(wr.w.opts.SyncInterval - time.Since(wr.txStart))
				timerC = timer.C
			}
			select {
			case r := <-wr.w.appendCh:
				appends = append(appends, r)
			case c := <-wr.w.commitCh:
				commits = append(commits, c)
			case <-wr.w.kick:
			case <-timerC:
				timerC = nil
			case <-wr.noSpaceRetry:
				wr.noSpaceRetry = nil
				wr.moreWork = true // retention, and what waits, once more
			case <-wr.dropLogDue:
				wr.dropLogDue = nil // logDrops below says what was lost
			case <-wr.maxRecheck:
				wr.maxRecheck = nil // the step below sets Full again
			case <-wr.holdLogDue:
				wr.holdLogDue, lateLog = nil, true // after the step, which measures the room again
			case <-wr.w.quit:
				return
			}
		}
		bytes := int64(0)
	gather:
		for len(appends)+len(commits) < maxGroupRequests && bytes < maxGroupBytes {
			select {
			case r := <-wr.w.appendCh:
				appends = append(appends, r)
				bytes += r.bytes
			case c := <-wr.w.commitCh:
				commits = append(commits, c)
			default:
				break gather
			}
		}
		wr.step(append(wr.waiting, appends...), commits)
		// A commit of cursors or sink state (Commit) returns once durable,
		// also with SyncInterval: its caller waits for it (a sink commits
		// its intent before a call and its delivery after), so it is
		// flushed at once, with whatever appends share its transaction,
		// rather than at the interval, which would hold each sink to a
		// batch or two a second. So are the deletes of retention and of
		// chunk expiry, which deleteLimit bounds per transaction, and
		// whose room held appends may be waiting for.
		if wr.tx != nil && (wr.w.opts.Sync == SyncAlways || len(wr.commits) > 0 || wr.txDeleted > 0 || time.Since(wr.txStart) >= wr.w.opts.SyncInterval || wr.txBytes >= intervalFlushBytes) {
			wr.flush()
			if timer != nil {
				timer.Stop()
				timerC = nil
			}
		}
		wr.logDrops(false)
		if lateLog {
			lateLog = false
			wr.logLateHolds(time.Now())
		}
		if m := wr.noSpace; m != nil && wr.w.diskFull.Load() && wr.tx == nil && wr.failed == nil && !time.Now().Before(m.probeAt) {
			wr.probeRoom()
		}
	}
}

// probeRoom stores, in a transaction of its own, a value of probeBytes in
// the meta bucket, and deletes it in the next: whether the file takes an
// append's pages again, learnt without refusing any append. If it takes
// them, the room measured counts again (the hold ends at the next step
// that finds enough); if not, the held appends wait for the next probe or
// for room gained.
func (wr *writer) probeRoom() {
	wr.noSpace.probeAt = time.Now().Add(noSpaceProbeInterval)
	err := wr.commitAlone(func(meta *bolt.Bucket) error { return meta.Put(keySpaceProbe, make([]byte, probeBytes)) })
	if err != nil {
		if !isNoSpace(err) {
			wr.fail(fmt.Errorf("commit a probe of the disk's room: %w", err))
		}
		return
	}
	wr.noSpace = nil
	wr.moreWork = true // a step, to lift the hold
	wr.probeLeft = true
	wr.deleteProbe()
}

// deleteProbe deletes probeRoom's value; should a full disk refuse it,
// the next transaction deletes it (apply), or Open.
func (wr *writer) deleteProbe() {
	err := wr.commitAlone(func(meta *bolt.Bucket) error { return meta.Delete(keySpaceProbe) })
	switch {
	case err == nil:
		wr.probeLeft = false
	case !isNoSpace(err):
		wr.fail(fmt.Errorf("commit the deletion of a probe of the disk's room: %w", err))
	}
}

// commitAlone commits, with no open transaction, one that only does op on
// the meta bucket.
func (wr *writer) commitAlone(op func(meta *bolt.Bucket) error) error {
	defer wr.atDisk()()
	tx, err := wr.w.db.Begin(true)
	if err != nil {
		return err
	}
	if err := op(tx.Bucket(bucketMeta)); err != nil {
		tx.Rollback()
		return err
	}
	if err := wr.commitTx(tx); err != nil {
		return err
	}
	wr.w.commits.Add(1)
	return nil
}

// step applies one group of requests to the open transaction.
func (wr *writer) step(appends []*appendReq, commits []*commitReq) {
	wr.waiting, wr.diskHeld = nil, false
	if room, ok := wr.applyGroup(appends, commits); ok {
		wr.setFull()
		wr.checkDisk(room)
	}
}

// setFull sets what Full reports of MaxBytes: appends wait for room under
// it, or the next one would (live bytes at or over it, as after a restart
// with a backlog or a lowered max_bytes), so that the inputs and /readyz
// push back before a client's append waits. Once full, it stays full until
// an append of the size last held would fit, not the moment no append
// waits (its client gave up, and retries in a moment: /readyz would flap),
// but only for Options.HoldFor after the last hold (as the disk's hold,
// checkDisk).
func (wr *writer) setFull() {
	max := wr.w.opts.MaxBytes
	block := max > 0 && wr.w.opts.WhenFull == Block
	full := block && wr.st.liveBytes >= max || len(wr.waiting) > 0 && !wr.diskHeld
	if left := wr.w.opts.HoldFor - time.Since(wr.maxHeldAt); !full && block && wr.w.full.Load() && left >= 0 {
		if full = wr.st.liveBytes+wr.maxHeldNeed > max; full && wr.maxRecheck == nil {
			wr.maxRecheck = time.After(left + time.Millisecond) // then smaller appends may come in
		}
	}
	now := time.Now()
	if !full && wr.maxLogged && wr.st.liveBytes+wr.maxHeldNeed <= max {
		// Room for what was held (a hold that merely ran out of HoldFor
		// is not room: the line waits for it).
		wr.maxLogged = false
		wr.w.log.Info("wal: room under max_bytes again: appends resume", "path", wr.w.path,
			"live_bytes", wr.st.liveBytes, "max_bytes", max, "full_for", now.Sub(wr.maxFullSince).Round(time.Millisecond))
	}
	if full == wr.w.full.Load() {
		return
	}
	wr.w.full.Store(full)
	if !full {
		return
	}
	if !wr.maxLogged {
		wr.maxFullSince = now
	}
	if now.Sub(wr.lastMaxLog) < diskLogInterval {
		wr.maxHolds++
		wr.lateHoldLine(wr.lastMaxLog, now)
		return
	}
	wr.logMaxHold(now)
}

// lateHoldLine makes sure that a hold not logged because a line came
// within the minute before (last) is logged once the minute is over, if it
// lasts: the log must not say that appends resumed while they wait.
func (wr *writer) lateHoldLine(last, now time.Time) {
	at := last.Add(diskLogInterval + time.Millisecond)
	if wr.holdLogDue == nil || at.Before(wr.holdLogAt) { // the other kind's line may be due later
		wr.holdLogDue, wr.holdLogAt = time.After(at.Sub(now)), at
	}
}

// logLateHolds logs the holds lateHoldLine deferred that still last.
func (wr *writer) logLateHolds(now time.Time) {
	if wr.w.full.Load() && !wr.maxLogged && wr.maxHolds > 0 {
		if now.Sub(wr.lastMaxLog) < diskLogInterval {
			wr.lateHoldLine(wr.lastMaxLog, now)
		} else {
			wr.maxHolds-- // this one is logged now
			wr.logMaxHold(now)
		}
	}
	if wr.w.diskFull.Load() && !wr.diskLogged && wr.diskHolds > 0 {
		if now.Sub(wr.lastDiskLog) < diskLogInterval {
			wr.lateHoldLine(wr.lastDiskLog, now)
		} else {
			wr.diskHolds-- // this one is logged now
			wr.logDiskHold(now)
		}
	}
}

// logMaxHold logs that appends wait for room under max_bytes.
func (wr *writer) logMaxHold(now time.Time) {
	max := wr.w.opts.MaxBytes
	// The cursor furthest behind holds the oldest records; of cursors level
	// with it, one of a sink no longer configured (Options.Sinks), which no
	// delivery moves.
	gone := func(name string) bool { return !wr.w.configured(name) }
	behind, pos := "", uint64(0)
	for name, p := range wr.st.cursors {
		if behind == "" || p < pos || p == pos && (gone(name) && !gone(behind) || gone(name) == gone(behind) && name < behind) {
			behind, pos = name, p
		}
	}
	says := "wal: max_bytes reached (when_full: block): appends wait and the inputs push back on clients until the sinks deliver and retention frees room"
	if behind != "" && gone(behind) {
		// No sink will ever move it: only dropping it frees room.
		says = "wal: max_bytes reached (when_full: block): appends wait and the inputs push back on clients; the cursor furthest behind is of a sink no longer configured, which no delivery moves: list it under wal.drop_cursors and restart, or run forwarder wal drop-cursor with the service stopped"
	}
	wr.w.log.Warn(says,
		"path", wr.w.path, "live_bytes", wr.st.liveBytes, "max_bytes", max, "furthest_behind", behind,
		"its_records_behind", wr.st.nextSeq-1-min(pos, wr.st.nextSeq-1), "times_not_logged", wr.maxHolds,
		"full_for", now.Sub(wr.maxFullSince).Round(time.Millisecond))
	wr.lastMaxLog, wr.maxLogged, wr.maxHolds = now, true, 0
}

// applyGroup applies appends and commits to the open transaction, which it
// begins if there is none. When it fails, the WAL has failed and it has
// answered every request.
func (wr *writer) applyGroup(appends []*appendReq, commits []*commitReq) (room *diskRoom, ok bool) {
	defer wr.atDisk()()
	wr.waiting = nil // those held before are in appends: answered once, here
	if wr.failed == nil && wr.tx == nil {
		tx, err := wr.w.db.Begin(true)
		if err != nil {
			wr.fail(fmt.Errorf("begin transaction: %w", err))
		} else {
			wr.tx, wr.txStart, wr.txBytes, wr.txAppends, wr.txDeleted, wr.txProbe = tx, time.Now(), 0, 0, 0, false
		}
	}
	if wr.failed == nil {
		// Work on a copy so that a failed transaction leaves the last
		// committed state in place.
		before := wr.st
		wr.st = wr.st.clone()
		var (
			now     []func()
			later   []func(error)
			applied []pendingCommit
			room    *diskRoom
		)
		// A damaged page the writes meet (bbolt panics, or faults in the
		// mapped file) fails the WAL, named, rather than the process.
		err := damagedPage(wr.w.path, func() (err error) {
			now, later, applied, room, err = wr.apply(wr.tx, appends, commits)
			return err
		})
		if err == nil {
			for _, reply := range now {
				reply()
			}
			wr.replies = append(wr.replies, later...)
			wr.commits = append(wr.commits, applied...)
			return room, true
		}
		wr.st = before
		wr.waiting = nil
		wr.fail(err)
	}
	for _, r := range appends {
		r.answer(appendResult{err: wr.failed})
	}
	for _, c := range commits {
		c.done <- commitResult{err: wr.failed}
	}
	return nil, false
}

// apply writes one group into tx. It answers nothing itself: it returns
// the answers due now, those due when tx commits (appends) and the commits
// applied, so that a failure can answer every request exactly once. room
// is the room on the disk that the appends left, when apply measured it
// (nil: not measured).
func (wr *writer) apply(tx *bolt.Tx, appends []*appendReq, commits []*commitReq) (now []func(), later []func(error), applied []pendingCommit, room *diskRoom, err error) {
	if h := applyHook.Load(); h != nil {
		(*h)()
	}
	if wr.probeLeft && !wr.txProbe {
		// It sits in the meta bucket's leaf, which every transaction
		// writes: out of it first.
		if err := tx.Bucket(bucketMeta).Delete(keySpaceProbe); err != nil {
			return nil, nil, nil, room, err
		}
		wr.txProbe, wr.dirty = true, true
	}
	cursorsMoved := false
	for _, c := range commits {
		seq, moved, err := wr.applyOps(tx, c.ops)
		if errors.Is(err, errOpInvalid) {
			now = append(now, func() { c.done <- commitResult{err: err} })
			continue
		}
		if err != nil {
			return nil, nil, nil, room, err
		}
		cursorsMoved = cursorsMoved || moved
		if len(c.ops) > 0 {
			wr.dirty = true // Sync's empty commit changes nothing of itself
		}
		applied = append(applied, pendingCommit{req: c, seq: seq})
	}
	if wr.noHousekeeping {
		// Retention and expiry wait for the next transaction.
		wr.moreWork = wr.moreWork || cursorsMoved
	} else {
		expire := wr.moreWork || time.Since(wr.lastExpire) >= chunkExpiryInterval
		if cursorsMoved || wr.moreWork {
			wr.moreWork = false
			if err := wr.retain(tx); err != nil {
				return nil, nil, nil, room, err
			}
		}
		if expire {
			wr.lastExpire = time.Now()
			if err := wr.expireChunks(tx); err != nil {
				return nil, nil, nil, room, err
			}
		}
	}

	seen := map[string]storedChunk{} // chunk ids stored earlier in this group
	chunks := tx.Bucket(bucketChunks)
	t := time.Now()
	for i, r := range appends {
		if r.ctx.Err() != nil {
			err := wr.w.givenUp(r.ctx, r.held.Load())
			now = append(now, func() { r.answer(appendResult{err: err}) })
			continue
		}
		if r.chunk != "" {
			if c, ok := seen[r.chunk]; ok {
				// The first copy is in this very transaction: the duplicate is
				// answered only when, and as, that copy commits.
				ans := c.answer(r)
				if wr.w.opts.Sync == SyncInterval {
					now = append(now, func() { r.answer(ans) })
				} else {
					later = append(later, func(err error) {
						if err != nil {
							ans = appendResult{err: err}
						}
						r.answer(ans)
					})
				}
				continue
			}
			if c, ok := lookupChunk(chunks, r.chunk, t, wr.w.opts.DedupWindow); ok {
				ans := c.answer(r) // stored by a committed transaction
				now = append(now, func() { r.answer(ans) })
				continue
			}
		}
		max := wr.w.opts.MaxBytes
		if max > 0 && r.bytes > max {
			err := fmt.Errorf("%w: %d bytes stored, max_bytes is %d", ErrTooLarge, r.bytes, max)
			now = append(now, func() { r.answer(appendResult{err: err}) })
			continue
		}
		// Room on the disk first, whatever WhenFull says: dropping the
		// oldest entries frees their pages only once this transaction
		// commits, too late for this append.
		if room == nil {
			room = wr.room()
		}
		if !room.take(storeCost(r.bytes), wr.floor()) {
			r.held.Store(true)
			wr.waiting = append(wr.waiting, appends[i:]...)
			wr.diskHeld = true
			wr.heldNeed, wr.heldAt = storeCost(r.bytes), time.Now()
			break
		}
		over := max > 0 && wr.st.liveBytes+r.bytes > max
		if over && wr.w.opts.WhenFull == Block {
			r.held.Store(true)
			wr.waiting = append(wr.waiting, appends[i:]...)
			wr.maxHeldNeed, wr.maxHeldAt = r.bytes, time.Now()
			break
		}
		// Taken now, before anything is dropped for it.
		if !r.state.CompareAndSwap(reqPending, reqTaken) {
			// Given up by Append a moment ago: not stored.
			now = append(now, func() { r.answer(appendResult{err: context.Canceled}) })
			continue
		}
		if r.held.Load() {
			wr.maxHeldNeed = 0 // a held append fits now: Full follows the appends again
		}
		if over {
			if err := wr.dropOldest(tx, wr.st.liveBytes+r.bytes-max); err != nil {
				return nil, nil, nil, room, err
			}
		}
		wr.dirty = true
		res, err := wr.put(tx, r, t)
		if err != nil {
			return nil, nil, nil, room, err
		}
		if r.chunk != "" {
			seen[r.chunk] = storedChunk{Result: res, digest: r.digest}
		}
		if wr.w.opts.Sync == SyncInterval {
			// Acknowledged before the commit: see SyncInterval.
			now = append(now, func() { r.answer(appendResult{Result: res}) })
		} else {
			later = append(later, func(err error) { r.answer(appendResult{Result: res, err: err}) })
		}
	}
	meta := tx.Bucket(bucketMeta)
	if err := meta.Put(keyNextSeq, u64(wr.st.nextSeq)); err != nil {
		return nil, nil, nil, room, err
	}
	if err := meta.Put(keyBytes, u64(uint64(wr.st.liveBytes))); err != nil {
		return nil, nil, nil, room, err
	}
	return now, later, applied, room, nil
}

// storeCost is the most an append of stored bytes may take of the disk:
// bbolt splits a leaf it fills in key order into halves, so small entries
// can take twice their size in pages (an entry over a page takes whole
// pages of its own, up to a page more than its size), plus a page for a
// new branch.
func storeCost(stored int64) int64 { return 2*stored + 4096 }

// diskRoom is the room for appends, as a step measured it.
type diskRoom struct {
	disk, file int64 // see WAL.space
	known      bool  // false: the file system cannot tell; appends are not held
}

// take reports whether an append that may take cost bytes leaves floor
// free, and if so counts it as taken. It must leave floor free either on
// the disk (then whatever a later commit needs, the file can grow into)
// or in free pages inside the file, the case of a file that stays at the
// high-water mark of a backlog its sinks have since drained: bbolt reuses
// those pages before it grows the file. An append may take its pages from
// either, so it is counted against both.
func (r *diskRoom) take(cost, floor int64) bool {
	if !r.known {
		return true
	}
	if r.disk-cost < floor && r.file-cost < floor {
		return false
	}
	r.disk -= cost
	r.file -= cost
	return true
}

// enough reports whether floor is free on the disk or in the file.
func (r *diskRoom) enough(floor int64) bool {
	return !r.known || r.disk >= floor || r.file >= floor
}

// room measures the room for this transaction's appends, less what the
// open transaction already stored and has not written (SyncInterval holds
// it across steps). After a commit of appends was refused for lack of
// space, it is only the room gained since (see writer.noSpace).
func (wr *writer) room() *diskRoom {
	disk, file, ok := wr.w.space()
	if !ok && !wr.noStatfs {
		wr.noStatfs = true
		wr.w.log.Warn("wal: cannot read the free space of the data directory's file system: appends are not held back to keep wal.min_free_bytes free", "path", wr.w.path)
	}
	if m := wr.noSpace; m != nil {
		disk -= m.disk
		file -= m.file
		// Even where the file system cannot tell its free space, the free
		// pages in the file tell what was gained since.
		ok = true
	}
	pending := 2 * wr.txBytes
	return &diskRoom{disk: disk - pending, file: file - pending, known: ok}
}

// floor is the room an append must leave: MinFreeBytes, and an eighth
// more while appends are held for room, so that they resume with some
// room to spare instead of at every page retention frees.
func (wr *writer) floor() int64 {
	f := wr.w.opts.MinFreeBytes
	if wr.w.diskFull.Load() {
		f += f / 8
	}
	return f
}

// dropLogInterval spaces drop_oldest's lines (a variable for tests).
var dropLogInterval = time.Minute

// heldFor is Options.HoldFor's default (a variable for tests).
var heldFor = 10 * time.Second // a variable for tests

// openRoom sets DiskFull at open when less than MinFreeBytes is free on
// the disk and in the file: no append has been held yet, but one would
// be, and /readyz must say so before clients are sent here (a restart on
// a full disk). The hold ends as any does (checkDisk), looked at every
// second.
func (wr *writer) openRoom() {
	if wr.room().enough(wr.w.opts.MinFreeBytes) {
		return
	}
	wr.setDiskFull(true, nil)
	wr.noSpaceRetry = time.After(noSpaceRetryInterval)
}

// checkDisk updates DiskFull after a step. room is what apply left of the
// room on the disk (nil: it stored nothing and did not measure). While
// appends are held for room, the writer looks again every second, and
// after each commit, since retention or another process may have freed
// some.
func (wr *writer) checkDisk(room *diskRoom) {
	switch full := wr.w.diskFull.Load(); {
	case wr.diskHeld && !full:
		wr.setDiskFull(true, nil)
	case !wr.diskHeld && full:
		if room == nil {
			room = wr.room()
		}
		// No append waits (the held one may have given up): the hold ends
		// once one of its size would fit, not the moment its client left
		// (its retry would be held again: the hold would flap), but only
		// for HoldFor after the last hold, or a request its client gave up
		// for good would hold smaller ones off (the inputs refuse while
		// the WAL is full, so none would come to prove there is room).
		need := wr.heldNeed
		if time.Since(wr.heldAt) > wr.w.opts.HoldFor {
			need = 0
		}
		if room.enough(wr.floor() + need) {
			wr.setDiskFull(false, nil)
			wr.heldNeed = 0
		}
	}
	if wr.w.diskFull.Load() && wr.noSpaceRetry == nil {
		wr.noSpaceRetry = time.After(noSpaceRetryInterval)
	}
}

// setDiskFull records a hold for room on the disk or its end, with a log
// line for each (holds at most once a minute; the end of a logged hold
// always). refused is the write error of a commit of appends the file
// system refused although the room measured was enough (nil: the room
// measured is below the floor).
func (wr *writer) setDiskFull(full bool, refused error) {
	wr.w.diskFull.Store(full)
	now := time.Now()
	if !full {
		if wr.diskLogged {
			wr.diskLogged = false
			disk, file, _ := wr.w.space()
			wr.w.log.Info("wal: room on the disk again: appends resume", "path", wr.w.path, "disk_free_bytes", disk,
				"file_free_bytes", file, "min_free_bytes", wr.w.opts.MinFreeBytes, "held_for", now.Sub(wr.diskHeldSince).Round(time.Millisecond))
		}
		return
	}
	wr.diskHeldSince, wr.diskRefused = now, refused
	if now.Sub(wr.lastDiskLog) < diskLogInterval {
		wr.diskHolds++
		wr.lateHoldLine(wr.lastDiskLog, now)
		return
	}
	wr.logDiskHold(now)
}

// logDiskHold logs that appends wait for room on the disk.
func (wr *writer) logDiskHold(now time.Time) {
	disk, file, _ := wr.w.space()
	refused := wr.diskRefused
	args := []any{"path", wr.w.path, "disk_free_bytes", disk, "file_free_bytes", file, "min_free_bytes", wr.w.opts.MinFreeBytes,
		"holds_not_logged", wr.diskHolds, "held_for", now.Sub(wr.diskHeldSince).Round(time.Millisecond)}
	if refused != nil {
		// The figures say there is room: say why appends wait all the same.
		wr.w.log.Warn(fmt.Sprintf("wal: the file system refused a commit of appends (no space) although it reports room (another process took it, a quota, a thin volume): appends wait and the inputs push back on clients, while sinks go on delivering and committing; the room is tried every %s", noSpaceProbeInterval),
			append(args, "error", refused)...)
	} else {
		wr.w.log.Warn("wal: the disk is nearly full: appends wait and the inputs push back on clients, while sinks go on delivering and committing; appends resume once retention or the operator frees room", args...)
	}
	wr.lastDiskLog, wr.diskLogged, wr.diskHolds = now, true, 0
}

func (wr *writer) put(tx *bolt.Tx, r *appendReq, now time.Time) (Result, error) {
	entries := tx.Bucket(bucketEntries)
	res := Result{First: wr.st.nextSeq, Last: wr.st.nextSeq + r.n - 1}
	for i := range r.entries {
		e := &r.entries[i]
		if err := entries.Put(seqKey(wr.st.nextSeq), e.finish(wr.st.nextSeq)); err != nil {
			return res, fmt.Errorf("put entry %d: %w", wr.st.nextSeq, err)
		}
		wr.keepRecent(e)
		wr.st.nextSeq += uint64(e.count)
	}
	wr.st.liveBytes += r.bytes
	wr.txBytes += r.bytes
	wr.txAppends++
	if r.chunk != "" {
		if err := storeChunk(tx, r.chunk, r.digest, now, res); err != nil {
			return res, err
		}
	}
	return res, nil
}

// keepRecent takes the buffer of an entry put at wr.st.nextSeq for the
// recent entries, which get it if the transaction commits. An entry without
// one breaks the run that recent holds (txFresh).
func (wr *writer) keepRecent(e *entry) {
	if e.raw == nil {
		wr.releaseRecent()
		wr.txFresh = true
		return
	}
	// What recent cannot hold of them (more than recentCap) it lets go of
	// when it takes them, oldest first.
	wr.txRecent = append(wr.txRecent, recentEntry{first: wr.st.nextSeq, count: e.count, raw: e.raw})
	e.raw = nil
}

// releaseRecent lets go of the buffers the open transaction's entries hold.
func (wr *writer) releaseRecent() {
	for _, e := range wr.txRecent {
		wr.w.recent.release(e.raw)
	}
	wr.txRecent = wr.txRecent[:0]
}

var errOpInvalid = errors.New("wal: invalid change")

// applyOps applies one Batch. It validates every op before changing
// anything, so an invalid batch is refused whole and the rest of the group
// still commits.
func (wr *writer) applyOps(tx *bolt.Tx, ops []op) (uint64, bool, error) {
	for _, o := range ops {
		switch o.kind {
		case opSetCursor:
			if _, ok := wr.st.cursors[o.name]; !ok {
				return 0, false, fmt.Errorf("%w: set cursor %q: %w", errOpInvalid, o.name, ErrUnknownCursor)
			}
			if o.seq >= wr.st.nextSeq {
				return 0, false, fmt.Errorf("%w: set cursor %q to %d, last record is %d: %w", errOpInvalid, o.name, o.seq, wr.st.nextSeq-1, ErrCursorAhead)
			}
		}
	}
	cursors := tx.Bucket(bucketCursors)
	var seq uint64
	moved := false
	for _, o := range ops {
		switch o.kind {
		case opRegister:
			pos, ok := wr.st.cursors[o.name]
			if !ok {
				pos = wr.st.firstSeq - 1
				wr.st.cursors[o.name] = pos
				if err := cursors.Put([]byte(o.name), u64(pos)); err != nil {
					return 0, false, err
				}
			}
			seq = pos
		case opDropCursor:
			if _, ok := wr.st.cursors[o.name]; !ok {
				return 0, false, fmt.Errorf("%w: drop cursor %q: %w", errOpInvalid, o.name, ErrUnknownCursor)
			}
			delete(wr.st.cursors, o.name)
			delete(wr.st.dropped, o.name)
			if err := cursors.Delete([]byte(o.name)); err != nil {
				return 0, false, err
			}
			if err := tx.Bucket(bucketDropped).Delete([]byte(o.name)); err != nil {
				return 0, false, err
			}
			if err := tx.Bucket(bucketState).DeleteBucket([]byte(o.name)); err != nil && !errors.Is(err, bolt.ErrBucketNotFound) {
				return 0, false, err
			}
			moved = true
		case opSetCursor:
			if o.seq > wr.st.cursors[o.name] {
				wr.st.cursors[o.name] = o.seq
				if err := cursors.Put([]byte(o.name), u64(o.seq)); err != nil {
					return 0, false, err
				}
				moved = true
			}
		case opPut:
			b, err := tx.Bucket(bucketState).CreateBucketIfNotExists([]byte(o.name))
			if err != nil {
				return 0, false, err
			}
			if err := b.Put(o.key, o.value); err != nil {
				return 0, false, err
			}
		case opDelete:
			if b := tx.Bucket(bucketState).Bucket([]byte(o.name)); b != nil {
				if err := b.Delete(o.key); err != nil {
					return 0, false, err
				}
			}
		case opReplaceDamaged:
			last, repaired, err := wr.replaceDamaged(tx, o.seq)
			if err != nil {
				return 0, false, err
			}
			seq = last
			if o.repaired != nil {
				*o.repaired = repaired
			}
		}
	}
	return seq, moved, nil
}

// maxDamagedRecords bounds the records replaceDamaged puts for one entry:
// an entry holds at most this many (maxEntryRaw bytes of records of at
// least a few bytes each), so a larger range means keys that do not
// follow each other, not one damaged entry.
const maxDamagedRecords = 1 << 20

// replaceDamaged is ReplaceDamaged in tx; repaired reports an entry
// written again from the records recent holds.
func (wr *writer) replaceDamaged(tx *bolt.Tx, first uint64) (last uint64, repaired bool, err error) {
	b := tx.Bucket(bucketEntries)
	c := b.Cursor()
	k, v := c.Seek(seqKey(first))
	if k == nil || binary.BigEndian.Uint64(k) != first {
		return 0, false, nil
	}
	if _, err := decodeEntry(first, v, nil, nil); err == nil {
		return 0, false, nil
	}
	old := int64(len(v))
	// The key is checked too (the checksum covers it, so it may be what
	// is damaged): it must be where the entry before it ends, or the
	// first live record.
	begin := wr.st.firstSeq
	if pk, pv := c.Prev(); pk != nil {
		n, ok := entryCount(pv)
		if recs, err := decodeEntry(binary.BigEndian.Uint64(pk), pv, nil, nil); err == nil {
			n, ok = len(recs), true
		}
		if !ok {
			return 0, false, fmt.Errorf("%w: replace damaged entry %d: the entry before it is damaged too, so where this one begins is not known", errOpInvalid, first)
		}
		begin = binary.BigEndian.Uint64(pk) + uint64(n)
	}
	c.Seek(seqKey(first))
	end := wr.st.nextSeq
	if nk, _ := c.Next(); nk != nil {
		end = binary.BigEndian.Uint64(nk)
	}
	if begin != first || end <= first || end-first > maxDamagedRecords {
		return 0, false, fmt.Errorf("%w: replace damaged entry %d: the entry before it ends at %d and the next begins at %d: its key may be damaged", errOpInvalid, first, begin, end)
	}
	var recs []Record
	if kept, ok := wr.w.recent.read(first, int(end-first), 0, nil, &decoder{tags: tagTable{}}); ok && uint64(len(kept)) >= end-first &&
		kept[0].Seq == first && kept[end-first-1].Seq == end-1 {
		// Committed by this process and still in memory: the entry as it
		// was, read from there.
		recs, repaired = kept[:end-first], true
	} else {
		recs = make([]Record, end-first)
		now := time.Now().UnixNano() // what Age and the lag see of them
		for i := range recs {
			recs[i].Tag, recs[i].Time = DamagedTag, now
		}
	}
	if !repaired {
		// A client's chunk re-sent within dedup_window is stored again: its
		// records may be those lost here.
		if err := forgetChunks(tx, first, end-1); err != nil {
			return 0, false, err
		}
	}
	seq, added := first, int64(0)
	for _, e := range encodeEntries(recs, nil) {
		value := e.finish(seq)
		if err := b.Put(seqKey(seq), value); err != nil {
			return 0, false, fmt.Errorf("replace damaged entry %d: %w", first, err)
		}
		added += int64(len(value))
		seq += uint64(e.count)
	}
	wr.st.liveBytes += added - old
	wr.dirty = true
	return end - 1, repaired, nil
}

// retain deletes entries that every cursor has passed.
func (wr *writer) retain(tx *bolt.Tx) error {
	if len(wr.st.cursors) == 0 {
		return nil // nothing has said it is done with anything
	}
	min := ^uint64(0)
	for _, pos := range wr.st.cursors {
		if pos < min {
			min = pos
		}
	}
	b := tx.Bucket(bucketEntries)
	c := b.Cursor()
	var keys [][]byte
	var freed int64
	for k, v := c.First(); k != nil; k, v = c.Next() {
		last := wr.spanLast(c, k)
		if last > min {
			break
		}
		if len(keys) == wr.deleteLimit {
			wr.moreWork = true
			break
		}
		keys = append(keys, append([]byte(nil), k...))
		freed += int64(len(v))
		wr.st.firstSeq = last + 1
	}
	if len(keys) > 0 {
		wr.dirty = true
		wr.txDeleted += len(keys)
	}
	for _, k := range keys {
		if err := b.Delete(k); err != nil {
			return fmt.Errorf("delete entry %d: %w", binary.BigEndian.Uint64(k), err)
		}
	}
	wr.st.liveBytes -= freed
	return nil
}

// spanLast is the last sequence number of the entry at key k, which c is
// on: keys are dense, so one before the next entry's key, or before
// next_seq for the last entry. Unlike the count in the entry's header,
// which its checksum covers but which is read here unchecked, it cannot be
// damaged. c is left on k.
func (wr *writer) spanLast(c *bolt.Cursor, k []byte) uint64 {
	last := wr.st.nextSeq - 1
	key := append([]byte(nil), k...) // k may not outlive the cursor's move
	if nk, _ := c.Next(); nk != nil {
		last = binary.BigEndian.Uint64(nk) - 1
	}
	c.Seek(key)
	return last
}

// dropOldest deletes the oldest entries until at least need bytes are free
// and moves every cursor that had not passed them to their end, counting
// the records each cursor lost.
func (wr *writer) dropOldest(tx *bolt.Tx, need int64) error {
	b := tx.Bucket(bucketEntries)
	c := b.Cursor()
	var keys [][]byte
	var freed int64
	var last uint64
	// What each cursor whose sink takes some tags only loses: the records
	// of the dropped entries past it that it would have taken.
	var taken map[string]uint64
	// Entries of ReplaceDamaged's placeholders: their records were lost
	// and counted as damaged, not dropped.
	var holes [][2]uint64
	for k, v := c.First(); k != nil && freed < need; k, v = c.Next() {
		first := binary.BigEndian.Uint64(k)
		last = wr.spanLast(c, k)
		keys = append(keys, append([]byte(nil), k...))
		freed += int64(len(v))
		if placeholders(first, v) {
			holes = append(holes, [2]uint64{first, last})
			continue
		}
		taken = wr.countTaken(taken, first, last, v)
	}
	if len(keys) == 0 {
		return nil
	}
	wr.dirty = true
	for _, k := range keys {
		if err := b.Delete(k); err != nil {
			return fmt.Errorf("delete entry %d: %w", binary.BigEndian.Uint64(k), err)
		}
	}
	first := wr.st.firstSeq
	wr.st.firstSeq = last + 1
	wr.st.liveBytes -= freed
	for name, pos := range wr.st.cursors {
		if pos >= last {
			continue
		}
		lost := last - max(pos, first-1)
		for _, h := range holes {
			if h[1] > pos {
				lost -= h[1] - max(h[0]-1, pos)
			}
		}
		if n, ok := taken[name]; ok {
			lost = n
		}
		wr.st.cursors[name] = last
		wr.st.dropped[name] += lost
		if lost > 0 {
			if wr.txDropped == nil {
				wr.txDropped = map[string]uint64{}
			}
			wr.txDropped[name] += lost
		}
		if err := tx.Bucket(bucketCursors).Put([]byte(name), u64(last)); err != nil {
			return err
		}
		if err := tx.Bucket(bucketDropped).Put([]byte(name), u64(wr.st.dropped[name])); err != nil {
			return err
		}
	}
	return nil
}

// placeholderRaw bounds the bytes of one of ReplaceDamaged's placeholder
// records in an entry's payload: a time (at most 10 bytes), DamagedTag with
// its length, and an empty body's length.
const placeholderRaw = binary.MaxVarintLen64 + 1 + len(DamagedTag) + 1

// placeholders reports whether the entry of records from first, stored as
// v, holds ReplaceDamaged's placeholders (it holds nothing else). Only an
// entry whose records are as small as placeholders is decoded.
func placeholders(first uint64, v []byte) bool {
	count, ok := entryCount(v)
	if !ok || len(v) < entryHeaderLen || uint64(binary.BigEndian.Uint32(v[6:10])) > uint64(count)*uint64(placeholderRaw) {
		return false
	}
	recs, err := decodeEntry(first, v, nil, nil)
	return err == nil && len(recs) > 0 && recs[0].Tag == DamagedTag
}

// countTaken adds to taken, for each cursor with a tag filter
// (Options.CursorTags) that has not passed the entry of records first to
// last, how many of the entry's records past it its sink would take. An
// entry that does not decode counts whole: what it held is not known.
func (wr *writer) countTaken(taken map[string]uint64, first, last uint64, v []byte) map[string]uint64 {
	var recs []Record
	decoded := false
	for name, match := range wr.w.opts.CursorTags {
		pos, ok := wr.st.cursors[name]
		if !ok || match == nil || pos >= last {
			continue
		}
		if taken == nil {
			taken = map[string]uint64{}
		}
		if !decoded {
			var err error
			if recs, err = decodeEntry(first, v, nil, nil); err != nil {
				recs = nil
			}
			decoded = true
		}
		n := taken[name]
		if recs == nil {
			n += last - max(pos, first-1)
		}
		for i := range recs {
			if recs[i].Seq > pos && match(recs[i].Tag) {
				n++
			}
		}
		taken[name] = n
	}
	return taken
}

func (wr *writer) logDrops(force bool) {
	if len(wr.droppedSince) == 0 {
		return
	}
	if wait := dropLogInterval - time.Since(wr.lastDropLog); !force && wait > 0 {
		if wr.dropLogDue == nil {
			wr.dropLogDue = time.After(wait)
		}
		return
	}
	names := make([]string, 0, len(wr.droppedSince))
	for n := range wr.droppedSince {
		names = append(names, n)
	}
	sort.Strings(names)
	args := []any{"max_bytes", wr.w.opts.MaxBytes}
	for _, n := range names {
		args = append(args, "dropped_"+n, wr.droppedSince[n])
	}
	wr.w.log.Warn("wal full: dropped the oldest records that these sinks had not delivered (wal.when_full: drop_oldest); raise wal.max_bytes or fix the slow sink", args...)
	wr.droppedSince = map[string]uint64{}
	wr.lastDropLog = time.Now()
}

// flush commits the open transaction and answers the requests it holds.
func (wr *writer) flush() {
	if wr.tx == nil {
		return
	}
	tx, replies, commits := wr.tx, wr.replies, wr.commits
	appended, deleted, probe := wr.txAppends, wr.txDeleted, wr.txProbe
	wr.tx, wr.replies, wr.commits, wr.txAppends, wr.txDeleted, wr.txProbe = nil, nil, nil, 0, 0, false
	kept, fresh := wr.txRecent, wr.txFresh
	wr.txRecent, wr.txFresh = nil, false
	dropped := wr.txDropped // what drop_oldest lost, if the commit holds
	wr.txDropped = nil
	answer := func(err error) {
		for _, reply := range replies {
			reply(err)
		}
		for _, c := range commits {
			c.req.done <- commitResult{seq: c.seq, err: err}
		}
	}
	if !wr.dirty {
		// Nothing changed (a kick, an append still waiting for room):
		// no commit, no fsync.
		tx.Rollback()
		for _, e := range kept { // none: storing an entry changes something
			wr.w.recent.release(e.raw)
		}
		answer(nil)
		return
	}
	wr.dirty = false
	err := damagedPage(wr.w.path, func() error { return wr.commitTx(tx) })
	if err == nil {
		wr.w.commits.Add(1)
		for name, n := range dropped {
			wr.droppedSince[name] += n
		}
		if appended > 0 {
			wr.w.appended.note(wr.st.nextSeq-1, time.Now()) // before publish: no reader sees a record Age does not know
		}
		wr.w.recent.committed(kept, fresh, wr.st.firstSeq)
		wr.w.publish(wr.st)
		answer(nil)
		if deleted > 0 {
			wr.deleteLimit = min(2*wr.deleteLimit, maxDeletesPerTx)
		}
		if appended > 0 {
			wr.noSpace = nil // the room measured serves again
		}
		if probe {
			wr.probeLeft = false
		}
		if wr.w.diskFull.Load() {
			wr.moreWork = true // see whether the held appends fit now
		}
		return
	}
	for _, e := range kept {
		wr.w.recent.release(e.raw)
	}
	// With SyncInterval, appends in the transaction were acknowledged
	// already: a commit that cannot hold them loses them, and the WAL
	// stops. One without appends (cursors, sink state, retention) is
	// refused and tried again as with SyncAlways.
	if !isNoSpace(err) || wr.w.opts.Sync != SyncAlways && appended > 0 {
		wr.fail(fmt.Errorf("commit: %w%s", err, wr.lost(appended)))
		answer(wr.failed)
		return
	}
	// Nothing of this transaction reached the file and bbolt rolled it
	// back: refuse this group, keep going.
	err = fmt.Errorf("%w: %v", ErrNoSpace, err)
	wr.st = wr.w.snapshot()
	if appended > 0 {
		// The room measured was not room for these appends: hold the next
		// ones until some is gained, as for a disk below the floor, rather
		// than refuse them one group after another.
		disk, file, _ := wr.w.space()
		wr.noSpace = &noSpaceMark{disk: disk, file: file, probeAt: time.Now().Add(noSpaceProbeInterval)}
		if !wr.w.diskFull.Load() {
			wr.setDiskFull(true, err)
		}
	}
	if limit := max(1, deleted/2); deleted > 1 && limit < wr.deleteLimit {
		// Deleting fewer keys rewrites fewer pages (a leaf that keeps
		// some of its entries is rewritten whole, in one run of pages):
		// try again at once with half as many.
		wr.deleteLimit = limit
		wr.moreWork = true
	} else {
		// Try again in a while, not at once: the disk stays full for a
		// time. Retention that stopped at its limit waits too.
		wr.moreWork = false
		wr.noSpaceRetry = time.After(noSpaceRetryInterval)
	}
	if len(commits) == 0 || (appended == 0 && deleted == 0) {
		answer(err)
		return
	}
	// Appends, retention or expiry shared the transaction: refuse the
	// appends and commit the rest alone, which takes a few pages where the
	// others took many. A cursor that frees entries must not wait on
	// appends that need the room it frees, nor on the deletes it allows.
	for _, reply := range replies {
		reply(err)
	}
	reqs := make([]*commitReq, len(commits))
	for i, c := range commits {
		reqs[i] = c.req
	}
	// The retry stores no append and deletes nothing, so a refusal of it
	// is answered below, one level down, not retried again.
	held := wr.waiting // not part of this group: kept for the next step
	wr.waiting = nil
	wr.noHousekeeping = true
	_, ok := wr.applyGroup(nil, reqs)
	wr.noHousekeeping = false
	if !ok {
		for _, r := range held {
			r.answer(appendResult{err: wr.failed})
		}
		return
	}
	wr.waiting = held
	wr.flush()
}

// commitHook, when set, replaces tx.Commit: tests inject failures with it.
var commitHook atomic.Pointer[func(*bolt.Tx) error]

// applyHook, when set, runs as a group is applied to its transaction:
// tests stall it with it.
var applyHook atomic.Pointer[func()]

// atDisk marks the writer at work that waits on the disk until the
// function it returns is called: a transaction's begin, its page reads
// (retention and the chunk index read pages the cache may not hold; a
// stalled disk blocks them as it blocks an fsync), and the commit; not the
// free space read between steps (statfs). CommitPending and Stalled time
// it. Nested calls keep the outer start.
func (wr *writer) atDisk() func() {
	if !wr.w.commitSince.CompareAndSwap(0, time.Now().UnixNano()) {
		return func() {}
	}
	return func() { wr.w.commitSince.Store(0) }
}

func (wr *writer) commitTx(tx *bolt.Tx) error {
	start := time.Now().UnixNano()
	defer wr.atDisk()()
	defer func() {
		wr.w.commitNanos.Add(time.Now().UnixNano() - start)
	}()
	if h := commitHook.Load(); h != nil {
		return (*h)(tx)
	}
	return tx.Commit()
}

// isNoSpace reports a commit whose page write failed because the file
// system is full (ENOSPC from a write, not from an fsync). bbolt writes the
// meta page last, so the file still holds the previous transaction: the
// data pages of the failed one are not referenced. (The meta page write
// itself overwrites an existing page and so cannot run out of space on an
// ordinary file system; on a copy-on-write one it could, and that case is
// treated the same way.) Any other failure, a failed fsync above all, is
// fatal.
func isNoSpace(err error) bool {
	var pe *fs.PathError
	return errors.As(err, &pe) && pe.Op == "write" && errors.Is(err, syscall.ENOSPC)
}

// lost says which acknowledged records a failure loses, when the open
// transaction, which appended appends, is not committed: with SyncInterval
// they were acknowledged when stored, after the last commit (the records
// from the published state's next sequence number to the working
// state's). "" when none were.
func (wr *writer) lost(appended int) string {
	if wr.w.opts.Sync == SyncAlways || appended == 0 {
		return ""
	}
	first := wr.w.snapshot().nextSeq
	if wr.st.nextSeq <= first {
		return ""
	}
	return fmt.Sprintf("; %d acknowledged records (seq %d to %d) were not committed and are lost (wal.sync: interval)", wr.st.nextSeq-first, first, wr.st.nextSeq-1)
}

func (wr *writer) fail(err error) {
	if wr.failed != nil {
		return
	}
	if wr.tx != nil {
		err = fmt.Errorf("%w%s", err, wr.lost(wr.txAppends))
	}
	wr.failed = fmt.Errorf("%w: %v", ErrFatal, err)
	if wr.tx != nil {
		_ = wr.tx.Rollback()
		wr.tx = nil
	}
	wr.releaseRecent()
	for _, reply := range wr.replies {
		reply(wr.failed)
	}
	for _, c := range wr.commits {
		c.req.done <- commitResult{err: wr.failed}
	}
	// Appends held for room wait in no transaction: answered now, not at
	// the next request, which may never come.
	for _, r := range wr.waiting {
		r.answer(appendResult{err: wr.failed})
	}
	wr.replies, wr.commits, wr.waiting = nil, nil, nil
	wr.w.mu.Lock()
	wr.w.fatalErr = wr.failed
	wr.w.mu.Unlock()
	close(wr.w.fatal)
}

func (w *WAL) snapshot() state {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.st.clone()
}

func (w *WAL) publish(st state) {
	w.mu.Lock()
	grew := st.nextSeq != w.st.nextSeq
	w.st = st.clone()
	if grew {
		close(w.notify)
		w.notify = make(chan struct{})
	}
	w.mu.Unlock()
}
