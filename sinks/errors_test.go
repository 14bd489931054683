package sinks

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/logfwd/forwarder/internal/nettest"
)

func TestClassify(t *testing.T) {
	base := errors.New("boom")
	tests := []struct {
		err    error
		class  Class
		reason string
	}{
		{NewThrottled("ThrottlingException", time.Second, base), Throttled, "ThrottlingException"},
		{fmt.Errorf("put events: %w", NewSinkPermanent("AccessDenied", base)), SinkPermanent, "AccessDenied"},
		{NewRecordPermanent("too_old", base), RecordPermanent, "too_old"},
		{NewRetryable("http_503", base), Retryable, "http_503"},
		{fmt.Errorf("send: %w", context.DeadlineExceeded), Retryable, "timeout"},
		{base, Retryable, "unclassified"}, // never dropped for an unknown error
	}
	for _, tt := range tests {
		e := Classify(tt.err)
		if e.Class != tt.class || e.Reason != tt.reason {
			t.Errorf("Classify(%v) = %v/%q, want %v/%q", tt.err, e.Class, e.Reason, tt.class, tt.reason)
		}
	}
	if e := Classify(NewThrottled("x", 3*time.Second, nil)); e.Wait != 3*time.Second || e.Error() != "x (throttled)" {
		t.Errorf("throttled wait %v, text %q", e.Wait, e.Error())
	}
	if !errors.Is(NewRetryable("r", base), base) {
		t.Error("a classified error does not unwrap to its cause")
	}
}

// Unreachable is what net/http's errors say of the connection: a dial
// refused, to the destination or to the proxy in front of it, is; a
// connection the other end closes unread, a timeout or an answer is not.
func TestUnreachable(t *testing.T) {
	closed, hangUp := nettest.ClosedAddr(t), nettest.HangUpAddr(t)
	get := func(proxy, target string) error {
		tr := &http.Transport{}
		if proxy != "" {
			u, _ := url.Parse("http://" + proxy)
			tr.Proxy = http.ProxyURL(u)
		}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr}).Get(target)
		if err == nil {
			resp.Body.Close()
			t.Fatalf("GET %s through %q succeeded", target, proxy)
		}
		return err
	}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"refused", get("", "http://"+closed+"/"), true},
		{"proxy refused, https", get(closed, "https://logs.example/"), true},
		{"proxy refused, http", get(closed, "http://logs.example/"), true},
		{"hung up", get("", "http://"+hangUp+"/"), false},
		{"proxy hung up", get(hangUp, "https://logs.example/"), false},
		{"name not resolved", &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "logs.example"}}, true},
		{"timeout", context.DeadlineExceeded, false},
		{"read", &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")}, false},
	} {
		if got := NewRetryable("network", c.err).(*Error).Unreachable(); got != c.want {
			t.Errorf("%s (%v): unreachable %v, want %v", c.name, c.err, got, c.want)
		}
	}
	refused := get("", "http://"+closed+"/")
	if NewSinkPermanent("AccessDenied", refused).(*Error).Unreachable() {
		t.Error("a sink-permanent error counted as unreachable")
	}
}
