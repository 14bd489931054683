package inputs

import (
	"container/list"
	"sync"
)

// Slots holds an input to max open connections, and keeps connections
// that have not finished their handshake, or that sit idle, from crowding
// out those at work. When every slot is taken, a new connection takes the
// slot of the oldest connection still in its handshake, or else of the
// connection idle the longest (one that marks itself idle between
// messages: Idle), which is closed (or told to finish what its socket
// holds and close: OnIdleEviction); only when every open connection is at
// work is the new one refused. nginx does the same when it runs out of
// worker_connections: it closes the oldest connections that have sent no
// request yet, and idle keep-alive ones, before refusing new ones. A
// client thus cannot lock others out by opening connections that never
// authenticate, or by leaving them idle: an idle connection is closed
// only when a newer one needs its slot, never on a timer (a client that
// writes without waiting for acks would lose the first message it writes
// into a connection closed under it).
type Slots struct {
	mu      sync.Mutex
	max     int
	open    int       // slots held, evicted ones not counted
	pending list.List // of *Slot: connections in their handshake, oldest first
	idle    list.List // of *Slot: connections past it that wait for a message, longest first
}

// NewSlots returns max slots.
func NewSlots(max int) *Slots { return &Slots{max: max} }

// Slot is one connection's place. It starts in the handshake.
type Slot struct {
	s        *Slots
	elem     *list.Element // in s.pending while in the handshake
	idleElem *list.Element // in s.idle while idle
	close    func()
	wake     func() // evicts an idle connection (OnIdleEviction); nil: close
	evicted  bool
	gone     bool // released or evicted: holds no slot
}

// Take gives a new connection a slot, in its handshake; closeConn closes
// the connection, should a newer one need its slot before the handshake
// is over or while it is idle. Take returns nil when every slot is held by
// a connection at work. evicted reports that an older connection, in its
// handshake or idle, was closed to make room.
func (s *Slots) Take(closeConn func()) (slot *Slot, evicted bool) {
	s.mu.Lock()
	var evict func() // how the victim is told: closed, or woken (OnIdleEviction)
	if s.open >= s.max {
		var victim *Slot
		switch {
		case s.pending.Len() > 0:
			victim = s.pending.Remove(s.pending.Front()).(*Slot)
			victim.elem, evict = nil, victim.close
		case s.idle.Len() > 0:
			victim = s.idle.Remove(s.idle.Front()).(*Slot)
			victim.idleElem, evict = nil, victim.close
			if victim.wake != nil {
				evict = victim.wake
			}
		default:
			s.mu.Unlock()
			return nil, false
		}
		victim.evicted, victim.gone = true, true
		s.open--
	}
	slot = &Slot{s: s, close: closeConn}
	slot.elem = s.pending.PushBack(slot)
	s.open++
	s.mu.Unlock()
	if evict != nil {
		evict()
	}
	return slot, evict != nil
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

// OnIdleEviction sets how the connection is told that a new one took its
// slot while it was idle, in place of closing it: an idle connection may
// have bytes of a message in its socket that it has not read yet, which a
// close would reset. wake must make it finish what it reads and close.
func (sl *Slot) OnIdleEviction(wake func()) {
	if sl == nil {
		return
	}
	sl.s.mu.Lock()
	defer sl.s.mu.Unlock()
	sl.wake = wake
}

// Idle marks the connection, past its handshake, as waiting for a message
// (true) or at work again (false): an idle one gives its slot to a new
// connection when every slot is taken. It reports false when the
// connection was evicted first. A nil slot (a connection outside Slots)
// is never evicted.
func (sl *Slot) Idle(idle bool) bool {
	if sl == nil {
		return true
	}
	sl.s.mu.Lock()
	defer sl.s.mu.Unlock()
	switch {
	case sl.gone:
	case idle && sl.idleElem == nil && sl.elem == nil:
		sl.idleElem = sl.s.idle.PushBack(sl)
	case !idle && sl.idleElem != nil:
		sl.s.idle.Remove(sl.idleElem)
		sl.idleElem = nil
	}
	return !sl.evicted
}

// Evicted reports whether a newer connection took the slot while this one
// was in its handshake or idle (and closed it).
func (sl *Slot) Evicted() bool {
	if sl == nil {
		return false
	}
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
	if sl.idleElem != nil {
		sl.s.idle.Remove(sl.idleElem)
		sl.idleElem = nil
	}
	sl.s.open--
}

// Open is the number of slots held.
func (s *Slots) Open() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.open
}
