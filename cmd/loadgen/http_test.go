package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// httpServer is the HTTP input for the tests: it checks each NDJSON body
// and answers {"stored": N}, or what status says.
type httpServer struct {
	t   *testing.T
	srv *httptest.Server

	mu     sync.Mutex
	keys   map[string]int              // Idempotency-Key: requests
	ids    map[string]int              // record id: times received
	lines  int                         // records received
	bytes  int                         // their JSON
	status func(key string, n int) int // answer for the n-th request with this key (from 1)
}

func newHTTPServer(t *testing.T) *httpServer {
	s := &httpServer{t: t, keys: map[string]int{}, ids: map[string]int{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.handle))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *httpServer) handle(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/logs/pod.shop" || r.Header.Get("Content-Type") != "application/x-ndjson" {
		s.t.Errorf("%s %s %s", r.Method, r.URL.Path, r.Header.Get("Content-Type"))
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		s.t.Errorf("read body: %v", err)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys[key]++
	if s.status != nil {
		if code := s.status(key, s.keys[key]); code != http.StatusOK {
			w.WriteHeader(code)
			return
		}
	}
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var rec struct {
			Time   string `json:"time"`
			Log    string `json:"log"`
			Stream string `json:"stream"`
			K      struct {
				NS  string `json:"namespace_name"`
				Pod string `json:"pod_name"`
			} `json:"kubernetes"`
			ID string `json:"id"`
		}
		if err := json.Unmarshal(line, &rec); err != nil {
			s.t.Errorf("line %q: %v", line, err)
			continue
		}
		tm, err := time.Parse(time.RFC3339Nano, rec.Time)
		if err != nil || time.Since(tm) > time.Minute || !strings.Contains(rec.Log, "status=") ||
			rec.Stream == "" || rec.K.NS == "" || rec.K.Pod == "" || rec.ID == "" || !strings.HasPrefix(string(line), `{"time":`) {
			s.t.Errorf("record %s", line)
		}
		if len(line) < 240 || len(line) > 260 {
			s.t.Errorf("record of %d bytes, want about 250: %s", len(line), line)
		}
		s.ids[rec.ID]++
		s.lines++
		s.bytes += len(line)
		n++
	}
	fmt.Fprintf(w, "{\"stored\":%d}\n", n)
}

func (s *httpServer) url() string { return s.srv.URL + "/v1/logs/pod.shop" }

func TestHTTP(t *testing.T) {
	s := newHTTPServer(t)
	ids := filepath.Join(t.TempDir(), "ids")
	code, r, stderr := runLoadgen(t, "http", "-url", s.url(), "-clients", "3", "-batch", "20", "-messages", "5",
		"-duration", "0", "-run", "h1", "-ids", ids)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if s.lines != 300 || len(s.ids) != 300 || len(s.keys) != 15 {
		t.Fatalf("server got %d records, %d distinct ids, %d keys; want 300, 300, 15", s.lines, len(s.ids), len(s.keys))
	}
	for c := range 3 {
		for n := range 100 {
			if id := fmt.Sprintf("h1-%d-%d", c, n); s.ids[id] != 1 {
				t.Fatalf("record %s received %d times", id, s.ids[id])
			}
		}
	}
	if r.Mode != "http" || r.SentRecords != 300 || r.AckedRecords != 300 || r.AckedMessages != 15 ||
		r.AckedBytes != uint64(s.bytes) || r.errorCount() != 0 || r.P50ms <= 0 {
		t.Fatalf("result %+v; the server got %d bytes", r, s.bytes)
	}
	lines := readIDs(t, ids)
	if len(lines) != 300 {
		t.Fatalf("ids file has %d ids, want 300", len(lines))
	}
	for _, id := range lines {
		if s.ids[id] != 1 {
			t.Fatalf("ids file has %q", id)
		}
	}
}

// Only 200 answers count: a 503 is an error, and without
// -tolerate-errors the client stops.
func TestHTTPOnly200Counts(t *testing.T) {
	s := newHTTPServer(t)
	s.status = func(key string, n int) int {
		if strings.HasSuffix(key, "-r1") {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	}
	ids := filepath.Join(t.TempDir(), "ids")
	code, r, _ := runLoadgen(t, "http", "-url", s.url(), "-clients", "2", "-batch", "10", "-messages", "3", "-duration", "0", "-ids", ids)
	if code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	if r.AckedRecords != 20 || r.SentRecords != 40 || r.Errors["http: status 503"] != 2 {
		t.Fatalf("result %+v", r)
	}
	if n := len(readIDs(t, ids)); n != 20 {
		t.Fatalf("ids file has %d ids, want the 20 answered 200", n)
	}
}

// With -tolerate-errors a refused request is sent again, with the same
// Idempotency-Key and records.
func TestHTTPTolerateErrors(t *testing.T) {
	s := newHTTPServer(t)
	s.status = func(key string, n int) int {
		if strings.HasSuffix(key, "-r1") && n == 1 {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	}
	code, r, stderr := runLoadgen(t, "http", "-url", s.url(), "-clients", "2", "-batch", "10", "-messages", "3", "-duration", "0", "-tolerate-errors")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if r.AckedRecords != 60 || r.SentRecords != 60 || r.Errors["http: status 503"] != 2 {
		t.Fatalf("result %+v", r)
	}
	for k, n := range s.keys {
		if want := 1 + boolInt(strings.HasSuffix(k, "-r1")); n != want {
			t.Fatalf("key %s sent %d times, want %d", k, n, want)
		}
	}
	if len(s.ids) != 60 {
		t.Fatalf("%d distinct records, want 60", len(s.ids))
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestTextOutput(t *testing.T) {
	s := newHTTPServer(t)
	var out, errb bytes.Buffer
	code := run(t.Context(), []string{"http", "-url", s.url(), "-clients", "1", "-batch", "5", "-messages", "2", "-duration", "0"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"sent          10 records in 2 messages", "acknowledged  10 records in 2 messages",
		"records/s", "MB/s of record JSON", "ack latency   p50", "errors        none"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("output has no %q:\n%s", want, out.String())
		}
	}
}
