package queue

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/logfwd/forwarder/sinks"
)

// bareLoop is a loop with no drainer: enough state for the watermark,
// the marks and the partitions' accounts, driven by hand.
func bareLoop(readPos uint64) *loop {
	l := &loop{
		lim:     sinks.Limits{MaxRecords: 1000, MaxBytes: 1 << 20, MaxAge: time.Hour, Concurrency: 4},
		readPos: readPos,
		parts:   map[string]*partition{},
		marks:   newMarkSet(),
		joined:  map[*partition]struct{}{},
	}
	l.initIndex(time.Now())
	return l
}

// queueRecs gives p queued records seqs, as ingest does, and files its
// first pending record.
func (l *loop) queueRecs(p *partition, now time.Time, seqs ...uint64) {
	for _, s := range seqs {
		rec := sinks.Record{Seq: s, Tag: p.key, Body: []byte(fmt.Sprint("body ", s))}
		p.queue = append(p.queue, rec)
		p.sizes = append(p.sizes, int32(len(rec.Body)))
		p.size += len(rec.Body)
		p.mem += recordMem(&rec)
		p.arrived(1, now)
	}
	if len(p.queue) > 0 {
		p.resetSpan()
	}
	l.touch(p)
	l.notePending(p)
}

func (l *loop) newPart(key string) *partition {
	p := &partition{key: key, heapIdx: -1}
	l.parts[key] = p
	return p
}

// The low watermark is one below the first record some partition has not
// delivered: queued, in a batch, carried, or spilled (to be read again).
func TestLowWatermark(t *testing.T) {
	now := time.Now()
	type part struct {
		queue      []uint64
		batch      []uint64 // a batch waiting to be sent again, before the queue
		carryFirst uint64   // a carry from this record up to the batch
		spillFrom  uint64
	}
	cases := []struct {
		name    string
		readPos uint64
		parts   []part
		want    uint64
	}{
		{"nothing held: everything read", 11, nil, 10},
		{"a queue", 11, []part{{queue: []uint64{5, 7}}}, 4},
		{"a batch before its queue", 11, []part{{batch: []uint64{3, 4}, queue: []uint64{7}}}, 2},
		{"a carry before its batch", 11, []part{{carryFirst: 2, batch: []uint64{6}}}, 1},
		{"a carry alone", 11, []part{{carryFirst: 9}}, 8},
		{"spilled: its records are read again", 11, []part{{spillFrom: 6}}, 5},
		{"the lowest of several", 101, []part{
			{queue: []uint64{50, 60}},
			{batch: []uint64{20}, queue: []uint64{70}},
			{carryFirst: 30, batch: []uint64{40}},
			{spillFrom: 25},
		}, 19},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := bareLoop(c.readPos)
			for i, cp := range c.parts {
				p := l.newPart(fmt.Sprint("p", i))
				if cp.carryFirst != 0 {
					p.carry, p.carryFirst, p.carryLast, p.carryRecs = emptyCarry{}, cp.carryFirst, cp.carryFirst, 1
				}
				for _, s := range cp.batch {
					p.batch = append(p.batch, sinks.Record{Seq: s})
					p.batchMem += recordMem(&p.batch[len(p.batch)-1])
				}
				if len(p.batch) > 0 || p.carry != nil {
					p.phase = phaseWaiting
				}
				if cp.spillFrom != 0 {
					p.spillFrom, p.reading = cp.spillFrom, readSpilled
				}
				l.queueRecs(p, now, cp.queue...)
				l.notePending(p)
			}
			if got := l.lowWatermark(); got != c.want {
				t.Fatalf("low watermark %d, want %d", got, c.want)
			}
			if err := l.check(); err != nil {
				t.Fatalf("loop state: %v", err)
			}
		})
	}
}

// emptyCarry is a carry of nothing (its memory is 0).
type emptyCarry struct{}

func (emptyCarry) Mem() int  { return 0 }
func (emptyCarry) Room() int { return 1 << 20 }

// Partitions deliver their records in order, in random amounts, while
// others are read: the low watermark never reaches a record not yet
// delivered, and is right behind the first one.
func TestLowWatermarkNeverPassesUndelivered(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	now := time.Now()
	l := bareLoop(1)
	delivered := map[uint64]bool{}
	var next uint64 = 1
	for step := range 5000 {
		if rng.IntN(2) == 0 || len(l.parts) == 0 {
			// Read a few records for random partitions.
			for range rng.IntN(20) + 1 {
				key := fmt.Sprint("p", rng.IntN(40))
				p := l.parts[key]
				if p == nil {
					p = l.newPart(key)
				}
				l.queueRecs(p, now, next)
				next++
				l.readPos = next
			}
		} else {
			// A random partition delivers its first few records.
			keys := make([]string, 0, len(l.parts))
			for k := range l.parts {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			p := l.parts[keys[rng.IntN(len(keys))]]
			n := min(len(p.queue), rng.IntN(5)+1)
			for _, r := range p.queue[:n] {
				delivered[r.Seq] = true
			}
			p.queue, p.sizes, p.arrivals = p.queue[n:], p.sizes[n:], nil
			p.size, p.mem = 0, 0
			for i := range p.queue {
				p.mem += recordMem(&p.queue[i])
				p.size += int(p.sizes[i])
				p.arrived(1, now)
			}
			l.touch(p)
			if p.empty() {
				l.forget(p) // its stale entries in the pending heap are dropped
			}
		}
		low := l.lowWatermark()
		for seq := uint64(1); seq <= low; seq++ {
			if !delivered[seq] {
				t.Fatalf("step %d: low watermark %d passes record %d, not delivered", step, low, seq)
			}
		}
		if low+1 < next && delivered[low+1] {
			t.Fatalf("step %d: low watermark %d, but %d is delivered too", step, low, low+1)
		}
	}
}

// when_full: drop_oldest moves the cursor past records the WAL dropped:
// the partition forgets those it queues or holds in a waiting batch, its
// accounts follow, and it reads from after them when it was spilled. A
// batch being sent is left to finish.
func TestDropOldest(t *testing.T) {
	now := time.Now()
	cases := []struct {
		name      string
		batch     []uint64
		sending   bool
		queue     []uint64
		spillFrom uint64
		pos       uint64
		wantBatch []uint64
		wantQueue []uint64
		wantSpill uint64
		wantPhase phase
	}{
		{"queue partly dropped", nil, false, []uint64{3, 5, 8}, 0, 5, nil, []uint64{8}, 0, phaseGathering},
		{"queue all dropped", nil, false, []uint64{3, 5}, 0, 9, nil, nil, 0, phaseGathering},
		{"waiting batch partly dropped", []uint64{2, 4}, false, []uint64{6}, 0, 2, []uint64{4}, []uint64{6}, 0, phaseWaiting},
		{"waiting batch all dropped: no batch", []uint64{2, 4}, false, []uint64{6}, 0, 4, nil, []uint64{6}, 0, phaseGathering},
		{"a batch being sent finishes", []uint64{2, 4}, true, []uint64{6}, 0, 5, []uint64{2, 4}, []uint64{6}, 0, phaseSending},
		{"spilled: read again from after the drop", []uint64{1}, false, nil, 3, 7, nil, nil, 8, phaseGathering},
		{"spilled at the last dropped record", nil, false, nil, 7, 7, nil, nil, 8, phaseGathering},
		{"spilled past the drop: unchanged", []uint64{9}, false, nil, 12, 7, []uint64{9}, nil, 12, phaseWaiting},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := bareLoop(20)
			p := l.newPart("p")
			for _, s := range c.batch {
				p.batch = append(p.batch, sinks.Record{Seq: s, Body: []byte("batched")})
				p.batchMem += recordMem(&p.batch[len(p.batch)-1])
			}
			if len(p.batch) > 0 {
				p.phase = phaseWaiting
				if c.sending {
					l.startSend(p)
				}
			}
			if c.spillFrom != 0 {
				p.spillFrom, p.reading = c.spillFrom, readSpilled
			}
			l.queueRecs(p, now, c.queue...)
			l.dropPart(p, c.pos, now)
			l.cursor = c.pos
			seqs := func(recs []sinks.Record) []uint64 {
				var out []uint64
				for _, r := range recs {
					out = append(out, r.Seq)
				}
				return out
			}
			if got := seqs(p.batch); !slices.Equal(got, c.wantBatch) {
				t.Errorf("batch %v, want %v", got, c.wantBatch)
			}
			if got := seqs(p.queue); !slices.Equal(got, c.wantQueue) {
				t.Errorf("queue %v, want %v", got, c.wantQueue)
			}
			if p.spillFrom != c.wantSpill || p.phase != c.wantPhase {
				t.Errorf("spilled from %d in phase %v, want %d, %v", p.spillFrom, p.phase, c.wantSpill, c.wantPhase)
			}
			mem := 0
			for i := range p.queue {
				mem += recordMem(&p.queue[i])
			}
			bmem := 0
			for i := range p.batch {
				bmem += recordMem(&p.batch[i])
			}
			if l.mem.queued != mem || l.mem.batched != bmem {
				t.Errorf("account %+v, the partition holds %d queued, %d batched", l.mem, mem, bmem)
			}
			if fp := p.firstPending(); fp != 0 && fp <= c.pos && !p.busy() {
				t.Errorf("first pending %d, at or below the dropped %d", fp, c.pos)
			}
			if err := l.check(); err != nil {
				t.Errorf("loop state: %v", err)
			}
		})
	}
}

// The marks the cursor reaches are taken, those past it stay, whatever
// order marks were set, moved and deleted in.
func TestMarkSet(t *testing.T) {
	s := newMarkSet()
	s.set("a", 10)
	s.set("b", 20)
	s.set("c", 30)
	s.set("a", 25) // moved on: its entry at 10 is stale
	s.del("b")
	var taken []string
	take := func(seq uint64) []string {
		taken = taken[:0]
		s.takeUpTo(seq, func(k string) { taken = append(taken, k) })
		slices.Sort(taken)
		return taken
	}
	for _, c := range []struct {
		upTo uint64
		want []string
		left int
	}{
		{5, nil, 2},
		{20, nil, 2}, // a's stale 10 and b's deleted 20 are not taken
		{25, []string{"a"}, 1},
		{29, nil, 1},
		{30, []string{"c"}, 0},
	} {
		if got := take(c.upTo); !slices.Equal(got, c.want) || s.len() != c.left {
			t.Fatalf("up to %d: took %v, %d left; want %v, %d", c.upTo, got, s.len(), c.want, c.left)
		}
		if err := s.check(); err != nil {
			t.Fatal(err)
		}
	}
	rng := rand.New(rand.NewPCG(7, 8))
	ref := map[string]uint64{}
	var cursor uint64
	for step := range 20000 {
		key := fmt.Sprint("k", rng.IntN(300))
		switch rng.IntN(4) {
		case 0, 1:
			seq := cursor + 1 + rng.Uint64N(100)
			s.set(key, seq)
			ref[key] = seq
		case 2:
			s.del(key)
			delete(ref, key)
		case 3:
			cursor += rng.Uint64N(10)
			var want []string
			for k, m := range ref {
				if m <= cursor {
					want = append(want, k)
					delete(ref, k)
				}
			}
			slices.Sort(want)
			if got := take(cursor); !slices.Equal(got, want) {
				t.Fatalf("step %d: up to %d took %v, want %v", step, cursor, got, want)
			}
		}
		if s.len() != len(ref) {
			t.Fatalf("step %d: %d marks, want %d", step, s.len(), len(ref))
		}
		for k, m := range ref {
			if got, ok := s.get(k); !ok || got != m {
				t.Fatalf("step %d: mark of %q is %d, %v; want %d", step, k, got, ok, m)
			}
		}
	}
	if err := s.check(); err != nil {
		t.Fatal(err)
	}
	if len(s.h) > 2*s.len()+1024 {
		t.Fatalf("%d heap entries for %d marks: stale entries are not dropped", len(s.h), s.len())
	}
}
