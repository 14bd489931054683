package main

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/logfwd/forwarder/wal"
)

// A damaged leaf page of the records' tree (garbage no checksum covers)
// does not end the dump: the records before it are saved, those it held
// are told as skipped, and the dump goes on after it.
func TestDumpPastADamagedPage(t *testing.T) {
	dir := t.TempDir()
	w, err := wal.Open(dir, wal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	pad := make([]byte, 1500)
	rand.Read(pad)
	for i := range 200 {
		if _, err := w.Append(t.Context(), []wal.Record{{Tag: "a", Body: []byte(fmt.Sprintf(`{"i":%d,"p":"%x"}`, i, pad))}}, wal.AppendOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	first := w.Stats().FirstSeq
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	// Garbage in the element headers of the middle leaf under the
	// entries bucket's root.
	path := filepath.Join(dir, wal.FileName)
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	var root, ps int64
	_ = db.View(func(tx *bolt.Tx) error {
		root, ps = int64(tx.Bucket([]byte("entries")).RootPage()), int64(tx.DB().Info().PageSize)
		return nil
	})
	db.Close()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	page := data[root*ps:]
	count := int(binary.LittleEndian.Uint16(page[10:]))
	if count < 3 {
		t.Fatalf("the entries' root has %d children: the test needs a branch of several leaves", count)
	}
	mid := int64(binary.LittleEndian.Uint64(page[16+16*(count/2)+8:]))
	leaf := data[mid*ps:]
	for i := range int(binary.LittleEndian.Uint16(leaf[10:])) {
		binary.LittleEndian.PutUint32(leaf[16+16*i+4:], 0x7f000000)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := wal.Open(dir, wal.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var out bytes.Buffer
	var told []string
	skipped, err := dump(&out, r, 0, 0, func(a, b uint64, err error) { told = append(told, fmt.Sprintf("%d-%d: %v", a, b, err)) })
	if err != nil {
		t.Fatalf("dump: %v", err)
	}
	lines := strings.Count(out.String(), "\n")
	if skipped != 1 || len(told) != 1 || !strings.Contains(told[0], "a page of the file is damaged") {
		t.Errorf("%d skipped, told %q; want one run of records on the damaged page", skipped, told)
	}
	for _, seq := range []uint64{first, first + 199} {
		if !strings.Contains(out.String(), fmt.Sprintf(`"seq":%d,`, seq)) {
			t.Errorf("record %d not saved (%d lines)", seq, lines)
		}
	}
	if lines >= 200 || lines < 100 {
		t.Errorf("%d records saved of 200, one leaf of several lost", lines)
	}
}
