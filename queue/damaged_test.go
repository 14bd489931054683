package queue

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// TestDamagedEntryIsPassed: a WAL entry damaged on disk (a flipped byte in
// its payload, which its checksum catches) does not stop the sink at every
// start: the entry is replaced by placeholders (wal.ReplaceDamaged), the
// sink delivers every other record, never a placeholder, and its cursor
// passes the lost ones.
func TestDamagedEntryIsPassed(t *testing.T) {
	w, last := damagedWAL(t, "s")
	defer w.Close()
	s := newTestSink(sinks.Limits{MaxRecords: 50, MaxBytes: 1 << 20, MaxAge: time.Millisecond, Concurrency: 2})
	r := start(w, "s", s, Options{})
	waitCursor(t, w, "s", last, 10*time.Second)
	r.stop(t)
	got, order, _ := s.snapshot()
	for seq := uint64(1); seq <= last; seq++ {
		want := 1
		if seq > 100 && seq <= 200 {
			want = 0
		}
		if got[seq] != want {
			t.Errorf("record %d delivered %d times, want %d", seq, got[seq], want)
		}
	}
	if _, ok := order[wal.DamagedTag]; ok {
		t.Error("a placeholder was delivered")
	}
	if n := w.Stats().DamagedRecords; n != 100 {
		t.Errorf("DamagedRecords %d, want 100", n)
	}
}

// damagedWAL is a WAL of entries 1-100, 101-200 and 201-300 (3 tags),
// the second damaged on disk, with cursors registered before; it returns
// it open, and the last record.
func damagedWAL(t *testing.T, cursors ...string) (*wal.WAL, uint64) {
	t.Helper()
	dir := t.TempDir()
	w, err := wal.Open(dir, wal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cursors {
		if _, err := w.RegisterCursor(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	var last uint64
	for range 3 {
		last = appendN(t, w, 100, tagsOf(3), 200)
	}
	w.Close()
	flipEntry(t, filepath.Join(dir, wal.FileName), 101)
	if w, err = wal.Open(dir, wal.Options{}); err != nil {
		t.Fatal(err)
	}
	return w, last
}

// flipEntry flips a byte in the middle of the stored value of the WAL
// entry whose key is seq, in every copy the file holds (bbolt copies
// pages on write: free pages may hold older ones).
func flipEntry(t *testing.T, path string, seq uint64) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	var value []byte
	db.View(func(tx *bolt.Tx) error {
		value = bytes.Clone(tx.Bucket([]byte("entries")).Get(u64(seq))) // the WAL's bucket of entries (wal/doc.go)
		return nil
	})
	db.Close()
	if value == nil {
		t.Fatalf("no entry at %d", seq)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for i := 0; ; {
		j := bytes.Index(data[i:], value)
		if j < 0 {
			break
		}
		data[i+j+len(value)/2] ^= 0xff
		n++
		i += j + 1
	}
	if n == 0 {
		t.Fatalf("the entry at %d is not in the file", seq)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}
