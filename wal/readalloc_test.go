package wal

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"
	"unsafe"

	bolt "go.etcd.io/bbolt"
)

// entryFirsts lists the first sequence number of every entry.
func entryFirsts(t *testing.T, w *WAL) []uint64 {
	t.Helper()
	var out []uint64
	err := w.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketEntries).ForEach(func(k, _ []byte) error {
			out = append(out, binary.BigEndian.Uint64(k))
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestReadAllocations: Read allocates its result once, no larger than the
// entries it decoded, and the records of an entry that share a tag share
// its string, as do those of one read that share a tag; tags that differ
// stay right.
func TestReadAllocations(t *testing.T) {
	w := openT(t, t.TempDir(), Options{})
	defer w.Close()
	r := rand.New(rand.NewSource(1))
	var all []Record
	for i := range 10 {
		recs := makeRecords(r, fmt.Sprint(i), 1000, 250)
		if i == 9 {
			for j := range recs {
				recs[j].Tag = []string{"web.a", "web.b", "web.b", "", "web.b"}[j%5]
			}
		}
		appendT(t, w, recs, "")
		all = append(all, recs...)
	}
	firsts := entryFirsts(t, w)
	// entriesOf is how many entries hold seqs from..to, and how many
	// records those entries hold in all.
	entriesOf := func(from, to uint64) (entries, records int) {
		i := sort.Search(len(firsts), func(i int) bool { return firsts[i] > from }) - 1
		j := sort.Search(len(firsts), func(i int) bool { return firsts[i] > to })
		end := uint64(len(all)) + 1
		if j < len(firsts) {
			end = firsts[j]
		}
		return j - i, int(end - firsts[i])
	}

	// Records 1-9,000 have one tag; 9,001-10,000 alternate.
	for _, c := range []struct {
		from      uint64
		max, size int
	}{{1, 4000, 0}, {1, 4000, 300 << 10}, {777, 100, 0}, {8500, 1500, 0}, {9001, 1000, 0}} {
		got, err := w.Read(c.from, c.max, c.size)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 0 || c.size == 0 && len(got) != c.max {
			t.Fatalf("read %+v: %d records", c, len(got))
		}
		for i, g := range got {
			want := all[int(c.from)-1+i]
			if g.Seq != c.from+uint64(i) || g.Tag != want.Tag || string(g.Body) != string(want.Body) {
				t.Fatalf("read %+v: record %d is %d %q, want %d %q", c, i, g.Seq, g.Tag, c.from+uint64(i), want.Tag)
			}
		}
		// The records the entries read hold from c.from on; a read bounded
		// by bytes may count the next entry too.
		last := got[len(got)-1].Seq
		if c.size > 0 && last < uint64(len(all)) {
			last++
		}
		entries, records := entriesOf(c.from, last)
		records -= int(c.from - firsts[sort.Search(len(firsts), func(i int) bool { return firsts[i] > c.from })-1])
		if cap(got) > records {
			t.Errorf("read %+v: %d records in a slice of %d, from %d entries holding %d", c, len(got), cap(got), entries, records)
		}
	}

	// A raw buffer and a tag per entry, and one result; bbolt's read
	// transaction and cursors add a few more.
	const bboltAllocs = 40
	entries, _ := entriesOf(1, 4000)
	allocs := testing.AllocsPerRun(5, func() {
		if _, err := w.Read(1, 4000, 0); err != nil {
			t.Fatal(err)
		}
	})
	if limit := 2*entries + 1 + bboltAllocs; allocs > float64(limit) {
		t.Errorf("reading 4,000 records from %d entries took %v allocations, want at most %d", entries, allocs, limit)
	}

	// Interleaved tags are shared across the read too: a string per
	// distinct tag, not one per change of tag (400 here), and a small map.
	entries, _ = entriesOf(9001, 10000)
	allocs = testing.AllocsPerRun(5, func() {
		if _, err := w.Read(9001, 1000, 0); err != nil {
			t.Fatal(err)
		}
	})
	if limit := entries + 2 + 4 + 1 + bboltAllocs; allocs > float64(limit) {
		t.Errorf("reading 1,000 records of alternating tags from %d entries took %v allocations, want at most %d", entries, allocs, limit)
	}
}

// TestNextInto: reads into one ReadBuffer return the same records as Read,
// and after the first they decode into the buffer's memory instead of
// allocating the records' bytes and slice again.
func TestNextInto(t *testing.T) {
	w := openT(t, t.TempDir(), Options{})
	defer w.Close()
	r := rand.New(rand.NewSource(2))
	var all []Record
	for i := range 20 {
		recs := makeRecords(r, fmt.Sprint(i), 500, 100+r.Intn(400))
		appendT(t, w, recs, "")
		all = append(all, recs...)
	}
	var buf ReadBuffer
	rd := w.NewReader(1)
	next := 0
	for next < len(all) {
		got, err := rd.NextInto(context.Background(), 700, 64<<10, &buf)
		if err != nil {
			t.Fatal(err)
		}
		for i, g := range got {
			want := all[next+i]
			if g.Seq != uint64(next+i+1) || g.Tag != want.Tag || g.Time != want.Time || string(g.Body) != string(want.Body) {
				t.Fatalf("record %d: got %d %q, want %q", next+i+1, g.Seq, g.Tag, want.Tag)
			}
		}
		next += len(got)
	}

	// Once the buffer has grown to a read's size, a read decodes into it:
	// at least an allocation per entry fewer than a read into new memory
	// (its bytes; and the records' slice).
	entries := 0
	for _, f := range entryFirsts(t, w) {
		if f <= 4000 {
			entries++
		}
	}
	readInto := func(buf *ReadBuffer) float64 {
		return testing.AllocsPerRun(5, func() {
			if _, err := w.read(1, 4000, 0, buf); err != nil {
				t.Fatal(err)
			}
		})
	}
	fresh, reused := readInto(nil), readInto(&buf)
	if reused > fresh-float64(entries) {
		t.Errorf("reading 4,000 records of %d entries took %v allocations into a buffer, %v into new memory; want at least %d fewer", entries, reused, fresh, entries)
	}
}

// TestNextIntoDamagedHeader: a damaged entry header (its decoded length) is
// reported, and does not size the buffer a read decodes into: only entries
// that passed their checksums do.
func TestNextIntoDamagedHeader(t *testing.T) {
	w := openT(t, t.TempDir(), Options{})
	defer w.Close()
	r := rand.New(rand.NewSource(3))
	for i := range 3 {
		appendT(t, w, makeRecords(r, fmt.Sprint(i), 100, 300), "")
	}
	err := w.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketEntries)
		v := bytes.Clone(b.Get(seqKey(101)))
		v[6] = 0x7f // decoded length: about 2 GiB
		return b.Put(seqKey(101), v)
	})
	if err != nil {
		t.Fatal(err)
	}
	forgetRecent(w)
	var buf ReadBuffer
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 3 {
		_, err := w.NewReader(1).NextInto(context.Background(), 10000, 4<<20, &buf)
		var ce *CorruptionError
		if !errors.As(err, &ce) || ce.FirstSeq != 101 {
			t.Fatalf("read over a damaged header: %v, want a corruption of the entry at 101", err)
		}
	}
	runtime.ReadMemStats(&after)
	if grown := after.TotalAlloc - before.TotalAlloc; grown > 16<<20 {
		t.Fatalf("three reads over a damaged header allocated %d MiB", grown>>20)
	}
}

// TestNextIntoWaitingKeepsSmallBuffer: a reader that has caught up and waits
// for appends keeps a buffer the size of the reads that follow appends, and
// decodes the next read into it; a buffer past maxWaitingBuffer goes.
func TestNextIntoWaitingKeepsSmallBuffer(t *testing.T) {
	w := openT(t, t.TempDir(), Options{})
	defer w.Close()
	r := rand.New(rand.NewSource(3))
	for i := range 3 {
		appendT(t, w, makeRecords(r, fmt.Sprint(i), 200, 250), "")
	}
	ctx := context.Background()
	var buf ReadBuffer
	rd := w.NewReader(1)
	for range 2 { // the second read decodes into the memory the first one sized
		if _, err := rd.NextInto(ctx, 200, 0, &buf); err != nil {
			t.Fatal(err)
		}
	}
	if cap(buf.raw) == 0 || cap(buf.raw) > maxWaitingBuffer {
		t.Fatalf("buffer of %d bytes after two reads of 200 records", cap(buf.raw))
	}
	mem := buf.raw[:cap(buf.raw)]
	got := make(chan []Record, 1)
	third := make(chan struct{})
	go func() { // reads the third batch, then waits
		if _, err := rd.NextInto(ctx, 200, 0, &buf); err != nil {
			t.Error(err)
		}
		close(third)
		recs, err := rd.NextInto(ctx, 200, 0, &buf)
		if err != nil {
			t.Error(err)
		}
		got <- recs
	}()
	<-third
	time.Sleep(20 * time.Millisecond) // waiting for appends now
	appendT(t, w, makeRecords(r, "after", 100, 250), "")
	recs := <-got
	if len(recs) != 100 || recs[0].Seq != 601 {
		t.Fatalf("read %d records from %d, want 100 from 601", len(recs), recs[0].Seq)
	}
	if !within(recs[0].Body, mem) {
		t.Errorf("the read after waiting decoded into new memory, not into the buffer of %d bytes", cap(buf.raw))
	}

	// A buffer past maxWaitingBuffer is not kept while waiting.
	big := ReadBuffer{raw: make([]byte, 0, 2*maxWaitingBuffer)}
	done := make(chan []Record, 1)
	go func() {
		recs, err := rd.NextInto(ctx, 200, 0, &big)
		if err != nil {
			t.Error(err)
		}
		done <- recs
	}()
	time.Sleep(20 * time.Millisecond)
	appendT(t, w, makeRecords(r, "later", 10, 250), "")
	<-done
	if cap(big.raw) > maxWaitingBuffer {
		t.Errorf("a buffer of %d bytes was kept while the reader waited", cap(big.raw))
	}
}

// TestReadBufferKeptAcrossSizes: the reads of a reader that keeps up with
// appends find one append or a few, of varying size; after the first, they
// decode into the same memory, not into a buffer made again for each one
// larger than the last.
func TestReadBufferKeptAcrossSizes(t *testing.T) {
	w := openT(t, t.TempDir(), Options{})
	defer w.Close()
	r := rand.New(rand.NewSource(4))
	var buf ReadBuffer
	rd := w.NewReader(1)
	var mem []byte
	for i, n := range []int{100, 300, 200, 1200, 50, 2000, 800} {
		appendT(t, w, makeRecords(r, fmt.Sprint(i), n, 250), "")
		recs, err := rd.ReadInto(4000, 0, &buf)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) != n {
			t.Fatalf("read %d records, want %d", len(recs), n)
		}
		if i == 0 {
			mem = buf.raw[:cap(buf.raw)]
			continue
		}
		if !within(recs[0].Body, mem) || !within(recs[n-1].Body, mem) {
			t.Fatalf("read %d (%d records) decoded into new memory, not into the buffer of %d bytes the first read made", i, n, len(mem))
		}
	}
}

// TestBacklogReadsKeepTheirBuffer: reads of a backlog that stop at
// maxBytes of bodies decode more than that (each record's time, tag and
// length too); after the first reads, they decode into the same memory,
// not into a buffer made again at each read.
func TestBacklogReadsKeepTheirBuffer(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 33 MB to the WAL")
	}
	w := openT(t, t.TempDir(), Options{})
	defer w.Close()
	r := rand.New(rand.NewSource(5))
	tag := strings.Repeat("t", 75)
	for range 8 {
		recs := makeRecords(r, "b", 4000, 1000)
		for i := range recs {
			recs[i].Tag = tag
		}
		appendT(t, w, recs, "")
	}
	var buf ReadBuffer
	rd := w.NewReader(1)
	var mem []byte
	for i := range 7 {
		recs, err := rd.ReadInto(10000, 4<<20, &buf)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 0 {
			t.Fatalf("read %d found no records", i)
		}
		switch {
		case i == 2:
			mem = buf.raw[:cap(buf.raw)]
		case i > 2:
			for _, j := range []int{0, len(recs) / 2, len(recs) - 1} {
				if !within(recs[j].Body, mem) {
					t.Fatalf("read %d: record %d of %d decoded into new memory, not into the buffer of %d bytes the reads before used", i, j, len(recs), len(mem))
				}
			}
		}
	}
}

// within reports whether b's bytes lie in mem's memory.
func within(b, mem []byte) bool {
	p, lo := uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	return p >= lo && p < lo+uintptr(len(mem))
}
