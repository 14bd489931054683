package wal

import (
	"sort"
	"sync"
	"time"
)

// appendTimes remembers when records were committed since Open: for each
// second with commits of appends, the last sequence number committed in
// it. A sink's lag in seconds is then how long its oldest record has
// waited in the WAL, which no client's clock can shift (event times can be
// anything). Memory is bounded: at most maxAppendTimes seconds (a day of
// steady appends), the oldest forgotten first.
type appendTimes struct {
	mu    sync.Mutex
	floor uint64   // the lowest sequence number the seconds kept cover
	seqs  []uint64 // last sequence number committed in each second, ascending
	secs  []int64  // that second (Unix), ascending
}

const maxAppendTimes = 86400

// reset starts over at Open: next is the first sequence number to come.
func (a *appendTimes) reset(next uint64) {
	a.mu.Lock()
	a.floor, a.seqs, a.secs = next, nil, nil
	a.mu.Unlock()
}

// note records that sequence numbers up to last were committed at t.
func (a *appendTimes) note(last uint64, t time.Time) {
	sec := t.Unix()
	a.mu.Lock()
	defer a.mu.Unlock()
	if n := len(a.seqs); n > 0 && a.secs[n-1] == sec {
		a.seqs[n-1] = last
		return
	}
	if len(a.seqs) >= maxAppendTimes { // forget the oldest half
		half := len(a.seqs) / 2
		a.floor = a.seqs[half-1] + 1
		a.seqs = append(a.seqs[:0], a.seqs[half:]...)
		a.secs = append(a.secs[:0], a.secs[half:]...)
	}
	a.seqs = append(a.seqs, last)
	a.secs = append(a.secs, sec)
}

// at returns when seq was committed (to the second), and false for a
// sequence number committed before Open, forgotten, or not committed yet.
func (a *appendTimes) at(seq uint64) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if seq < a.floor {
		return time.Time{}, false
	}
	i := sort.Search(len(a.seqs), func(i int) bool { return a.seqs[i] >= seq })
	if i == len(a.seqs) {
		return time.Time{}, false
	}
	return time.Unix(a.secs[i], 0), true
}
