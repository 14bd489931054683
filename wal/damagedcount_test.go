package wal

import (
	"context"
	"errors"
	"log/slog"
	"math/rand"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/logfwd/forwarder/internal/syncbuf"
)

// damageEntryCount flips bits of the record count in the header of the
// entry stored at key seq (its bytes 2 to 5), in the closed WAL file of
// dir, wherever the file holds the entry.
func damageEntryCount(t *testing.T, dir, path string, seq uint64, at int, bits byte) {
	t.Helper()
	w := openT(t, dir, Options{})
	if _, err := w.RegisterCursor(context.Background(), "s"); err != nil {
		t.Fatal(err)
	}
	var entry []byte
	w.db.View(func(tx *bolt.Tx) error {
		entry = append(entry, tx.Bucket(bucketEntries).Get(seqKey(seq))...)
		return nil
	})
	w.Close()
	offs := findIn(t, path, entry)
	if len(offs) == 0 {
		t.Fatalf("entry %d not found in the file", seq)
	}
	for _, off := range offs {
		xorAt(t, path, off+int64(at), bits)
	}
}

// TestDropOldestWithADamagedCount: drop_oldest drops the oldest entry, whose
// header's record count is damaged (a bit of its high byte: a billion
// records more). The entry's records are those up to the next entry's
// first, as the keys say: the cursor and the first live record move past
// them alone, and what is appended after is kept until it is delivered.
func TestDropOldestWithADamagedCount(t *testing.T) {
	dir := t.TempDir()
	path, _ := buildCorruptionFixture(t, dir)
	damageEntryCount(t, dir, path, 1, 2, 0x40)
	w := openT(t, dir, Options{MaxBytes: 64 << 10, WhenFull: DropOldest})
	defer w.Close()
	r := rand.New(rand.NewSource(3))
	appendT(t, w, makeRecords(r, "new", 100, 300), "")
	res := appendT(t, w, makeRecords(r, "new2", 10, 300), "")
	st := w.Stats()
	if st.Cursors["s"] >= st.NextSeq || st.FirstSeq > st.NextSeq || st.Dropped["s"] > st.NextSeq {
		t.Fatalf("cursor %d, first_seq %d, dropped %d against next_seq %d: past every record", st.Cursors["s"], st.FirstSeq, st.Dropped["s"], st.NextSeq)
	}
	// Retention runs at a cursor's move: the undelivered records stay.
	if _, err := w.RegisterCursor(context.Background(), "tmp"); err != nil {
		t.Fatal(err)
	}
	if err := w.DropCursor(context.Background(), "tmp"); err != nil {
		t.Fatal(err)
	}
	if got, err := w.Read(res.First, 0, 0); err != nil || len(got) != 10 {
		t.Fatalf("the undelivered records %d to %d: %d read, %v", res.First, res.Last, len(got), err)
	}
}

// TestReadWithinADamagedLastEntry: the last entry (201 to 300) says 36
// records in its header. A read from 250 (a cursor within its records,
// past what the header says) reports the damage, as a read of its first
// record does, instead of finding nothing below next_seq: a reader then
// waited for records that were there, and Wait, seeing them committed,
// returned at once, round after round.
func TestReadWithinADamagedLastEntry(t *testing.T) {
	dir := t.TempDir()
	path, _ := buildCorruptionFixture(t, dir)
	damageEntryCount(t, dir, path, 201, 5, 0x40)
	w := openT(t, dir, Options{})
	defer w.Close()
	_, err := w.Read(250, 0, 0)
	var ce *CorruptionError
	if !errors.As(err, &ce) || ce.FirstSeq != 201 || ce.LastSeq != 300 {
		t.Fatalf("Read(250): %v, want the damage of entry 201 to 300", err)
	}
	if _, err := w.NewReader(250).ReadInto(0, 0, nil); !errors.As(err, &ce) {
		t.Fatalf("a reader from 250: %v, want the damage", err)
	}
}

// TestRegisterAnExistingCursorOnAFullDisk: registering a cursor that is
// registered already (every sink's start) writes nothing, so a full disk,
// which refuses every commit, does not fail it.
func TestRegisterAnExistingCursorOnAFullDisk(t *testing.T) {
	w := openT(t, t.TempDir(), Options{})
	defer w.Close()
	ctx := context.Background()
	appendT(t, w, makeRecords(rand.New(rand.NewSource(1)), "a", 10, 100), "")
	want, err := w.RegisterCursor(ctx, "s3")
	if err != nil {
		t.Fatal(err)
	}
	calls, stop := noSpaceCommits(t)
	defer stop()
	if pos, err := w.RegisterCursor(ctx, "s3"); err != nil || pos != want {
		t.Fatalf("RegisterCursor of an existing cursor on a full disk: %d, %v; want %d", pos, err, want)
	}
	if _, err := w.RegisterCursor(ctx, "new"); !errors.Is(err, ErrNoSpace) || calls.Load() == 0 {
		t.Fatalf("a new cursor on a full disk: %v after %d commits, want ErrNoSpace", err, calls.Load())
	}
}

// TestRefusedDropsAreNotLogged: a commit that drop_oldest's deletes shared,
// refused by a full disk, dropped nothing: the warning of what was dropped
// names only what committed drops lost.
func TestRefusedDropsAreNotLogged(t *testing.T) {
	var logs syncbuf.Buffer
	w := openT(t, t.TempDir(), Options{MaxBytes: 64 << 10, WhenFull: DropOldest, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx := context.Background()
	if _, err := w.RegisterCursor(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewSource(5))
	for w.Stats().Bytes < 48<<10 {
		appendT(t, w, makeRecords(r, "a", 20, 300), "")
	}
	if d := w.Stats().Dropped["s"]; d != 0 {
		t.Fatalf("dropped %d before the full disk", d)
	}
	_, stop := noSpaceCommits(t)
	if _, err := w.Append(ctx, makeRecords(r, "b", 100, 300), AppendOptions{}); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("an append that drops, on a full disk: %v", err)
	}
	stop()
	if d := w.Stats().Dropped["s"]; d != 0 {
		t.Fatalf("dropped %d by a refused commit", d)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), "dropped the oldest") {
		t.Errorf("drops logged that did not happen:\n%s", logs.String())
	}
}
