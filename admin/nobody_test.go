package admin

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Requests that announce a body they never send (no admin route reads
// one) do not hold the connections the cap allows: each is answered 400
// and closed at once, and the kubelet's probe gets in.
func TestUnsentBodiesDoNotHoldTheConnections(t *testing.T) {
	old := maxConns
	maxConns = 4
	t.Cleanup(func() { maxConns = old })
	s := serveBare(t, slog.New(slog.DiscardHandler))
	for range maxConns {
		c, err := net.Dial("tcp", s.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("a request announcing a body it does not send: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "no request body") {
			t.Errorf("answer %d %q, want 400 saying routes take no body", resp.StatusCode, b)
		}
	}
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + s.Addr().String() + "/healthz")
	if err != nil {
		t.Fatalf("a probe after %d requests with unsent bodies: %v", maxConns, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("probe: %d", resp.StatusCode)
	}
}
