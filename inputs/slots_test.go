package inputs

import (
	"sync"
	"testing"
)

func TestSlots(t *testing.T) {
	s := NewSlots(3)
	closed := map[int]bool{}
	take := func(i int) (*Slot, bool) { return s.Take(func() { closed[i] = true }) }
	a, _ := take(0)
	b, _ := take(1)
	c, _ := take(2)
	if !a.Ready() {
		t.Fatal("a not ready")
	}
	// Full: the oldest in its handshake (b) makes room, and is closed.
	d, evicted := take(3)
	if d == nil || !evicted || !closed[1] || !b.Evicted() || b.Ready() || s.Open() != 3 {
		t.Fatalf("d %v evicted %v closed %v b.evicted %v open %d", d, evicted, closed, b.Evicted(), s.Open())
	}
	b.Release() // its goroutine ends: nothing more to give back
	if s.Open() != 3 {
		t.Fatalf("open %d after an evicted slot's release, want 3", s.Open())
	}
	c.Ready()
	d.Ready()
	// Every slot past its handshake: refused, nobody closed.
	if e, evicted := take(4); e != nil || evicted || len(closed) != 1 {
		t.Fatalf("take with every slot ready: %v %v, closed %v", e, evicted, closed)
	}
	a.Release()
	a.Release()
	if s.Open() != 2 {
		t.Fatalf("open %d, want 2", s.Open())
	}
	f, evicted := take(5)
	if f == nil || evicted {
		t.Fatal("a free slot not given")
	}
	f.Release() // released in its handshake
	if s.Open() != 2 || s.pending.Len() != 0 {
		t.Fatalf("open %d pending %d", s.Open(), s.pending.Len())
	}
}

// Concurrent takes, readies and releases never hold more than max slots
// and give every slot back.
func TestSlotsConcurrent(t *testing.T) {
	s := NewSlots(8)
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 200 {
				sl, _ := s.Take(func() {})
				if sl == nil {
					continue
				}
				if n := s.Open(); n > 8 {
					t.Errorf("%d slots open, max 8", n)
				}
				if (i+j)%3 == 0 {
					sl.Ready()
				}
				sl.Release()
			}
		}()
	}
	wg.Wait()
	if s.Open() != 0 || s.pending.Len() != 0 {
		t.Fatalf("open %d pending %d after every release", s.Open(), s.pending.Len())
	}
}
