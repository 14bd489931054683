package queue

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"sync"
	"testing"
	"time"

	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// barrierSink holds every Send until n are in flight, then releases them
// all at once, as a destination does when it recovers.
type barrierSink struct {
	lim     sinks.Limits
	n       int
	mu      sync.Mutex
	waiting int
	release chan struct{}
}

func (s *barrierSink) Limits() sinks.Limits             { return s.lim }
func (s *barrierSink) Partition(r *sinks.Record) string { return r.Tag }
func (s *barrierSink) Size(r *sinks.Record) int         { return len(r.Body) }
func (s *barrierSink) Send(ctx context.Context, b *sinks.Batch) (sinks.Outcome, error) {
	s.mu.Lock()
	s.waiting++
	if s.waiting == s.n {
		close(s.release)
	}
	s.mu.Unlock()
	select {
	case <-s.release:
	case <-time.After(5 * time.Second):
	}
	return sinks.Outcome{}, nil
}

// With more partitions in flight than a fixed commit queue holds, deliver
// could block while the committer waits to hand back a result only the
// loop reads: the drainer must never stop that way.
func TestManyPartitionsInFlightDoNotDeadlock(t *testing.T) { testDeadlock(t, 200) }
func TestFiftyPartitionsInFlight(t *testing.T)             { testDeadlock(t, 50) }

func testDeadlock(t *testing.T, parts int) {
	w := openWAL(t, wal.Options{})
	defer w.Close()
	var recs []wal.Record
	for i := range parts {
		recs = append(recs, wal.Record{Time: time.Now().UnixNano(), Tag: fmt.Sprintf("p%03d", i), Body: []byte(`{}`)})
	}
	if _, err := w.Append(context.Background(), recs, wal.AppendOptions{}); err != nil {
		t.Fatal(err)
	}
	s := &barrierSink{lim: sinks.Limits{MaxRecords: 1, MaxBytes: 1 << 20, MaxAge: time.Millisecond, Concurrency: parts}, n: parts, release: make(chan struct{})}
	r := start(w, "s", s, Options{})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if pos, _ := w.Cursor("s"); pos >= uint64(parts) {
			break
		}
		if time.Now().After(deadline) {
			pos, _ := w.Cursor("s")
			st := r.d.Status()
			pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
			t.Fatalf("drainer stuck: cursor %d of %d, status %+v (goroutines left running)", pos, parts, st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.stop(t)
}
