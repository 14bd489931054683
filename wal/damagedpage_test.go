package wal

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/logfwd/forwarder/internal/syncbuf"
)

// A page of garbage inside wal.db (damage the meta pages' checksums do
// not cover) makes bbolt panic when a read reaches it: the read fails
// with a *CorruptionError naming the file, rather than the process, and
// Verify names the bucket the page belongs to (bbolt's own check, which
// runs in a goroutine of its own, would crash on it).
func TestDamagedPage(t *testing.T) {
	dir := t.TempDir()
	w := openT(t, dir, Options{})
	if _, err := w.RegisterCursor(t.Context(), "s"); err != nil {
		t.Fatal(err)
	}
	appendT(t, w, []Record{{Tag: "a", Body: []byte(`{"m":1}`)}}, "")
	path, root, pageSize := manyStatePages(t, w, dir)
	garbage := make([]byte, 64)
	rand.Read(garbage)
	for i := range garbage {
		garbage[i] |= 0x80 // page ids and offsets far past the file
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(garbage, root*pageSize+16); err != nil { // past the page's header
		t.Fatal(err)
	}
	f.Close()

	w = openT(t, dir, Options{})
	err = w.ScanState("s", []byte("dead/"), func(k, v []byte) error { return nil })
	var ce *CorruptionError
	if !errors.As(err, &ce) || ce.Path != path || !strings.Contains(err.Error(), "a page of the file is damaged") {
		t.Errorf("ScanState over a damaged page: %v, want a CorruptionError naming %s", err, path)
	}
	// The records are another tree: they still read.
	if recs := readAll(t, w, 1); len(recs) != 1 {
		t.Errorf("%d records read, want 1", len(recs))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}

	w = openT(t, dir, Options{ReadOnly: true})
	defer w.Close()
	rep := w.Verify()
	found := false
	for _, p := range rep.Problems {
		found = found || (errors.As(p, &ce) && strings.Contains(p.Error(), `sink "s"'s state`))
	}
	if !found || rep.Records != 1 {
		t.Errorf("Verify: %d records, problems %v; want 1 record and the damaged page in sink \"s\"'s state", rep.Records, rep.Problems)
	}
}

// A leaf page whose elements point far past the file (so that bbolt's key
// search faults in bytes.Compare, outside bbolt's own code) is damage too.
func TestDamagedLeafPage(t *testing.T) {
	dir := t.TempDir()
	w := openT(t, dir, Options{})
	path, root, pageSize := manyStatePages(t, w, dir)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	page := data[root*pageSize:]
	if flags := binary.LittleEndian.Uint16(page[8:]); flags != 0x01 { // a branch page
		t.Fatalf("the state bucket's root is no branch page (flags %#x)", flags)
	}
	leaf := int64(binary.LittleEndian.Uint64(page[16+8:])) // its first element's page
	lp := data[leaf*pageSize:]
	count := int(binary.LittleEndian.Uint16(lp[10:]))
	for i := range count { // each element: flags, pos, ksize, vsize
		binary.LittleEndian.PutUint32(lp[16+16*i+4:], 0x7f000000)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	w = openT(t, dir, Options{})
	defer w.Close()
	err = w.ScanState("s", []byte("dead/"), func(k, v []byte) error { return nil })
	var ce *CorruptionError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "a page of the file is damaged") {
		t.Errorf("ScanState over a leaf pointing past the file: %v, want a CorruptionError", err)
	}
}

// manyStatePages commits to w, in dir, a state bucket of sink "s" of many
// pages under a branch page, closes w, and returns the file, the bucket's
// root page and the page size.
func manyStatePages(t *testing.T, w *WAL, dir string) (path string, root, pageSize int64) {
	t.Helper()
	var b Batch
	for i := range 2000 {
		b.Put("s", fmt.Appendf(nil, "dead/%08d", i), []byte(strings.Repeat("x", 100)))
	}
	commitT(t, w, &b)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(dir, FileName)
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_ = db.View(func(tx *bolt.Tx) error {
		root, pageSize = int64(tx.Bucket(bucketState).Bucket([]byte("s")).RootPage()), int64(tx.DB().Info().PageSize)
		return nil
	})
	if root == 0 {
		t.Fatal("the state bucket is inline: no page to damage")
	}
	return path, root, pageSize
}

// A panic of the caller's own inside a read is not taken for damage.
func TestViewPanicsOfItsOwn(t *testing.T) {
	w := openT(t, t.TempDir(), Options{})
	defer w.Close()
	defer func() {
		if r := recover(); r != "ours" {
			t.Errorf("recovered %v, want the caller's own panic", r)
		}
	}()
	_ = w.ScanState("s", nil, func(k, v []byte) error { return nil })
	_ = w.view(func(tx *bolt.Tx) error { panic("ours") })
	t.Error("no panic")
}

// A damaged freelist page (bbolt loads it unchecked at a read-write open,
// and would panic or hand out pages in use) stops a read-write open with
// a CorruptionError; a read-only one reads the records, and Verify reports
// it without running bbolt's check, which would load it.
func TestDamagedFreelist(t *testing.T) {
	for _, c := range []struct {
		name   string
		damage func(page []byte)
	}{
		{"not a freelist", func(page []byte) { binary.LittleEndian.PutUint16(page[8:], 0x02) }},
		{"ids past the file", func(page []byte) {
			binary.LittleEndian.PutUint16(page[10:], 1)
			binary.LittleEndian.PutUint64(page[16:], 1<<40)
		}},
		{"overflow past the file", func(page []byte) {
			binary.LittleEndian.PutUint16(page[10:], 0xFFFF)
			binary.LittleEndian.PutUint32(page[12:], 0xFFFFFFFF)
			binary.LittleEndian.PutUint64(page[16:], 1<<40)
		}},
		{"more ids than the file holds", func(page []byte) {
			binary.LittleEndian.PutUint16(page[10:], 0xFFFF)
			binary.LittleEndian.PutUint32(page[12:], 1) // the file's last page
			binary.LittleEndian.PutUint64(page[16:], 1000)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			w := openT(t, dir, Options{})
			appendT(t, w, []Record{{Tag: "a", Body: []byte(`{"m":1}`)}}, "")
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, FileName)
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			m0, err0 := readMeta(data)
			m1, err1 := readMeta(data[m0.pageSize:])
			if err0 != nil || err1 != nil {
				t.Fatal(err0, err1)
			}
			m := m0
			if m1.txid > m0.txid {
				m = m1
			}
			if m.freelist == boltNoFreelist {
				t.Fatal("no freelist page synced")
			}
			c.damage(data[m.freelist*uint64(m.pageSize):])
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err = Open(dir, Options{})
			var ce *CorruptionError
			if !errors.As(err, &ce) || !errors.Is(err, errDamagedFreelist) {
				t.Fatalf("read-write open over a damaged freelist: %v, want a CorruptionError", err)
			}
			r := openT(t, dir, Options{ReadOnly: true})
			defer r.Close()
			if recs := readAll(t, r, 1); len(recs) != 1 {
				t.Errorf("%d records read, want 1", len(recs))
			}
			rep := r.Verify()
			found := false
			for _, p := range rep.Problems {
				found = found || errors.Is(p, errDamagedFreelist)
			}
			if !found {
				t.Errorf("Verify: problems %v, want the damaged freelist", rep.Problems)
			}
		})
	}
}

// A damaged page that compaction at start meets (its copy walks every
// page) is said, and the file kept as it is: Open does not panic.
func TestCompactionOverADamagedPage(t *testing.T) {
	dir := t.TempDir()
	w := openT(t, dir, Options{})
	if _, err := w.RegisterCursor(context.Background(), "s"); err != nil {
		t.Fatal(err)
	}
	appendT(t, w, []Record{{Tag: "a", Body: []byte(`{"m":1}`)}}, "")
	path, root, pageSize := manyStatePages(t, w, dir)
	garbage := make([]byte, 64)
	for i := range garbage {
		garbage[i] = 0x80 | byte(i*37)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(garbage, root*pageSize+16); err != nil {
		t.Fatal(err)
	}
	f.Close()
	var logs syncbuf.Buffer
	w, err = Open(dir, Options{CompactMinFileBytes: 1, CompactRatio: 1e9, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatalf("Open with compaction due over a damaged page: %v", err)
	}
	w.Close()
	if out := logs.String(); !strings.Contains(out, "could not compact the file") || !strings.Contains(out, "a page of the file is damaged") {
		t.Errorf("the damage met by compaction not said:\n%s", out)
	}
}

// A damaged page the writer meets (the entries' last leaf, which Open does
// not read, holds garbage) fails the WAL with the damage named: the append
// gets ErrFatal, and the process does not fault.
func TestWriterOverADamagedPage(t *testing.T) {
	dir := t.TempDir()
	w := openT(t, dir, Options{})
	body := make([]byte, 1500)
	rand.Read(body)
	for range 200 {
		appendT(t, w, []Record{{Tag: "a", Body: body}}, "")
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, FileName)
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	var root, ps int64
	_ = db.View(func(tx *bolt.Tx) error {
		root, ps = int64(tx.Bucket(bucketEntries).RootPage()), int64(tx.DB().Info().PageSize)
		return nil
	})
	db.Close()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	page := data[root*ps:]
	if flags := binary.LittleEndian.Uint16(page[8:]); flags != 0x01 {
		t.Fatalf("the entries' root is no branch: %#x", flags)
	}
	count := int(binary.LittleEndian.Uint16(page[10:]))
	last := int64(binary.LittleEndian.Uint64(page[16+16*(count-1)+8:])) // a branch element: pos, ksize, pgid
	leaf := data[last*ps:]
	for i := range int(binary.LittleEndian.Uint16(leaf[10:])) {
		binary.LittleEndian.PutUint32(leaf[16+16*i+4:], 0x7f000000) // the element's key position: past the page
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	w, err = Open(dir, Options{})
	if err != nil {
		t.Fatalf("Open (it reads the first leaf only): %v", err)
	}
	defer w.Close()
	_, err = w.Append(context.Background(), []Record{{Tag: "a", Body: []byte(`{}`)}}, AppendOptions{})
	var ce *CorruptionError
	if !errors.Is(err, ErrFatal) || !errors.As(err, &ce) && !strings.Contains(err.Error(), "a page of the file is damaged") {
		t.Fatalf("an append over a damaged page: %v, want ErrFatal naming the damage", err)
	}
	if w.Err() == nil {
		t.Error("the WAL did not fail")
	}
}
