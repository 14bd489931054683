package wal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/logfwd/forwarder/internal/racedetect"
)

// sameRecords fails t unless got and want hold the same records.
func sameRecords(t *testing.T, what string, got, want []Record) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d records, the file has %d", what, len(got), len(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.Seq != w.Seq || g.Time != w.Time || g.Tag != w.Tag || !bytes.Equal(g.Body, w.Body) {
			t.Fatalf("%s: record %d is seq %d %q %q, the file has seq %d %q %q", what, i, g.Seq, g.Tag, g.Body, w.Seq, w.Tag, w.Body)
		}
	}
}

// TestRecentReadsMatchTheFile: reads served from the entries committed last
// return what reads of the file return, whatever the position, limits,
// entry sizes (large records are not kept), retention and drop_oldest.
func TestRecentReadsMatchTheFile(t *testing.T) {
	racedetect.Heavy(t)
	w := openT(t, t.TempDir(), Options{MaxBytes: 6 << 20, WhenFull: DropOldest})
	defer w.Close()
	if _, err := w.RegisterCursor(context.Background(), "s"); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewSource(7))
	tags := []string{"a", "b.c", "pod.prod.web"}
	var buf ReadBuffer
	steps := 100
	if testing.Short() {
		steps = 60
	}
	for step := range steps {
		n := 1 + r.Intn(2500)
		if r.Intn(4) == 0 {
			n = 1 + r.Intn(5)
		}
		recs := make([]Record, n)
		for i := range recs {
			size := 20 + r.Intn(600)
			if r.Intn(3000) == 0 {
				size = maxEntryRaw + r.Intn(100<<10) // an entry of its own, not kept
			}
			recs[i] = Record{Time: int64(step*10000 + i), Tag: tags[r.Intn(len(tags))], Body: logBody(r, fmt.Sprintf("%d-%d", step, i), size)}
		}
		appendT(t, w, recs, "")
		if r.Intn(3) == 0 {
			// Retention: a cursor passes part of what is stored.
			st := w.Stats()
			var b Batch
			b.SetCursor("s", st.FirstSeq+uint64(r.Int63n(int64(st.NextSeq-st.FirstSeq)+1)))
			if err := w.Commit(context.Background(), &b); err != nil {
				t.Fatal(err)
			}
		}
		st := w.Stats()
		for range 8 {
			from := st.FirstSeq + uint64(r.Int63n(int64(st.NextSeq-st.FirstSeq)+3))
			if r.Intn(4) == 0 {
				from = st.NextSeq - uint64(r.Intn(300)) // a head reader
			}
			maxRecords, maxBytes := []int{0, 1, 100, 1000, 5000}[r.Intn(5)], []int{0, 100, 64 << 10, 1 << 20}[r.Intn(4)]
			got, err := w.read(from, maxRecords, maxBytes, &buf)
			if err != nil {
				t.Fatal(err)
			}
			want, err := w.readFile(from, maxRecords, maxBytes, nil, &decoder{tags: tagTable{}})
			if err != nil {
				t.Fatal(err)
			}
			if maxRecords > 0 && len(want) > maxRecords {
				want = want[:maxRecords]
			}
			sameRecords(t, fmt.Sprintf("step %d, read from %d (live %d to %d), at most %d records and %d bytes", step, from, st.FirstSeq, st.NextSeq, maxRecords, maxBytes), got, want)
		}
		if in := w.recent.inflight.Load(); in != 0 {
			t.Fatalf("step %d: %d bytes of buffers held by entries no append waits for", step, in)
		}
	}
	mem, file := w.recent.memoryReads.Load(), w.recent.fileReads.Load()
	t.Logf("%d reads from memory, %d from the file", mem, file)
	if mem < uint64(steps) || file < uint64(steps/4) {
		t.Fatalf("%d reads from memory, %d from the file: the test did not read both ways enough", mem, file)
	}
	w.recent.mu.RLock()
	held, ents := w.recent.bytes, len(w.recent.ents)-w.recent.head
	w.recent.mu.RUnlock()
	if held > recentCap || ents > recentMaxEntries {
		t.Fatalf("recent holds %d bytes in %d entries, at most %d in %d", held, ents, recentCap, recentMaxEntries)
	}
}

// TestRecentNeverHoldsRefusedEntries: an append refused because the disk
// was full, and its sequence numbers taken by the next append, is never
// read back, from memory or the file; nor is one refused by a failed commit.
func TestRecentNeverHoldsRefusedEntries(t *testing.T) {
	probeEvery(t, 300*time.Millisecond)
	w := openT(t, t.TempDir(), Options{})
	defer w.Close()
	appendT(t, w, []Record{{Body: []byte(`{"a":1}`)}}, "")
	_, stop := noSpaceCommits(t)
	_, err := w.Append(context.Background(), []Record{{Body: []byte(`{"refused":2}`)}, {Body: []byte(`{"refused":3}`)}}, AppendOptions{})
	stop()
	if err == nil {
		t.Fatal("an append on a full disk was stored")
	}
	// Nothing at 2 yet, from memory or the file.
	for from := uint64(1); from <= 2; from++ {
		if got, err := w.read(from, 0, 0, &ReadBuffer{}); err != nil || len(got) != int(2-from) {
			t.Fatalf("read from %d after the refusal: %d records (%v), want %d", from, len(got), err, 2-from)
		}
	}
	appendT(t, w, []Record{{Body: []byte(`{"a":2}`)}, {Body: []byte(`{"a":3}`)}}, "")
	for from := uint64(1); from <= 3; from++ {
		got, err := w.NewReader(from).ReadInto(0, 0, &ReadBuffer{})
		if err != nil {
			t.Fatal(err)
		}
		for _, rec := range got {
			if want := fmt.Sprintf(`{"a":%d}`, rec.Seq); string(rec.Body) != want {
				t.Fatalf("read from %d: record %d is %s, want %s", from, rec.Seq, rec.Body, want)
			}
		}
		if len(got) != int(4-from) {
			t.Fatalf("read from %d: %d records", from, len(got))
		}
	}
	if w.recent.memoryReads.Load() == 0 {
		t.Fatal("no read from memory")
	}
	if in := w.recent.inflight.Load(); in != 0 {
		t.Fatalf("%d bytes of buffers held by entries no append waits for", in)
	}
}

// TestRecentConcurrentReadersAndAppends: appenders, head readers and
// retention at once (run it with -race): every reader reads every record as
// appended, in order, and the buffers entries hold return once all is
// stored.
func TestRecentConcurrentReadersAndAppends(t *testing.T) {
	w := openT(t, t.TempDir(), Options{})
	defer w.Close()
	if _, err := w.RegisterCursor(context.Background(), "first"); err != nil {
		t.Fatal(err)
	}
	const appenders, perAppender = 4, 60
	var mu sync.Mutex
	bodies := map[uint64]string{}
	var wg sync.WaitGroup
	for a := range appenders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewSource(int64(a)))
			for i := range perAppender {
				recs := makeRecords(r, fmt.Sprintf("%d-%d", a, i), 1+r.Intn(800), 50+r.Intn(400))
				res, err := w.Append(context.Background(), recs, AppendOptions{})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for j := range recs {
					bodies[res.First+uint64(j)] = string(recs[j].Body)
				}
				mu.Unlock()
			}
		}()
	}
	appended := make(chan struct{})
	go func() { wg.Wait(); close(appended) }()
	type read struct {
		seq  uint64
		body string
	}
	reads := make([][]read, 3)
	var rg sync.WaitGroup
	for i := range reads {
		rg.Add(1)
		go func() {
			defer rg.Done()
			rd := w.NewReader(1)
			var buf ReadBuffer
			for {
				recs, err := rd.ReadInto(2000, 1<<20, &buf)
				if err != nil {
					t.Error(err)
					return
				}
				for _, rec := range recs {
					reads[i] = append(reads[i], read{rec.Seq, string(rec.Body)})
				}
				if len(recs) == 0 {
					select {
					case <-appended:
						if rd.Position() == w.Stats().NextSeq {
							return
						}
					default:
					}
					ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
					_ = rd.Wait(ctx)
					cancel()
				}
				if i == 0 && len(recs) > 0 {
					// The first reader's cursor lets retention delete
					// behind it, while the others may still read there.
					var b Batch
					b.SetCursor("first", recs[len(recs)-1].Seq)
					if err := w.Commit(context.Background(), &b); err != nil {
						t.Error(err)
						return
					}
				}
			}
		}()
	}
	rg.Wait()
	<-appended
	if t.Failed() {
		return
	}
	for i, rs := range reads {
		// Retention may pass a reader that lags: it then reads on from the
		// oldest live record, so its records are in order, and each is the
		// record appended at its seq.
		var last uint64
		for _, rd := range rs {
			if rd.seq <= last {
				t.Fatalf("reader %d: seq %d after %d", i, rd.seq, last)
			}
			last = rd.seq
			if bodies[rd.seq] != rd.body {
				t.Fatalf("reader %d: seq %d is %q, appended %q", i, rd.seq, rd.body, bodies[rd.seq])
			}
		}
		if i == 0 && len(rs) != len(bodies) {
			t.Fatalf("the first reader read %d records of %d", len(rs), len(bodies))
		}
	}
	t.Logf("%d records; %d reads from memory, %d from the file", len(bodies), w.recent.memoryReads.Load(), w.recent.fileReads.Load())
	if w.recent.memoryReads.Load() == 0 {
		t.Fatal("no read from memory")
	}
	if in := w.recent.inflight.Load(); in != 0 {
		t.Fatalf("%d bytes of buffers held by entries no append waits for", in)
	}
}

// TestRecentBuffersReturned: every append answered without its entries
// being stored (a duplicate chunk, one too large, a cancelled one, one
// waiting for room when the WAL closes) gives back the buffers its entries
// held for recent: none is left counted, which would keep later entries
// out of it for good.
func TestRecentBuffersReturned(t *testing.T) {
	w := openT(t, t.TempDir(), Options{MaxBytes: 64 << 10, WhenFull: Block})
	r := rand.New(rand.NewSource(5))
	recs := makeRecords(r, "a", 20, 200)
	appendT(t, w, recs, "c1")
	appendT(t, w, recs, "c1") // a duplicate of a committed chunk
	var wg sync.WaitGroup
	for range 4 { // duplicates within one group, some of them
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = w.Append(context.Background(), recs, AppendOptions{ChunkID: "c2"}) }()
	}
	wg.Wait()
	if _, err := w.Append(context.Background(), makeRecords(r, "big", 2000, 300), AppendOptions{}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("an append over max_bytes: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, _ = w.Append(ctx, recs, AppendOptions{})
	// The cancelled one may have reached the writer, which answers it
	// after Append returned.
	waitUntil(t, 5*time.Second, "every buffer given back by the appends answered", func() bool { return w.recent.inflight.Load() == 0 })
	// Appends that wait for room under max_bytes hold theirs until Close
	// answers them.
	for w.Stats().Bytes < 48<<10 {
		appendT(t, w, makeRecords(r, "fill", 50, 300), "")
	}
	waiting := make(chan error, 1)
	go func() {
		_, err := w.Append(context.Background(), makeRecords(r, "wait", 100, 300), AppendOptions{})
		waiting <- err
	}()
	waitUntil(t, 5*time.Second, "waiting for room", w.Full)
	if w.recent.inflight.Load() == 0 {
		t.Fatal("the waiting append holds no buffer: the test tests nothing")
	}
	w.Close()
	if err := <-waiting; !errors.Is(err, ErrClosed) {
		t.Fatalf("the waiting append: %v", err)
	}
	if in := w.recent.inflight.Load(); in != 0 {
		t.Fatalf("%d bytes of buffers held after Close", in)
	}
	if _, err := w.Read(1, 0, 0); err == nil {
		t.Fatal("a read after Close succeeded")
	}
}

// TestRecentSmallAppends: appends of a record or a few, with a reader at
// the head, in both sync modes: the reader reads from memory, and what
// recent holds is counted at about its size.
func TestRecentSmallAppends(t *testing.T) {
	for _, o := range []Options{{}, {Sync: SyncInterval, SyncInterval: 20 * time.Millisecond}} {
		w := openT(t, t.TempDir(), o)
		r := rand.New(rand.NewSource(9))
		rd := w.NewReader(1)
		var buf ReadBuffer
		read := 0
		for i := range 600 {
			appendT(t, w, makeRecords(r, fmt.Sprint(i), 1+i%3, 300), "")
			if i%5 == 0 {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				recs, err := rd.NextInto(ctx, 1000, 1<<20, &buf)
				cancel()
				if err != nil {
					t.Fatal(err)
				}
				read += len(recs)
			}
		}
		w.recent.mu.RLock()
		held, data := w.recent.bytes, 0
		for _, e := range w.recent.ents[w.recent.head:] {
			data += len(*e.raw)
		}
		w.recent.mu.RUnlock()
		mem, file := w.recent.memoryReads.Load(), w.recent.fileReads.Load()
		t.Logf("sync %v: %d records read, %d reads from memory, %d from the file; recent holds %d bytes of buffers for %d of records", o.Sync, read, mem, file, held, data)
		if mem < 10*file {
			t.Errorf("sync %v: %d reads from memory, %d from the file", o.Sync, mem, file)
		}
		if held > 2*data+keptBufCap {
			t.Errorf("sync %v: recent counts %d bytes for %d of records", o.Sync, held, data)
		}
		w.Close()
	}
}
