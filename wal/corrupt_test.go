package wal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

const openChildEnv = "WAL_TEST_OPEN_CHILD"

// openChild opens a possibly damaged WAL, verifies it and reads it, and
// prints what happened. It runs in its own process: bbolt maps the file,
// and a damaged file can fault the process instead of returning an error.
func openChild(dir string) {
	debug.SetPanicOnFault(true)
	defer func() {
		if r := recover(); r != nil {
			fmt.Println("PANIC", r)
			os.Exit(5)
		}
	}()
	w, err := Open(dir, Options{ReadOnly: true})
	if err != nil {
		fmt.Println("OPEN ERROR", err)
		return
	}
	defer w.Close()
	fmt.Println("OPENED")
	rep := w.Verify()
	for _, p := range rep.Problems {
		fmt.Println("VERIFY", p)
	}
	if _, err := w.Read(1, 0, 0); err != nil {
		fmt.Println("READ ERROR", err)
	}
	fmt.Println("RECORDS", rep.Records)
}

func runOpenChild(t *testing.T, dir string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), openChildEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child exited with %v (a fault, not an error):\n%s", err, out)
	}
	return string(out)
}

// buildCorruptionFixture writes 3 entries of 100 records (1-100, 101-200,
// 201-300) and returns the file path and the stored value of the middle one.
func buildCorruptionFixture(t *testing.T, dir string) (string, []byte) {
	w := openT(t, dir, Options{})
	r := rand.New(rand.NewSource(11))
	for i := 0; i < 3; i++ {
		appendT(t, w, makeRecords(r, fmt.Sprint(i), 100, 300), "")
	}
	var mid []byte
	w.db.View(func(tx *bolt.Tx) error {
		mid = append(mid, tx.Bucket(bucketEntries).Get(seqKey(101))...)
		return nil
	})
	w.Close()
	return filepath.Join(dir, FileName), mid
}

func TestCorruption(t *testing.T) {
	cases := []struct {
		name   string
		damage func(t *testing.T, path string, mid []byte)
		want   []string // lines the child must print
	}{
		{
			name: "flipped byte in an entry's payload",
			damage: func(t *testing.T, path string, mid []byte) {
				for _, off := range findIn(t, path, mid) {
					flipAt(t, path, off+int64(len(mid)/2))
				}
			},
			want: []string{"OPENED", "VERIFY wal: corruption in " + "%s" + ", entry with records 101-200: checksum mismatch",
				"READ ERROR wal: corruption in %s, entry with records 101-200: checksum mismatch", "RECORDS 200"},
		},
		{
			name: "flipped byte in an entry's header",
			damage: func(t *testing.T, path string, mid []byte) {
				for _, off := range findIn(t, path, mid) {
					flipAt(t, path, off+1) // the codec byte
				}
			},
			want: []string{"OPENED", "VERIFY wal: corruption in %s, entry with records 101-200: unknown entry version or codec", "RECORDS 200"},
		},
		{
			name: "truncated file",
			damage: func(t *testing.T, path string, _ []byte) {
				fi, _ := os.Stat(path)
				if err := os.Truncate(path, fi.Size()/2); err != nil {
					t.Fatal(err)
				}
			},
			want: []string{"OPEN ERROR wal: corruption in %s at byte", "but its meta page refers to", "truncated"},
		},
		{
			name: "empty file",
			damage: func(t *testing.T, path string, _ []byte) {
				os.Truncate(path, 0)
			},
			want: []string{"OPEN ERROR wal: corruption in %s at byte 0: file is empty"},
		},
		{
			name: "damaged older meta page",
			damage: func(t *testing.T, path string, _ []byte) {
				flipAt(t, path, metaOffset(t, path, false)+boltPageHeader+20)
			},
			want: []string{"OPENED", "VERIFY wal: corruption in %s at byte", "is damaged (meta checksum mismatch); using meta page", "RECORDS 300"},
		},
		{
			// bbolt falls back to the previous transaction: the last one
			// (records 201-300) is gone, and Open and Verify say so.
			name: "damaged newest meta page",
			damage: func(t *testing.T, path string, _ []byte) {
				flipAt(t, path, metaOffset(t, path, true)+boltPageHeader+20)
			},
			want: []string{"OPENED", "VERIFY wal: corruption in %s at byte", "is damaged (meta checksum mismatch); using meta page", "RECORDS 200"},
		},
		{
			name: "both meta pages damaged",
			damage: func(t *testing.T, path string, _ []byte) {
				flipAt(t, path, boltPageHeader+20)
				flipAt(t, path, int64(os.Getpagesize())+boltPageHeader+20)
			},
			want: []string{"OPEN ERROR wal: corruption in %s at byte 0: both meta pages are damaged"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path, mid := buildCorruptionFixture(t, dir)
			tc.damage(t, path, mid)
			out := runOpenChild(t, dir)
			for _, want := range tc.want {
				if strings.Contains(want, "%s") {
					want = fmt.Sprintf(want, path)
				}
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
		})
	}
}

// TestCorruptionNeverReturnsWrongData flips every byte of one entry in turn
// (in memory) and checks that decoding either fails or yields exactly the
// original records.
func TestCorruptionNeverReturnsWrongData(t *testing.T) {
	r := rand.New(rand.NewSource(12))
	recs := makeRecords(r, "x", 20, 60)
	e := encodeEntries(recs, nil)[0]
	value := append([]byte(nil), e.finish(42)...)
	want, err := decodeEntry(42, value, nil, nil)
	if err != nil || len(want) != 20 {
		t.Fatalf("clean entry: %v", err)
	}
	for i := range value {
		for _, bit := range []byte{0x01, 0x80} {
			v := append([]byte(nil), value...)
			v[i] ^= bit
			got, err := decodeEntry(42, v, nil, nil)
			if err == nil {
				t.Fatalf("flipping bit %x of byte %d went unnoticed", bit, i)
			}
			if len(got) != 0 {
				t.Fatalf("byte %d: a failed decode returned %d records", i, len(got))
			}
		}
	}
	// The key is covered too: the same value under another key is damage.
	if _, err := decodeEntry(43, value, nil, nil); err == nil {
		t.Fatal("an entry moved to another key went unnoticed")
	}
	// And a truncated value.
	for _, n := range []int{0, 5, entryHeaderLen, len(value) - 1} {
		if _, err := decodeEntry(42, value[:n], nil, nil); err == nil {
			t.Fatalf("entry cut to %d bytes went unnoticed", n)
		}
	}
}

// findIn returns every offset of value in the file: bbolt copies pages on
// write, so free pages may still hold older copies of the live one.
func findIn(t *testing.T, path string, value []byte) []int64 {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var offs []int64
	for i := 0; ; {
		j := bytes.Index(data[i:], value)
		if j < 0 {
			break
		}
		offs = append(offs, int64(i+j))
		i += j + 1
	}
	if len(offs) == 0 {
		t.Fatal("stored entry not found in the file")
	}
	return offs
}

// metaOffset returns the offset of the newest (or the older) meta page.
func metaOffset(t *testing.T, path string, newest bool) int64 {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ps := os.Getpagesize()
	m0, err0 := readMeta(data[:ps])
	m1, err1 := readMeta(data[ps : 2*ps])
	if err0 != nil || err1 != nil {
		t.Fatalf("fixture meta pages: %v, %v", err0, err1)
	}
	if (m1.txid > m0.txid) == newest {
		return int64(ps)
	}
	return 0
}

func flipAt(t *testing.T, path string, off int64) { t.Helper(); xorAt(t, path, off, 0xff) }

// xorAt changes the byte at off of the file to itself XOR mask.
func xorAt(t *testing.T, path string, off int64, mask byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= mask
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// TestReplaceDamaged: a damaged entry (its payload, or the record count in
// its header) is replaced by placeholders of DamagedTag for the records
// from its key to the next entry's, so that reads go on past it; whole
// entries are not touched, a second replacement does nothing, Verify finds
// nothing left, the live bytes stay right across a reopen, and retention
// deletes the placeholders once the cursor passed them.
func TestReplaceDamaged(t *testing.T) {
	for _, c := range []struct {
		name string
		at   func(mid []byte) int64 // offset in the entry's value of the byte flipped
	}{
		{"payload", func(mid []byte) int64 { return int64(len(mid) / 2) }},
		{"record count", func([]byte) int64 { return 5 }}, // the count's low byte: the header says 36, not 100
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			path, mid := buildCorruptionFixture(t, dir)
			w := openT(t, dir, Options{})
			want, err := w.Read(1, 100, 0)
			if err != nil {
				t.Fatal(err)
			}
			tail, err := w.Read(201, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, tail...)
			w.Close()
			for _, off := range findIn(t, path, mid) {
				xorAt(t, path, off+c.at(mid), 0x40)
			}

			w = openT(t, dir, Options{})
			ctx := context.Background()
			if _, err := w.RegisterCursor(ctx, "s"); err != nil {
				t.Fatal(err)
			}
			_, err = w.Read(1, 0, 0)
			var ce *CorruptionError
			if !errors.As(err, &ce) || ce.FirstSeq != 101 {
				t.Fatalf("read of the damaged WAL: %v, want a CorruptionError at 101", err)
			}
			// A read from within the entry meets the damage too, whatever
			// count its header says: it does not skip to the next entry.
			if _, err := w.Read(150, 0, 0); !errors.As(err, &ce) || ce.FirstSeq != 101 {
				t.Fatalf("read from 150 of the damaged WAL: %v, want a CorruptionError at 101", err)
			}
			if last, err := w.ReplaceDamaged(ctx, 1); err != nil || last != 0 {
				t.Fatalf("ReplaceDamaged of a whole entry: %d, %v; want 0, nil", last, err)
			}
			if last, err := w.ReplaceDamaged(ctx, 101); err != nil || last != 200 {
				t.Fatalf("ReplaceDamaged(101) = %d, %v; want 200", last, err)
			}
			if last, err := w.ReplaceDamaged(ctx, 101); err != nil || last != 0 {
				t.Fatalf("second ReplaceDamaged(101) = %d, %v; want 0", last, err)
			}
			got, err := w.Read(1, 0, 0)
			if err != nil || len(got) != 300 {
				t.Fatalf("read after the replacement: %d records, %v", len(got), err)
			}
			var kept []Record
			for _, r := range got {
				switch {
				case r.Seq >= 101 && r.Seq <= 200:
					if r.Tag != DamagedTag || len(r.Body) != 0 {
						t.Fatalf("record %d: tag %q, body %q; want a placeholder", r.Seq, r.Tag, r.Body)
					}
				default:
					kept = append(kept, r)
				}
			}
			if len(kept) != len(want) {
				t.Fatalf("%d records kept, want %d", len(kept), len(want))
			}
			for i := range want {
				if kept[i].Seq != want[i].Seq || kept[i].Tag != want[i].Tag || !bytes.Equal(kept[i].Body, want[i].Body) {
					t.Fatalf("record %d changed", want[i].Seq)
				}
			}
			if rep := w.Verify(); len(rep.Problems) != 0 || rep.Records != 300 {
				t.Fatalf("verify after the replacement: %d records, problems %v", rep.Records, rep.Problems)
			}
			if n := w.Stats().DamagedRecords; n != 100 {
				t.Fatalf("DamagedRecords %d, want 100", n)
			}
			if a := w.Age(150); a > time.Minute {
				t.Fatalf("a placeholder's age is %v: the lag would say so", a)
			}
			var stored int64
			w.db.View(func(tx *bolt.Tx) error {
				return tx.Bucket(bucketEntries).ForEach(func(_, v []byte) error { stored += int64(len(v)); return nil })
			})
			if b := w.Stats().Bytes; b != stored {
				t.Fatalf("live bytes %d, entries hold %d", b, stored)
			}
			w.Close()
			w = openT(t, dir, Options{})
			defer w.Close()
			if b := w.Stats().Bytes; b != stored {
				t.Fatalf("live bytes %d after a reopen, entries hold %d", b, stored)
			}
			var b Batch
			b.SetCursor("s", 250)
			commitT(t, w, &b)
			waitUntil(t, 5*time.Second, "retention past the placeholders", func() bool { return w.Stats().FirstSeq > 200 })
		})
	}
}

// TestDropOldestPassesPlaceholders: drop_oldest does not count the
// placeholders of a damaged entry as dropped records: they were lost, and
// counted, as damaged; the records around them count, for a sink of every
// tag and for one of some tags alike.
func TestDropOldestPassesPlaceholders(t *testing.T) {
	dir := t.TempDir()
	path, mid := buildCorruptionFixture(t, dir)
	for _, off := range findIn(t, path, mid) {
		flipAt(t, path, off+int64(len(mid)/2))
	}
	ctx := context.Background()
	w := openT(t, dir, Options{})
	for _, n := range []string{"all", "some", "within"} {
		if _, err := w.RegisterCursor(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	if last, err := w.ReplaceDamaged(ctx, 101); err != nil || last != 200 {
		t.Fatalf("ReplaceDamaged(101) = %d, %v", last, err)
	}
	var b Batch
	b.SetCursor("within", 150) // a cursor within the placeholders
	commitT(t, w, &b)
	w.Close()

	every := func(string) bool { return true } // takes DamagedTag too
	w = openT(t, dir, Options{MaxBytes: 64 << 10, WhenFull: DropOldest, CursorTags: map[string]func(string) bool{"some": every}})
	defer w.Close()
	r := rand.New(rand.NewSource(3))
	for w.Stats().FirstSeq <= 300 {
		appendT(t, w, makeRecords(r, "new", 100, 300), "")
	}
	st := w.Stats()
	want := st.FirstSeq - 1 - 100 // all before the first live record, but the placeholders
	for _, n := range []string{"all", "some"} {
		if st.Dropped[n] != want {
			t.Errorf("%s: %d records counted dropped, want %d (the first live record is %d; 100 were placeholders)", n, st.Dropped[n], want, st.FirstSeq)
		}
	}
	if n := st.Dropped["within"]; n != want-100 {
		t.Errorf("within: %d records counted dropped, want %d", n, want-100)
	}
}

// TestReplaceDamagedChecksTheKey: the checksum covers the key, which may be
// what is damaged (here 101 read as 154): the entry is not replaced then,
// since where its records begin is not known, and the read still fails.
func TestReplaceDamagedChecksTheKey(t *testing.T) {
	dir := t.TempDir()
	path, mid := buildCorruptionFixture(t, dir)
	for _, off := range findIn(t, path, mid) {
		flipAt(t, path, off-1) // the key's last byte, just before its value in the leaf
	}
	w := openT(t, dir, Options{})
	defer w.Close()
	_, err := w.Read(1, 0, 0)
	var ce *CorruptionError
	if !errors.As(err, &ce) || ce.FirstSeq != 154 {
		t.Fatalf("read of the WAL with a damaged key: %v, want a CorruptionError at 154", err)
	}
	if last, err := w.ReplaceDamaged(context.Background(), 154); err == nil || last != 0 {
		t.Fatalf("ReplaceDamaged of an entry whose key is damaged: %d, %v; want an error", last, err)
	}
	if _, err := w.Read(1, 0, 0); !errors.As(err, &ce) {
		t.Fatalf("read after the refused replacement: %v", err)
	}
	if n := w.Stats().DamagedRecords; n != 0 {
		t.Fatalf("DamagedRecords %d, want 0", n)
	}
}

// TestReplaceDamagedForgetsItsChunks: the chunk ids of the lost records
// are forgotten, so that a client sending such a chunk again has it
// stored; the others still dedup.
func TestReplaceDamagedForgetsItsChunks(t *testing.T) {
	dir := t.TempDir()
	w := openT(t, dir, Options{})
	r := rand.New(rand.NewSource(11))
	var batches [][]Record
	for i := 0; i < 3; i++ {
		batches = append(batches, makeRecords(r, fmt.Sprint(i), 100, 300))
		appendT(t, w, batches[i], fmt.Sprintf("c%d", i))
	}
	var mid []byte
	w.db.View(func(tx *bolt.Tx) error {
		mid = append(mid, tx.Bucket(bucketEntries).Get(seqKey(101))...)
		return nil
	})
	w.Close()
	path := filepath.Join(dir, FileName)
	for _, off := range findIn(t, path, mid) {
		flipAt(t, path, off+int64(len(mid)/2))
	}
	w = openT(t, dir, Options{})
	defer w.Close()
	ctx := context.Background()
	if last, err := w.ReplaceDamaged(ctx, 101); err != nil || last != 200 {
		t.Fatalf("ReplaceDamaged(101) = %d, %v", last, err)
	}
	if res := appendT(t, w, batches[0], "c0"); !res.Duplicate {
		t.Fatalf("chunk c0 sent again was stored again: %+v", res)
	}
	if res := appendT(t, w, batches[1], "c1"); res.Duplicate || res.First != 301 {
		t.Fatalf("chunk c1, whose records were lost, sent again: %+v; want it stored from 301", res)
	}
}

// TestReplaceDamagedFromMemory: an entry found damaged while the entries
// committed last, kept in memory, still hold its records is written again
// from them: nothing is lost, nothing is counted as lost, and the file
// holds the records as they were appended.
func TestReplaceDamagedFromMemory(t *testing.T) {
	dir := t.TempDir()
	w := openT(t, dir, Options{})
	r := rand.New(rand.NewSource(11))
	var want []Record
	for i := 0; i < 3; i++ {
		recs := makeRecords(r, fmt.Sprint(i), 100, 300)
		res := appendT(t, w, recs, "")
		for k := range recs {
			recs[k].Seq = res.First + uint64(k)
		}
		want = append(want, recs...)
	}
	var mid []byte
	w.db.View(func(tx *bolt.Tx) error {
		mid = append(mid, tx.Bucket(bucketEntries).Get(seqKey(101))...)
		return nil
	})
	path := filepath.Join(dir, FileName)
	for _, off := range findIn(t, path, mid) {
		flipAt(t, path, off+int64(len(mid)/2)) // under the open WAL: its map sees it
	}
	ctx := context.Background()
	if last, err := w.ReplaceDamaged(ctx, 101); err != nil || last != 200 {
		t.Fatalf("ReplaceDamaged(101) = %d, %v", last, err)
	}
	if n := w.Stats().DamagedRecords; n != 0 {
		t.Fatalf("DamagedRecords %d, want 0: the records were in memory", n)
	}
	w.Close()
	w = openT(t, dir, Options{})
	defer w.Close()
	got, err := w.Read(1, 0, 0)
	if err != nil || len(got) != len(want) {
		t.Fatalf("read after the repair: %d records, %v", len(got), err)
	}
	for i := range want {
		if got[i].Seq != want[i].Seq || got[i].Tag != want[i].Tag || got[i].Time != want[i].Time || !bytes.Equal(got[i].Body, want[i].Body) {
			t.Fatalf("record %d differs after the repair", want[i].Seq)
		}
	}
	if rep := w.Verify(); len(rep.Problems) != 0 {
		t.Fatalf("verify after the repair: %v", rep.Problems)
	}
}

// A cursor's value damaged in its length, or in its bytes to a position
// past next_seq, makes Open refuse the file with a CorruptionError (naming
// it and what saves the records), rather than panic, or let retention
// delete records no sink passed.
func TestDamagedCursorValueRefused(t *testing.T) {
	for _, c := range []struct {
		name   string
		damage func(t *testing.T, path string, name string, off int64)
	}{
		{"length", func(t *testing.T, path, name string, off int64) { xorAt(t, path, off-4, 8^4) }},                        // the element's vsize, before its key
		{"past next_seq", func(t *testing.T, path, name string, off int64) { xorAt(t, path, off+int64(len(name)), 0x01) }}, // the value's top byte
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			w := openT(t, dir, Options{})
			const name = "slow-sink-with-a-unique-name"
			if _, err := w.RegisterCursor(context.Background(), name); err != nil {
				t.Fatal(err)
			}
			for range 5 {
				appendT(t, w, []Record{{Tag: "a", Body: []byte(`{"m":1}`)}}, "")
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, FileName)
			offs := findIn(t, path, []byte(name))
			if len(offs) == 0 {
				t.Fatal("the cursor's key is not in the file")
			}
			for _, off := range offs {
				c.damage(t, path, name, off)
			}
			w, err := Open(dir, Options{})
			var ce *CorruptionError
			if err == nil {
				w.Close()
			}
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), name) {
				t.Fatalf("Open of a WAL with a damaged cursor: %v, want a CorruptionError naming it", err)
			}
		})
	}
}
