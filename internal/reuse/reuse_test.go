package reuse

import (
	"runtime"
	"sync"
	"testing"
)

// TestKeptOutliveCollections: the values kept for good come back after
// garbage collections; the pooled ones may not.
func TestKeptOutliveCollections(t *testing.T) {
	b := Buffers[*[]byte]{Keep: 2}
	var made []*[]byte
	for range 5 {
		p := new([]byte)
		*p = make([]byte, 0, 1<<20)
		made = append(made, p)
		b.Put(p)
	}
	runtime.GC()
	runtime.GC()
	runtime.GC()
	got := map[*[]byte]bool{}
	for {
		p, ok := b.Get()
		if !ok {
			break
		}
		got[p] = true
		if len(got) > 5 {
			t.Fatal("more values came back than were put")
		}
	}
	if !got[made[0]] || !got[made[1]] {
		t.Fatalf("the first two values put (kept for good) did not come back after three collections: %v", got)
	}
}

// TestZeroKeepsNone: the zero value is a sync.Pool, and Get on an empty
// one says so.
func TestZeroKeepsNone(t *testing.T) {
	var b Buffers[*int]
	if _, ok := b.Get(); ok {
		t.Fatal("Get of an empty Buffers returned a value")
	}
	v := 7
	b.Put(&v)
	if len(b.kept) != 0 {
		t.Fatalf("%d kept for good with Keep 0", len(b.kept))
	}
}

// TestConcurrent is for the race detector: Get and Put from many goroutines.
func TestConcurrent(t *testing.T) {
	b := Buffers[*[]byte]{Keep: 3}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				p, ok := b.Get()
				if !ok {
					p = new([]byte)
				}
				*p = append((*p)[:0], 1)
				b.Put(p)
			}
		}()
	}
	wg.Wait()
	if len(b.kept) > 3 {
		t.Fatalf("%d kept for good, Keep is 3", len(b.kept))
	}
}

// TestKeepIf: a value KeepIf refuses is only pooled, however few are kept.
func TestKeepIf(t *testing.T) {
	b := Buffers[*[]byte]{Keep: 2, KeepIf: func(p *[]byte) bool { return cap(*p) <= 1<<20 }}
	big, small := new([]byte), new([]byte)
	*big, *small = make([]byte, 0, 4<<20), make([]byte, 0, 1<<20)
	b.Put(big)
	b.Put(small)
	if len(b.kept) != 1 || b.kept[0] != small {
		t.Fatalf("kept %d values for good, want only the small one", len(b.kept))
	}
}
