package admin

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/logfwd/forwarder/internal/syncbuf"
	"github.com/logfwd/forwarder/queue"
	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// refusingSink dead-letters every record, as a destination that will never
// take them does.
type refusingSink struct{ deniedSink }

func (refusingSink) Send(context.Context, *sinks.Batch) (sinks.Outcome, error) {
	return sinks.Outcome{}, sinks.NewRecordPermanent("too_old", fmt.Errorf("older than 14 days"))
}

// /wal and /dead-letters serve what forwarder wal stats and dead-letters
// print, from a running service.
func TestWALAndDeadLetters(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := wal.Open(t.TempDir(), wal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for i := range 30 {
		if _, err := w.Append(ctx, []wal.Record{{Tag: "t", Time: int64(i), Body: fmt.Appendf(nil, `{"i":%d}`, i)}}, wal.AppendOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	d := queue.New(w, "cw", refusingSink{}, queue.Options{Metrics: queue.NewMetrics(nil)})
	drained := make(chan error, 1)
	go func() { drained <- d.Run(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for pos, _ := w.Cursor("cw"); pos < 30 && time.Now().Before(deadline); pos, _ = w.Cursor("cw") {
		time.Sleep(5 * time.Millisecond)
	}
	s := New("127.0.0.1:0", Sources{WAL: w, Drainers: []*queue.Drainer{d}, Gatherer: prometheus.NewRegistry()}, slog.New(slog.DiscardHandler))
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	base := "http://" + s.Addr().String()

	code, body := get(t, base, "/status")
	var status Status
	if err := json.Unmarshal([]byte(body), &status); code != 200 || err != nil || status.Links["wal"] != "/wal" || status.Links["dead_letters_of_cw"] != "/dead-letters?sink=cw" {
		t.Fatalf("/status links: %d %v %s", code, err, body)
	}
	code, body = get(t, base, "/wal")
	var st wal.Stats
	if err := json.Unmarshal([]byte(body), &st); code != 200 || err != nil || st.NextSeq != 31 || st.Cursors["cw"] != 30 {
		t.Fatalf("/wal: %d %v %s", code, err, body)
	}
	var keys map[string]any
	_ = json.Unmarshal([]byte(body), &keys)
	for _, k := range []string{"path", "first_seq", "next_seq", "records", "live_bytes", "file_bytes", "cursors", "dropped",
		"commits", "commit_seconds", "disk_free_bytes", "file_free_bytes", "memory_reads", "file_reads", "damaged_records"} {
		if _, ok := keys[k]; !ok || len(keys) != 15 {
			t.Fatalf("/wal's keys are not the documented ones (%s): %s", k, body)
		}
	}
	lines := func(path string) (int, []queue.DeadLetter, http.Header) {
		t.Helper()
		res, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var out []queue.DeadLetter
		sc := bufio.NewScanner(res.Body)
		for sc.Scan() {
			var l struct {
				Sink string `json:"sink"`
				queue.DeadLetter
			}
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil || (res.StatusCode == 200 && l.Sink != "cw") {
				t.Fatalf("%s: line %q: %v", path, sc.Text(), err)
			}
			out = append(out, l.DeadLetter)
		}
		return res.StatusCode, out, res.Header
	}
	code, all, h := lines("/dead-letters")
	if code != 200 || len(all) != 30 || all[0].Seq != 1 || all[29].Seq != 30 || all[0].Reason != "too_old" || string(all[3].Body) != `{"i":3}` || h.Get("Dead-Letters-Omitted") != "0" {
		t.Fatalf("/dead-letters: %d, %d lines, %+v", code, len(all), all)
	}
	if code, newest, _ := lines("/dead-letters?sink=cw&limit=5"); code != 200 || len(newest) != 5 || newest[0].Seq != 26 || newest[4].Seq != 30 {
		t.Fatalf("/dead-letters?limit=5: %d %+v", code, newest)
	}
	if code, body := get(t, base, "/dead-letters?sink=nope"); code != http.StatusNotFound || !strings.Contains(body, `the WAL has no sink \"nope\"`) {
		t.Fatalf("/dead-letters of an unknown sink: %d %s", code, body)
	}
	if code, body := get(t, base, "/dead-letters?limit=0"); code != http.StatusBadRequest || !strings.Contains(body, "from 1 to 10000") {
		t.Fatalf("/dead-letters?limit=0: %d %s", code, body)
	}
	// A dead letter whose bytes do not decode is left out, and counted in a
	// header; the others are served.
	var b wal.Batch
	b.Put("cw", []byte("d/\x00\x00\x00\x00\x00\x00\x00\x03"), []byte(`{"seq":3,`))
	if err := w.Commit(ctx, &b); err != nil {
		t.Fatal(err)
	}
	if code, all, h := lines("/dead-letters"); code != 200 || len(all) != 29 || h.Get("Dead-Letters-Damaged") != "1" {
		t.Fatalf("/dead-letters with a damaged one: %d, %d lines, damaged %q", code, len(all), h.Get("Dead-Letters-Damaged"))
	}
	cancel()
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
}

// /dead-letters, which holds records' content, answers only requests from
// the machine itself: another pod reaching admin.listen gets 403.
func TestDeadLettersOnlyFromThisMachine(t *testing.T) {
	w, err := wal.Open(t.TempDir(), wal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	s := New("127.0.0.1:0", Sources{WAL: w, Gatherer: prometheus.NewRegistry()}, slog.New(slog.DiscardHandler))
	for _, c := range []struct {
		remote, local string
		want          int
	}{
		{"127.0.0.1:40000", "127.0.0.1:9880", http.StatusOK},
		{"[::1]:40000", "[::1]:9880", http.StatusOK},
		{"10.1.2.3:40000", "10.1.2.3:9880", http.StatusOK}, // the pod's own address
		{"10.1.2.4:40000", "10.1.2.3:9880", http.StatusForbidden},
		{"127.0.0.6:40000", "10.1.2.3:9880", http.StatusForbidden}, // a sidecar passing another pod's request
	} {
		local, err := net.ResolveTCPAddr("tcp", c.local)
		if err != nil {
			t.Fatal(err)
		}
		r := httptest.NewRequestWithContext(context.WithValue(context.Background(), http.LocalAddrContextKey, local), "GET", "/dead-letters", nil)
		r.RemoteAddr = c.remote
		rec := httptest.NewRecorder()
		s.srv.Handler.ServeHTTP(rec, r)
		if rec.Code != c.want {
			t.Errorf("from %s to %s: %d %s, want %d", c.remote, c.local, rec.Code, rec.Body, c.want)
		}
	}
}

// A token that cannot be written (a full disk, here a directory that is
// not there) does not fail the start: the admin server runs, and
// /dead-letters is refused for the run, whatever token a request says.
func TestTokenNotWritten(t *testing.T) {
	w, err := wal.Open(t.TempDir(), wal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var logs syncbuf.Buffer
	s := New("127.0.0.1:0", Sources{WAL: w, Gatherer: prometheus.NewRegistry(), TokenFile: filepath.Join(t.TempDir(), "gone", "admin.token")},
		slog.New(slog.NewTextHandler(&logs, nil)))
	if err := s.Start(); err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer s.ln.Close()
	if !strings.Contains(logs.String(), "could not write the admin token") {
		t.Errorf("no warning:\n%s", logs.String())
	}
	local, _ := net.ResolveTCPAddr("tcp", "127.0.0.1:9880")
	for _, auth := range []string{"", "Bearer ", "bearer x"} {
		r := httptest.NewRequestWithContext(context.WithValue(context.Background(), http.LocalAddrContextKey, local), "GET", "/dead-letters", nil)
		r.RemoteAddr = "127.0.0.1:40000"
		r.Header.Set("Authorization", auth)
		rec := httptest.NewRecorder()
		s.srv.Handler.ServeHTTP(rec, r)
		if rec.Code != http.StatusForbidden {
			t.Errorf("Authorization %q: %d, want 403", auth, rec.Code)
		}
	}
}

// The token is written anew at each start, mode 0600, and is asked for
// with any case of Bearer.
func TestTokenWritten(t *testing.T) {
	w, err := wal.Open(t.TempDir(), wal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	path := filepath.Join(t.TempDir(), "admin.token")
	if err := os.WriteFile(path+".new", []byte("left over"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := New("127.0.0.1:0", Sources{WAL: w, Gatherer: prometheus.NewRegistry(), TokenFile: path}, slog.New(slog.DiscardHandler))
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.ln.Close()
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v, %v", fi, err)
	}
	token, _ := os.ReadFile(path)
	local, _ := net.ResolveTCPAddr("tcp", "127.0.0.1:9880")
	for auth, want := range map[string]int{"Bearer " + strings.TrimSpace(string(token)): 200, "bearer " + strings.TrimSpace(string(token)): 200, "Bearer wrong": 403} {
		r := httptest.NewRequestWithContext(context.WithValue(context.Background(), http.LocalAddrContextKey, local), "GET", "/dead-letters", nil)
		r.RemoteAddr = "127.0.0.1:40000"
		r.Header.Set("Authorization", auth)
		rec := httptest.NewRecorder()
		s.srv.Handler.ServeHTTP(rec, r)
		if rec.Code != want {
			t.Errorf("Authorization %q: %d, want %d", auth, rec.Code, want)
		}
	}
}
