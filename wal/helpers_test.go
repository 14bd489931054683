package wal

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// Child processes for crash and corruption tests run the same binary.
	if dir := os.Getenv(crashChildEnv); dir != "" {
		crashChild(dir)
		return
	}
	if dir := os.Getenv(openChildEnv); dir != "" {
		openChild(dir)
		return
	}
	if dir := os.Getenv(powerOpenChildEnv); dir != "" {
		powerOpenChild(dir)
		return
	}
	goleak.VerifyTestMain(m)
}

// logBody builds a log-like JSON body of about size bytes, unique by id.
func logBody(r *rand.Rand, id string, size int) []byte {
	paths := []string{"/api/v1/items", "/healthz", "/api/v2/orders", "/login", "/static/app.js"}
	s := fmt.Sprintf(`{"id":%q,"log":"INFO handled request path=%s/%d status=%d dur=%dms","stream":"stdout","kubernetes":{"namespace_name":"prod-%d","pod_name":"web-%x"}`,
		id, paths[r.Intn(len(paths))], r.Intn(100000), 200+r.Intn(4)*100, r.Intn(2000), r.Intn(5), r.Uint32())
	pad := size - len(s) - len(`,"pad":""}`)
	if pad > 0 {
		b := make([]byte, pad)
		for i := range b {
			b[i] = "abcdefghijklmnopqrstuvwxyz0123456789"[r.Intn(36)]
		}
		s += `,"pad":"` + string(b) + `"`
	}
	return []byte(s + "}")
}

func makeRecords(r *rand.Rand, prefix string, n, size int) []Record {
	recs := make([]Record, n)
	for i := range recs {
		recs[i] = Record{Time: time.Now().UnixNano(), Tag: "pod.prod.web", Body: logBody(r, fmt.Sprintf("%s-%d", prefix, i), size)}
	}
	return recs
}

func openT(t testing.TB, dir string, opts Options) *WAL {
	t.Helper()
	w, err := Open(dir, opts)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	return w
}

// forgetRecent empties w's recent entries, so that reads go to the file:
// for tests that change the file behind the writer's back.
func forgetRecent(w *WAL) { w.recent.committed(nil, true, 0) }

func appendT(t testing.TB, w *WAL, recs []Record, chunk string) Result {
	t.Helper()
	res, err := w.Append(context.Background(), recs, AppendOptions{ChunkID: chunk})
	if err != nil {
		t.Fatalf("append: %v", err)
	}
	return res
}

func commitT(t testing.TB, w *WAL, b *Batch) {
	t.Helper()
	if err := w.Commit(context.Background(), b); err != nil {
		t.Fatalf("commit: %v", err)
	}
}

func readAll(t testing.TB, w *WAL, from uint64) []Record {
	t.Helper()
	recs, err := w.Read(from, 0, 0)
	if err != nil {
		t.Fatalf("read from %d: %v", from, err)
	}
	return recs
}
