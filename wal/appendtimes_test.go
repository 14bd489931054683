package wal

import (
	"context"
	"testing"
	"time"
)

func TestAppendTimes(t *testing.T) {
	var a appendTimes
	a.reset(11) // records 1 to 10 were there at Open
	t0 := time.Unix(1_750_000_000, 0)
	a.note(12, t0)
	a.note(15, t0.Add(300*time.Millisecond)) // the same second
	a.note(20, t0.Add(2*time.Second))
	for _, c := range []struct {
		seq  uint64
		want time.Time
		ok   bool
	}{
		{10, time.Time{}, false}, // before Open
		{11, t0, true},
		{15, t0, true},
		{16, t0.Add(2 * time.Second), true},
		{20, t0.Add(2 * time.Second), true},
		{21, time.Time{}, false}, // not committed yet
	} {
		if got, ok := a.at(c.seq); ok != c.ok || !got.Equal(c.want) {
			t.Errorf("at(%d) = %v %v, want %v %v", c.seq, got, ok, c.want, c.ok)
		}
	}
	// Bounded: the oldest half is forgotten, and its records count as unknown.
	a.reset(1)
	for i := range maxAppendTimes + 1 {
		a.note(uint64(i+1), t0.Add(time.Duration(i)*time.Second))
	}
	if n := len(a.seqs); n > maxAppendTimes {
		t.Fatalf("%d seconds kept, bound %d", n, maxAppendTimes)
	}
	if _, ok := a.at(1); ok {
		t.Error("a forgotten second still answers")
	}
	if got, ok := a.at(maxAppendTimes + 1); !ok || !got.Equal(t0.Add(maxAppendTimes*time.Second)) {
		t.Errorf("the last second: %v %v", got, ok)
	}
}

// A record's age in the WAL is its time there, not its event time, which
// a client sets: a record dated a day ahead or a year back that was just
// appended is seconds old. Records from before Open are at least as old as
// the Open.
func TestAgeIsTimeInTheWAL(t *testing.T) {
	dir := t.TempDir()
	w := openT(t, dir, Options{})
	ctx := context.Background()
	old := Record{Tag: "t", Time: time.Now().Add(-365 * 24 * time.Hour).UnixNano(), Body: []byte(`{}`)}
	if _, err := w.Append(ctx, []Record{old}, AppendOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	w = openT(t, dir, Options{})
	defer w.Close()
	ahead := Record{Tag: "t", Time: time.Now().Add(24 * time.Hour).UnixNano(), Body: []byte(`{}`)}
	back := Record{Tag: "t", Time: time.Now().Add(-365 * 24 * time.Hour).UnixNano(), Body: []byte(`{}`)}
	if _, err := w.Append(ctx, []Record{ahead, back}, AppendOptions{}); err != nil {
		t.Fatal(err)
	}
	for seq := uint64(2); seq <= 3; seq++ {
		if age := w.Age(seq); age < 0 || age > 5*time.Second {
			t.Errorf("record %d appended just now: age %v", seq, age)
		}
	}
	// Appended before this Open: its event time, a year back, is all there is.
	if age := w.Age(1); age < 364*24*time.Hour {
		t.Errorf("record 1 from before Open: age %v, want its event time's", age)
	}
	if age := w.Age(4); age != 0 {
		t.Errorf("a record not there: age %v", age)
	}
}
