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

// Idle connections give way after those in their handshake, the one idle
// the longest first; one at work again, or released, does not.
func TestSlotsIdle(t *testing.T) {
	s := NewSlots(3)
	closed := map[int]bool{}
	take := func(i int) (*Slot, bool) { return s.Take(func() { closed[i] = true }) }
	a, _ := take(0)
	b, _ := take(1)
	c, _ := take(2)
	a.Ready()
	c.Ready()
	if !a.Idle(true) || !c.Idle(true) || !b.Idle(true) {
		t.Fatal("Idle of a slot not evicted reported false")
	}
	// b is in its handshake (Idle does not change that): it goes first.
	d, evicted := take(3)
	if d == nil || !evicted || !closed[1] || closed[0] || closed[2] {
		t.Fatalf("d %v evicted %v closed %v: want b, in its handshake, closed", d, evicted, closed)
	}
	d.Ready()
	// Then a, idle the longest.
	e, evicted := take(4)
	if e == nil || !evicted || !closed[0] || closed[2] || !a.Evicted() || a.Idle(false) {
		t.Fatalf("e %v evicted %v closed %v: want a closed", e, evicted, closed)
	}
	e.Ready()
	// c at work again, d and e at work: refused.
	c.Idle(false)
	if f, evicted := take(5); f != nil || evicted || closed[2] {
		t.Fatalf("take with every slot at work: %v %v, closed %v", f, evicted, closed)
	}
	// d idle, then released: it holds no place in the idle list.
	d.Idle(true)
	d.Release()
	if s.Open() != 2 || s.idle.Len() != 0 {
		t.Fatalf("open %d, idle %d after a release", s.Open(), s.idle.Len())
	}
	if f, evicted := take(6); f == nil || evicted {
		t.Fatalf("a free slot not given: %v %v", f, evicted)
	}
	if s.Open() != 3 || a.Idle(true) {
		t.Fatalf("open %d", s.Open())
	}
}
