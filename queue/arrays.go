package queue

import (
	"math/bits"

	"github.com/logfwd/forwarder/sinks"
)

// queueArrays keeps the arrays of queues that partitions no longer use, a
// partition's forgotten or its queue moved to a larger array, for the
// queues that grow next: a partition that comes and goes does not
// allocate its queue again each time, nor does the collector clear and
// scan new arrays. The arrays are kept by log2 of their capacity, and
// cleared: no record is in them. It holds at most max records' places;
// the loop alone uses it.
type queueArrays struct {
	free  [64][]queueArray // by log2 of the capacity, rounded down
	slots int              // the capacities of the arrays kept, summed
	max   int
}

// queueArray is the array of a queue and that of its records' sizes,
// of the same capacity.
type queueArray struct {
	recs  []sinks.Record
	sizes []int32
}

// get returns arrays for 2k records: kept ones of at least k and less
// than 4k, or new ones.
func (a *queueArrays) get(k int) queueArray {
	c := bits.Len(uint(2*k)) - 1 // 2^c <= 2k < 2^(c+1): a kept array of class c holds more than k
	if n := len(a.free[c]); n > 0 {
		q := a.free[c][n-1]
		a.free[c][n-1] = queueArray{}
		a.free[c] = a.free[c][:n-1]
		a.slots -= cap(q.recs)
		return q
	}
	return queueArray{make([]sinks.Record, 2*k), make([]int32, 2*k)}
}

// put keeps q, whose records are cleared. Beyond max places kept, smaller
// arrays make room for it, or it is not kept.
func (a *queueArrays) put(q queueArray) {
	n := cap(q.recs)
	if n == 0 || cap(q.sizes) != n || n > a.max {
		return
	}
	c := bits.Len(uint(n)) - 1
	for s := 0; s < c && a.slots+n > a.max; s++ {
		for len(a.free[s]) > 0 && a.slots+n > a.max {
			a.slots -= cap(a.free[s][len(a.free[s])-1].recs)
			a.free[s][len(a.free[s])-1] = queueArray{}
			a.free[s] = a.free[s][:len(a.free[s])-1]
		}
	}
	if a.slots+n > a.max {
		return
	}
	a.free[c] = append(a.free[c], queueArray{q.recs[:n], q.sizes[:n]})
	a.slots += n
}
