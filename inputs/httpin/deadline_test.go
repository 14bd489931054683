package httpin

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A body that pauses (less than idle), then arrives far faster than the
// least rate, gets in: the rate is looked at again at each read within the
// last quarter of idle before the deadline, not only every quarter of idle
// (which, after a check that failed in the pause, came after the deadline).
func TestBodyResumingAfterAPauseGetsIn(t *testing.T) {
	e := newEnv(t, withReadTimeout(2*time.Second), withBodyTimes(2*time.Second, 20*time.Second, 1024))
	line := `{"msg":"` + strings.Repeat("x", 1000) + `"}` + "\n" // 1 KB a record
	body := bytes.Repeat([]byte(line), 120)
	conn := dialRaw(t, e)
	fmt.Fprintf(conn, "POST /v1/logs/slow HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", len(body))
	conn.Write(body[:len(line)]) // 1 KB at once: the rate check passes
	rest := body[len(line):]
	time.Sleep(1600 * time.Millisecond) // a pause shorter than idle
	for len(rest) > 0 {                 // then 50 KB a second
		conn.Write(rest[:len(line)])
		rest = rest[len(line):]
		time.Sleep(20 * time.Millisecond)
	}
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("answer %d %s; want 200: every 2 s held at least 20 KB (10 KB/s), over the 1 KiB/s minimum", resp.StatusCode, b)
	}
}

// A request whose body is read and that then waits (for room in a full
// WAL) is not cut short by the body's read deadline: net/http's read of
// the connection in the background, meeting it, would end the request's
// context, and the client, still there, would get "request canceled"
// instead of 503 wal_full with Retry-After.
func TestBodyDeadlineDoesNotCancelAWaitingRequest(t *testing.T) {
	e := fullEnv(t, 3*time.Second) // the WAL full (when_full: block), the store's wait 3 s
	e.s.bodyIdle, e.s.bodyMax, e.s.bodyRate = time.Second, 10*time.Second, 1
	got := e.post("/v1/logs/app", randomBody(rand.New(rand.NewSource(7)), 2000))
	if got.status != http.StatusServiceUnavailable || got.header.Get("Retry-After") != "1" || e.rejected("canceled") != 0 || e.rejected("wal_full") != 1 {
		t.Errorf("%d %s Retry-After %q, canceled %v, wal_full %v; want 503 wal_full with Retry-After after 3 s",
			got.status, got.body, got.header.Get("Retry-After"), e.rejected("canceled"), e.rejected("wal_full"))
	}
}

// A body that stops arriving is answered 503 at its deadline and its
// connection is not held: net/http's read of the rest of the body after
// the answer keeps the deadline.
func TestStalledBodyIsAnswered(t *testing.T) {
	e := newEnv(t, withReadTimeout(2*time.Second), withBodyTimes(2*time.Second, 20*time.Second, 1024))
	conn := dialRaw(t, e)
	fmt.Fprintf(conn, "POST /v1/logs/slow HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
	conn.Write([]byte(`{"msg":"x`))
	conn.SetReadDeadline(time.Now().Add(8 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to a body that stopped arriving: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("answer %d (Retry-After %q), want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}
