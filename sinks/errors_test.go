package sinks

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
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
