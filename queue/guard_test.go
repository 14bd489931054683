package queue

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/logfwd/forwarder/internal/syncbuf"
	"github.com/logfwd/forwarder/internal/testseed"
	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

func TestGuardBoundsAndOverflows(t *testing.T) {
	w := openWAL(t, wal.Options{})
	defer w.Close()
	now := time.Unix(1000, 0)
	g, err := loadGuard(w, "s", 2, 1, false, now)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key  string
		seq  uint64
		want bool
	}{
		{"a", 1, true},  // admitted
		{"b", 2, true},  // admitted: the bound is reached
		{"c", 3, false}, // overflow
		{"a", 4, true},  // admitted before
		{"c", 5, false},
	} {
		if ok, _ := g.route(c.key, c.seq, now); ok != c.want {
			t.Fatalf("route(%s, %d) = %v, want %v", c.key, c.seq, ok, c.want)
		}
	}
	if g.open() != 2 {
		t.Fatalf("open %d, want 2", g.open())
	}
	// a was busy until now; b has been idle since 1000: b goes at 6.
	g.seenAt("a", now.Add(time.Hour))
	if n := g.letGo(6, now.Add(time.Minute), func(string) bool { return false }); n != 1 {
		t.Fatalf("let %d go, want 1 (b)", n)
	}
	for _, c := range []struct {
		key  string
		seq  uint64
		want bool
	}{
		{"b", 5, true},  // still b's: before it was let go
		{"c", 5, false}, // decided when it was read
		{"c", 6, true},  // b's room
		{"b", 7, false}, // the bound again
	} {
		if ok, _ := g.route(c.key, c.seq, now); ok != c.want {
			t.Fatalf("route(%s, %d) = %v, want %v", c.key, c.seq, ok, c.want)
		}
	}
}

// TestGuardRoutesTheSameAfterRestarts routes random records with random
// admissions, partitions let go, stores and restarts (losing what was not
// stored, as a kill does), and checks that every record routed before a
// store is routed the same way when it is read again after the restart,
// by the loop (route) and by a sink's Recover (admitted) alike; also when
// the bound changes at a restart. GUARD_SEED replays a run.
func TestGuardRoutesTheSameAfterRestarts(t *testing.T) {
	seed := testseed.Seed(t, "GUARD_SEED", "the records, keys and restarts")
	rng := rand.New(rand.NewPCG(uint64(seed), 1))
	w := openWAL(t, wal.Options{})
	defer w.Close()
	d := &Drainer{w: w, name: "s", log: slog.New(slog.DiscardHandler)}
	limit := 8
	clock := time.Unix(0, 0)
	g, err := loadGuard(w, "s", limit, 1, false, clock)
	if err != nil {
		t.Fatal(err)
	}
	type decision struct {
		key string
		ok  bool
	}
	var (
		decided  []decision  // by seq-1: the route each record got
		stored   int         // records whose routes are stored
		pos      = uint64(1) // the next record to read
		cursor   uint64
		restarts int
		letGo    int
		overflow int
	)
	key := func() string {
		if rng.IntN(4) == 0 {
			return fmt.Sprintf("k%d", rng.IntN(60)) // the rare ones
		}
		return fmt.Sprintf("k%d", rng.IntN(6))
	}
	for step := 0; step < 5000; step++ {
		clock = clock.Add(time.Second)
		switch r := rng.IntN(40); {
		case r < 30: // a read of a few records: read again up to the last one routed, then new ones
			for range 1 + rng.IntN(5) {
				seq := pos
				pos++
				if seq <= uint64(len(decided)) {
					want := decided[seq-1]
					if ok, _ := g.route(want.key, seq, clock); ok != want.ok {
						t.Fatalf("seed %d, restart %d: record %d (%s) routed %v again, it was routed %v", seed, restarts, seq, want.key, ok, want.ok)
					}
					continue
				}
				k := key()
				before := g.holding(seq)
				ok, _ := g.route(k, seq, clock)
				if !ok {
					overflow++
				}
				decided = append(decided, decision{k, ok})
				// A lower bound after a restart lets the partitions above
				// it stay, but admits none.
				if h := g.holding(seq); h > before && h > g.bound(seq) {
					t.Fatalf("seed %d: %d partitions hold record %d, bound %d", seed, h, seq, g.bound(seq))
				}
			}
			if err := d.commitGuard(context.Background(), g); err != nil {
				t.Fatal(err)
			}
			stored = max(stored, int(pos-1))
		case r < 34: // partitions let go
			for range 3 {
				g.seenAt(key(), clock)
			}
			letGo += g.letGo(pos, clock.Add(-5*time.Second), func(string) bool { return rng.IntN(3) == 0 })
			if err := d.commitGuard(context.Background(), g); err != nil {
				t.Fatal(err)
			}
		case r < 37: // the cursor moves; what no record after it needs goes
			cursor += uint64(rng.IntN(int(pos - cursor)))
			g.forget(cursor)
			if err := d.commitGuard(context.Background(), g); err != nil {
				t.Fatal(err)
			}
		case r < 38: // an unstored read of new records, then a kill
			if pos > uint64(len(decided)) {
				for range rng.IntN(4) {
					g.route(key(), pos, clock)
					pos++
				}
			}
			fallthrough
		default: // a restart, sometimes with another bound
			restarts++
			decided = decided[:stored] // what was not stored was never sent
			if rng.IntN(4) == 0 {
				limit = 2 + rng.IntN(12)
			}
			if g, err = loadGuard(w, "s", limit, uint64(len(decided)+1), false, clock); err != nil {
				t.Fatal(err)
			}
			if err := d.commitGuard(context.Background(), g); err != nil {
				t.Fatal(err)
			}
			// A sink's Recover; then the loop reads again from the cursor.
			for seq := cursor + 1; seq <= uint64(len(decided)); seq++ {
				want := decided[seq-1]
				if ok := g.admitted(want.key, seq); ok != want.ok {
					t.Fatalf("seed %d, restart %d: Recover routes record %d (%s) %v, it was routed %v", seed, restarts, seq, want.key, ok, want.ok)
				}
			}
			pos = cursor + 1
		}
	}
	t.Logf("%d records, %d overflowed, %d restarts, %d partitions let go", len(decided), overflow, restarts, letGo)
	if restarts < 50 || letGo < 20 || overflow < 100 {
		t.Fatalf("too little happened: %d restarts, %d let go, %d overflowed", restarts, letGo, overflow)
	}
}

// TestGuardKeepsOldRoutesWhenRepartitioned: a changed partitioning closes
// the intervals at the first record after those routed, so that an
// interrupted send of records before it is rebuilt as it was.
func TestGuardKeepsOldRoutesWhenRepartitioned(t *testing.T) {
	w := openWAL(t, wal.Options{})
	defer w.Close()
	d := &Drainer{w: w, name: "s", log: slog.New(slog.DiscardHandler)}
	now := time.Unix(0, 0)
	g, _ := loadGuard(w, "s", 1, 1, false, now)
	g.route("old", 1, now)
	if err := d.commitGuard(context.Background(), g); err != nil {
		t.Fatal(err)
	}
	g, err := loadGuard(w, "s", 1, 3, true, now)
	if err != nil {
		t.Fatal(err)
	}
	if !g.admitted("old", 2) || g.admitted("new", 2) {
		t.Fatal("records before the change are not routed as they were")
	}
	if ok, _ := g.route("new", 3, now); !ok {
		t.Fatal("a partition of the new partitioning is not admitted: the old one still takes the room")
	}
}

// overflowSink is a testSink whose partitions the drainer bounds: records
// beyond the bound go to partition "overflow".
type overflowSink struct {
	*testSink
	mu        sync.Mutex
	explained int
}

func (s *overflowSink) Overflow(r *sinks.Record) string         { return "overflow" }
func (s *overflowSink) Family(_ *sinks.Record, p string) string { return p }

var _ sinks.Overflower = (*overflowSink)(nil)

func (s *overflowSink) Explain(recs []sinks.Record) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.explained = len(recs)
	tags := map[string]bool{}
	for _, r := range recs {
		tags[r.Tag] = true
	}
	return fmt.Sprintf("${tag} took %d values", len(tags))
}

// TestMaxPartitionsOverflows: 100 tags under a bound of 10: the first ten
// tags read get their own partitions, every other record goes to the
// overflow partition, each record is delivered once, the warning names
// what the sink explains, and the routes hold across a restart; once
// partitions are idle, they are let go and new ones take their room.
func TestMaxPartitionsOverflows(t *testing.T) {
	w := openWAL(t, wal.Options{})
	defer w.Close()
	ts := newTestSink(sinks.Limits{MaxRecords: 50, MaxBytes: 1 << 20, MaxAge: 10 * time.Millisecond, Concurrency: 4, MaxPartitions: 10})
	ts.overflows = true
	s := &overflowSink{testSink: ts}
	var logs syncbuf.Buffer
	m := NewMetrics(nil)
	opts := Options{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Metrics: m, SummaryInterval: 50 * time.Millisecond, PartitionIdle: time.Hour,
		Fingerprint: "tags"}
	last := appendN(t, w, 2000, tagsOf(100), 40)
	r := start(w, "s", s, opts)
	waitCursor(t, w, "s", last, 20*time.Second)
	st := r.d.Status()
	for deadline := time.Now().Add(3 * time.Second); st.Overflowed < 1800 && time.Now().Before(deadline); st = r.d.Status() {
		time.Sleep(10 * time.Millisecond) // the status is updated every second
	}
	r.stop(t)
	ts.check(t)
	ts.deliveredOnce(t, last)
	_, order, _ := ts.snapshot()
	own := 0
	for p, seqs := range order {
		if p != "overflow" {
			own++
			if len(seqs) != 20 {
				t.Fatalf("partition %s got %d records, want all 20 of its tag", p, len(seqs))
			}
		}
	}
	if own != 10 || len(order["overflow"]) != 2000-200 {
		t.Fatalf("%d partitions of their own and %d records in the overflow, want 10 and 1800", own, len(order["overflow"]))
	}
	if st.Admitted != 10 || st.MaxPartitions != 10 || st.Overflowed != 1800 {
		t.Fatalf("status admitted %d max %d overflowed %d, want 10, 10, 1800", st.Admitted, st.MaxPartitions, st.Overflowed)
	}
	if !strings.Contains(logs.String(), "more partitions than max_partitions") || !strings.Contains(logs.String(), "${tag} took") {
		t.Fatalf("no warning naming the cause:\n%s", logs.String())
	}
	if n := strings.Count(logs.String(), "more partitions than max_partitions"); n > 2 {
		t.Fatalf("%d warnings for one burst, want at most one per interval", n)
	}

	// A restart: the ten admitted stay admitted, the others still overflow.
	last2 := appendN(t, w, 200, tagsOf(100), 40)
	r = start(w, "s", s, opts)
	waitCursor(t, w, "s", last2, 20*time.Second)
	r.stop(t)
	_, order2, _ := ts.snapshot()
	if len(order2["overflow"]) != 1800+180 {
		t.Fatalf("after the restart %d records in the overflow, want %d", len(order2["overflow"]), 1800+180)
	}

	// Idle partitions are let go: new tags get partitions of their own.
	opts.PartitionIdle = time.Millisecond
	r = start(w, "s", s, opts)
	for deadline := time.Now().Add(20 * time.Second); r.d.Status().Admitted != 0 || r.d.Status().MaxPartitions == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the idle partitions were not let go: status %+v", r.d.Status())
		}
	}
	last3 := appendN(t, w, 10, func(i int) string { return fmt.Sprintf("new%d", i) }, 40)
	waitCursor(t, w, "s", last3, 20*time.Second)
	r.stop(t)
	ts.check(t)
	ts.deliveredOnce(t, last3)
	_, order3, _ := ts.snapshot()
	for i := range 10 {
		if len(order3[fmt.Sprintf("new%d", i)]) != 1 {
			t.Fatalf("tag new%d has no partition of its own after the idle ones were let go", i)
		}
	}
	if got := testutil.ToFloat64(m.Overflowed.WithLabelValues("s")); got != 1800+180 {
		t.Fatalf("forwarder_sink_overflow_records_total %v, want %d", got, 1800+180)
	}
}

// A stop while the admitted partitions' commit waits for room on a full
// disk is a stop: Run returns nil and the status says stopped, not
// failed (which exited the service with status 1 on a plain SIGTERM);
// nothing read and not routed is passed by the cursor.
func TestStopWhileTheGuardWaitsForRoom(t *testing.T) {
	w := openWAL(t, wal.Options{})
	defer w.Close()
	ts := newTestSink(sinks.Limits{MaxRecords: 50, MaxBytes: 1 << 20, MaxAge: 10 * time.Millisecond, Concurrency: 4, MaxPartitions: 10})
	ts.overflows = true
	s := &overflowSink{testSink: ts}
	var logs syncbuf.Buffer
	opts := Options{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Fingerprint: "tags"}
	full := diskFullSwitch(t)
	first := appendN(t, w, 20, tagsOf(2), 40)
	r := start(w, "s", s, opts)
	waitCursor(t, w, "s", first, 10*time.Second)
	full.Store(true)
	appendN(t, w, 20, func(i int) string { return fmt.Sprintf("new%d", i%3) }, 40) // new partitions: a guard commit
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), "cannot store the admitted partitions (max_partitions): the WAL's disk is full; retrying"); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no wait for room:\n%s", logs.String())
		}
	}
	r.stop(t) // fails the test if Run returns an error
	if st := r.d.Status(); st.State != StateStopped {
		t.Errorf("state %s after the stop, want stopped (%s)", st.State, st.LastError)
	}
	if pos, _ := w.Cursor("s"); pos != first {
		t.Errorf("cursor %d after the stop, want %d: the records read while the disk was full are not delivered", pos, first)
	}
}

// A stop while a start-up commit waits for room on a full disk (the
// admitted partitions', the partitioning's) ends Run with nil and the
// status stopped, not starting.
func TestStopWhileStartingOnAFullDisk(t *testing.T) {
	w := openWAL(t, wal.Options{})
	defer w.Close()
	if _, err := w.RegisterCursor(context.Background(), "s"); err != nil {
		t.Fatal(err)
	}
	appendN(t, w, 20, tagsOf(2), 40)
	commit := walCommit
	walCommit = func(*wal.WAL, *wal.Batch) error { return fmt.Errorf("commit: %w", wal.ErrNoSpace) }
	defer func() { walCommit = commit }()
	ts := newTestSink(sinks.Limits{MaxRecords: 50, MaxBytes: 1 << 20, MaxAge: 10 * time.Millisecond, Concurrency: 4, MaxPartitions: 10})
	ts.overflows = true
	var logs syncbuf.Buffer
	r := start(w, "s", &overflowSink{testSink: ts}, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Fingerprint: "tags"})
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), "the WAL's disk is full; retrying"); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no wait for room at the start:\n%s", logs.String())
		}
	}
	r.stop(t)
	if st := r.d.Status(); st.State != StateStopped {
		t.Errorf("state %s after a stop during the start, want stopped", st.State)
	}
}
