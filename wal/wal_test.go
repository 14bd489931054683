package wal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/logfwd/forwarder/internal/syncbuf"
	"github.com/logfwd/forwarder/internal/tmpfstest"
)

func TestAppendReadRoundTrip(t *testing.T) {
	dir := t.TempDir()
	w := openT(t, dir, Options{})
	r := rand.New(rand.NewSource(1))
	var want []Record
	for i, n := range []int{1, 7, 1000, 3} {
		recs := makeRecords(r, fmt.Sprint(i), n, 250)
		res := appendT(t, w, recs, "")
		if res.Last-res.First+1 != uint64(n) || res.First != uint64(len(want)+1) {
			t.Fatalf("append %d: got range %d-%d, want %d records from %d", i, res.First, res.Last, n, len(want)+1)
		}
		want = append(want, recs...)
	}
	// Invalid UTF-8, empty bodies and empty tags are stored as they are.
	odd := []Record{{Time: -5, Tag: "", Body: nil}, {Time: 1, Tag: "t", Body: []byte{0xff, 0xfe}}}
	appendT(t, w, odd, "")
	want = append(want, odd...)

	check := func(w *WAL) {
		t.Helper()
		got := readAll(t, w, 1)
		if len(got) != len(want) {
			t.Fatalf("read %d records, want %d", len(got), len(want))
		}
		for i := range got {
			if got[i].Seq != uint64(i+1) || got[i].Time != want[i].Time || got[i].Tag != want[i].Tag || !bytes.Equal(got[i].Body, want[i].Body) {
				t.Fatalf("record %d: got %+v, want %+v", i+1, got[i], want[i])
			}
		}
		// Reads from the middle of an entry start exactly there.
		mid := readAll(t, w, 500)
		if len(mid) != len(want)-499 || mid[0].Seq != 500 {
			t.Fatalf("read from 500: %d records starting at %d", len(mid), mid[0].Seq)
		}
		lim, err := w.Read(3, 5, 0)
		if err != nil || len(lim) != 5 || lim[0].Seq != 3 || lim[4].Seq != 7 {
			t.Fatalf("read 5 from 3: %v %v", lim, err)
		}
		rng, err := w.ReadRange(8, 12)
		if err != nil || len(rng) != 5 || rng[0].Seq != 8 || rng[4].Seq != 12 {
			t.Fatalf("read range 8-12: %d records, %v", len(rng), err)
		}
		if got := readAll(t, w, uint64(len(want)+1)); len(got) != 0 {
			t.Fatalf("read past the end returned %d records", len(got))
		}
	}
	check(w)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	w = openT(t, dir, Options{})
	defer w.Close()
	check(w)
	if res := appendT(t, w, makeRecords(r, "x", 1, 10), ""); res.First != uint64(len(want)+1) {
		t.Fatalf("after reopen the next sequence number is %d, want %d", res.First, len(want)+1)
	}
}

func TestLargeAppendSplitsIntoEntries(t *testing.T) {
	w := openT(t, t.TempDir(), Options{})
	defer w.Close()
	r := rand.New(rand.NewSource(2))
	recs := makeRecords(r, "big", 200, 64<<10) // 12.5 MiB: several entries
	res := appendT(t, w, recs, "")
	entries := 0
	if err := w.db.View(func(tx *bolt.Tx) error {
		entries = tx.Bucket(bucketEntries).Stats().KeyN
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if entries < 3 {
		t.Fatalf("12.5 MiB stored as %d entries, want several of about 4 MiB", entries)
	}
	got, err := w.ReadRange(res.First, res.Last)
	if err != nil || len(got) != 200 {
		t.Fatalf("read back %d records: %v", len(got), err)
	}
	for i := range got {
		if !bytes.Equal(got[i].Body, recs[i].Body) {
			t.Fatalf("record %d differs", i)
		}
	}
}

func TestConcurrentAppendsShareCommits(t *testing.T) {
	w := openT(t, t.TempDir(), Options{})
	defer w.Close()
	const goroutines, appends = 64, 20
	var mu sync.Mutex
	seen := map[uint64]string{}
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			r := rand.New(rand.NewSource(int64(g)))
			for i := 0; i < appends; i++ {
				recs := makeRecords(r, fmt.Sprintf("g%d-%d", g, i), 10, 100)
				res, err := w.Append(context.Background(), recs, AppendOptions{})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for s := res.First; s <= res.Last; s++ {
					if _, dup := seen[s]; dup {
						t.Errorf("sequence number %d handed out twice", s)
					}
					seen[s] = string(recs[s-res.First].Body)
				}
				mu.Unlock()
			}
		}(g)
	}
	wg.Wait()
	total := goroutines * appends * 10
	if len(seen) != total {
		t.Fatalf("%d sequence numbers, want %d", len(seen), total)
	}
	got := readAll(t, w, 1)
	if len(got) != total {
		t.Fatalf("read %d, want %d", len(got), total)
	}
	for _, r := range got {
		if seen[r.Seq] != string(r.Body) {
			t.Fatalf("record %d holds another append's body", r.Seq)
		}
	}
	if c := w.Stats().Commits; c >= goroutines*appends {
		t.Fatalf("%d appends took %d commits: no group commit", goroutines*appends, c)
	} else {
		t.Logf("%d appends in %d commits", goroutines*appends, c)
	}
}

func TestCursorsStateAndRetention(t *testing.T) {
	dir := t.TempDir()
	w := openT(t, dir, Options{})
	ctx := context.Background()
	r := rand.New(rand.NewSource(3))
	for i := 0; i < 10; i++ {
		appendT(t, w, makeRecords(r, fmt.Sprint(i), 100, 100), "") // entries 1-100, 101-200, ...
	}
	for _, name := range []string{"s3", "cw"} {
		pos, err := w.RegisterCursor(ctx, name)
		if err != nil || pos != 0 {
			t.Fatalf("register %s: %d, %v", name, pos, err)
		}
	}
	// A cursor and sink state commit together.
	b := &Batch{}
	b.SetCursor("s3", 450)
	b.Put("s3", []byte("intent/1"), []byte("key-a"))
	commitT(t, w, b)
	if st := w.Stats(); st.FirstSeq != 1 || st.Records != 1000 {
		t.Fatalf("cw has passed nothing, yet first live is %d (%d records)", st.FirstSeq, st.Records)
	}
	b = &Batch{}
	b.SetCursor("cw", 250)
	commitT(t, w, b)
	if st := w.Stats(); st.FirstSeq != 201 {
		t.Fatalf("both cursors passed 200: first live is %d, want 201 (whole entries only)", st.FirstSeq)
	}
	// Reading from a deleted position starts at the oldest live record.
	if got := readAll(t, w, 5); got[0].Seq != 201 {
		t.Fatalf("read from 5 starts at %d", got[0].Seq)
	}
	// An invalid batch is refused whole; the valid state stays.
	b = &Batch{}
	b.Put("s3", []byte("intent/2"), []byte("x"))
	b.SetCursor("s3", 5000)
	if err := w.Commit(ctx, b); !errors.Is(err, ErrCursorAhead) {
		t.Fatalf("cursor past the end: %v", err)
	}
	b = &Batch{}
	b.SetCursor("nope", 1)
	if err := w.Commit(ctx, b); !errors.Is(err, ErrUnknownCursor) {
		t.Fatalf("unknown cursor: %v", err)
	}
	// Cursors never move back.
	b = &Batch{}
	b.SetCursor("s3", 10)
	commitT(t, w, b)
	w.Close()

	w = openT(t, dir, Options{})
	defer w.Close()
	st := w.Stats()
	if st.Cursors["s3"] != 450 || st.Cursors["cw"] != 250 || st.FirstSeq != 201 || st.NextSeq != 1001 {
		t.Fatalf("after reopen: %+v", st)
	}
	if v, _ := w.State("s3", []byte("intent/1")); string(v) != "key-a" {
		t.Fatalf("state intent/1 = %q", v)
	}
	if v, _ := w.State("s3", []byte("intent/2")); v != nil {
		t.Fatalf("a refused batch left state behind: %q", v)
	}
	var keys []string
	if err := w.ScanState("s3", []byte("intent/"), func(k, v []byte) error { keys = append(keys, string(k)); return nil }); err != nil || len(keys) != 1 {
		t.Fatalf("scan: %v %v", keys, err)
	}
	// A new cursor starts at the oldest live record.
	if pos, _ := w.RegisterCursor(ctx, "new"); pos != 200 {
		t.Fatalf("new cursor at %d, want 200", pos)
	}
	// Dropping the slowest cursors releases what they pinned.
	if err := w.DropCursor(ctx, "new"); err != nil {
		t.Fatal(err)
	}
	if err := w.DropCursor(ctx, "cw"); err != nil {
		t.Fatal(err)
	}
	if st := w.Stats(); st.FirstSeq != 401 {
		t.Fatalf("after dropping cw, first live %d, want 401", st.FirstSeq)
	}
	if err := w.DropCursor(ctx, "cw"); !errors.Is(err, ErrUnknownCursor) {
		t.Fatalf("dropping twice: %v", err)
	}
}

// TestReaderPassedByRetentionWaits: a reader whose records were all
// deleted (no cursor held them) waits for the next append; it does not
// find its position committed and read nothing, again and again.
func TestReaderPassedByRetentionWaits(t *testing.T) {
	w := openT(t, t.TempDir(), Options{})
	defer w.Close()
	ctx := context.Background()
	if _, err := w.RegisterCursor(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	appendT(t, w, []Record{{Tag: "a", Body: []byte(`{"a":1}`)}, {Tag: "a", Body: []byte(`{"a":2}`)}}, "")
	rd := w.NewReader(1)
	var b Batch
	b.SetCursor("s", 2)
	if err := w.Commit(ctx, &b); err != nil {
		t.Fatal(err)
	}
	for w.Stats().FirstSeq != 3 {
		time.Sleep(time.Millisecond) // retention runs in the next transaction
		if err := w.Commit(ctx, &Batch{}); err != nil {
			t.Fatal(err)
		}
	}
	var reads atomic.Int64
	got := make(chan []Record, 1)
	go func() {
		for {
			recs, err := rd.ReadInto(0, 0, nil)
			reads.Add(1)
			if err != nil || len(recs) > 0 {
				got <- recs
				return
			}
			if err := rd.Wait(ctx); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	time.Sleep(100 * time.Millisecond)
	if n := reads.Load(); n > 2 {
		t.Fatalf("a reader passed by retention read %d times in 100 ms with nothing appended", n)
	}
	appendT(t, w, []Record{{Tag: "a", Body: []byte(`{"a":3}`)}}, "")
	select {
	case recs := <-got:
		if len(recs) != 1 || recs[0].Seq != 3 {
			t.Fatalf("got %+v", recs)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("reader not woken by append")
	}
}

func TestReaderWakesOnAppend(t *testing.T) {
	w := openT(t, t.TempDir(), Options{})
	defer w.Close()
	rd := w.NewReader(1)
	got := make(chan []Record, 1)
	go func() {
		recs, err := rd.Next(context.Background(), 0, 0)
		if err != nil {
			t.Error(err)
		}
		got <- recs
	}()
	select {
	case <-got:
		t.Fatal("Next returned before anything was appended")
	case <-time.After(50 * time.Millisecond):
	}
	appendT(t, w, []Record{{Tag: "a", Body: []byte(`{}`)}}, "")
	select {
	case recs := <-got:
		if len(recs) != 1 || recs[0].Seq != 1 {
			t.Fatalf("got %+v", recs)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("reader not woken by append")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := rd.Next(ctx, 0, 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Next: %v", err)
	}
}

func TestChunkDedup(t *testing.T) {
	dir := t.TempDir()
	w := openT(t, dir, Options{})
	r := rand.New(rand.NewSource(4))
	first := appendT(t, w, makeRecords(r, "a", 5, 50), "chunk-A")
	again := appendT(t, w, makeRecords(r, "a", 5, 50), "chunk-A")
	if !again.Duplicate || again.First != first.First || again.Last != first.Last {
		t.Fatalf("re-sent chunk: %+v, first %+v", again, first)
	}
	// Concurrent sends of one chunk store it once.
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := w.Append(context.Background(), makeRecords(rand.New(rand.NewSource(9)), "b", 3, 50), AppendOptions{ChunkID: "chunk-B"}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if n := w.Stats().Records; n != 8 {
		t.Fatalf("%d records stored, want 8 (5 + one copy of 3)", n)
	}
	w.Close()
	w = openT(t, dir, Options{DedupWindow: 200 * time.Millisecond})
	defer w.Close()
	if res := appendT(t, w, makeRecords(r, "a", 5, 50), "chunk-A"); !res.Duplicate {
		t.Fatal("chunk id forgotten across a restart")
	}
	time.Sleep(300 * time.Millisecond)
	if res := appendT(t, w, makeRecords(r, "a", 5, 50), "chunk-A"); res.Duplicate || res.First != 9 {
		t.Fatalf("after the window the chunk is new: %+v", res)
	}
}

// A chunk id stored with a digest of its request dedups the same request
// and refuses another one (ErrChunkConflict), storing nothing of it; an id
// stored without a digest, as every id was before digests were stored,
// matches any request.
func TestChunkDigest(t *testing.T) {
	dir := t.TempDir()
	w := openT(t, dir, Options{})
	recs := func() []Record { return []Record{{Tag: "t", Body: []byte(`{"a":1}`)}} }
	a, b := bytes.Repeat([]byte{0xaa}, 32), bytes.Repeat([]byte{0xbb}, 32)
	first, err := w.Append(context.Background(), recs(), AppendOptions{ChunkID: "k", ChunkDigest: a})
	if err != nil {
		t.Fatal(err)
	}
	again, err := w.Append(context.Background(), recs(), AppendOptions{ChunkID: "k", ChunkDigest: a})
	if err != nil || !again.Duplicate || again.First != first.First {
		t.Fatalf("same id, same digest: %+v %v", again, err)
	}
	if _, err := w.Append(context.Background(), recs(), AppendOptions{ChunkID: "k", ChunkDigest: b}); !errors.Is(err, ErrChunkConflict) {
		t.Fatalf("same id, another digest: %v", err)
	}
	if res, err := w.Append(context.Background(), recs(), AppendOptions{ChunkID: "k"}); err != nil || !res.Duplicate {
		t.Fatalf("same id, no digest: %+v %v", res, err)
	}
	// Stored without a digest: the 24 bytes of the format before digests.
	appendT(t, w, recs(), "old")
	w.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketChunks).Get([]byte("old")); len(v) != 24 {
			t.Errorf("an id without a digest stored as %d bytes, want 24", len(v))
		}
		if v := tx.Bucket(bucketChunks).Get([]byte("k")); len(v) != 24+32 || !bytes.Equal(v[24:], a) {
			t.Errorf("an id with a digest stored as %x", v)
		}
		return nil
	})
	if res, err := w.Append(context.Background(), recs(), AppendOptions{ChunkID: "old", ChunkDigest: b}); err != nil || !res.Duplicate {
		t.Fatalf("an id stored without a digest, sent with one: %+v %v", res, err)
	}
	// In one group: the copies with the first one's digest are duplicates,
	// the others conflicts, whichever comes first.
	var wg sync.WaitGroup
	var mu sync.Mutex
	stored, dups, conflicts := 0, 0, 0
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := a
			if i%2 == 1 {
				d = b
			}
			res, err := w.Append(context.Background(), recs(), AppendOptions{ChunkID: "g", ChunkDigest: d})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, ErrChunkConflict):
				conflicts++
			case err != nil:
				t.Error(err)
			case res.Duplicate:
				dups++
			default:
				stored++
			}
		}()
	}
	wg.Wait()
	if stored != 1 || dups != 3 || conflicts != 4 {
		t.Fatalf("8 appends of one id, half with each digest: %d stored, %d duplicates, %d conflicts", stored, dups, conflicts)
	}
	if n := w.Stats().Records; n != 3 {
		t.Fatalf("%d records stored, want 3", n)
	}
	w.Close()
	w = openT(t, dir, Options{})
	defer w.Close()
	if _, err := w.Append(context.Background(), recs(), AppendOptions{ChunkID: "k", ChunkDigest: b}); !errors.Is(err, ErrChunkConflict) {
		t.Fatalf("after a restart, same id, another digest: %v", err)
	}
	for _, o := range []AppendOptions{{ChunkID: "x", ChunkDigest: make([]byte, 33)}, {ChunkDigest: a}} {
		if _, err := w.Append(context.Background(), recs(), o); !errors.Is(err, ErrChunkID) {
			t.Errorf("digest of %d bytes for id %q: %v", len(o.ChunkDigest), o.ChunkID, err)
		}
	}
}

// A client's chunk id never reaches bbolt unchecked: a key over bbolt's
// limit would fail the whole transaction.
func TestLongChunkIDRefused(t *testing.T) {
	w := openT(t, t.TempDir(), Options{})
	defer w.Close()
	_, err := w.Append(context.Background(), []Record{{Body: []byte(`{}`)}}, AppendOptions{ChunkID: strings.Repeat("k", 60000)})
	if !errors.Is(err, ErrChunkID) {
		t.Fatalf("60,000-byte chunk id: %v", err)
	}
	appendT(t, w, []Record{{Body: []byte(`{}`)}}, strings.Repeat("k", MaxChunkID))
	if w.Err() != nil {
		t.Fatalf("the WAL failed: %v", w.Err())
	}
}

func TestChunkExpiryForgetsOldIDs(t *testing.T) {
	dir := t.TempDir()
	w := openT(t, dir, Options{DedupWindow: time.Millisecond})
	for i := 0; i < 50; i++ {
		appendT(t, w, []Record{{Body: []byte(`{}`)}}, fmt.Sprint("c", i))
		// With a digest too: expiry reads both forms.
		w.Append(context.Background(), []Record{{Body: []byte(`{}`)}}, AppendOptions{ChunkID: fmt.Sprint("d", i), ChunkDigest: []byte{byte(i)}})
	}
	w.Close()
	time.Sleep(5 * time.Millisecond)
	// Expiry runs in the first transaction after Open, then every few seconds.
	w = openT(t, dir, Options{DedupWindow: time.Millisecond})
	defer w.Close()
	appendT(t, w, []Record{{Body: []byte(`{}`)}}, "last")
	var n int
	w.db.View(func(tx *bolt.Tx) error {
		n = tx.Bucket(bucketChunks).Stats().KeyN + tx.Bucket(bucketChunkTimes).Stats().KeyN
		return nil
	})
	if n != 2 {
		t.Fatalf("%d chunk keys left after expiry, want only the last id's two", n)
	}
}

func TestMaxBytesBlock(t *testing.T) {
	w := openT(t, t.TempDir(), Options{MaxBytes: 64 << 10})
	defer w.Close()
	ctx := context.Background()
	if _, err := w.RegisterCursor(ctx, "sink"); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewSource(5))
	var last Result
	for w.Stats().Bytes < 48<<10 {
		last = appendT(t, w, makeRecords(r, "f", 20, 250), "")
	}
	// The next appends do not fit: they wait, in order.
	results := make(chan Result, 2)
	for i := 0; i < 2; i++ {
		go func() {
			res, err := w.Append(ctx, makeRecords(rand.New(rand.NewSource(6)), "w", 200, 250), AppendOptions{})
			if err != nil {
				t.Error(err)
			}
			results <- res
		}()
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case res := <-results:
		t.Fatalf("append over max_bytes returned at once: %+v", res)
	case <-time.After(100 * time.Millisecond):
	}
	if !w.Full() {
		t.Fatal("Full() is false while appends wait for room")
	}
	// Appends that only join the wait change nothing: no commit, no fsync.
	commits := w.Stats().Commits
	for i := 0; i < 5; i++ {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		w.Append(wctx, makeRecords(r, "k", 200, 250), AppendOptions{})
		cancel()
	}
	if n := w.Stats().Commits - commits; n != 0 {
		t.Fatalf("%d commits while nothing but waiting happened", n)
	}
	// A cancelled wait returns the context's error.
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := w.Append(cctx, makeRecords(r, "c", 1, 250), AppendOptions{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cancelled blocked append: %v", err)
	}
	// The sink passing everything makes room.
	b := &Batch{}
	b.SetCursor("sink", last.Last)
	commitT(t, w, b)
	for i := 0; i < 2; i++ {
		select {
		case <-results:
		case <-time.After(5 * time.Second):
			t.Fatal("blocked append not released by retention")
		}
	}
	if st := w.Stats(); st.Bytes > 64<<10 {
		t.Fatalf("live bytes %d above max_bytes", st.Bytes)
	}
	if w.Full() {
		t.Fatal("Full() still true once the waiting appends are stored")
	}
	// Something that can never fit is refused, not blocked.
	if _, err := w.Append(ctx, makeRecords(r, "huge", 1, 200<<10), AppendOptions{}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("append larger than max_bytes: %v", err)
	}
}

// TestFullHoldsUntilTheHeldSizeFits: once an append waits for room under
// max_bytes, Full stays true after its client gave up (its retry would
// wait again: /readyz flapped with every retry) until an append of its size
// would fit, or heldFor has passed; one warning says so, naming the sink
// furthest behind, and one line says when room is back.
func TestFullHoldsUntilTheHeldSizeFits(t *testing.T) {
	defer func(d time.Duration) { heldFor = d }(heldFor)
	heldFor = 2 * time.Second
	var logs syncbuf.Buffer
	w := openT(t, t.TempDir(), Options{MaxBytes: 64 << 10, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	defer w.Close()
	ctx := context.Background()
	for _, c := range []string{"archive", "slow"} {
		if _, err := w.RegisterCursor(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	r := rand.New(rand.NewSource(5))
	var last Result
	for w.Stats().Bytes < 48<<10 {
		last = appendT(t, w, makeRecords(r, "f", 20, 250), "")
	}
	b := &Batch{}
	b.SetCursor("archive", last.Last)
	commitT(t, w, b)
	hold := func() {
		t.Helper()
		hctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		if _, err := w.Append(hctx, makeRecords(r, "big", 300, 250), AppendOptions{}); !errors.Is(err, ErrFull) {
			t.Fatalf("an append over max_bytes: %v, want ErrFull", err)
		}
	}
	for range 2 {
		hold()
		if !w.Full() {
			t.Fatal("Full() false the moment the held append gave up")
		}
		time.Sleep(300 * time.Millisecond)
		if !w.Full() {
			t.Fatal("Full() false within heldFor of the hold, though an append of its size would not fit")
		}
		waitUntil(t, 5*time.Second, "Full() false once heldFor passed", func() bool { return !w.Full() })
	}
	out := logs.String()
	if n := strings.Count(out, "wal: max_bytes reached (when_full: block)"); n != 1 || !strings.Contains(out, "furthest_behind=slow") {
		t.Errorf("%d warnings of max_bytes (want 1 a minute, naming the sink furthest behind):\n%s", n, out)
	}
	if strings.Contains(out, "wal: room under max_bytes again") {
		t.Errorf("room said while there is none (the holds ran out):\n%s", out)
	}
	// The sink furthest behind passes everything: retention makes room.
	b = &Batch{}
	b.SetCursor("slow", last.Last)
	commitT(t, w, b)
	waitUntil(t, 5*time.Second, "the line saying there is room again", func() bool {
		return strings.Contains(logs.String(), "wal: room under max_bytes again: appends resume")
	})
}

// TestFullOverMaxBytesWithNothingWaiting: live bytes at or over
// max_bytes (a restart with a backlog and a lowered max_bytes) make Full()
// true before any append waits, since the next one would; it ends when
// retention brings them under.
func TestFullOverMaxBytesWithNothingWaiting(t *testing.T) {
	dir := t.TempDir()
	w := openT(t, dir, Options{})
	ctx := context.Background()
	if _, err := w.RegisterCursor(ctx, "sink"); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewSource(5))
	var last Result
	for w.Stats().Bytes < 48<<10 {
		last = appendT(t, w, makeRecords(r, "f", 20, 250), "")
	}
	w.Close()
	w = openT(t, dir, Options{MaxBytes: 32 << 10, WhenFull: DropOldest})
	if w.Full() {
		t.Fatal("Full() over max_bytes with when_full: drop_oldest, which never waits")
	}
	w.Close()
	w = openT(t, dir, Options{MaxBytes: 32 << 10})
	defer w.Close()
	if !w.Full() {
		t.Fatalf("Full() false at open with %d live bytes over max_bytes 32 KiB", w.Stats().Bytes)
	}
	b := &Batch{}
	b.SetCursor("sink", last.Last)
	commitT(t, w, b)
	waitUntil(t, 5*time.Second, "Full() to end once retention freed the records", func() bool { return !w.Full() })
}

func TestMaxBytesDropOldestCountsExactly(t *testing.T) {
	dir := t.TempDir()
	w := openT(t, dir, Options{MaxBytes: 64 << 10, WhenFull: DropOldest})
	ctx := context.Background()
	for _, n := range []string{"fast", "slow", "stuck"} {
		if _, err := w.RegisterCursor(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	r := rand.New(rand.NewSource(7))
	var total uint64
	for i := 0; i < 100; i++ {
		res := appendT(t, w, makeRecords(r, fmt.Sprint(i), 10, 250), "")
		total = res.Last
		b := &Batch{}
		b.SetCursor("fast", res.Last) // delivers everything at once
		if i%3 == 0 && res.Last > 15 {
			b.SetCursor("slow", res.Last-15) // lags a little
		}
		commitT(t, w, b)
	}
	st := w.Stats()
	if st.Bytes > 64<<10 {
		t.Fatalf("live bytes %d above max_bytes", st.Bytes)
	}
	if st.Dropped["fast"] != 0 {
		t.Fatalf("the sink that kept up lost %d records", st.Dropped["fast"])
	}
	// stuck delivered nothing: all it lost is exactly what is no longer
	// stored below its cursor.
	if st.Dropped["stuck"] != st.Cursors["stuck"] || st.Cursors["stuck"] != st.FirstSeq-1 || st.Dropped["stuck"] == 0 {
		t.Fatalf("stuck: dropped %d, cursor %d, first live %d", st.Dropped["stuck"], st.Cursors["stuck"], st.FirstSeq)
	}
	// What is still stored plus what was dropped is everything.
	if got := uint64(len(readAll(t, w, 1))); got+st.Dropped["stuck"] != total {
		t.Fatalf("stored %d + dropped %d != appended %d", got, st.Dropped["stuck"], total)
	}
	w.Close()
	w = openT(t, dir, Options{})
	defer w.Close()
	if w.Stats().Dropped["stuck"] != st.Dropped["stuck"] {
		t.Fatal("drop counts not kept across a restart")
	}
}

// A cursor whose sink takes some tags only loses, to drop_oldest, the
// dropped records it would have taken: a sink of other tags loses none.
func TestDropOldestCountsWhatEachSinkTakes(t *testing.T) {
	even := func(tag string) bool { n, _ := strconv.Atoi(tag); return n%2 == 0 }
	w := openT(t, t.TempDir(), Options{MaxBytes: 64 << 10, WhenFull: DropOldest, CursorTags: map[string]func(string) bool{
		"even":  even,
		"other": func(tag string) bool { return tag == "other" },
	}})
	defer w.Close()
	ctx := context.Background()
	for _, n := range []string{"all", "even", "other"} {
		if _, err := w.RegisterCursor(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	r := rand.New(rand.NewSource(7))
	for i := 0; i < 100; i++ {
		recs := makeRecords(r, fmt.Sprint(i), 10, 250)
		for j := range recs {
			recs[j].Tag = fmt.Sprint(i)
		}
		appendT(t, w, recs, "")
		if i == 0 {
			b := &Batch{}
			b.SetCursor("even", 5) // half of the first append delivered
			commitT(t, w, b)
		}
	}
	st := w.Stats()
	if st.FirstSeq < 100 {
		t.Fatalf("first live record %d: too little dropped for the test", st.FirstSeq)
	}
	var want uint64
	for seq := uint64(6); seq < st.FirstSeq; seq++ {
		if even(fmt.Sprint((seq - 1) / 10)) {
			want++
		}
	}
	if st.Dropped["all"] != st.FirstSeq-1 {
		t.Errorf("all: dropped %d, want %d", st.Dropped["all"], st.FirstSeq-1)
	}
	if st.Dropped["even"] != want {
		t.Errorf("even: dropped %d, want %d", st.Dropped["even"], want)
	}
	if st.Dropped["other"] != 0 {
		t.Errorf("other: dropped %d, want 0", st.Dropped["other"])
	}
	for _, n := range []string{"all", "even", "other"} {
		if st.Cursors[n] != st.FirstSeq-1 {
			t.Errorf("%s: cursor %d, want %d (moved past what was dropped)", n, st.Cursors[n], st.FirstSeq-1)
		}
	}
}

func TestFailedCommitIsFatal(t *testing.T) {
	w := openT(t, t.TempDir(), Options{})
	defer w.Close()
	appendT(t, w, []Record{{Body: []byte(`{}`)}}, "")
	failSync := func(tx *bolt.Tx) error {
		tx.Rollback()
		return syscall.EIO // what a failed fdatasync returns
	}
	commitHook.Store(&failSync)
	defer commitHook.Store(nil)
	_, err := w.Append(context.Background(), []Record{{Body: []byte(`{}`)}}, AppendOptions{})
	if !errors.Is(err, ErrFatal) || !errors.Is(w.Err(), ErrFatal) {
		t.Fatalf("append after a failed fsync: %v", err)
	}
	select {
	case <-w.Fatal():
	default:
		t.Fatal("Fatal() not closed")
	}
	commitHook.Store(nil)
	// Never retried: every later append fails too.
	if _, err := w.Append(context.Background(), []Record{{Body: []byte(`{}`)}}, AppendOptions{}); !errors.Is(err, ErrFatal) {
		t.Fatalf("append after the WAL failed: %v", err)
	}
}

func TestNoSpaceIsNotFatal(t *testing.T) {
	probeEvery(t, 300*time.Millisecond)
	w := openT(t, t.TempDir(), Options{})
	defer w.Close()
	appendT(t, w, []Record{{Body: []byte(`{"a":1}`)}}, "")
	full := func(tx *bolt.Tx) error {
		tx.Rollback()
		return &fs.PathError{Op: "write", Path: "wal.db", Err: syscall.ENOSPC}
	}
	commitHook.Store(&full)
	_, err := w.Append(context.Background(), []Record{{Body: []byte(`{"a":2}`)}}, AppendOptions{})
	commitHook.Store(nil)
	if !errors.Is(err, ErrNoSpace) || w.Err() != nil {
		t.Fatalf("append on a full disk: %v (fatal: %v)", err, w.Err())
	}
	// The next append is held until the refused room is tried again (see
	// TestRefusedCommitHoldsAppends), then stored.
	res := appendT(t, w, []Record{{Body: []byte(`{"a":3}`)}}, "")
	if res.First != 2 {
		t.Fatalf("the refused append used sequence numbers: next is %d", res.First)
	}
	if got := readAll(t, w, 1); len(got) != 2 || string(got[1].Body) != `{"a":3}` {
		t.Fatalf("after a full disk: %+v", got)
	}
}

// TestDiskFilledByAnotherProcess: another process takes the last free
// byte of the WAL's file system. Appends wait (not acknowledged, the WAL
// does not fail), a sink's cursor still commits, and once the space is
// given back the waiting append is stored without any other request to
// wake the WAL.
func TestDiskFilledByAnotherProcess(t *testing.T) {
	mnt := tmpfstest.Mount(t, "4m")
	// Far more than the few pages free inside the file: the append
	// cannot be stored there either.
	w := openT(t, mnt, Options{MinFreeBytes: 1 << 20})
	defer w.Close()
	ctx := context.Background()
	if _, err := w.RegisterCursor(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewSource(8))
	var acked []Result
	for i := 0; i < 10; i++ {
		acked = append(acked, appendT(t, w, makeRecords(r, fmt.Sprint(i), 50, 2000), ""))
	}
	// The other process: a file that takes every free block.
	ballast := filepath.Join(mnt, "ballast")
	f, err := os.Create(ballast)
	if err != nil {
		t.Fatal(err)
	}
	for buf := make([]byte, 64<<10); ; {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	f.Close()

	done := make(chan error, 1)
	go func() {
		_, err := w.Append(ctx, makeRecords(r, "held", 50, 2000), AppendOptions{})
		done <- err
	}()
	waitUntil(t, 5*time.Second, "DiskFull with the file system full", w.DiskFull)
	select {
	case err := <-done:
		t.Fatalf("append on a full file system returned %v, want it held", err)
	case <-time.After(200 * time.Millisecond):
	}
	if !w.Full() || w.Err() != nil {
		t.Fatalf("Full() %v, Err() %v on a full file system", w.Full(), w.Err())
	}
	last := acked[len(acked)-1].Last
	if n := uint64(len(readAll(t, w, 1))); n != last {
		t.Fatalf("%d records readable, %d acknowledged", n, last)
	}
	b := &Batch{}
	b.SetCursor("s", acked[3].Last)
	b.Put("s", []byte("intent"), []byte("next object"))
	commitT(t, w, b)

	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("held append once space returned: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("held append not stored within 5s of space returning")
	}
	if w.DiskFull() || w.Full() {
		t.Fatalf("DiskFull() %v, Full() %v once space returned", w.DiskFull(), w.Full())
	}
}

func TestSyncIntervalCommitsInBackground(t *testing.T) {
	dir := t.TempDir()
	w := openT(t, dir, Options{Sync: SyncInterval, SyncInterval: 100 * time.Millisecond})
	r := rand.New(rand.NewSource(9))
	start := time.Now()
	for i := 0; i < 50; i++ {
		appendT(t, w, makeRecords(r, fmt.Sprint(i), 10, 100), "")
	}
	if c := w.Stats().Commits; c > 3 {
		t.Fatalf("%d commits for 50 appends in %v: interval mode commits per append", c, time.Since(start))
	}
	if err := w.Wait(context.Background(), 500); err != nil {
		t.Fatal(err)
	}
	w.Close()
	w = openT(t, dir, Options{})
	defer w.Close()
	if n := w.Stats().Records; n != 500 {
		t.Fatalf("%d records after close, want 500", n)
	}
}

// TestSyncIntervalCommitsSinkStateAtOnce: with SyncInterval, a Commit (a
// sink's intent or delivery) is durable when it returns, and does not wait
// for the interval: a sink commits twice a batch, one batch after another.
// The appends that share its transaction are committed with it.
func TestSyncIntervalCommitsSinkStateAtOnce(t *testing.T) {
	dir := t.TempDir()
	w := openT(t, dir, Options{Sync: SyncInterval, SyncInterval: time.Hour})
	defer w.Close()
	appendT(t, w, []Record{{Body: []byte(`{"a":1}`)}}, "")
	done := make(chan error, 1)
	go func() {
		if _, err := w.RegisterCursor(context.Background(), "s3"); err != nil {
			done <- err
			return
		}
		for i := range 20 {
			var b Batch
			b.Put("s3", []byte("intent"), []byte(fmt.Sprint(i)))
			if err := w.Commit(context.Background(), &b); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		// A commit waits for the interval: Close commits it, and the
		// goroutine ends.
		w.Close()
		<-done
		t.Fatal("20 commits not done in 10 s with a SyncInterval of an hour: they wait for the interval")
	}
	// Committed: a copy of the file as it is now, what a crash of the
	// process would leave, holds the last intent and the append.
	data, err := os.ReadFile(filepath.Join(dir, "wal.db"))
	if err != nil {
		t.Fatal(err)
	}
	crashed := t.TempDir()
	if err := os.WriteFile(filepath.Join(crashed, "wal.db"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	c := openT(t, crashed, Options{ReadOnly: true})
	defer c.Close()
	if v, err := c.State("s3", []byte("intent")); err != nil || string(v) != "19" {
		t.Fatalf("the copy's intent: %q, %v; want the last one committed, 19", v, err)
	}
	if n := c.Stats().Records; n != 1 {
		t.Fatalf("the copy holds %d records, want the append that shared the commits' transaction", n)
	}
}

// TestSyncIntervalCloseReportsALostCommit: with SyncInterval, appends are
// acknowledged before their commit; when the last commit, at Close, fails,
// Close must say so (the service then exits non-zero), not return nil.
func TestSyncIntervalCloseReportsALostCommit(t *testing.T) {
	dir := t.TempDir()
	w := openT(t, dir, Options{Sync: SyncInterval, SyncInterval: time.Hour})
	appendT(t, w, []Record{{Body: []byte(`{"a":1}`)}}, "")
	failing := func(tx *bolt.Tx) error {
		tx.Rollback()
		return &fs.PathError{Op: "sync", Path: "wal.db", Err: syscall.EIO}
	}
	commitHook.Store(&failing)
	defer commitHook.Store(nil)
	err := w.Close()
	if !errors.Is(err, ErrFatal) || !strings.Contains(fmt.Sprint(err), "input/output error") {
		t.Fatalf("Close after a failed last commit: %v, want ErrFatal wrapping EIO", err)
	}
	commitHook.Store(nil)
	if err := w.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	// A WAL that failed before Close reported it then: Close does not again.
	w = openT(t, dir, Options{Sync: SyncInterval, SyncInterval: 10 * time.Millisecond})
	commitHook.Store(&failing)
	appendT(t, w, []Record{{Body: []byte(`{"a":2}`)}}, "")
	select {
	case <-w.Fatal():
	case <-time.After(5 * time.Second):
		t.Fatal("the interval's commit did not fail the WAL within 5s")
	}
	commitHook.Store(nil)
	if err := w.Close(); err != nil {
		t.Fatalf("Close of a WAL that had failed before: %v", err)
	}
}

func TestLockedAndFormat(t *testing.T) {
	dir := t.TempDir()
	w := openT(t, dir, Options{})
	if _, err := Open(dir, Options{ReadOnly: true}); !errors.Is(err, ErrLocked) {
		t.Fatalf("second open of a held file: %v", err)
	}
	w.Close()
	ro := openT(t, dir, Options{ReadOnly: true})
	if _, err := ro.Append(context.Background(), []Record{{}}, AppendOptions{}); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("append on read-only: %v", err)
	}
	ro.Close()
	db, err := bolt.Open(filepath.Join(dir, FileName), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(keyFormat, u64(99)) })
	db.Close()
	if _, err := Open(dir, Options{}); !errors.Is(err, ErrFormat) {
		t.Fatalf("open of format 99: %v", err)
	}
	if _, err := Open(filepath.Join(dir, "missing"), Options{ReadOnly: true}); err == nil {
		t.Fatal("read-only open created a file")
	}
}

// fileToCompact closes, in dir, a WAL whose live records (its last append,
// of 500 records, which it returns) take a fortieth of its file.
func fileToCompact(t *testing.T, dir string) Result {
	t.Helper()
	w := openT(t, dir, Options{})
	defer w.Close()
	w.RegisterCursor(context.Background(), "s")
	r := rand.New(rand.NewSource(10))
	var last Result
	for i := 0; i < 40; i++ {
		last = appendT(t, w, makeRecords(r, fmt.Sprint(i), 500, 500), "")
	}
	b := &Batch{}
	b.SetCursor("s", last.Last-500) // all but the last append
	commitT(t, w, b)
	if st := w.Stats(); st.FirstSeq != last.First {
		t.Fatalf("retention left records from %d, want %d", st.FirstSeq, last.First)
	}
	return last
}

func TestCompactAtOpen(t *testing.T) {
	dir := t.TempDir()
	last := fileToCompact(t, dir)
	before, _ := os.Stat(filepath.Join(dir, FileName))
	var logs syncbuf.Buffer
	w := openT(t, dir, Options{CompactMinFileBytes: 1 << 20, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	defer w.Close()
	after, _ := os.Stat(filepath.Join(dir, FileName))
	if after.Size()*2 > before.Size() {
		t.Fatalf("compaction: %d bytes before, %d after", before.Size(), after.Size())
	}
	// Said before it begins (it can take minutes), and once it is over.
	begins := fmt.Sprintf(`msg="wal: compacting the file, mostly free pages, before the service starts; the inputs listen once it is done (a stop meanwhile leaves the file as it was)" path=%s bytes=%d live_bytes=`, filepath.Join(dir, FileName), before.Size())
	i, j := strings.Index(logs.String(), begins), strings.Index(logs.String(), `msg="wal compacted"`)
	if i < 0 || j < i {
		t.Errorf("log lacks %q before the line of the end:\n%s", begins, logs.String())
	}
	if got := readAll(t, w, 1); len(got) != 500 || got[0].Seq != last.First {
		t.Fatalf("after compaction: %d records from %d", len(got), got[0].Seq)
	}
	if st := w.Stats(); st.Cursors["s"] != last.Last-500 {
		t.Fatalf("cursor after compaction: %v", st.Cursors)
	}
	t.Logf("file %d bytes before compaction, %d after", before.Size(), after.Size())
}

// TestStaleCompactionCopyIsRemoved: the copy a compaction cut short (a stop
// while the WAL opened) leaves is removed by the next open, which does not
// compact, instead of taking disk space for good.
func TestStaleCompactionCopyIsRemoved(t *testing.T) {
	dir := t.TempDir()
	w := openT(t, dir, Options{})
	appendT(t, w, []Record{{Body: []byte(`{"a":1}`)}}, "")
	w.Close()
	stale := filepath.Join(dir, FileName+".compact")
	if err := os.WriteFile(stale, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs syncbuf.Buffer
	w = openT(t, dir, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	defer w.Close()
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the stale copy is still there: %v", err)
	}
	if !strings.Contains(logs.String(), "wal: removed the copy a compaction cut short left") {
		t.Errorf("not logged:\n%s", logs.String())
	}
}

// A compaction that cannot make its copy (here a directory where the copy
// goes; on a full disk, no room for it) leaves the file as it is: the WAL
// opens with every record, and says why it did not compact.
func TestCompactionThatCannotCopyIsSkipped(t *testing.T) {
	dir := t.TempDir()
	last := fileToCompact(t, dir)
	in := filepath.Join(dir, FileName+".compact")
	if err := os.MkdirAll(filepath.Join(in, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	before, _ := os.Stat(filepath.Join(dir, FileName))
	var logs syncbuf.Buffer
	w := openT(t, dir, Options{CompactMinFileBytes: 1 << 20, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	defer w.Close()
	after, _ := os.Stat(filepath.Join(dir, FileName))
	if after.Size() != before.Size() {
		t.Fatalf("the file went from %d to %d bytes", before.Size(), after.Size())
	}
	if got := readAll(t, w, 1); len(got) != 500 || got[0].Seq != last.First {
		t.Fatalf("%d records from %d", len(got), got[0].Seq)
	}
	if !strings.Contains(logs.String(), "could not compact the file") {
		t.Fatalf("no warning:\n%s", logs.String())
	}
	appendT(t, w, makeRecords(rand.New(rand.NewSource(11)), "after", 10, 100), "") // and it is in use
}

// TestFirstSeq: a new WAL numbers its records from Options.FirstSeq; an
// existing one goes on from where it was, whatever FirstSeq says, and a
// new WAL's numbers from the clock begin past those of one begun earlier.
func TestFirstSeq(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	first := NewFirstSeq(time.Now())
	w, err := Open(dir, Options{FirstSeq: first})
	if err != nil {
		t.Fatal(err)
	}
	if got := w.Stats().NextSeq; got != first {
		t.Fatalf("a new WAL's next sequence number %d, want %d", got, first)
	}
	res, err := w.Append(ctx, []Record{{Tag: "a", Body: []byte(`{}`)}, {Tag: "a", Body: []byte(`{}`)}}, AppendOptions{})
	if err != nil || res.First != first || res.Last != first+1 {
		t.Fatalf("append: %+v %v, want %d to %d", res, err, first, first+1)
	}
	w.Close()
	// Reopened (a later start): the numbers go on.
	w, err = Open(dir, Options{FirstSeq: NewFirstSeq(time.Now().Add(time.Hour))})
	if err != nil {
		t.Fatal(err)
	}
	res, err = w.Append(ctx, []Record{{Tag: "a", Body: []byte(`{}`)}}, AppendOptions{})
	w.Close()
	if err != nil || res.First != first+2 {
		t.Fatalf("after a reopen: %+v %v, want %d", res, err, first+2)
	}
	// Opened and closed before any append: the first number stays.
	dir2 := t.TempDir()
	if w, err = Open(dir2, Options{FirstSeq: 5000}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if w, err = Open(dir2, Options{}); err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if got := w.Stats().NextSeq; got != 5000 {
		t.Fatalf("a WAL opened before without appends begins at %d, want 5000", got)
	}
	if a, b := NewFirstSeq(time.Unix(1_800_000_000, 0)), NewFirstSeq(time.Unix(1_800_000_001, 0)); b-a != 1_000_000 || uint64(float64(b)) != b || b >= 1<<53 {
		t.Fatalf("NewFirstSeq: %d then %d a second later", a, b)
	}
}

// A commit of appends the file system refuses although it reports room
// holds the appends as a full disk does; its warning says so, rather than
// that the disk is nearly full next to figures that say it is not.
func TestRefusedCommitSaysWhy(t *testing.T) {
	stubFree(t, 10<<30, true)
	var logs syncbuf.Buffer
	w := openT(t, t.TempDir(), Options{MinFreeBytes: 1 << 20, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	defer w.Close()
	appendT(t, w, []Record{{Body: []byte(`{"a":1}`)}}, "")
	_, stop := noSpaceCommits(t)
	defer stop()
	if _, err := w.Append(context.Background(), []Record{{Body: []byte(`{"a":2}`)}}, AppendOptions{}); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("append whose commit finds no space: %v, want ErrNoSpace", err)
	}
	if out := logs.String(); !strings.Contains(out, "the file system refused a commit of appends (no space) although it reports room") || strings.Contains(out, "nearly full") {
		t.Fatalf("log:\n%s\nwant the refusal said as such", out)
	}
}

// A WAL full under max_bytes whose cursor furthest behind is of a sink no
// longer configured (not in Options.Sinks) says that no delivery will free
// room, and how to drop it.
func TestFullByAnUnconfiguredCursor(t *testing.T) {
	var logs syncbuf.Buffer
	w := openT(t, t.TempDir(), Options{MaxBytes: 64 << 10, Logger: slog.New(slog.NewTextHandler(&logs, nil)), Sinks: []string{"archive"}})
	defer w.Close()
	ctx := context.Background()
	for _, c := range []string{"archive", "gone"} {
		if _, err := w.RegisterCursor(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	r := rand.New(rand.NewSource(5))
	for w.Stats().Bytes < 48<<10 {
		appendT(t, w, makeRecords(r, "f", 20, 250), "")
	}
	hctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := w.Append(hctx, makeRecords(r, "big", 300, 250), AppendOptions{}); !errors.Is(err, ErrFull) {
		t.Fatalf("an append over max_bytes: %v, want ErrFull", err)
	}
	waitUntil(t, 5*time.Second, "the max_bytes warning", func() bool { return strings.Contains(logs.String(), "max_bytes reached") })
	out := logs.String()
	if !strings.Contains(out, "the cursor furthest behind is of a sink no longer configured") || !strings.Contains(out, "furthest_behind=gone") {
		t.Errorf("the max_bytes warning does not say the cursor holding the WAL is no configured sink's:\n%s", out)
	}
}

// drop_oldest's losses are said once a dropLogInterval: those after a line
// get theirs when the interval ends, also when the writer has nothing
// else to do by then (the sinks paused, the clients gone).
func TestDropsLoggedWhenIdle(t *testing.T) {
	defer func(d time.Duration) { dropLogInterval = d }(dropLogInterval)
	dropLogInterval = 300 * time.Millisecond
	var logs syncbuf.Buffer
	w := openT(t, t.TempDir(), Options{MaxBytes: 64 << 10, WhenFull: DropOldest, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	defer w.Close()
	if _, err := w.RegisterCursor(context.Background(), "s"); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewSource(7))
	const line = "wal full: dropped the oldest records"
	for strings.Count(logs.String(), line) == 0 {
		appendT(t, w, makeRecords(r, "f", 20, 250), "")
	}
	dropped := w.Stats().Dropped["s"]
	for w.Stats().Dropped["s"] == dropped { // more, within the interval
		appendT(t, w, makeRecords(r, "f", 20, 250), "")
	}
	waitUntil(t, 3*time.Second, "the second line, with the writer idle", func() bool { return strings.Count(logs.String(), line) == 2 })
}

// Holding: with the WAL full, the cursors furthest behind hold it when their
// sinks' deliveries can move them: not a paused sink's, nor those level with
// a paused sink's or with a cursor no configured sink has.
func TestHolding(t *testing.T) {
	w := openT(t, t.TempDir(), Options{MaxBytes: 64 << 10, Sinks: []string{"a", "b", "c"}})
	defer w.Close()
	ctx := context.Background()
	for _, c := range []string{"a", "b", "c"} {
		if _, err := w.RegisterCursor(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	r := rand.New(rand.NewSource(9))
	var last Result
	for w.Stats().Bytes < 48<<10 {
		last = appendT(t, w, makeRecords(r, "f", 20, 250), "")
	}
	if w.Holding("a") {
		t.Fatal("Holding while the WAL is not full")
	}
	b := &Batch{}
	b.SetCursor("c", last.Last) // c is ahead: never holding
	commitT(t, w, b)
	hctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := w.Append(hctx, makeRecords(r, "big", 300, 250), AppendOptions{}); !errors.Is(err, ErrFull) {
		t.Fatalf("an append over max_bytes: %v, want ErrFull", err)
	}
	if !w.Holding("a") || !w.Holding("b") || w.Holding("c") {
		t.Errorf("a and b level, c ahead: Holding %v %v %v, want true true false", w.Holding("a"), w.Holding("b"), w.Holding("c"))
	}
	w.SetPaused("b", true)
	if w.Holding("a") || w.Holding("b") {
		t.Errorf("b paused, level with a: Holding a %v, b %v; want false, false", w.Holding("a"), w.Holding("b"))
	}
	w.SetPaused("b", false)
	if _, err := w.RegisterCursor(ctx, "gone"); err != nil { // a cursor no configured sink has, at 0
		t.Fatal(err)
	}
	if w.Holding("a") {
		t.Error("a level with a cursor of no configured sink: Holding true")
	}
}

// A hold under max_bytes that begins within diskLogInterval of the last
// hold's line is logged once the interval is over, if it lasts, and then
// its end too: the log must not end on "appends resume" while they wait.
func TestMaxBytesHoldSoonAfterAResumeIsLogged(t *testing.T) {
	defer func(h, d time.Duration) { heldFor, diskLogInterval = h, d }(heldFor, diskLogInterval)
	heldFor, diskLogInterval = 10*time.Second, 1500*time.Millisecond
	var logs syncbuf.Buffer
	w := openT(t, t.TempDir(), Options{MaxBytes: 64 << 10, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	defer w.Close()
	ctx := context.Background()
	if _, err := w.RegisterCursor(ctx, "sink"); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewSource(5))
	fill := func() {
		t.Helper()
		for w.Stats().Bytes < 48<<10 {
			appendT(t, w, makeRecords(r, "f", 20, 250), "")
		}
		hctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		if _, err := w.Append(hctx, makeRecords(r, "big", 300, 250), AppendOptions{}); !errors.Is(err, ErrFull) {
			t.Fatalf("an append over max_bytes: %v, want ErrFull", err)
		}
		if !w.Full() {
			t.Fatal("Full() false the moment the held append gave up")
		}
	}
	free := func() {
		t.Helper()
		b := &Batch{}
		b.SetCursor("sink", w.Stats().NextSeq-1)
		commitT(t, w, b)
		waitUntil(t, 5*time.Second, "Full() false once the cursor passed everything", func() bool { return !w.Full() })
	}
	const held, resumed = "wal: max_bytes reached", "wal: room under max_bytes again: appends resume"
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
	if out := logs.String(); !strings.Contains(out[strings.LastIndex(out, held):], "times_not_logged=0") {
		t.Errorf("the late line counts itself as not logged:\n%s", out)
	}
	free()
	if out := logs.String(); strings.Count(out, resumed) != 2 {
		t.Errorf("the end of the hold logged late, want its line:\n%s", out)
	}
}

// A cursor name longer than bbolt takes as a key is refused alone: the
// WAL goes on taking appends.
func TestOverlongCursorNameIsRefusedAlone(t *testing.T) {
	w := openT(t, t.TempDir(), Options{})
	defer w.Close()
	if _, err := w.RegisterCursor(context.Background(), strings.Repeat("s", 40000)); err == nil {
		t.Fatal("a cursor name of 40,000 bytes registered")
	}
	if _, err := w.Append(context.Background(), []Record{{Tag: "t", Body: []byte(`{}`)}}, AppendOptions{}); err != nil {
		t.Fatalf("an append after the refused name: %v", err)
	}
}
