package queue

import (
	"runtime"
	"testing"

	"github.com/logfwd/forwarder/wal"
)

// TestReadBuffersOutliveCollections: the buffers a loop's readers decode
// into are kept across garbage collections (at the memory limit the heap
// is collected every few reads), and a reader that waits for appends leaves
// the loop no more than the two buffers of a reader that keeps up, trimmed.
func TestReadBuffersOutliveCollections(t *testing.T) {
	w := openWAL(t, wal.Options{})
	defer w.Close()
	appendN(t, w, 30000, func(int) string { return "a" }, 250)

	var b readBuffers
	rd := w.NewReader(1)
	var got []*wal.ReadBuffer
	for range 3 { // 3 x 10,000 records of 250 bytes: buffers of a backlog
		buf := b.get(true)
		recs, err := rd.ReadInto(10000, readBytes, buf)
		if err != nil || len(recs) != 10000 {
			t.Fatalf("read %d records: %v", len(recs), err)
		}
		got = append(got, buf)
	}
	for _, buf := range got {
		b.put(buf)
	}
	runtime.GC()
	runtime.GC()
	if len(b.bufs) != 3 {
		t.Fatalf("%d buffers kept after two collections, want 3", len(b.bufs))
	}
	again := b.get(true)
	if again != got[2] {
		t.Fatal("get after two collections made a new buffer")
	}
	b.put(again)

	// Caught up: what is kept is cut to what a waiting reader keeps. These
	// buffers hold 10,000 records and 2.5 MB of bodies, more than that.
	if recs, err := rd.ReadInto(10000, readBytes, b.get(true)); err != nil || len(recs) != 0 {
		t.Fatalf("read %d records at the end: %v", len(recs), err)
	}
	b.wait()
	if len(b.bufs) > readBufferCapWaiting {
		t.Fatalf("%d buffers kept while the reader waits, want at most %d", len(b.bufs), readBufferCapWaiting)
	}
	// The catch-up reader's reads do not end the head reader's wait.
	b.put(b.get(false))
	big := &wal.ReadBuffer{}
	if _, err := w.NewReader(1).ReadInto(10000, readBytes, big); err != nil {
		t.Fatal(err)
	}
	if n, size := big.Cap(); n < 10000 || size < 10000*250 {
		t.Fatalf("a read of 10,000 records of 250 bytes made a buffer of %d records and %d bytes", n, size)
	}
	b.put(big)
	b.put(new(wal.ReadBuffer))
	b.put(new(wal.ReadBuffer))
	if len(b.bufs) > readBufferCapWaiting {
		t.Fatalf("%d buffers kept while the reader waits, want at most %d", len(b.bufs), readBufferCapWaiting)
	}
	for _, kept := range b.bufs {
		if n, size := kept.Cap(); n >= 10000 || size >= 10000*250 {
			t.Fatalf("a buffer of %d records and %d bytes is kept while the reader waits", n, size)
		}
	}
	b.drop()
	if len(b.bufs) != 0 {
		t.Fatalf("%d buffers kept after drop", len(b.bufs))
	}
}
