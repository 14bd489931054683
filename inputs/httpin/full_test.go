package httpin

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/logfwd/forwarder/wal"
)

// fullEnv is a server on a WAL of 64 KiB that blocks when full, with a
// cursor that passed nothing, filled until one more small append waits.
func fullEnv(t *testing.T, storeTimeout time.Duration) *env {
	t.Helper()
	// HoldFor: Full ends as soon as no append waits (the fill's last one
	// gave up), as it does in production HoldFor after it.
	e := newEnv(t, withWAL(wal.Options{MaxBytes: 64 << 10, WhenFull: wal.Block, HoldFor: time.Millisecond}), withStoreTimeout(storeTimeout))
	if _, err := e.w.RegisterCursor(context.Background(), "sink"); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewSource(1))
	for _, size := range []int{2000, 200, 20} { // fill, then top up with smaller records
		for i := 0; ; i++ {
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			_, err := e.w.Append(ctx, []wal.Record{{Time: 1, Tag: "fill", Body: randomBody(r, size)}}, wal.AppendOptions{})
			cancel()
			if errors.Is(err, context.DeadlineExceeded) {
				break
			}
			if err != nil {
				t.Fatalf("fill: %v", err)
			}
			if i > 10000 {
				t.Fatal("the WAL never fills")
			}
		}
	}
	// The appends that timed out no longer wait.
	deadline := time.Now().Add(5 * time.Second)
	for e.w.Full() {
		if time.Now().After(deadline) {
			t.Fatal("WAL still reports waiting appends")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return e
}

// randomBody is a JSON object of about size bytes that does not compress.
func randomBody(r *rand.Rand, size int) []byte {
	b := make([]byte, size)
	for i := range b {
		b[i] = "abcdefghijklmnopqrstuvwxyz0123456789"[r.Intn(36)]
	}
	return []byte(fmt.Sprintf(`{"pad":%q}`, b))
}

// TestWALFullWaiting: while appends wait for room (Full), a request is
// answered 503 at once, without appending.
func TestWALFullWaiting(t *testing.T) {
	e := fullEnv(t, 5*time.Second)
	before := len(e.records())

	ctx, cancel := context.WithCancel(context.Background())
	waiting := make(chan error, 1)
	go func() {
		_, err := e.w.Append(ctx, []wal.Record{{Time: 1, Tag: "fill", Body: randomBody(rand.New(rand.NewSource(4)), 2000)}}, wal.AppendOptions{})
		waiting <- err
	}()
	defer func() {
		cancel()
		<-waiting
	}()
	deadline := time.Now().Add(5 * time.Second)
	for !e.w.Full() {
		if time.Now().After(deadline) {
			t.Fatal("the WAL does not report Full with an append waiting")
		}
		time.Sleep(5 * time.Millisecond)
	}
	start := time.Now()
	got := e.post("/v1/logs/app", []byte(`{"a":1}`))
	if got.status != 503 || got.header.Get("Retry-After") != "1" {
		t.Fatalf("answer %d %s Retry-After %q, want 503 with Retry-After: 1", got.status, got.body, got.header.Get("Retry-After"))
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("answered after %v: want at once, not after the store timeout", d)
	}
	if got.body != `{"error":"the WAL is full: retry later"}` {
		t.Errorf("answer %s", got.body)
	}
	if n := e.rejected("wal_full"); n != 1 {
		t.Errorf("rejected{reason=wal_full} = %v, want 1", n)
	}
	if n := len(e.records()); n != before {
		t.Errorf("WAL holds %d records, had %d", n, before)
	}
}

// TestWALFullTimeout: an append that finds no room within the store
// timeout is answered 503 and not acknowledged; once the sink passes
// records and retention makes room, the same request is stored.
func TestWALFullTimeout(t *testing.T) {
	e := fullEnv(t, 300*time.Millisecond)
	before := len(e.records())
	body := randomBody(rand.New(rand.NewSource(2)), 2000)

	start := time.Now()
	got := e.post("/v1/logs/app", body, "Idempotency-Key", "k1")
	if got.status != 503 || got.header.Get("Retry-After") != "1" {
		t.Fatalf("answer %d %s, want 503 with Retry-After: 1", got.status, got.body)
	}
	if d := time.Since(start); d < 300*time.Millisecond || d > 3*time.Second {
		t.Errorf("answered after %v, want about the store timeout (300ms)", d)
	}
	if n := e.rejected("wal_full"); n != 1 {
		t.Errorf("rejected{reason=wal_full} = %v, want 1", n)
	}
	if n := len(e.records()); n != before {
		t.Fatalf("WAL holds %d records, had %d", n, before)
	}

	var b wal.Batch
	b.SetCursor("sink", e.w.Stats().NextSeq-1)
	if err := e.w.Commit(context.Background(), &b); err != nil {
		t.Fatal(err)
	}
	got = e.post("/v1/logs/app", body, "Idempotency-Key", "k1")
	if got.status != 200 || got.body != `{"stored":1}` {
		t.Fatalf("after room was made: %d %s", got.status, got.body)
	}
	recs := e.records()
	if len(recs) != 1 || string(recs[0].Body) != string(body) {
		t.Fatalf("WAL holds %d records, want the one just stored", len(recs))
	}
}

// TestTooLargeForWAL: a request larger than wal.max_bytes could never be
// stored: 413, not a wait.
func TestTooLargeForWAL(t *testing.T) {
	e := newEnv(t, withWAL(wal.Options{MaxBytes: 4 << 10, WhenFull: wal.Block}), withStoreTimeout(5*time.Second))
	got := e.post("/v1/logs/app", randomBody(rand.New(rand.NewSource(3)), 8000))
	if got.status != 413 {
		t.Fatalf("answer %d %s, want 413", got.status, got.body)
	}
	if n := e.rejected("too_large"); n != 1 {
		t.Errorf("rejected{reason=too_large} = %v, want 1", n)
	}
}
