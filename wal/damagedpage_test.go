package wal

import (
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
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
	var b Batch
	for i := range 2000 { // a state bucket of many pages, under a branch page
		b.Put("s", fmt.Appendf(nil, "dead/%08d", i), []byte(strings.Repeat("x", 100)))
	}
	commitT(t, w, &b)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}

	path := filepath.Join(dir, FileName)
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	var root uint64
	var pageSize int
	_ = db.View(func(tx *bolt.Tx) error {
		root = uint64(tx.Bucket(bucketState).Bucket([]byte("s")).RootPage())
		pageSize = tx.DB().Info().PageSize
		return nil
	})
	db.Close()
	if root == 0 {
		t.Fatal("the state bucket is inline: no page to damage")
	}
	garbage := make([]byte, 64)
	rand.Read(garbage)
	for i := range garbage {
		garbage[i] |= 0x80 // page ids and offsets far past the file
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(garbage, int64(root)*int64(pageSize)+16); err != nil { // past the page's header
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
