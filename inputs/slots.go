package inputs

import (
	"container/list"
	"sync"
)

// Slots holds an input to max open connections, and keeps connections
// that have not finished their handshake from crowding out those that
// have. When every slot is taken, a new connection takes the slot of the
// oldest connection still in its handshake, which is closed; only when
// every open connection is past its handshake is the new one refused.
// nginx does the same when it runs out of worker_connections: it closes
// the oldest connections that have sent no request yet before refusing
// new ones. A client thus cannot lock others out by opening connections
// that never authenticate: each holds a slot only until handshake_timeout
// or until newer connections need its slot, whichever comes first, and a
// legitimate client's handshake takes milliseconds.
type Slots struct {
	mu      sync.Mutex
	max     int
	open    int       // slots held, evicted ones not counted
	pending list.List // of *Slot: connections in their handshake, oldest first
}

// NewSlots returns max slots.
func NewSlots(max int) *Slots { return &Slots{max: max} }

// Slot is one connection's place. It starts in the handshake.
type Slot struct {
	s       *Slots
	elem    *list.Element // in s.pending while in the handshake
	close   func()
	evicted bool
	gone    bool // released or evicted: holds no slot
}

// Take gives a new connection a slot, in its handshake; closeConn closes
// the connection, should a newer one need its slot before the handshake
// is over. Take returns nil when every slot is held by a connection past
// its handshake. evicted reports that an older connection in its handshake
// was closed to make room.
func (s *Slots) Take(closeConn func()) (slot *Slot, evicted bool) {
	s.mu.Lock()
	var victim *Slot
	if s.open >= s.max {
		front := s.pending.Front()
		if front == nil {
			s.mu.Unlock()
			return nil, false
		}
		victim = s.pending.Remove(front).(*Slot)
		victim.elem, victim.evicted, victim.gone = nil, true, true
		s.open--
	}
	slot = &Slot{s: s, close: closeConn}
	slot.elem = s.pending.PushBack(slot)
	s.open++
	s.mu.Unlock()
	if victim != nil {
		victim.close()
	}
	return slot, victim != nil
}

// Ready marks the connection as past its handshake: its slot is its own
// until Release. It reports false when the connection was evicted first.
func (sl *Slot) Ready() bool {
	sl.s.mu.Lock()
	defer sl.s.mu.Unlock()
	if sl.elem != nil {
		sl.s.pending.Remove(sl.elem)
		sl.elem = nil
	}
	return !sl.evicted
}

// Evicted reports whether a newer connection took the slot while this one
// was in its handshake (and closed it).
func (sl *Slot) Evicted() bool {
	sl.s.mu.Lock()
	defer sl.s.mu.Unlock()
	return sl.evicted
}

// Release gives the slot back, once the connection is closed. Calling it
// again, or after an eviction, does nothing.
func (sl *Slot) Release() {
	sl.s.mu.Lock()
	defer sl.s.mu.Unlock()
	if sl.gone {
		return
	}
	sl.gone = true
	if sl.elem != nil {
		sl.s.pending.Remove(sl.elem)
		sl.elem = nil
	}
	sl.s.open--
}

// Open is the number of slots held.
func (s *Slots) Open() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.open
}
