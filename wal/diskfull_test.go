package wal

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/logfwd/forwarder/internal/diskfree"
	"github.com/logfwd/forwarder/internal/racedetect"
	"github.com/logfwd/forwarder/internal/syncbuf"
	"github.com/logfwd/forwarder/internal/tmpfstest"
	bolt "go.etcd.io/bbolt"
)

func fsFree(t *testing.T, path string) int64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

// TestFullDiskDoesNotWedgeCursors fills a real file system while one sink
// is behind and another keeps up, with clients that keep sending: appends
// must be refused or held (never acknowledged without being stored), every
// cursor, intent and delivered-mark commit must go through, and once the
// slow sink drains, retention frees room and appends are acknowledged
// again, without a restart and although the file never shrinks.
func TestFullDiskDoesNotWedgeCursors(t *testing.T) {
	mnt := tmpfstest.Mount(t, "8m")
	w := openT(t, mnt, Options{MinFreeBytes: 1 << 20})
	defer w.Close()
	ctx := context.Background()
	for _, name := range []string{"slow", "fast"} {
		if _, err := w.RegisterCursor(ctx, name); err != nil {
			t.Fatal(err)
		}
	}

	// Clients: each appends 50 records of about 1 KB, gives up on one
	// after 300ms (pushed back) and sends the next.
	var (
		mu       sync.Mutex
		acked    []Result
		refused  int
		otherErr []error
	)
	stop := make(chan struct{})
	var clients sync.WaitGroup
	for c := 0; c < 4; c++ {
		clients.Add(1)
		go func() {
			defer clients.Done()
			r := rand.New(rand.NewSource(int64(c)))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				res, err := w.Append(actx, makeRecords(r, fmt.Sprintf("c%d-%d", c, i), 50, 1000), AppendOptions{})
				cancel()
				mu.Lock()
				switch {
				case err == nil:
					acked = append(acked, res)
				case errors.Is(err, ErrNoSpace), errors.Is(err, context.DeadlineExceeded):
					refused++
				default:
					otherErr = append(otherErr, err)
				}
				mu.Unlock()
				if err != nil {
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
	}
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		clients.Wait()
	}()
	counts := func() (int, int, uint64) {
		mu.Lock()
		defer mu.Unlock()
		var last uint64
		for _, r := range acked {
			last = max(last, r.Last)
		}
		return len(acked), refused, last
	}

	// The fast sink keeps up while the disk fills: each of its commits
	// (cursor, intent, delivered mark) must go through.
	fastErrs := 0
	fastCommit := func(to uint64, n int) {
		var b Batch
		b.Put("fast", []byte("intent"), []byte(fmt.Sprintf("object up to %d", to)))
		if err := w.Commit(ctx, &b); err != nil {
			fastErrs++
			t.Errorf("fast sink: intent commit %d on a full disk: %v", n, err)
			return
		}
		b = Batch{}
		b.SetCursor("fast", to)
		b.Delete("fast", []byte("intent"))
		b.Put("fast", []byte("delivered"), u64(to))
		if err := w.Commit(ctx, &b); err != nil {
			fastErrs++
			t.Errorf("fast sink: cursor commit %d on a full disk: %v", n, err)
		}
	}
	start := time.Now()
	deadline := start.Add(60 * time.Second)
	// The flags say the disk is full while appends are held for room; the
	// fast sink's commits free pages in the file now and then, which may
	// lift the hold for a moment: they must have been seen set, not be set
	// at one chosen instant.
	sawFull := false
	for n := 0; ; n++ {
		_, ref, _ := counts()
		sawFull = sawFull || w.DiskFull() && w.Full()
		if ref >= 40 && sawFull {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("within 60s on an 8 MiB file system (free %d bytes, %d free in the file): %d appends refused, DiskFull() and Full() seen true: %v", fsFree(t, mnt), w.Stats().FileFreeBytes, ref, sawFull)
		}
		if fastErrs < 5 {
			fastCommit(w.Stats().NextSeq-1, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	nAcked, nRefused, lastAcked := counts()
	st := w.Stats()
	t.Logf("full after %v: %d appends acknowledged (up to record %d), %d refused; free %d bytes on the file system, %d in the file; WAL %d bytes live, file %d bytes",
		time.Since(start).Round(time.Millisecond), nAcked, lastAcked, nRefused, st.DiskFreeBytes, st.FileFreeBytes, st.Bytes, st.FileBytes)
	if err := w.Err(); err != nil {
		t.Fatalf("a full disk made the WAL fail: %v", err)
	}
	if !sawFull {
		t.Errorf("DiskFull() and Full() never both true while appends were refused for room (now %v, %v)", w.DiskFull(), w.Full())
	}
	mu.Lock()
	for _, err := range otherErr {
		t.Errorf("append failed with %v, want ErrNoSpace or the client's deadline", err)
	}
	mu.Unlock()

	// Nothing acknowledged is missing: the slow sink reads every record.
	slow, _ := w.Cursor("slow")
	if got := uint64(len(readAll(t, w, slow+1))); slow+got < lastAcked {
		t.Fatalf("records %d-%d readable, %d acknowledged", slow+1, slow+got, lastAcked)
	}

	// The slow sink comes back and drains, in batches of 2,000 records,
	// while the clients keep sending: an intent before each upload, then
	// the cursor with the delivered mark.
	target := w.Stats().NextSeq - 1
	bytesBefore := w.Stats().Bytes
	drainStart := time.Now()
	for pos := slow; pos < target; {
		to := min(pos+2000, target)
		var b Batch
		b.Put("slow", []byte("intent"), []byte(fmt.Sprintf("object %d-%d", pos+1, to)))
		if err := w.Commit(ctx, &b); err != nil {
			t.Fatalf("slow sink: intent commit for records %d-%d on a full disk: %v (WAL %d bytes live, file system free %d bytes)",
				pos+1, to, err, w.Stats().Bytes, fsFree(t, mnt))
		}
		b = Batch{}
		b.SetCursor("slow", to)
		b.Delete("slow", []byte("intent"))
		b.Put("slow", []byte("delivered"), u64(to))
		if err := w.Commit(ctx, &b); err != nil {
			t.Fatalf("slow sink: cursor commit to %d on a full disk: %v (WAL %d bytes live, file system free %d bytes)",
				to, err, w.Stats().Bytes, fsFree(t, mnt))
		}
		fastCommit(to, -1)
		pos = to
	}
	drained := time.Since(drainStart)
	if after := w.Stats().Bytes; after >= bytesBefore {
		t.Fatalf("the drain freed nothing: %d live bytes before, %d after", bytesBefore, after)
	}

	// Appends are acknowledged again.
	n0, _, _ := counts()
	resumed := false
	for until := time.Now().Add(10 * time.Second); time.Now().Before(until); time.Sleep(20 * time.Millisecond) {
		if n, _, _ := counts(); n >= n0+10 {
			resumed = true
			break
		}
	}
	resumeAfter := time.Since(drainStart)
	close(stop)
	clients.Wait()
	if !resumed {
		t.Fatalf("appends not acknowledged again within 10s of the drain (WAL %d bytes live, file system free %d bytes)", w.Stats().Bytes, fsFree(t, mnt))
	}
	if w.DiskFull() {
		t.Errorf("DiskFull() still true once appends are acknowledged again")
	}
	st = w.Stats()
	t.Logf("drained %d records in %v; appends acknowledged again %v after the drain began; WAL %d bytes live (was %d), file %d bytes, file system free %d bytes",
		target-slow, drained.Round(time.Millisecond), resumeAfter.Round(time.Millisecond), st.Bytes, bytesBefore, st.FileBytes, fsFree(t, mnt))
	if err := w.Err(); err != nil {
		t.Fatalf("the WAL failed: %v", err)
	}
}

// noSpaceCommits makes every commit fail as a full disk does (ENOSPC from
// a page write) until the returned function is called; it counts them.
func noSpaceCommits(t *testing.T) (calls *atomic.Int64, stop func()) {
	calls = new(atomic.Int64)
	full := func(tx *bolt.Tx) error {
		calls.Add(1)
		tx.Rollback()
		return &fs.PathError{Op: "write", Path: "wal.db", Err: syscall.ENOSPC}
	}
	commitHook.Store(&full)
	var once sync.Once
	stop = func() { once.Do(func() { commitHook.Store(nil) }) }
	t.Cleanup(stop)
	return calls, stop
}

// probeEvery sets how often the room is probed after a refused commit,
// for one test.
func probeEvery(t *testing.T, d time.Duration) {
	old := noSpaceProbeInterval
	noSpaceProbeInterval = d
	t.Cleanup(func() { noSpaceProbeInterval = old })
}

// stubFree makes the WAL see free bytes on its file system (ok false: the
// file system cannot tell), for one test: room other processes free on a
// shared disk would otherwise end a hold.
func stubFree(t *testing.T, free int64, ok bool) {
	freeBytes = func(string) (int64, bool) { return free, ok }
	t.Cleanup(func() { freeBytes = diskfree.Free })
}

// refusedCommit opens a WAL in dir (MinFreeBytes 1 MiB, closed when the
// test ends) with one record, and makes every commit fail as a full disk
// does (noSpaceCommits); the next append must be refused with ErrNoSpace.
func refusedCommit(t *testing.T, dir string) (w *WAL, calls *atomic.Int64, stop func()) {
	t.Helper()
	w = openT(t, dir, Options{MinFreeBytes: 1 << 20})
	t.Cleanup(func() { w.Close() })
	appendT(t, w, []Record{{Body: []byte(`{"a":1}`)}}, "")
	calls, stop = noSpaceCommits(t)
	if _, err := w.Append(context.Background(), []Record{{Body: []byte(`{"a":2}`)}}, AppendOptions{}); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("append whose commit finds no space: %v, want ErrNoSpace", err)
	}
	return w, calls, stop
}

// appendLater appends one record to w in a goroutine of its own; the
// channel gets Append's error.
func appendLater(w *WAL, body string) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := w.Append(context.Background(), []Record{{Body: []byte(body)}}, AppendOptions{})
		done <- err
	}()
	return done
}

// TestRefusedCommitHoldsAppends: a commit of appends is refused for lack
// of space although the file system says there is room (its free pages
// are too scattered, or it counts them otherwise). The appends after it
// must be held, unacknowledged, with DiskFull() set, not refused one group
// after another: the room is tried every noSpaceProbeInterval with a
// value of the WAL's own, and once one commits, the hold ends and the
// value is gone.
func TestRefusedCommitHoldsAppends(t *testing.T) {
	probeEvery(t, 600*time.Millisecond)
	stubFree(t, 10<<30, true)
	w, calls, stop := refusedCommit(t, t.TempDir())
	ctx := context.Background()
	if !w.DiskFull() || !w.Full() {
		t.Fatalf("after a commit refused for lack of space: DiskFull() %v, Full() %v, want both true", w.DiskFull(), w.Full())
	}

	// Clients keep sending for 3s: none is refused, every one is held.
	var refused, held, other atomic.Int64
	start := time.Now()
	var fullSeen, samples int
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for time.Since(start) < 2900*time.Millisecond {
			samples++
			if w.DiskFull() {
				fullSeen++
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	var clients sync.WaitGroup
	for c := 0; c < 4; c++ {
		clients.Add(1)
		go func() {
			defer clients.Done()
			for time.Since(start) < 3*time.Second {
				actx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
				_, err := w.Append(actx, []Record{{Body: []byte(`{"a":"c"}`)}}, AppendOptions{})
				cancel()
				switch {
				case errors.Is(err, ErrNoSpace):
					refused.Add(1)
				case errors.Is(err, context.DeadlineExceeded):
					held.Add(1)
				default:
					other.Add(1)
				}
			}
		}()
	}
	clients.Wait()
	<-sampled
	t.Logf("in 3s: %d appends refused, %d held past their 200ms, %d other; %d commits tried; DiskFull() in %d of %d samples", refused.Load(), held.Load(), other.Load(), calls.Load(), fullSeen, samples)
	if other.Load() != 0 {
		t.Errorf("%d appends acknowledged or failed otherwise with every commit refused", other.Load())
	}
	if held.Load() < 20 {
		t.Errorf("only %d appends held in 3s: they are not held after a refused commit", held.Load())
	}
	if n := refused.Load(); n > 0 {
		t.Errorf("%d appends refused in 3s after the first refusal: held appends were tried on a disk that refuses commits", n)
	}
	// A probe every 600ms: 5 in 3s, one more at the edges.
	if n := calls.Load(); n < 2 || n > 1+6 {
		t.Errorf("%d commits tried in 3s with every one refused, want the refused one and a probe about every 600ms", n)
	}
	if fullSeen != samples {
		t.Errorf("DiskFull() in only %d of %d samples while every commit is refused", fullSeen, samples)
	}

	// The disk takes writes again: the next try commits and the hold ends.
	stop()
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := w.Append(actx, []Record{{Body: []byte(`{"a":3}`)}}, AppendOptions{}); err != nil {
		t.Fatalf("append once commits go through again: %v", err)
	}
	waitUntil(t, 3*time.Second, "DiskFull() false once appends commit again", func() bool { return !w.DiskFull() && !w.Full() })
	if err := w.Err(); err != nil {
		t.Fatalf("the WAL failed: %v", err)
	}
	noProbeLeft(t, w)
}

// noProbeLeft fails t if a probe's value is still in w's file.
func noProbeLeft(t *testing.T, w *WAL) {
	t.Helper()
	if err := w.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(keySpaceProbe); v != nil {
			return fmt.Errorf("a probe's value of %d bytes is still in the file", len(v))
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
}

// TestSpaceProbeDeletionRefused: a full disk refuses the deletion of a
// probe's value after the probe itself committed. The value sits in the
// meta bucket's leaf, which every commit writes: the next transaction must
// delete it, whatever it holds, not wait for a commit of appends.
func TestSpaceProbeDeletionRefused(t *testing.T) {
	probeEvery(t, 300*time.Millisecond)
	stubFree(t, 10<<30, true)
	w, _, _ := refusedCommit(t, t.TempDir())
	// From now on (the refusing hook replaced, with no moment between):
	// the probe commits; the first commit that deletes its value is
	// refused; every other commit goes through.
	var stored, refusedDelete atomic.Bool
	hook := func(tx *bolt.Tx) error {
		has := tx.Bucket(bucketMeta).Get(keySpaceProbe) != nil
		if !has && stored.Load() && refusedDelete.CompareAndSwap(false, true) {
			tx.Rollback()
			return &fs.PathError{Op: "write", Path: "wal.db", Err: syscall.ENOSPC}
		}
		if has {
			stored.Store(true)
		}
		return tx.Commit()
	}
	commitHook.Store(&hook)
	t.Cleanup(func() { commitHook.Store(nil) })
	waitUntil(t, 5*time.Second, "a probe stored and its deletion refused", refusedDelete.Load)
	waitUntil(t, 3*time.Second, "the probe's value deleted by the next transaction", func() bool {
		var left bool
		w.db.View(func(tx *bolt.Tx) error { left = tx.Bucket(bucketMeta).Get(keySpaceProbe) != nil; return nil })
		return !left
	})
	waitUntil(t, 3*time.Second, "DiskFull() false after the probe", func() bool { return !w.DiskFull() })
	if err := w.Err(); err != nil {
		t.Fatalf("the WAL failed: %v", err)
	}
}

// TestSpaceProbeLeftIsDeletedAtOpen: a crash between a probe's commit and
// its deletion leaves its value; Open deletes it.
func TestSpaceProbeLeftIsDeletedAtOpen(t *testing.T) {
	dir := t.TempDir()
	w := openT(t, dir, Options{})
	appendT(t, w, []Record{{Body: []byte(`{"a":1}`)}}, "")
	if err := w.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keySpaceProbe, make([]byte, probeBytes))
	}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	w = openT(t, dir, Options{})
	defer w.Close()
	noProbeLeft(t, w)
	if got := readAll(t, w, 1); len(got) != 1 {
		t.Fatalf("%d records after reopening, want 1", len(got))
	}
}

// TestRefusedCommitHoldEndsWithNothingWaiting: an input that sends nothing
// while the WAL is full (the HTTP input answers 503 at once, a load
// balancer sends clients elsewhere on /readyz) leaves no append to try
// again; the hold must end all the same once a probe of the room commits,
// not wait for room that nothing will free.
func TestRefusedCommitHoldEndsWithNothingWaiting(t *testing.T) {
	probeEvery(t, 300*time.Millisecond)
	w, _, stop := refusedCommit(t, t.TempDir())
	stop()
	if !w.Full() {
		t.Fatalf("Full() false just after a refused commit")
	}
	waitUntil(t, 5*time.Second, "Full() false with no append waiting once a probe is due", func() bool { return !w.Full() && !w.DiskFull() })
	noProbeLeft(t, w)
	res := appendT(t, w, []Record{{Body: []byte(`{"a":3}`)}}, "")
	if res.First != 2 {
		t.Fatalf("the append after the hold was stored at %d, want 2", res.First)
	}
}

// TestRefusedCommitHoldsWithoutStatfs: where the file system cannot tell
// its free space, appends are not held for MinFreeBytes, but after a
// commit of appends was refused for lack of space the next ones are held
// all the same (the free pages in the file tell what is gained), until a
// probe of the room commits.
func TestRefusedCommitHoldsWithoutStatfs(t *testing.T) {
	probeEvery(t, 1500*time.Millisecond)
	stubFree(t, 0, false)
	w, _, stop := refusedCommit(t, t.TempDir())
	stop()
	start := time.Now()
	done := appendLater(w, `{"a":3}`)
	select {
	case err := <-done:
		t.Fatalf("append after a refused commit, statfs unknown: %v after %v, want it held until the next try", err, time.Since(start))
	case <-time.After(time.Second):
	}
	if !w.DiskFull() {
		t.Errorf("DiskFull() false while an append is held")
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("held append at the next try: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("held append not stored within 6s of the refusal (tries every 1.5s)")
	}
	waitUntil(t, 3*time.Second, "DiskFull() false once the held append is stored", func() bool { return !w.DiskFull() })
}

// TestRefusedCommitHoldsUntilRoomIsGained: after a commit of appends was
// refused for lack of space, room freed on the file system ends the hold
// at once, without waiting for the next try.
func TestRefusedCommitHoldsUntilRoomIsGained(t *testing.T) {
	probeEvery(t, time.Hour)
	mnt := tmpfstest.Mount(t, "8m")
	// Another process takes 4 MiB, leaving more than the floor free.
	ballast := filepath.Join(mnt, "ballast")
	if err := os.WriteFile(ballast, make([]byte, 4<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	w, _, stop := refusedCommit(t, mnt)
	stop()
	done := appendLater(w, `{"a":3}`)
	select {
	case err := <-done:
		t.Fatalf("append after a refused commit, with no room gained: %v, want it held (free %d bytes)", err, fsFree(t, mnt))
	case <-time.After(1500 * time.Millisecond):
	}
	if !w.DiskFull() {
		t.Fatalf("DiskFull() false while an append is held")
	}
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("held append once room was freed: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("held append not stored within 5s of 4 MiB freed (free %d bytes)", fsFree(t, mnt))
	}
	waitUntil(t, 3*time.Second, "DiskFull() false once the held append is stored", func() bool { return !w.DiskFull() })
}

// waitUntil polls cond until it holds, or fails the test after d.
func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("not %s within %v", what, d)
		}
	}
}

// TestFullDiskCyclesNeverRefuseCommits fills and drains a small file
// system fifteen times, with appends of mixed sizes (so that the free
// pages inside the file end up scattered) and a floor of only 64 KiB,
// while a fast sink commits every 10ms and a slow one drains a random part
// of its backlog in random steps at each fill. No cursor or state commit
// may ever be refused, even when no free run of pages is left for the
// leaves that retention rewrites: retention then runs in smaller steps,
// after the cursor commit, not in it.
func TestFullDiskCyclesNeverRefuseCommits(t *testing.T) {
	racedetect.Heavy(t)
	mnt := tmpfstest.Mount(t, "8m")
	w := openT(t, mnt, Options{MinFreeBytes: 64 << 10})
	defer w.Close()
	ctx := context.Background()
	for _, name := range []string{"slow", "fast"} {
		if _, err := w.RegisterCursor(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var acked, held atomic.Int64
	for c := 0; c < 4; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewSource(int64(c)))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				actx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
				_, err := w.Append(actx, makeRecords(r, fmt.Sprint(c, i), 1+r.Intn(100), 100+r.Intn(2000)), AppendOptions{})
				cancel()
				switch {
				case err == nil:
					acked.Add(1)
				case errors.Is(err, ErrNoSpace), errors.Is(err, context.DeadlineExceeded):
					held.Add(1)
					time.Sleep(5 * time.Millisecond)
				default:
					t.Errorf("append: %v", err)
					return
				}
			}
		}()
	}
	var refused atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for k := 0; ; k++ {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			var b Batch
			b.SetCursor("fast", w.Stats().NextSeq-1)
			b.Put("fast", []byte(fmt.Sprintf("mark/%d", k%50)), make([]byte, 200))
			if err := w.Commit(ctx, &b); err != nil {
				refused.Add(1)
				t.Errorf("fast sink commit: %v", err)
			}
		}
	}()
	defer func() {
		close(stop)
		wg.Wait()
	}()
	r := rand.New(rand.NewSource(99))
	const fills = 15
	for cycle := 0; cycle < fills && refused.Load() == 0; cycle++ {
		waitUntil(t, time.Minute, fmt.Sprintf("full at cycle %d", cycle), w.DiskFull)
		st := w.Stats()
		slow := st.Cursors["slow"]
		to := slow + uint64(r.Int63n(int64(st.NextSeq-1-slow)+1))
		for pos := slow; pos < to; {
			next := min(to, pos+uint64(1+r.Intn(3000)))
			var b Batch
			b.SetCursor("slow", next)
			b.Put("slow", []byte("intent"), make([]byte, 300))
			if err := w.Commit(ctx, &b); err != nil {
				t.Fatalf("cycle %d: slow sink commit to %d: %v (file system free %d bytes)", cycle, next, err, fsFree(t, mnt))
			}
			pos = next
		}
	}
	t.Logf("%d fills: %d appends acknowledged, %d held past their client's 100ms; file %d bytes, file system free %d bytes",
		fills, acked.Load(), held.Load(), w.Stats().FileBytes, fsFree(t, mnt))
	if err := w.Err(); err != nil {
		t.Fatal(err)
	}
}

// A commit that does not return (a disk that stalls) shows in
// CommitPending, and past StallAfter in Stalled, which /healthz and the
// watchdog read; once it returns, both clear, and its time is summed.
func TestStalledCommitIsSeen(t *testing.T) {
	w := openT(t, t.TempDir(), Options{})
	defer w.Close()
	defer func(d time.Duration) { StallAfter = d }(StallAfter)
	StallAfter = 200 * time.Millisecond
	release := make(chan struct{})
	hook := func(tx *bolt.Tx) error {
		<-release
		return tx.Commit()
	}
	commitHook.Store(&hook)
	t.Cleanup(func() { commitHook.Store(nil) })
	done := make(chan error, 1)
	go func() {
		_, err := w.Append(context.Background(), []Record{{Tag: "t", Body: []byte(`{}`)}}, AppendOptions{})
		done <- err
	}()
	waitUntil(t, 5*time.Second, "the commit seen pending", func() bool { return w.CommitPending() > 0 })
	if w.Stalled() {
		t.Fatal("stalled at once")
	}
	waitUntil(t, 5*time.Second, "the commit seen stalled", w.Stalled)
	commitHook.Store(nil)
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if w.CommitPending() != 0 || w.Stalled() {
		t.Errorf("pending %v after the commit returned", w.CommitPending())
	}
	if s := w.Stats().CommitSeconds; s < StallAfter.Seconds() {
		t.Errorf("commit time summed %vs, want at least the %v it was held", s, StallAfter)
	}
}

// A transaction whose page reads do not return before its commit (retention
// reading leaves the cache no longer holds, on a disk that stalls) shows in
// CommitPending and Stalled as a commit does; the time is not a commit's.
func TestStalledApplyIsSeen(t *testing.T) {
	w := openT(t, t.TempDir(), Options{})
	defer w.Close()
	defer func(d time.Duration) { StallAfter = d }(StallAfter)
	StallAfter = 200 * time.Millisecond
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { applyHook.Store(nil); once.Do(func() { close(release) }) }
	defer unblock() // before Close, when a check below fails
	hook := func() { <-release }
	applyHook.Store(&hook)
	done := make(chan error, 1)
	go func() {
		_, err := w.Append(context.Background(), []Record{{Tag: "t", Body: []byte(`{}`)}}, AppendOptions{})
		done <- err
	}()
	waitUntil(t, 5*time.Second, "the group seen pending", func() bool { return w.CommitPending() > 0 })
	waitUntil(t, 5*time.Second, "the group seen stalled", w.Stalled)
	unblock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 5*time.Second, "nothing pending once the group committed", func() bool { return w.CommitPending() == 0 && !w.Stalled() })
	if s := w.Stats().CommitSeconds; s >= StallAfter.Seconds() {
		t.Errorf("commit time summed %vs: the stall before the commit counted as the commit's", s)
	}
}

// An append held for room on the disk whose client gives up does not end
// the hold while an append of its size would still not fit: the next
// one would only be held again, and DiskFull (the metric, /readyz) would
// flap with every client's retry. The held size is forgotten heldFor after
// the last hold, so that a request given up for good does not hold
// smaller ones off.
func TestDiskHoldOutlivesAGivenUpAppend(t *testing.T) {
	mnt := tmpfstest.Mount(t, "16m")
	defer func(d time.Duration) { heldFor = d }(heldFor)
	heldFor = 4 * time.Second
	const floor = 1 << 20
	w := openT(t, mnt, Options{MinFreeBytes: floor})
	defer w.Close()
	// Leave about 1.5 MiB free: above the floor and its hysteresis (1.125
	// MiB), below the floor plus a 1 MiB append.
	ballast := filepath.Join(mnt, "ballast")
	if err := os.WriteFile(ballast, make([]byte, fsFree(t, mnt)-3<<19), 0o600); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 1<<20)
	rand.New(rand.NewSource(1)).Read(big) // s2 cannot shrink it
	for i := range big {
		big[i] = 'a' + big[i]%26
	}
	body := append(append([]byte(`{"a":"`), big...), `"}`...)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := w.Append(ctx, []Record{{Tag: "t", Body: body}}, AppendOptions{})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a 1 MiB append with %d bytes free: %v, want it held until its client gave up", fsFree(t, mnt), err)
	}
	time.Sleep(2500 * time.Millisecond) // the writer looks at the room every second
	if !w.DiskFull() {
		t.Fatalf("DiskFull() false once the held append gave up, with %d bytes free: an append of its size would be held again", fsFree(t, mnt))
	}
	// Not for good: a request its client gave up for good must not hold
	// smaller ones off, which fit (heldFor, 4 s here, after the hold).
	waitUntil(t, 5*time.Second, "DiskFull() false once the held size was forgotten", func() bool { return !w.DiskFull() })
	if _, err := w.Append(context.Background(), []Record{{Tag: "t", Body: []byte(`{"small":1}`)}}, AppendOptions{}); err != nil {
		t.Fatalf("a small append with %d bytes free: %v", fsFree(t, mnt), err)
	}
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
}

// A WAL opened on a disk with less than MinFreeBytes free is full on the
// disk before any append comes (/readyz fails before clients are sent to
// it), and no longer once room is freed.
func TestOpenOnAFullDisk(t *testing.T) {
	mnt := tmpfstest.Mount(t, "16m")
	const floor = 4 << 20
	w := openT(t, mnt, Options{MinFreeBytes: floor})
	if w.DiskFull() {
		t.Fatalf("DiskFull() with %d bytes free", fsFree(t, mnt))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	ballast := filepath.Join(mnt, "ballast")
	if err := os.WriteFile(ballast, make([]byte, fsFree(t, mnt)-2<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	w = openT(t, mnt, Options{MinFreeBytes: floor})
	defer w.Close()
	if !w.DiskFull() || !w.Full() {
		t.Fatalf("opened with %d bytes free, under min_free_bytes %d: DiskFull() %v, Full() %v; want both true", fsFree(t, mnt), floor, w.DiskFull(), w.Full())
	}
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 5*time.Second, "DiskFull() false once room was freed", func() bool { return !w.DiskFull() })
	if _, err := w.Append(context.Background(), []Record{{Tag: "t", Body: []byte(`{}`)}}, AppendOptions{}); err != nil {
		t.Fatal(err)
	}
}

// An Append whose context ends while its records are in a transaction
// (a commit that takes long) returns that transaction's outcome, not the
// context's end: records are never stored with their caller told they
// were not (an HTTP client would send them again, stored twice). One
// whose context ends before the writer takes it stores nothing.
func TestAppendTakenAnswersItsCommit(t *testing.T) {
	w := openT(t, t.TempDir(), Options{})
	defer w.Close()
	release := make(chan struct{})
	var held atomic.Bool
	hook := func(tx *bolt.Tx) error {
		held.Store(true)
		<-release
		return tx.Commit()
	}
	commitHook.Store(&hook)
	t.Cleanup(func() { commitHook.Store(nil) })
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	var res Result
	go func() {
		var err error
		res, err = w.Append(ctx, []Record{{Tag: "t", Body: []byte(`{"a":1}`)}}, AppendOptions{})
		done <- err
	}()
	waitUntil(t, 5*time.Second, "the commit held", held.Load)
	time.Sleep(300 * time.Millisecond) // the context has ended meanwhile
	select {
	case err := <-done:
		t.Fatalf("Append returned %v while its records were being committed", err)
	default:
	}
	commitHook.Store(nil)
	close(release)
	if err := <-done; err != nil || res.First != 1 {
		t.Fatalf("Append: %+v %v, want the commit's outcome", res, err)
	}
	// Ended before it was taken: nothing stored.
	ended, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if _, err := w.Append(ended, []Record{{Tag: "t", Body: []byte(`{"a":2}`)}}, AppendOptions{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Append with an ended context: %v", err)
	}
	if n := w.Stats().NextSeq; n != 2 {
		t.Errorf("next seq %d: a cancelled append was stored", n)
	}
}

// With SyncInterval, a commit the full disk refuses loses the appends it
// holds, acknowledged already: the WAL stops. One that holds none (a
// sink's cursor or state) is refused and may be tried again, as with
// SyncAlways: nothing acknowledged depends on it.
func TestSyncIntervalRefusedCommit(t *testing.T) {
	w := openT(t, t.TempDir(), Options{Sync: SyncInterval, SyncInterval: time.Hour})
	defer w.Close()
	if _, err := w.RegisterCursor(context.Background(), "s"); err != nil {
		t.Fatal(err)
	}
	last := appendT(t, w, []Record{{Body: []byte(`{"a":1}`)}}, "").Last
	if err := w.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	calls, stop := noSpaceCommits(t)
	var b Batch
	b.SetCursor("s", last)
	if err := w.Commit(context.Background(), &b); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("a cursor's commit on a full disk: %v, want ErrNoSpace", err)
	}
	if err := w.Err(); err != nil || calls.Load() == 0 {
		t.Fatalf("after a refused commit without appends (%d tried): the WAL failed: %v", calls.Load(), err)
	}
	stop()
	commitT(t, w, &b)
	if pos, _ := w.Cursor("s"); pos != last {
		t.Fatalf("cursor at %d once the disk has room, want %d", pos, last)
	}
	// Appends acknowledged and then refused: lost, and the WAL says so,
	// naming how many and which.
	r1 := appendT(t, w, []Record{{Body: []byte(`{"a":2}`)}}, "")
	r2 := appendT(t, w, []Record{{Body: []byte(`{"a":3}`)}, {Body: []byte(`{"a":4}`)}}, "")
	_, stop = noSpaceCommits(t)
	defer stop()
	err := w.Sync(context.Background())
	if !errors.Is(err, ErrFatal) {
		t.Fatalf("a commit of acknowledged appends on a full disk: %v, want ErrFatal", err)
	}
	want := fmt.Sprintf("3 acknowledged records (seq %d to %d) were not committed and are lost", r1.First, r2.Last)
	if !strings.Contains(err.Error(), want) || !strings.Contains(w.Err().Error(), want) {
		t.Fatalf("the WAL's failure: %v (Err: %v); want it to say %q", err, w.Err(), want)
	}
}

// With SyncInterval, retention's deletes are committed as they are made,
// in transactions of at most maxDeletesPerTx, not held for the interval:
// held appends may be waiting for the room they free.
func TestSyncIntervalRetentionCommits(t *testing.T) {
	w := openT(t, t.TempDir(), Options{Sync: SyncInterval, SyncInterval: time.Hour})
	defer w.Close()
	if _, err := w.RegisterCursor(context.Background(), "s"); err != nil {
		t.Fatal(err)
	}
	n := maxDeletesPerTx + 1000
	var last uint64
	for range n { // an entry each
		last = appendT(t, w, []Record{{Body: []byte(`{}`)}}, "").Last
	}
	if err := w.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	before := w.Stats().Commits
	var b Batch
	b.SetCursor("s", last)
	commitT(t, w, &b)
	deadline := time.Now().Add(10 * time.Second)
	for w.Stats().Records > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d records left 10 s after the cursor passed them all: retention waits for the interval", w.Stats().Records, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if c := w.Stats().Commits - before; c < 2 {
		t.Fatalf("%d entries deleted in %d commit(s): more than %d deletes in one", n, c, maxDeletesPerTx)
	}
}

// Sync with nothing to commit writes nothing: no commit, no fsync, and no
// refusal on a full disk (a drain asks it of every sink at a stop).
func TestSyncWithNothingToCommit(t *testing.T) {
	for _, o := range []Options{{}, {Sync: SyncInterval, SyncInterval: time.Hour}} {
		w := openT(t, t.TempDir(), o)
		appendT(t, w, []Record{{Body: []byte(`{"a":1}`)}}, "")
		if err := w.Sync(context.Background()); err != nil {
			t.Fatal(err)
		}
		before := w.Stats().Commits
		calls, stop := noSpaceCommits(t)
		for range 3 {
			if err := w.Sync(context.Background()); err != nil {
				t.Fatalf("sync %v, with nothing to commit on a full disk: %v", o.Sync, err)
			}
		}
		stop()
		if n := w.Stats().Commits - before; n != 0 || calls.Load() != 0 {
			t.Fatalf("sync %v: %d commits (%d tried) for three Syncs with nothing to commit", o.Sync, n, calls.Load())
		}
		w.Close()
	}
}

// A hold for room on the disk that begins within diskLogInterval of the
// last hold's line is not logged at once, but once the interval is over if
// it lasts: the log must not end on "appends resume" while they wait. Its
// end is logged then, as a logged hold's is.
func TestDiskHoldSoonAfterAResumeIsLogged(t *testing.T) {
	mnt := tmpfstest.Mount(t, "16m")
	defer func(d time.Duration) { diskLogInterval = d }(diskLogInterval)
	diskLogInterval = 3 * time.Second // the room is looked at every second: margins for a busy machine
	const floor = 4 << 20
	var logs syncbuf.Buffer
	w := openT(t, mnt, Options{MinFreeBytes: floor, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	defer w.Close()
	ballast := filepath.Join(mnt, "ballast")
	fill := func() {
		t.Helper()
		if err := os.WriteFile(ballast, make([]byte, fsFree(t, mnt)-2<<20), 0o600); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		if _, err := w.Append(ctx, []Record{{Tag: "t", Body: []byte(`{}`)}}, AppendOptions{}); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("an append with %d bytes free: %v, want it held", fsFree(t, mnt), err)
		}
		if !w.DiskFull() {
			t.Fatal("DiskFull() false while an append was held")
		}
	}
	free := func() {
		t.Helper()
		if err := os.Remove(ballast); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, 5*time.Second, "DiskFull() false once room was freed", func() bool { return !w.DiskFull() })
	}
	const held, resumed = "wal: the disk is nearly full", "wal: room on the disk again: appends resume"
	fill()
	free()
	if out := logs.String(); strings.Count(out, held) != 1 || strings.Count(out, resumed) != 1 {
		t.Fatalf("a hold and its end, want one line each:\n%s", out)
	}
	fill() // within diskLogInterval of the first line
	if out := logs.String(); strings.Count(out, held) != 1 {
		t.Fatalf("a second hold within the interval logged at once:\n%s", out)
	}
	waitUntil(t, 5*time.Second, "the second hold's line once the interval is over", func() bool {
		return strings.Count(logs.String(), held) == 2
	})
	if out := logs.String(); !strings.Contains(out[strings.LastIndex(out, held):], "holds_not_logged=0") {
		t.Errorf("the late line counts itself as not logged:\n%s", out)
	}
	free()
	if out := logs.String(); strings.Count(out, resumed) != 2 {
		t.Errorf("the end of the hold logged late, want its line:\n%s", out)
	}
	// A hold that ends within the interval is not logged late.
	fill()
	free()
	time.Sleep(diskLogInterval + 500*time.Millisecond)
	if out := logs.String(); strings.Count(out, held) != 2 || strings.Count(out, resumed) != 2 {
		t.Errorf("a hold that ended within the interval was logged:\n%s", out)
	}
}

// The deferred line of a hold of one kind does not wait for the other
// kind's, which may be due later: the earlier deadline wins.
func TestLateHoldLinesTakeTheEarlierDeadline(t *testing.T) {
	wr := &writer{}
	now := time.Now()
	wr.lateHoldLine(now.Add(-diskLogInterval/6), now) // a disk hold's last line, 10 s ago
	disk := wr.holdLogAt
	wr.lateHoldLine(now.Add(-diskLogInterval/2), now) // max_bytes' last line, 30 s ago
	if !wr.holdLogAt.Before(disk) {
		t.Fatalf("due at %s, after the disk hold's %s: the max_bytes line waits for it", wr.holdLogAt, disk)
	}
	at := wr.holdLogAt
	wr.lateHoldLine(now, now) // a later deadline does not put it off
	if !wr.holdLogAt.Equal(at) {
		t.Fatalf("due at %s, was %s", wr.holdLogAt, at)
	}
	select {
	case <-wr.holdLogDue:
		t.Fatal("fired before its time")
	default:
	}
}
