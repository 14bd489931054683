package queue

import (
	"math/bits"

	"github.com/logfwd/forwarder/sinks"
)

// queueArrays keeps the arrays of queues that partitions no longer use, a
// partition's forgotten or its queue moved to a larger array, for the
// queues that grow next: a partition that comes and goes, as most do
// when there are many of them, does not allocate its queue again each
// time, nor does the collector clear and scan new arrays. The arrays are
// kept by their capacity, a power of two, and cleared: no record is in
// them. It holds at most max records' places; the loop alone uses it.
type queueArrays struct {
	free  [64][]queueArray // by log2 of the capacity
	slots int              // the capacities of the arrays kept, summed
	max   int
}

// queueArray is the array of a queue and that of its records' sizes,
// of the same capacity.
type queueArray struct {
	recs  []sinks.Record
	sizes []int32
}

// get returns arrays for at least k records, and at most 2k: the largest
// power of two up to 2k.
func (a *queueArrays) get(k int) queueArray {
	c := bits.Len(uint(2*k)) - 1
	if n := len(a.free[c]); n > 0 {
		q := a.free[c][n-1]
		a.free[c][n-1] = queueArray{}
		a.free[c] = a.free[c][:n-1]
		a.slots -= cap(q.recs)
		return q
	}
	return queueArray{make([]sinks.Record, 1<<c), make([]int32, 1<<c)}
}

// put keeps q, whose records are cleared, unless its capacity is not one
// get returns. Beyond max places kept, smaller arrays make room for it,
// or it is not kept.
func (a *queueArrays) put(q queueArray) {
	n := cap(q.recs)
	if n == 0 || n&(n-1) != 0 || cap(q.sizes) != n || n > a.max {
		return
	}
	c := bits.Len(uint(n)) - 1
	for s := 0; s < c && a.slots+n > a.max; s++ {
		for len(a.free[s]) > 0 && a.slots+n > a.max {
			a.free[s][len(a.free[s])-1] = queueArray{}
			a.free[s] = a.free[s][:len(a.free[s])-1]
			a.slots -= 1 << s
		}
	}
	if a.slots+n > a.max {
		return
	}
	a.free[c] = append(a.free[c], queueArray{q.recs[:n], q.sizes[:n]})
	a.slots += n
}
