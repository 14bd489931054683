package queue

import (
	"testing"

	"github.com/logfwd/forwarder/sinks"
)

// TestQueueArrayShrinks: a partition whose queue once held a backlog does
// not keep the backlog's array while a trickle of records flows through
// it; an array left while a batch was in it goes once the batch is gone.
func TestQueueArrayShrinks(t *testing.T) {
	free := &queueArrays{max: 1 << 16}
	p := &partition{}
	seq := uint64(0)
	add := func(n int) {
		p.reserve(n, free)
		for range n {
			seq++
			p.queue = append(p.queue, sinks.Record{Seq: seq, Body: []byte("x")})
			p.sizes = append(p.sizes, 1)
		}
	}
	cut := func(n int) []sinks.Record {
		b := p.queue[:n:n]
		p.queue, p.sizes = p.queue[n:], p.sizes[n:]
		return b
	}
	add(100000)
	clear(cut(100000)) // delivered: its records cleared
	for range 50000 {
		add(10)
		clear(cut(10))
	}
	if c := cap(p.qbuf); c > 8*20 {
		t.Fatalf("a queue of at most 10 records keeps an array of %d places", c)
	}

	// A batch in the array when the queue grows out of it: the array waits
	// in prev, then goes at the next reserve after the batch is gone.
	add(10)
	p.batch = cut(10)
	add(1000)
	if p.prev.recs == nil {
		t.Fatal("the array holding the batch was not kept aside")
	}
	clear(p.batch)
	p.batch = nil
	add(1)
	if p.prev.recs != nil {
		t.Fatal("the array the batch was in is still held after the batch is gone")
	}
}

// TestArrayOwnersChecked: the loop's check finds an array held twice.
func TestArrayOwnersChecked(t *testing.T) {
	a := queueArray{make([]sinks.Record, 8), make([]int32, 8)}
	b := queueArray{make([]sinks.Record, 8), make([]int32, 8)}
	l := &loop{parts: map[string]*partition{
		"x": {key: "x", qbuf: a.recs, sbuf: a.sizes},
		"y": {key: "y", qbuf: b.recs, sbuf: b.sizes},
	}}
	if err := l.checkArrayOwners(); err != nil {
		t.Fatalf("arrays held once: %v", err)
	}
	for name, bad := range map[string]func(){
		"two partitions": func() { l.parts["y"].qbuf, l.parts["y"].sbuf = a.recs, a.sizes },
		"queue and left": func() { l.parts["x"].prev = a },
		"kept and held":  func() { l.arrays.free[3] = append(l.arrays.free[3], b) },
	} {
		saved := map[string]partition{"x": *l.parts["x"], "y": *l.parts["y"]}
		bad()
		if err := l.checkArrayOwners(); err == nil {
			t.Errorf("%s: an array held twice passes", name)
		}
		*l.parts["x"], *l.parts["y"] = saved["x"], saved["y"]
		l.arrays.free[3] = nil
	}
}

// TestIdlePartitionShedsArrays: a partition whose records all went (a
// tag that sends a read's worth now and then) gives its arrays back, so
// that thousands of such partitions do not each keep one sized for their
// largest read; the next read takes one of the kept arrays.
func TestIdlePartitionShedsArrays(t *testing.T) {
	free := &queueArrays{max: 1 << 16}
	p := &partition{}
	for i := range 100 {
		p.reserve(1, free)
		p.queue = append(p.queue, sinks.Record{Seq: uint64(i + 1), Body: []byte("x")})
		p.sizes = append(p.sizes, 1)
		if i == 0 {
			p.reserve(99, free) // one read of 100 records
		}
	}
	p.batch, p.queue, p.sizes = p.queue, p.queue[100:], p.sizes[100:]
	p.shedArrays(free)
	if p.qbuf == nil {
		t.Fatal("arrays shed while a batch is in them")
	}
	clear(p.batch) // delivered
	p.batch = nil
	p.shedArrays(free)
	if p.qbuf != nil || p.queue != nil || free.slots == 0 {
		t.Fatalf("an idle partition keeps arrays of %d places; %d kept for reuse", cap(p.qbuf), free.slots)
	}
	kept := free.slots
	p.reserve(100, free)
	if free.slots >= kept {
		t.Fatalf("the next read did not reuse a kept array: %d places kept before, %d after", kept, free.slots)
	}
}
