package inputs

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Errors of Hold.Grow.
var (
	// ErrOverBudget is a message or request that needs more memory than the
	// budget can ever give one: it is refused, never waited for.
	ErrOverBudget = errors.New("inputs: larger than the inputs' memory budget holds for one message")
	// ErrNoRoom is a wait for room that ended: its context ended first, or
	// every byte of the budget was held by others that were waiting too.
	ErrNoRoom = errors.New("inputs: no room in the inputs' memory budget")
)

// SmallHold is the most a hold may have for the Budget's reserve to serve
// it: a small message is read and decoded there even while large ones,
// complete or not, hold all of the rest.
const SmallHold = 64 << 10

// Budget bounds the bytes the inputs hold: what they have read of messages
// and request bodies, what decompressing gives, and the records decoded
// from them (the JSON bodies and the record slices), counted by the
// capacity of the buffers that hold them. Every buffer is reserved before
// it is allocated, and sized from bytes that have arrived. A connection or
// request that needs more than there is waits for room (the forward input
// reads no further: TCP backpressure) until others give back what they
// hold, or until its context ends.
//
// One hold may take all of the limit; holds of at most SmallHold may also
// take a reserve of a sixteenth more, which larger ones never touch, so
// that clients sending small messages are served while large messages,
// finished or not, hold all the rest. A hold that would pass the limit
// alone is ErrOverBudget at once. When every hold that holds bytes is
// waiting for more, none can ever be served: the one holding the least
// gives up (ErrNoRoom) and lets the others go on (breakDeadlock).
type Budget struct {
	limit int64 // all holds together, and the most one hold may take
	total int64 // all holds together, with the reserve for small ones

	mu      sync.Mutex
	used    int64
	holders int             // holds holding more than 0
	waiting map[*Hold]int64 // holds waiting in Grow, and for how much
	// favored is the waiter a broken deadlock was for (holding the most):
	// until it is served or gives up, other holds take only what leaves
	// room for it, so that what the victims free goes to it.
	favored *Hold
	wake    chan struct{} // closed (and made anew) when waiters should look again
	gauges  map[string]prometheus.Gauge
	waits   map[string]prometheus.Counter
	m       *Metrics
}

// NewBudget returns a budget of limit bytes, and a sixteenth of it more
// kept for small holds; m may be nil (no metrics).
func NewBudget(limit int64, m *Metrics) *Budget {
	b := &Budget{limit: limit, total: limit + limit/16, waiting: map[*Hold]int64{}, wake: make(chan struct{}),
		gauges: map[string]prometheus.Gauge{}, waits: map[string]prometheus.Counter{}, m: m}
	if m != nil {
		m.MemoryLimit.Set(float64(b.total))
	}
	return b
}

// Limit is the most one hold can ever take: the budget's size in bytes.
func (b *Budget) Limit() int64 { return b.limit }

// Total is the most all holds together take: the limit and the reserve
// for small ones.
func (b *Budget) Total() int64 { return b.total }

// Used is the bytes held now.
func (b *Budget) Used() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// Hold is what one connection or request holds of a budget. A nil *Hold
// (or one of a nil *Budget) holds nothing and never waits: decoding
// without a budget, in tests and tools. A Hold is used by one goroutine.
type Hold struct {
	b      *Budget
	n      int64
	gauge  prometheus.Gauge
	waits  prometheus.Counter
	doomed bool // picked to give up a wait that could never end (under b.mu)
}

// Hold returns an empty hold for a connection or request of input (the
// label of forwarder_input_memory_bytes).
func (b *Budget) Hold(input string) *Hold {
	if b == nil {
		return nil
	}
	h := &Hold{b: b}
	if b.m != nil {
		b.mu.Lock()
		g, ok := b.gauges[input]
		if !ok {
			g = b.m.MemoryHeld.WithLabelValues(input)
			b.gauges[input] = g
			b.waits[input] = b.m.MemoryWaits.WithLabelValues(input)
		}
		h.gauge, h.waits = g, b.waits[input]
		b.mu.Unlock()
	}
	return h
}

// Held is what h holds.
func (h *Hold) Held() int64 {
	if h == nil {
		return 0
	}
	return h.n
}

// Grow reserves n more bytes for h, waiting for room while there is none,
// until ctx ends. It returns ErrOverBudget, without waiting, when h would
// hold more than the budget ever gives one hold, and ErrNoRoom (with ctx's
// error, if that is why) when the wait ended without room.
func (h *Hold) Grow(ctx context.Context, n int64) error {
	if h == nil || h.b == nil || n <= 0 {
		return nil
	}
	b := h.b
	if total := h.n + n; total > b.limit && total > SmallHold {
		return fmt.Errorf("%w: %d bytes needed, at most %d for one", ErrOverBudget, total, b.limit)
	}
	b.mu.Lock()
	if b.fits(h, n) {
		b.take(h, n)
		b.mu.Unlock()
		return nil
	}
	if h.waits != nil {
		h.waits.Inc()
	}
	b.waiting[h] = n
	for {
		b.breakDeadlock()
		if h.doomed {
			h.doomed = false
			b.unwait(h)
			used := b.used
			b.mu.Unlock()
			return fmt.Errorf("%w: all of it is held by connections and requests that wait for more (%d bytes, %d of them by this one)", ErrNoRoom, used, h.n)
		}
		wake := b.wake
		b.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			b.mu.Lock()
			b.unwait(h)
			h.doomed = false
			// Holds that waited along with h may be in a deadlock now,
			// or fit: let them look again.
			b.wakeLocked()
			b.mu.Unlock()
			return fmt.Errorf("%w: %w", ErrNoRoom, ctx.Err())
		}
		b.mu.Lock()
		if b.fits(h, n) {
			h.doomed = false // room came: nothing to give up for
			b.unwait(h)
			b.take(h, n)
			b.mu.Unlock()
			return nil
		}
	}
}

// Release gives n of h's bytes back.
func (h *Hold) Release(n int64) {
	if h == nil || h.b == nil || n <= 0 {
		return
	}
	b := h.b
	b.mu.Lock()
	if n > h.n {
		n = h.n // never more than it holds
	}
	if n == 0 {
		b.mu.Unlock()
		return
	}
	h.n -= n
	b.used -= n
	if h.n == 0 {
		b.holders--
	}
	if len(b.waiting) > 0 {
		b.wakeLocked()
	}
	b.mu.Unlock()
	if h.gauge != nil {
		h.gauge.Sub(float64(n))
	}
}

// ReleaseAll gives back everything h holds.
func (h *Hold) ReleaseAll() {
	if h != nil {
		h.Release(h.n)
	}
}

func (b *Budget) fits(h *Hold, n int64) bool {
	if h.n+n <= SmallHold {
		return b.used+n <= b.total
	}
	if f := b.favored; f != nil && f != h {
		return b.used+n+b.waiting[f] <= b.limit // room left for the favored
	}
	return b.used+n <= b.limit
}

// unwait ends h's wait, and with it its favor.
func (b *Budget) unwait(h *Hold) {
	delete(b.waiting, h)
	if b.favored == h {
		b.favored = nil
		b.wakeLocked() // the others may fit now
	}
}

func (b *Budget) take(h *Hold, n int64) {
	if h.n == 0 {
		b.holders++
	}
	h.n += n
	b.used += n
	if h.gauge != nil {
		h.gauge.Add(float64(n))
	}
}

func (b *Budget) wakeLocked() {
	close(b.wake)
	b.wake = make(chan struct{})
}

// breakDeadlock picks a waiter to give up when every hold that holds bytes
// is waiting for more and none of them fits: no byte would ever be given
// back. The one holding the least gives up: it loses the least work, and
// the one holding the most, closest to whole, goes on: it is favored (what
// is freed is kept for it: others, and newcomers, take only what leaves
// it room), and when what is freed is not enough, the next deadlock takes
// the next least. Giving up the
// one holding the most, many large messages arriving at once took turns
// being closed just before they were whole, their clients sending them
// again at once: almost nothing got through.
func (b *Budget) breakDeadlock() {
	waitingHolders := 0
	var victim, most *Hold
	for w, n := range b.waiting {
		if b.fits(w, n) {
			b.wakeLocked() // it will go on
			return
		}
		if w.n > 0 {
			waitingHolders++
			if victim == nil || w.n < victim.n {
				victim = w
			}
			if most == nil || w.n > most.n {
				most = w
			}
		}
	}
	if victim == nil || waitingHolders < b.holders {
		return // a hold that is not waiting will give its bytes back
	}
	if b.favored == nil && most != victim {
		b.favored = most // what the victims free is for it
	}
	victim.doomed = true
	b.wakeLocked()
}
