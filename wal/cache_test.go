package wal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// registerT registers a cursor for each sink.
func registerT(t testing.TB, w *WAL, sinks ...string) {
	t.Helper()
	for _, s := range sinks {
		if _, err := w.RegisterCursor(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReadCacheSharesDecodedEntries: with two sinks' cursors, what one
// reader decoded is cached for the other, which gets the same records in
// memory of its own (its buffer, not the cache's, nor the other reader's):
// writing over them changes nothing another read returns. With one cursor
// nothing is cached.
func TestReadCacheSharesDecodedEntries(t *testing.T) {
	w := openT(t, t.TempDir(), Options{})
	defer w.Close()
	r := rand.New(rand.NewSource(4))
	var all []Record
	for i := range 10 {
		recs := makeRecords(r, fmt.Sprint(i), 500, 100+r.Intn(400))
		for j := range recs {
			recs[j].Tag = []string{"a", "b", "b", ""}[(i+j)%4]
		}
		appendT(t, w, recs, "")
		all = append(all, recs...)
	}
	check := func(got []Record, from int) {
		t.Helper()
		for i, g := range got {
			want := all[from-1+i]
			if g.Seq != uint64(from+i) || g.Time != want.Time || g.Tag != want.Tag || !bytes.Equal(g.Body, want.Body) {
				t.Fatalf("record %d: got %d %q %q, want %q %q", from+i, g.Seq, g.Tag, g.Body, want.Tag, want.Body)
			}
		}
	}

	registerT(t, w, "a")
	if _, err := w.ReadInto(1, 1000, 0, new(ReadBuffer)); err != nil {
		t.Fatal(err)
	}
	if n := len(w.cache.entries); n != 0 {
		t.Fatalf("one cursor: %d entries cached", n)
	}

	registerT(t, w, "b")
	var bufs [2]ReadBuffer
	rds := [2]*Reader{w.NewReader(1), w.NewReader(1)}
	for rds[1].Position() <= uint64(len(all)) {
		var got [2][]Record
		for j, rd := range rds {
			from := int(rd.Position())
			recs, err := rd.NextInto(context.Background(), 700, 0, &bufs[j])
			if err != nil {
				t.Fatal(err)
			}
			check(recs, from)
			got[j] = recs
		}
		if len(w.cache.entries) == 0 {
			t.Fatal("two cursors: nothing cached")
		}
		// The second reader's bodies are its own: overwrite them.
		for _, g := range got[1] {
			if len(g.Body) > 0 && !within(g.Body, bufs[1].raw[:cap(bufs[1].raw)]) {
				t.Fatalf("record %d: body outside the reader's buffer", g.Seq)
			}
			for i := range g.Body {
				g.Body[i] = 'x'
			}
		}
		check(got[0], int(got[0][0].Seq))
	}
	for from := 1; from <= len(all); from += 999 {
		recs, err := w.ReadInto(uint64(from), 999, 0, new(ReadBuffer))
		if err != nil {
			t.Fatal(err)
		}
		check(recs, from)
	}

	// A sink's cursor dropped: the cache is emptied and off.
	if err := w.DropCursor(context.Background(), "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := w.ReadInto(1, 1000, 0, new(ReadBuffer)); err != nil {
		t.Fatal(err)
	}
	if n := len(w.cache.entries); n != 0 {
		t.Fatalf("one cursor left: %d entries cached", n)
	}
}

// TestReadCacheChecksDamage: an entry damaged after it was read and cached
// is still reported: a read checks the stored value's checksum before it
// uses the cached records.
func TestReadCacheChecksDamage(t *testing.T) {
	w := openT(t, t.TempDir(), Options{})
	defer w.Close()
	registerT(t, w, "a", "b")
	r := rand.New(rand.NewSource(5))
	for i := range 3 {
		appendT(t, w, makeRecords(r, fmt.Sprint(i), 100, 300), "")
	}
	if _, err := w.ReadInto(1, 0, 0, new(ReadBuffer)); err != nil {
		t.Fatal(err)
	}
	if len(w.cache.entries) != 3 {
		t.Fatalf("%d entries cached, want 3", len(w.cache.entries))
	}
	err := w.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketEntries)
		v := bytes.Clone(b.Get(seqKey(101)))
		v[len(v)-1] ^= 0x40 // the payload; the header, checksum included, is the same
		return b.Put(seqKey(101), v)
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, from := range []uint64{1, 101, 150} {
		_, err := w.ReadInto(from, 0, 0, new(ReadBuffer))
		var ce *CorruptionError
		if !errors.As(err, &ce) || ce.FirstSeq != 101 || !errors.Is(err, errChecksum) {
			t.Fatalf("read from %d over a damaged cached entry: %v, want a checksum mismatch of the entry at 101", from, err)
		}
	}
}

// TestReadCacheBound: the cache holds at most DefaultReadCacheBytes, counted as
// the memory its entries hold, and keeps the entries of the highest keys.
func TestReadCacheBound(t *testing.T) {
	w := openT(t, t.TempDir(), Options{})
	defer w.Close()
	registerT(t, w, "a", "b")
	recs := benchRecords(benchBodies(1000, 250))
	for range 60 {
		appendT(t, w, recs, "")
	}
	var buf ReadBuffer
	rd := w.NewReader(1)
	for rd.Position() <= 60000 {
		if _, err := rd.NextInto(context.Background(), 5000, 0, &buf); err != nil {
			t.Fatal(err)
		}
		c := &w.cache
		size := 0
		for i, e := range c.entries {
			size += e.size()
			if i > 0 && e.first <= c.entries[i-1].first {
				t.Fatalf("cached entries out of order: %d after %d", e.first, c.entries[i-1].first)
			}
		}
		if size != c.size || size > DefaultReadCacheBytes {
			t.Fatalf("cache counts %d bytes, holds %d, bound %d", c.size, size, DefaultReadCacheBytes)
		}
	}
	if c := &w.cache; c.size < DefaultReadCacheBytes*3/4 || c.entries[len(c.entries)-1].first+300 < 60000 {
		t.Fatalf("after reading %d MiB: %d bytes cached, last entry %d", 60000*250>>20, c.size, c.entries[len(c.entries)-1].first)
	}
	// A read behind what is cached caches nothing in its place.
	before := w.cache.entries[0].first
	if _, err := w.ReadInto(1, 1000, 0, new(ReadBuffer)); err != nil {
		t.Fatal(err)
	}
	if w.cache.entries[0].first != before {
		t.Fatalf("a read of records 1-1000 evicted entries from %d on", before)
	}
}

// TestReadCacheOption: Options.ReadCacheBytes bounds the cache, and a
// negative one turns it off however many sinks read.
func TestReadCacheOption(t *testing.T) {
	for _, bound := range []int{1 << 20, -1} {
		w := openT(t, t.TempDir(), Options{ReadCacheBytes: bound})
		registerT(t, w, "a", "b")
		recs := benchRecords(benchBodies(1000, 250))
		for range 20 {
			appendT(t, w, recs, "")
		}
		var buf ReadBuffer
		for rd := w.NewReader(1); rd.Position() <= 20000; {
			if _, err := rd.NextInto(context.Background(), 5000, 0, &buf); err != nil {
				t.Fatal(err)
			}
		}
		switch size := w.cache.size; {
		case bound < 0 && (size != 0 || w.readCache() != nil):
			t.Errorf("ReadCacheBytes %d: %d bytes cached", bound, size)
		case bound > 0 && (size == 0 || size > bound):
			t.Errorf("ReadCacheBytes %d: %d bytes cached", bound, size)
		}
		w.Close()
	}
}

// TestReadCacheConcurrent: readers reading the same entries at once get
// the same records (run with -race).
func TestReadCacheConcurrent(t *testing.T) {
	w := openT(t, t.TempDir(), Options{})
	defer w.Close()
	registerT(t, w, "a", "b")
	r := rand.New(rand.NewSource(6))
	var all []Record
	for i := range 20 {
		recs := makeRecords(r, fmt.Sprint(i), 500, 250)
		appendT(t, w, recs, "")
		all = append(all, recs...)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			var buf ReadBuffer
			rd := w.NewReader(1)
			for rd.Position() <= uint64(len(all)) {
				recs, err := rd.NextInto(context.Background(), 300, 0, &buf)
				if err != nil {
					t.Error(err)
					return
				}
				for _, g := range recs {
					if want := all[g.Seq-1]; g.Tag != want.Tag || g.Time != want.Time || !bytes.Equal(g.Body, want.Body) {
						t.Errorf("record %d differs", g.Seq)
						return
					}
				}
				for _, g := range recs {
					clear(g.Body)
				}
			}
		})
	}
	wg.Wait()
}
