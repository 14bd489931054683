package wal

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/logfwd/forwarder/internal/faultfs"
	"github.com/logfwd/forwarder/internal/testseed"
)

// faultAppenders appends from four goroutines until stop is closed and
// keeps what was acknowledged and how appends failed.
type faultAppenders struct {
	mu      sync.Mutex
	acked   [][]Record // with their sequence numbers
	errs    map[string]int
	stop    chan struct{}
	wg      sync.WaitGroup
	lateAck int // appends started after Fatal() closed that were acknowledged
}

func startFaultAppenders(w *WAL, timeout time.Duration) *faultAppenders {
	a := &faultAppenders{errs: map[string]int{}, stop: make(chan struct{})}
	for g := 0; g < 4; g++ {
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			r := rand.New(rand.NewSource(int64(g)))
			for i := 0; ; i++ {
				select {
				case <-a.stop:
					return
				default:
				}
				recs := makeRecords(r, fmt.Sprintf("%d-%d", g, i), 1+r.Intn(50), 200+r.Intn(800))
				fatalBefore := false
				select {
				case <-w.Fatal():
					fatalBefore = true
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				res, err := w.Append(ctx, recs, AppendOptions{ChunkID: fmt.Sprintf("c%d-%d", g, i)})
				cancel()
				a.mu.Lock()
				switch {
				case err == nil:
					for k := range recs {
						recs[k].Seq = res.First + uint64(k)
					}
					a.acked = append(a.acked, recs)
					if fatalBefore {
						a.lateAck++
					}
				case errors.Is(err, ErrFatal):
					a.errs["fatal"]++
				case errors.Is(err, ErrNoSpace):
					a.errs["no space"]++
				case errors.Is(err, context.DeadlineExceeded):
					a.errs["held"]++
				default:
					a.errs[err.Error()]++
				}
				a.mu.Unlock()
				if err != nil {
					time.Sleep(5 * time.Millisecond)
				}
			}
		}()
	}
	return a
}

func (a *faultAppenders) end() {
	close(a.stop)
	a.wg.Wait()
}

func (a *faultAppenders) count() (acked int, errs map[string]int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := make(map[string]int, len(a.errs))
	for k, v := range a.errs {
		c[k] = v
	}
	return len(a.acked), c
}

// checkAckedAfterCut cuts the power, mounts backing again and checks that
// every acknowledged record is there with its bytes.
func checkAckedAfterCut(t *testing.T, m *faultfs.Mount, backing string, acked [][]Record) {
	t.Helper()
	m.Cut(faultfs.CutOptions{Tear: 512})
	m = faultfs.Start(t, backing)
	w := openT(t, m.Dir, Options{})
	defer w.Close()
	// Records every sink has passed may be gone (retention).
	done := ^uint64(0)
	for _, c := range w.Stats().Cursors {
		done = min(done, c)
	}
	n := 0
	for _, recs := range acked {
		if recs[len(recs)-1].Seq <= done {
			continue
		}
		got, err := w.Read(recs[0].Seq, len(recs), 0)
		if err != nil || len(got) != len(recs) {
			t.Fatalf("acknowledged records %d-%d after the power cut: %d read, %v", recs[0].Seq, recs[len(recs)-1].Seq, len(got), err)
		}
		for i := range recs {
			if string(got[i].Body) != string(recs[i].Body) {
				t.Fatalf("record %d after the power cut: %q, want %q", recs[i].Seq, got[i].Body, recs[i].Body)
			}
		}
		n += len(recs)
	}
	t.Logf("%d acknowledged records intact after a power cut", n)
}

// TestFailedFsyncOnFaultfsIsFatal: an fsync that returns EIO (a real one,
// through the file system) makes the WAL fail for good: Fatal() closes,
// every append and commit after it fails with ErrFatal, also once the disk
// works again, the fsync is never retried, and nothing was acknowledged
// that a power cut then loses.
func TestFailedFsyncOnFaultfsIsFatal(t *testing.T) {
	backing := t.TempDir()
	m := faultfs.Start(t, backing)
	w := openT(t, m.Dir, Options{})
	ctx := context.Background()
	if _, err := w.RegisterCursor(ctx, "sink"); err != nil {
		t.Fatal(err)
	}
	a := startFaultAppenders(w, 10*time.Second)
	waitUntil(t, 10*time.Second, "appending", func() bool { n, _ := a.count(); return n >= 20 })
	rng := rand.New(rand.NewSource(testseed.Seed(t, "WAL_FAULT_SEED", "after how many bytes fsyncs fail")))
	m.FailSyncs(rng.Int63n(256 << 10))
	select {
	case <-w.Fatal():
	case <-time.After(10 * time.Second):
		t.Fatal("no fatal error within 10s of fsyncs failing with EIO")
	}
	if err := w.Err(); !errors.Is(err, ErrFatal) {
		t.Fatalf("Err() = %v, want ErrFatal", err)
	}
	syncs := m.Stats()
	time.Sleep(100 * time.Millisecond) // the appenders go on trying
	m.Heal()
	if _, err := w.Append(ctx, []Record{{Body: []byte(`{}`)}}, AppendOptions{}); !errors.Is(err, ErrFatal) {
		t.Fatalf("append after the failed fsync, the disk healed: %v, want ErrFatal", err)
	}
	var b Batch
	b.SetCursor("sink", 1)
	if err := w.Commit(ctx, &b); !errors.Is(err, ErrFatal) {
		t.Fatalf("commit after the failed fsync: %v, want ErrFatal", err)
	}
	a.end()
	w.Close()
	after := m.Stats()
	if after.Syncs != syncs.Syncs || after.FailedSyncs != 1 {
		t.Fatalf("fsyncs: %d (%d failed) at the failure, %d (%d failed) at the end: the fsync was retried", syncs.Syncs, syncs.FailedSyncs, after.Syncs, after.FailedSyncs)
	}
	acked, errs := a.count()
	t.Logf("%d appends acknowledged before the failure; after it: %v", acked, errs)
	if a.lateAck > 0 {
		t.Fatalf("%d appends that started after Fatal() were acknowledged", a.lateAck)
	}
	if errs["fatal"] == 0 {
		t.Fatal("no append failed with ErrFatal")
	}
	checkAckedAfterCut(t, m, backing, a.acked)
}

// TestNoSpaceOnFaultfs: a disk that answers ENOSPC to writes that need a
// new block. Whether statfs shows it (appends wait under MinFreeBytes) or
// not (a commit finds the disk full), the WAL does not fail, the sinks'
// commits are never wedged, and once there is room again every cursor
// moves and appends are acknowledged again; nothing acknowledged is lost
// to a power cut afterwards. When statfs does not show it, only a try of
// the held appends finds the room back: tried every second here.
func TestNoSpaceOnFaultfs(t *testing.T) {
	probeEvery(t, time.Second)
	for _, statfs := range []bool{false, true} {
		t.Run(fmt.Sprintf("statfs shows it %v", statfs), func(t *testing.T) {
			backing := t.TempDir()
			m := faultfs.Start(t, backing)
			w := openT(t, m.Dir, Options{MinFreeBytes: 256 << 10})
			ctx := context.Background()
			for _, name := range []string{"fast", "slow"} {
				if _, err := w.RegisterCursor(ctx, name); err != nil {
					t.Fatal(err)
				}
			}
			a := startFaultAppenders(w, 200*time.Millisecond)
			waitUntil(t, 10*time.Second, "appending", func() bool { n, _ := a.count(); return n >= 20 })

			// The fast sink keeps up; the slow one is stuck until the end.
			commit := func(name string, to uint64) error {
				var b Batch
				b.SetCursor(name, to)
				b.Put(name, []byte("delivered"), u64(to))
				return w.Commit(ctx, &b)
			}
			var fastErrs int
			stop := make(chan struct{})
			fastDone := make(chan struct{})
			go func() {
				defer close(fastDone)
				for {
					select {
					case <-stop:
						return
					case <-time.After(10 * time.Millisecond):
					}
					if err := commit("fast", w.Stats().NextSeq-1); err != nil {
						if !errors.Is(err, ErrNoSpace) {
							t.Errorf("fast sink commit: %v", err)
						}
						fastErrs++
					}
				}
			}()
			rng := rand.New(rand.NewSource(testseed.Seed(t, "WAL_FAULT_SEED", "after how many bytes writes fail")))
			m.NoSpace(rng.Int63n(128<<10), statfs)
			waitUntil(t, 20*time.Second, "refusing appends", func() bool {
				if statfs {
					return w.DiskFull()
				}
				return m.Stats().FailedWrites > 0
			})
			time.Sleep(300 * time.Millisecond)
			ackedFull, errsFull := a.count()
			if err := w.Err(); err != nil {
				t.Fatalf("the WAL failed on a full disk: %v", err)
			}
			st := m.Stats()
			m.Heal()
			healed := time.Now()
			// Every cursor moves again (the slow one to half its backlog,
			// so that the power cut below has records to check), and
			// appends are acknowledged again.
			waitUntil(t, 10*time.Second, "slow moving", func() bool { return commit("slow", w.Stats().NextSeq/2) == nil })
			waitUntil(t, 10*time.Second, "fast moving", func() bool { return commit("fast", w.Stats().NextSeq-1) == nil })
			waitUntil(t, 10*time.Second, "acknowledging appends", func() bool { n, _ := a.count(); return n > ackedFull+10 })
			close(stop)
			<-fastDone
			a.end()
			acked, errs := a.count()
			t.Logf("full: %d failed writes, %d fsyncs, disk full %v; %d appends acknowledged before the room ran out and while it was short, then %v; the fast sink's commits refused %d times; after the room came back, cursors moved and appends were acknowledged within %v; %d appends acknowledged in all (%v)",
				st.FailedWrites, st.Syncs, statfs, ackedFull, errsFull, fastErrs, time.Since(healed).Round(time.Millisecond), acked, errs)
			if statfs && fastErrs > 0 {
				t.Errorf("with statfs showing the room, %d cursor commits were refused", fastErrs)
			}
			if !statfs && errsFull["no space"] == 0 {
				t.Errorf("no append was refused with ErrNoSpace: %v", errsFull)
			}
			if err := w.Err(); err != nil {
				t.Fatal(err)
			}
			w.Close()
			checkAckedAfterCut(t, m, backing, a.acked)
		})
	}
}
