package queue

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/logfwd/forwarder/wal"
)

// A sink's Recover scans its intents and, for each, reads the WAL and
// records the delivery. Reading from inside the scan would hold a read
// transaction across another one and deadlock with a writer that grows the
// file; sinkState.Scan hands the pairs over after its transaction ends.
func TestStateScanAllowsNestedWALCalls(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a long scan with WAL calls nested in it; make test runs it")
	}
	w := openWAL(t, wal.Options{}) // closed only on success: a deadlocked WAL cannot close
	st := &sinkState{w: w, name: "s"}
	ctx := context.Background()
	for _, k := range []string{"intent/1", "intent/2"} {
		if err := st.Put(ctx, []byte(k), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	grown := make(chan struct{})
	go func() { // grow the file: the writer must remap the memory map
		defer close(grown)
		for i := 0; i < 100; i++ {
			select {
			case <-stop:
				return
			default:
			}
			appendN(t, w, 2000, tagsOf(3), 500)
		}
	}()
	done := make(chan struct{})
	var calls atomic.Int64
	go func() {
		defer close(done)
		for i := 0; i < 100; i++ {
			st.Scan([]byte("intent/"), func(k, v []byte) error {
				time.Sleep(2 * time.Millisecond)
				if _, err := st.ReadRange(1, 10, nil); err != nil {
					return err
				}
				defer calls.Add(1)
				return st.Delivered(ctx, "p", 0, nil)
			})
		}
	}()
	// A deadlock is no progress at all; a loaded machine is slow progress
	// (each call commits, and fsyncs, beside the writer's commits).
	for last, idle := int64(-1), 0; ; {
		select {
		case <-done:
		case <-time.After(time.Second):
			if n := calls.Load(); n != last {
				last, idle = n, 0
				continue
			}
			if idle++; idle < 20 {
				continue
			}
			t.Fatalf("Scan with nested WAL calls deadlocked with the writer (no call returned for 20s, %d before)", last)
		}
		break
	}
	close(stop)
	<-grown
	w.Close()
}
