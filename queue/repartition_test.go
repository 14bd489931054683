package queue

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/internal/syncbuf"
	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// renamingSink partitions by tag under a prefix, its partitioning: a
// change of prefix is a change of partitioning that it can route as before.
type renamingSink struct {
	*testSink
	prefix string
}

func (s *renamingSink) Partition(r *sinks.Record) string { return s.prefix + r.Tag }
func (s *renamingSink) Partitioning() []byte             { return []byte(s.prefix) }
func (s *renamingSink) Router(desc []byte, _ sinks.State) (func(*sinks.Record) string, error) {
	if strings.HasPrefix(string(desc), "other:") {
		return nil, fmt.Errorf("partitioning %q is another sink type's", desc) // as after a type change
	}
	return func(r *sinks.Record) string { return string(desc) + r.Tag }, nil
}

// TestMarksOfAnEarlierPartitioning: after a change of partitioning, the
// marks of the one before are read through it, so that what its
// partitions delivered is not sent again, and forgotten once the cursor
// passed them; a second change replaces them only with marks of its own;
// marks of a partitioning not described (an older build's) are dropped.
func TestMarksOfAnEarlierPartitioning(t *testing.T) {
	for _, c := range []struct {
		name  string
		state map[string]string // key → value: u64 for marks
		skip  map[string]uint64 // tag → records of it up to this skipped
	}{
		{"changed", map[string]string{"m/A:p00": "50", "m/A:p01": "30", "fingerprint": "A", "partitioning": "A:"},
			map[string]uint64{"p00": 50, "p01": 30}},
		{"changed again, marks between", map[string]string{"o/A:p00": "50", "old_partitioning": "A:", "m/B:p01": "30", "fingerprint": "B", "partitioning": "B:"},
			map[string]uint64{"p00": 50, "p01": 30}},
		{"three configurations", map[string]string{"o/A:p00": "50", "old_partitioning": "A:", "o1/B:p01": "40", "old_partitioning/1": "B:",
			"m/B2:p02": "30", "fingerprint": "B2", "partitioning": "B2:"},
			map[string]uint64{"p00": 50, "p01": 40, "p02": 30}},
		// Generation n marks p01 up to 3n+2: the one forgotten must be the oldest, 0.
		{"too many configurations: the oldest forgotten", map[string]string{"o/A:p00": "50", "old_partitioning": "A:",
			"o1/X1:p01": "5", "old_partitioning/1": "X1:", "o2/X2:p01": "8", "old_partitioning/2": "X2:", "o3/X3:p01": "11", "old_partitioning/3": "X3:",
			"o4/X4:p01": "14", "old_partitioning/4": "X4:", "o5/X5:p01": "17", "old_partitioning/5": "X5:", "o6/X6:p01": "20", "old_partitioning/6": "X6:",
			"o7/X7:p01": "23", "old_partitioning/7": "X7:", "m/B:p02": "30", "fingerprint": "B", "partitioning": "B:"},
			map[string]uint64{"p01": 23, "p02": 30}},
		// Generations whose marks the cursor passed (drop_oldest moves it
		// without them) do not count against the bound: generation 0, live,
		// is kept.
		{"configurations the cursor passed do not count", map[string]string{"cursor": "40", "o/A:p00": "50", "old_partitioning": "A:",
			"o1/X1:p01": "5", "old_partitioning/1": "X1:", "o2/X2:p01": "8", "old_partitioning/2": "X2:", "o3/X3:p01": "11", "old_partitioning/3": "X3:",
			"o4/X4:p01": "14", "old_partitioning/4": "X4:", "o5/X5:p01": "17", "old_partitioning/5": "X5:", "o6/X6:p01": "20", "old_partitioning/6": "X6:",
			"o7/X7:p01": "23", "old_partitioning/7": "X7:", "m/B:p02": "55", "fingerprint": "B", "partitioning": "B:"},
			map[string]uint64{"p00": 50, "p02": 55}},
		{"changed again, no marks between", map[string]string{"o/A:p00": "50", "old_partitioning": "A:", "fingerprint": "B", "partitioning": "B:"},
			map[string]uint64{"p00": 50}},
		{"described otherwise, same fingerprint", map[string]string{"m/B:p00": "50", "fingerprint": "C", "partitioning": "B:"},
			map[string]uint64{"p00": 50}},
		{"earlier partitioning not described", map[string]string{"m/A:p00": "50", "fingerprint": "A"}, nil},
		{"earlier partitioning another sink type's", map[string]string{"m/A:p00": "50", "fingerprint": "A", "partitioning": "other:"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &renamingSink{testSink: newTestSink(sinks.Limits{MaxRecords: 100, MaxBytes: 1 << 20, MaxAge: time.Millisecond, Concurrency: 1}), prefix: "C:"}
			checkEarlierMarks(t, s, s.testSink, Options{Fingerprint: "C"}, c.state, func(r wal.Record) bool {
				up, ok := c.skip[r.Tag]
				return ok && r.Seq <= up
			}, nil)
		})
	}
}

// sharedSink puts every record in one partition, its prefix: the
// partitioning of an S3 key without ${tag}.
type sharedSink struct {
	*testSink
	prefix string
}

func (s *sharedSink) Partition(*sinks.Record) string { return s.prefix }
func (s *sharedSink) Partitioning() []byte           { return []byte(s.prefix) }
func (s *sharedSink) Router(desc []byte, _ sinks.State) (func(*sinks.Record) string, error) {
	return func(*sinks.Record) string { return string(desc) }, nil
}

// TestMarksOfAnEarlierMatch: a partition that several tags share
// delivered ahead of the cursor under a match that took some of them;
// after a change of match, its mark covers only those tags: the records
// of a tag the wider match takes now are sent, not skipped as delivered.
func TestMarksOfAnEarlierMatch(t *testing.T) {
	for _, c := range []struct {
		name   string
		globs  []string
		state  map[string]string
		skip   func(r wal.Record) bool
		stored string // the match stored after the run
	}{
		{"widened", []string{"p01", "p00"}, map[string]string{"m/C:": "50", "fingerprint": "C", "partitioning": "C:", "match": `["p00"]`},
			func(r wal.Record) bool { return r.Tag == "p00" && r.Seq <= 50 }, `["p00","p01"]`},
		{"narrowed", []string{"p00"}, map[string]string{"m/C:": "50", "fingerprint": "C", "partitioning": "C:", "match": `["p00","p01"]`},
			func(r wal.Record) bool { return r.Tag == "p00" && r.Seq <= 50 }, `["p00"]`},
		{"the same, in another order", []string{"p01", "p00", "p01"}, map[string]string{"m/C:": "50", "fingerprint": "C", "partitioning": "C:", "match": `["p00","p01"]`},
			func(r wal.Record) bool { return r.Tag != "p02" && r.Seq <= 50 }, `["p00","p01"]`},
		{"widened after a change of partitioning", []string{"**"}, map[string]string{"o/A:": "50", "old_partitioning": "A:", "old_match": `["p01"]`, "fingerprint": "C", "partitioning": "C:", "match": `["p00"]`},
			func(r wal.Record) bool { return r.Tag == "p01" && r.Seq <= 50 }, `["**"]`},
		// Each configuration's marks cover what its match took: the first's
		// p00 and p01 up to 50, the second's p00 up to 20.
		{"narrowed, then widened again", []string{"p00", "p01"}, map[string]string{"o/A:": "50", "old_partitioning": "A:", "old_match": `["p00","p01"]`,
			"m/C:": "20", "fingerprint": "C", "partitioning": "C:", "match": `["p00"]`},
			func(r wal.Record) bool { return r.Tag != "p02" && r.Seq <= 50 }, `["p00","p01"]`},
		{"not stored before (an older build)", []string{"**"}, map[string]string{"m/C:": "50", "fingerprint": "C", "partitioning": "C:"},
			func(r wal.Record) bool { return r.Seq <= 50 }, `["**"]`},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &sharedSink{testSink: newTestSink(sinks.Limits{MaxRecords: 100, MaxBytes: 1 << 20, MaxAge: time.Millisecond, Concurrency: 1}), prefix: "C:"}
			checkEarlierMarks(t, s, s.testSink, Options{Fingerprint: "C", MatchGlobs: c.globs}, c.state, c.skip, map[string]string{"match": c.stored})
		})
	}
}

// checkEarlierMarks stores state in sink s's bucket of a WAL of 60
// records of three tags, runs a drainer with opts until its cursor passed
// them all, and checks that the records skip says were delivered before
// were skipped (and counted so), that every other record opts.MatchGlobs
// takes was delivered once, that no mark is left, and the fingerprint,
// partitioning and the keys of want stored.
func checkEarlierMarks(t *testing.T, s sinks.Sink, ts *testSink, opts Options, state map[string]string, skip func(wal.Record) bool, want map[string]string) {
	t.Helper()
	w := openWAL(t, wal.Options{})
	defer w.Close()
	ctx := context.Background()
	if _, err := w.RegisterCursor(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	last := appendN(t, w, 60, tagsOf(3), 10)
	var b wal.Batch
	var cursor uint64
	for k, v := range state {
		if k == "cursor" {
			fmt.Sscan(v, &cursor)
			b.SetCursor("s", cursor)
			continue
		}
		if i := strings.IndexByte(k, '/'); i == 1 || i == 2 { // m/, o/, o<n>/: a mark
			var n uint64
			fmt.Sscan(v, &n)
			b.Put("s", []byte(k), u64(n))
		} else {
			b.Put("s", []byte(k), []byte(v))
		}
	}
	if err := w.Commit(ctx, &b); err != nil {
		t.Fatal(err)
	}
	recs, err := w.Read(1, 100, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	match := func(string) bool { return true }
	if opts.MatchGlobs != nil {
		match = config.NewTagMatcher(opts.MatchGlobs).Match
	}
	skipped, unmatched := map[uint64]bool{}, map[uint64]bool{}
	for _, r := range recs {
		switch {
		case !match(r.Tag) || r.Seq <= cursor:
			unmatched[r.Seq] = true // not for this run to deliver
		case skip(r):
			skipped[r.Seq] = true
		}
	}
	m := NewMetrics(nil)
	opts.Metrics = m
	var logs syncbuf.Buffer
	opts.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	r := start(w, "s", s, opts)
	waitCursor(t, w, "s", last, 10*time.Second)
	r.stop(t)
	// The skips are said (by the summary at the stop at the latest).
	said := regexp.MustCompile(`msg="records not sent again: their partitions had delivered them before this start.* skipped=([0-9]+)`).FindAllStringSubmatch(logs.String(), -1)
	n := 0
	for _, m := range said {
		k, _ := strconv.Atoi(m[1])
		n += k
	}
	if n != len(skipped) {
		t.Errorf("the log says %d records skipped, want %d:\n%s", n, len(skipped), logs.String())
	}
	// What happens to the earlier marks is said once, one way.
	if out := logs.String(); strings.Contains(out, "read through the earlier configuration and not sent again") && strings.Contains(out, "cannot read what partitions delivered before") {
		t.Errorf("the log says both that the marks are kept and that they are forgotten:\n%s", out)
	}
	got, _, _ := ts.snapshot()
	for seq := uint64(1); seq <= last; seq++ {
		if want := map[bool]int{true: 0, false: 1}[skipped[seq] || unmatched[seq]]; got[seq] != want {
			t.Errorf("record %d delivered %d times, want %d", seq, got[seq], want)
		}
	}
	if n := testutil.ToFloat64(m.Skipped.WithLabelValues("s")); n != float64(len(skipped)) {
		t.Errorf("%v skipped, want %d", n, len(skipped))
	}
	left := map[string]string{}
	w.ScanState("s", nil, func(k, v []byte) error {
		left[string(k)] = string(v)
		return nil
	})
	for k := range left {
		if k[0] == 'o' || k[:2] == "m/" {
			t.Errorf("state key %q left after the cursor passed every record", k)
		}
	}
	if left["fingerprint"] != "C" || left["partitioning"] != "C:" {
		t.Errorf("stored fingerprint %q and partitioning %q, want C and C:", left["fingerprint"], left["partitioning"])
	}
	for k, v := range want {
		if left[k] != v {
			t.Errorf("stored %s %q, want %q", k, left[k], v)
		}
	}
}

// readBackSink shares one partition among every tag now, after a
// partitioning of a partition per tag, and reads each batch back with
// State.ReadRange as it sends it (as the S3 sink rebuilds an object whose
// staged file is lost): the read must give the batch's records.
type readBackSink struct {
	*testSink
	mu       sync.Mutex
	reads    int
	mismatch string
}

func (s *readBackSink) Partition(*sinks.Record) string { return "C:" }
func (s *readBackSink) Partitioning() []byte           { return []byte("C:") }
func (s *readBackSink) Router(desc []byte, _ sinks.State) (func(*sinks.Record) string, error) {
	return func(r *sinks.Record) string { return string(desc) + r.Tag }, nil
}

func (s *readBackSink) Send(ctx context.Context, b *sinks.Batch) (sinks.Outcome, error) {
	if len(b.Records) > 0 {
		recs, err := b.State.ReadRange(b.First(), b.Last(), func(r *sinks.Record) bool { return s.Partition(r) == b.Partition })
		var got, want []uint64
		for _, r := range recs {
			got = append(got, r.Seq)
		}
		for _, r := range b.Records {
			want = append(want, r.Seq)
		}
		s.mu.Lock()
		s.reads++
		if err != nil || !slices.Equal(got, want) {
			s.mismatch = fmt.Sprintf("batch %v read back as %v (%v)", want, got, err)
		}
		s.mu.Unlock()
	}
	return s.testSink.Send(ctx, b)
}

// TestReadRangeLeavesOutEarlierDeliveries: after a change of partitioning,
// a batch leaves out the records the earlier partitions delivered, and a
// sink reading the batch back while the loop runs (State.ReadRange) gets
// the same records, not those too.
func TestReadRangeLeavesOutEarlierDeliveries(t *testing.T) {
	s := &readBackSink{testSink: newTestSink(sinks.Limits{MaxRecords: 100, MaxBytes: 1 << 20, MaxAge: time.Millisecond, Concurrency: 1})}
	checkEarlierMarks(t, s, s.testSink, Options{Fingerprint: "C"},
		map[string]string{"m/A:p00": "50", "fingerprint": "A", "partitioning": "A:"},
		func(r wal.Record) bool { return r.Tag == "p00" && r.Seq <= 50 }, nil)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reads == 0 || s.mismatch != "" {
		t.Errorf("%d batches read back; %s", s.reads, s.mismatch)
	}
}
