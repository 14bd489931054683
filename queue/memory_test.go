package queue

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// The memory account's sums are those of the partitions' shares as last
// set, however often and in whatever order they are set.
func TestMemAccountSums(t *testing.T) {
	type set struct {
		part  int
		share memShare
	}
	cases := []struct {
		name string
		sets []set
		want memAccount
	}{
		{"nothing", nil, memAccount{}},
		{"one queue", []set{{0, memShare{queued: 100}}}, memAccount{queued: 100}},
		{"queue cut into a batch", []set{
			{0, memShare{queued: 300}},
			{0, memShare{queued: 100, batched: 200}},
		}, memAccount{queued: 100, batched: 200}},
		{"the batch fails and waits with its carry", []set{
			{0, memShare{batched: 200, carried: 50}},
			{0, memShare{batched: 200, carried: 50, waiting: 250}},
		}, memAccount{batched: 200, carried: 50, waiting: 250}},
		{"two partitions, one delivered", []set{
			{0, memShare{queued: 10, batched: 20, carried: 30}},
			{1, memShare{queued: 1, batched: 2, carried: 3, waiting: 5}},
			{0, memShare{queued: 10}},
		}, memAccount{queued: 11, batched: 2, carried: 3, waiting: 5}},
		{"set twice the same", []set{
			{0, memShare{queued: 7}},
			{0, memShare{queued: 7}},
		}, memAccount{queued: 7}},
		{"everything let go", []set{
			{0, memShare{queued: 7, batched: 8, carried: 9, waiting: 17}},
			{1, memShare{queued: 1}},
			{0, memShare{}},
			{1, memShare{}},
		}, memAccount{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var a memAccount
			shares := make([]memShare, 2)
			for _, s := range c.sets {
				a.set(&shares[s.part], s.share)
				if shares[s.part] != s.share {
					t.Fatalf("share kept %+v, set %+v", shares[s.part], s.share)
				}
			}
			if a != c.want {
				t.Fatalf("account %+v, want %+v", a, c.want)
			}
			if got, want := a.buffered(), c.want.queued+c.want.batched+c.want.carried; got != want {
				t.Fatalf("buffered %d, want %d", got, want)
			}
		})
	}
}

// Random shares set in random order: the account is always their sum.
func TestMemAccountRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var a memAccount
	shares := make([]memShare, 50)
	for step := range 10000 {
		i := rng.IntN(len(shares))
		a.set(&shares[i], memShare{rng.IntN(1000), rng.IntN(1000), rng.IntN(1000), rng.IntN(1000)})
		var sum memAccount
		for _, s := range shares {
			sum.queued += s.queued
			sum.batched += s.batched
			sum.carried += s.carried
			sum.waiting += s.waiting
		}
		if a != sum {
			t.Fatalf("step %d: account %+v, the shares add up to %+v", step, a, sum)
		}
	}
}

// A partHeap's top is always the largest (or smallest) key among the
// partitions filed in it, as keys change and partitions come and go.
func TestPartHeap(t *testing.T) {
	for _, max := range []bool{true, false} {
		t.Run(fmt.Sprint("max=", max), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, 4))
			h := newPartHeap(slotOldest, max)
			parts := make([]*partition, 200)
			keys := map[*partition]int64{}
			for i := range parts {
				parts[i] = &partition{key: fmt.Sprint(i)}
			}
			for step := range 20000 {
				p := parts[rng.IntN(len(parts))]
				if in := rng.IntN(3) > 0; in {
					k := rng.Int64N(1000)
					h.set(p, k, true)
					keys[p] = k
				} else {
					h.set(p, 0, false)
					delete(keys, p)
				}
				if h.Len() != len(keys) {
					t.Fatalf("step %d: %d in the heap, want %d", step, h.Len(), len(keys))
				}
				for _, q := range parts {
					if _, in := keys[q]; in != (q.slots[slotOldest] != 0) {
						t.Fatalf("step %d: %q filed %v, its slot %d", step, q.key, in, q.slots[slotOldest])
					}
				}
				top, key := h.top()
				if len(keys) == 0 {
					if top != nil {
						t.Fatalf("step %d: empty heap has %q on top", step, top.key)
					}
					continue
				}
				best := keys[top]
				for _, k := range keys {
					if max && k > best || !max && k < best {
						best = k
					}
				}
				if key != best || keys[top] != key {
					t.Fatalf("step %d: %q (%d, filed %d) on top, want key %d", step, top.key, key, keys[top], best)
				}
			}
		})
	}
}
