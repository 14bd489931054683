package queue

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

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
			map[string]uint64{"p01": 30}},
		{"changed again, no marks between", map[string]string{"o/A:p00": "50", "old_partitioning": "A:", "fingerprint": "B", "partitioning": "B:"},
			map[string]uint64{"p00": 50}},
		{"described otherwise, same fingerprint", map[string]string{"m/B:p00": "50", "fingerprint": "C", "partitioning": "B:"},
			map[string]uint64{"p00": 50}},
		{"earlier partitioning not described", map[string]string{"m/A:p00": "50", "fingerprint": "A"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := openWAL(t, wal.Options{})
			defer w.Close()
			ctx := context.Background()
			if _, err := w.RegisterCursor(ctx, "s"); err != nil {
				t.Fatal(err)
			}
			last := appendN(t, w, 60, tagsOf(3), 10)
			var b wal.Batch
			for k, v := range c.state {
				if k[1] == '/' {
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
			skipped := map[uint64]bool{}
			for _, r := range recs {
				if up, ok := c.skip[r.Tag]; ok && r.Seq <= up {
					skipped[r.Seq] = true
				}
			}
			s := &renamingSink{testSink: newTestSink(sinks.Limits{MaxRecords: 100, MaxBytes: 1 << 20, MaxAge: time.Millisecond, Concurrency: 1}), prefix: "C:"}
			m := NewMetrics(nil)
			r := start(w, "s", s, Options{Fingerprint: "C", Metrics: m})
			waitCursor(t, w, "s", last, 10*time.Second)
			r.stop(t)
			got, _, _ := s.snapshot()
			for seq := uint64(1); seq <= last; seq++ {
				if want := map[bool]int{true: 0, false: 1}[skipped[seq]]; got[seq] != want {
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
				if k[:2] == "o/" || k[:2] == "m/" || k == "old_partitioning" {
					t.Errorf("state key %q left after the cursor passed every record", k)
				}
			}
			if left["fingerprint"] != "C" || left["partitioning"] != "C:" {
				t.Errorf("stored fingerprint %q and partitioning %q, want C and C:", left["fingerprint"], left["partitioning"])
			}
		})
	}
}
