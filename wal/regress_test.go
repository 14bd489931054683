package wal

import (
	"context"
	"encoding/binary"
	"errors"
	"io/fs"
	"math/rand"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// A second copy of a chunk id in the same group is acknowledged as a
// duplicate before the transaction holding the first copy commits. When
// that commit then fails (ENOSPC: the WAL goes on), the client holds an
// ack for records that were never stored.
func TestDuplicateInGroupAckedOnlyWithItsCommit(t *testing.T) {
	w := openT(t, t.TempDir(), Options{})
	defer w.Close()
	appendT(t, w, []Record{{Body: []byte(`{"first":1}`)}}, "") // the writer's start-up step is done
	var calls atomic.Int32
	hook := func(tx *bolt.Tx) error {
		switch calls.Add(1) {
		case 1: // hold the writer so that A and B queue up behind it
			time.Sleep(300 * time.Millisecond)
			return tx.Commit()
		case 2:
			tx.Rollback()
			return &fs.PathError{Op: "write", Path: "wal.db", Err: syscall.ENOSPC}
		}
		return tx.Commit()
	}
	commitHook.Store(&hook)
	defer commitHook.Store(nil)
	go w.Append(context.Background(), []Record{{Body: []byte(`{"warm":1}`)}}, AppendOptions{})
	time.Sleep(50 * time.Millisecond)
	var wg sync.WaitGroup
	res := make([]Result, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i], errs[i] = w.Append(context.Background(), []Record{{Body: []byte(`{"x":1}`)}}, AppendOptions{ChunkID: "X"})
		}()
	}
	wg.Wait()
	t.Logf("A: %+v err=%v; B: %+v err=%v", res[0], errs[0], res[1], errs[1])
	storedX := false
	for _, r := range readAll(t, w, 1) {
		storedX = storedX || string(r.Body) == `{"x":1}`
	}
	for i := range 2 {
		if errs[i] == nil && !storedX {
			t.Fatalf("append %d acknowledged (Duplicate=%v) but chunk X was never stored", i, res[i].Duplicate)
		}
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// After a fatal commit failure while retention still had work queued
// (moreWork), the writer loop never blocks again: it spins, and Close hangs.
func TestWriterIdleAfterFatalWithWorkQueued(t *testing.T) {
	w := openT(t, t.TempDir(), Options{})
	if _, err := w.RegisterCursor(context.Background(), "s"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := 0; i < 5000; i++ { // 5000 entries: more than maxDeletesPerTx
		wg.Add(1)
		go func() { defer wg.Done(); appendT(t, w, []Record{{Body: []byte(`{}`)}}, "") }()
	}
	wg.Wait()
	fail := func(tx *bolt.Tx) error { tx.Rollback(); return syscall.EIO }
	commitHook.Store(&fail)
	defer commitHook.Store(nil)
	var b Batch
	b.SetCursor("s", 5000)
	_ = w.Commit(context.Background(), &b) // retention stops at 4096 deletes: moreWork
	time.Sleep(50 * time.Millisecond)
	c0 := cpuTime()
	time.Sleep(time.Second)
	used := cpuTime() - c0
	t.Logf("CPU used in 1s by an idle, failed WAL: %v", used)
	closed := make(chan error, 1)
	go func() { closed <- w.Close() }()
	select {
	case <-closed:
	case <-time.After(3 * time.Second):
		t.Errorf("Close has not returned after 3s: the spinning writer never reads quit")
	}
	if used > 300*time.Millisecond {
		t.Errorf("writer busy-loops after a fatal error")
	}
}

// With the disk persistently full, the writer retries a commit in a tight
// loop (moreWork is set on every ENOSPC).
func TestWriterDoesNotSpinOnFullDisk(t *testing.T) {
	w := openT(t, t.TempDir(), Options{})
	defer w.Close()
	appendT(t, w, []Record{{Body: []byte(`{}`)}}, "")
	var calls atomic.Int64
	full := func(tx *bolt.Tx) error {
		calls.Add(1)
		tx.Rollback()
		return &fs.PathError{Op: "write", Path: "wal.db", Err: syscall.ENOSPC}
	}
	commitHook.Store(&full)
	defer commitHook.Store(nil)
	w.Append(context.Background(), []Record{{Body: []byte(`{}`)}}, AppendOptions{})
	c0 := calls.Load()
	time.Sleep(time.Second)
	n := calls.Load() - c0
	t.Logf("commit attempts in 1s with no requests: %d", n)
	if n > 10 {
		t.Fatalf("writer retries the commit %d times a second on a full disk", n)
	}
}

// TestFatalAnswersHeldAppends: an append held for room (max_bytes with
// WhenFull Block) when the WAL fails must get ErrFatal at once, not wait
// for another request that would wake the writer.
func TestFatalAnswersHeldAppends(t *testing.T) {
	w := openT(t, t.TempDir(), Options{MaxBytes: 4 << 10, WhenFull: Block})
	defer w.Close()
	ctx := context.Background()
	if _, err := w.RegisterCursor(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	body := func() []byte { // 3 KiB that s2 cannot make smaller
		b := make([]byte, 3<<10)
		rand.Read(b)
		return b
	}
	appendT(t, w, []Record{{Body: body()}}, "")
	held := make(chan error, 1)
	go func() {
		_, err := w.Append(ctx, []Record{{Body: body()}}, AppendOptions{})
		held <- err
	}()
	waitUntil(t, 5*time.Second, "the second append held (Full)", w.Full)
	fail := func(tx *bolt.Tx) error { tx.Rollback(); return syscall.EIO }
	commitHook.Store(&fail)
	defer commitHook.Store(nil)
	var b Batch
	b.Put("s", []byte("k"), []byte("v")) // not a cursor move: the held append stays held
	if err := w.Commit(ctx, &b); !errors.Is(err, ErrFatal) {
		t.Fatalf("commit with a failing write: %v, want ErrFatal", err)
	}
	select {
	case err := <-held:
		if !errors.Is(err, ErrFatal) {
			t.Fatalf("held append after the WAL failed: %v, want ErrFatal", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("held append not answered within 2s of the WAL failing")
	}
}

// TestHeldAppendTimesOutAsFull: an append held for room whose context
// ends says so (ErrFull with the context's error), whatever the writer has
// done since: a caller must not read the state of the WAL afterwards to
// tell a full WAL from a slow one (it may no longer be full by then).
func TestHeldAppendTimesOutAsFull(t *testing.T) {
	defer func(d time.Duration) { heldFor = d }(heldFor)
	heldFor = 200 * time.Millisecond // Full for that long after the hold (TestFullHoldsUntilTheHeldSizeFits)
	w := openT(t, t.TempDir(), Options{MaxBytes: 4 << 10, WhenFull: Block})
	defer w.Close()
	if _, err := w.RegisterCursor(context.Background(), "s"); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 3<<10)
	rand.Read(body)
	appendT(t, w, []Record{{Body: body}}, "")
	for range 5 {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := w.Append(ctx, []Record{{Body: body}}, AppendOptions{})
			done <- err
		}()
		waitUntil(t, 5*time.Second, "the append held (Full)", w.Full)
		cancel()
		if err := <-done; !errors.Is(err, ErrFull) || !errors.Is(err, context.Canceled) {
			t.Fatalf("held append whose context ended: %v, want ErrFull and Canceled", err)
		}
		waitUntil(t, 5*time.Second, "no append held", func() bool { return !w.Full() })
	}
	// Not held: the end of its context is all there is to say.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := w.Append(ctx, []Record{{Body: []byte(`{}`)}}, AppendOptions{}); errors.Is(err, ErrFull) || !errors.Is(err, context.Canceled) {
		t.Fatalf("append with an ended context: %v, want Canceled only", err)
	}
}

// An append whose context ends before the writer came to it, while the
// WAL holds appends for room on the disk, is answered ErrFull too: the
// writer was busy (a commit on a disk that is filling), and an input must
// tell its client the WAL is full, not slow.
func TestPendingAppendTimesOutAsFullWhileFull(t *testing.T) {
	w := openT(t, t.TempDir(), Options{})
	defer w.Close()
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { commitHook.Store(nil); once.Do(func() { close(release) }) }
	defer unblock() // before Close, also when the test fails
	entered := make(chan struct{}, 1)
	hook := func(tx *bolt.Tx) error {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
		return tx.Commit()
	}
	commitHook.Store(&hook)
	first := make(chan error, 1)
	go func() {
		_, err := w.Append(context.Background(), []Record{{Body: []byte(`{"a":1}`)}}, AppendOptions{})
		first <- err
	}()
	<-entered // the writer is in a commit: the next append waits for it
	try := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err := w.Append(ctx, []Record{{Body: []byte(`{"a":2}`)}}, AppendOptions{})
		return err
	}
	if err := try(); errors.Is(err, ErrFull) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("pending append, the WAL not full: %v, want DeadlineExceeded only", err)
	}
	w.diskFull.Store(true) // as the writer says when the disk has no room
	if err := try(); !errors.Is(err, ErrFull) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("pending append while the disk is full: %v, want ErrFull and DeadlineExceeded", err)
	}
	w.diskFull.Store(false)
	unblock()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
}

// TestRetentionDoesNotSpinOnFullDisk: retention halves its deletes after
// each refused commit; once it deletes one key a commit and that is
// refused too, it must wait for the next look at the disk (a second), not
// try again at once for as long as the disk stays full.
func TestRetentionDoesNotSpinOnFullDisk(t *testing.T) {
	w := openT(t, t.TempDir(), Options{})
	defer w.Close()
	ctx := context.Background()
	if _, err := w.RegisterCursor(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	var last Result
	for i := 0; i < 50; i++ {
		last = appendT(t, w, []Record{{Body: []byte(`{}`)}}, "")
	}
	// The disk takes every commit but those that delete entries (their
	// leaves need runs of pages it no longer has).
	var calls atomic.Int64
	hook := func(tx *bolt.Tx) error {
		if k, _ := tx.Bucket(bucketEntries).Cursor().First(); k == nil || binary.BigEndian.Uint64(k) != 1 {
			calls.Add(1)
			tx.Rollback()
			return &fs.PathError{Op: "write", Path: "wal.db", Err: syscall.ENOSPC}
		}
		return tx.Commit()
	}
	commitHook.Store(&hook)
	defer commitHook.Store(nil)
	var b Batch
	b.SetCursor("s", last.Last) // retention wants to delete 50 entries
	if err := w.Commit(ctx, &b); err != nil {
		t.Fatalf("cursor commit, made again without the deletes: %v", err)
	}
	time.Sleep(500 * time.Millisecond) // the deletes halve down to one
	c0 := calls.Load()
	time.Sleep(time.Second)
	n := calls.Load() - c0
	t.Logf("commits tried in 1s by retention on a full disk: %d", n)
	if n > 5 {
		t.Fatalf("retention tried %d commits in 1s on a full disk: it spins", n)
	}
	if err := w.Err(); err != nil {
		t.Fatalf("the WAL failed: %v", err)
	}
}

// endsWhenAsked is a context that ends the moment the writer first asks
// Err() (returning nil to that first call, then pausing the writer a bit),
// so that Append gives the request up between the writer's ctx check and
// its CAS: the window in which apply runs room() and dropOldest().
type endsWhenAsked struct {
	context.Context
	done  chan struct{}
	asked atomic.Bool
}

func (c *endsWhenAsked) Done() <-chan struct{} { return c.done }
func (c *endsWhenAsked) Err() error {
	if c.asked.CompareAndSwap(false, true) {
		close(c.done)
		time.Sleep(100 * time.Millisecond) // Append's goroutine abandons meanwhile
		return nil                         // the writer's one look: not ended yet
	}
	return context.Canceled
}

// An append its caller gives up after the writer looked at its context,
// but before the writer took it, makes drop_oldest drop nothing: it is not
// stored, so nothing may be dropped to make room for it.
func TestDropOldestNotForAnAbandonedAppend(t *testing.T) {
	w := openT(t, t.TempDir(), Options{MaxBytes: 4 << 10, WhenFull: DropOldest})
	defer w.Close()
	if _, err := w.RegisterCursor(context.Background(), "s"); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 3<<10)
	rand.Read(body)
	for i := range body {
		body[i] = 'a' + body[i]%26
	}
	rec := Record{Tag: "t", Body: append(append([]byte(`{"a":"`), body...), `"}`...)}
	if _, err := w.Append(context.Background(), []Record{rec}, AppendOptions{}); err != nil {
		t.Fatal(err)
	}
	ctx := &endsWhenAsked{Context: context.Background(), done: make(chan struct{})}
	_, err := w.Append(ctx, []Record{rec}, AppendOptions{})
	time.Sleep(300 * time.Millisecond)
	st := w.Stats()
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Append: %v, want Canceled (the context ended before it was taken)", err)
	}
	if st.Dropped["s"] > 0 || st.NextSeq != 2 || st.Records != 1 {
		t.Errorf("an append its caller gave up (not stored): next_seq %d, records %d, dropped %v; want nothing dropped", st.NextSeq, st.Records, st.Dropped)
	}
}
