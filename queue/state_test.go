package queue

import (
	"bytes"
	"fmt"
	"maps"
	"runtime"
	"testing"

	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// ReadRange keeps what keep accepts and what the sink matches, from first
// to last, with bodies that outlive the reads; and it holds only those: the
// range of a quiet partition's batch can span much of the WAL, and a
// restart that rebuilt it must not need that much memory.
func TestReadRangeHoldsOnlyKept(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: reads a large WAL range and measures the heap; make test runs it")
	}
	w := openWAL(t, wal.Options{})
	defer w.Close()
	const n, bodySize = 60_000, 1000 // about 60 MB of bodies
	last := appendN(t, w, n, func(i int) string {
		switch {
		case i%500 == 0:
			return "quiet"
		case i%500 == 1:
			return "quiet.unmatched"
		}
		return fmt.Sprintf("busy%d", i%7)
	}, bodySize)
	all, err := w.ReadRange(1, last)
	if err != nil {
		t.Fatal(err)
	}
	want := map[uint64][]byte{}
	for _, r := range all {
		if r.Tag == "quiet" && r.Seq >= 3 && r.Seq <= last-2 {
			want[r.Seq] = bytes.Clone(r.Body)
		}
	}
	all = nil

	st := &sinkState{w: w, name: "s", match: func(tag string) bool { return tag != "quiet.unmatched" }}
	keepCalls := 0
	keep := func(r *sinks.Record) bool {
		keepCalls++
		return r.Tag == "quiet" || r.Tag == "quiet.unmatched"
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	got, err := st.ReadRange(3, last-2, keep)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if keepCalls != int(last-2-3+1)-len(want) {
		t.Errorf("keep was called %d times, want once for each of the %d matched records", keepCalls, int(last-4)-len(want))
	}
	if len(got) != len(want) {
		t.Fatalf("got %d records, want %d", len(got), len(want))
	}
	prev := uint64(0)
	for _, r := range got {
		if r.Seq <= prev {
			t.Fatalf("records out of order: %d after %d", r.Seq, prev)
		}
		prev = r.Seq
		if r.Tag != "quiet" || !bytes.Equal(r.Body, want[r.Seq]) {
			t.Fatalf("record %d: tag %q body %.40q, want tag quiet body %.40q", r.Seq, r.Tag, r.Body, want[r.Seq])
		}
	}
	// Reading the range whole allocates its 60 MB of bodies and more; this
	// allocates the pieces' buffers (4 MiB of bodies each, reused) and
	// what is kept (120 KB).
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("ReadRange allocated %.1f MiB", float64(alloc)/(1<<20))
	if alloc > 24<<20 {
		t.Errorf("ReadRange allocated %d MiB for %d KiB of kept records in a range of %d MiB", alloc>>20, len(want)*bodySize>>10, n*bodySize>>20)
	}
}

// ReadRangeAll keeps the records of every tag that keep accepts, whatever
// the sink's match: a batch begun under other globs is rebuilt with them.
func TestReadRangeAllPassesOverMatch(t *testing.T) {
	w := openWAL(t, wal.Options{})
	defer w.Close()
	last := appendN(t, w, 40, func(i int) string { return fmt.Sprintf("t%d", i%4) }, 50)
	st := &sinkState{w: w, name: "s", match: func(tag string) bool { return tag == "t0" }}
	keep := func(r *sinks.Record) bool { return r.Tag != "t3" }
	matched, err := st.ReadRange(1, last, keep)
	if err != nil {
		t.Fatal(err)
	}
	all, err := st.ReadRangeAll(1, last, keep)
	if err != nil {
		t.Fatal(err)
	}
	tags := func(recs []sinks.Record) map[string]int {
		n := map[string]int{}
		for _, r := range recs {
			n[r.Tag]++
		}
		return n
	}
	if got, want := tags(matched), map[string]int{"t0": 10}; !maps.Equal(got, want) {
		t.Errorf("ReadRange: %v, want %v", got, want)
	}
	if got, want := tags(all), map[string]int{"t0": 10, "t1": 10, "t2": 10}; !maps.Equal(got, want) {
		t.Errorf("ReadRangeAll: %v, want %v", got, want)
	}
}
