package sinks

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"
)

// Class says what the drainer does after a failed send.
type Class int

const (
	// Retryable: a passing fault (network, 5xx). Retry the batch with
	// backoff and jitter; the other partitions go on.
	Retryable Class = iota
	// Throttled: the destination asked for less. Every partition of the
	// sink waits (Wait, when the destination said how long) and the sink
	// sends fewer batches at once for a while.
	Throttled
	// RecordPermanent: the destination will never take these records.
	// Dead-letter the whole batch with the reason and move on.
	RecordPermanent
	// SinkPermanent: nothing will get through until an operator acts (bad
	// credentials, access denied, missing bucket). Pause the sink, say what
	// to fix, retry slowly; never drop or dead-letter for it.
	SinkPermanent
)

func (c Class) String() string {
	switch c {
	case Retryable:
		return "retryable"
	case Throttled:
		return "throttled"
	case RecordPermanent:
		return "record_permanent"
	case SinkPermanent:
		return "sink_permanent"
	}
	return fmt.Sprintf("class(%d)", int(c))
}

// ErrCarryLost, wrapped in a Retryable error from Send, says the sink can
// no longer deliver what it carries for the partition (the S3 sink's
// staged object is damaged and the WAL no longer holds all of its
// records to build it again): the drainer gives the carry up (Discarder)
// and reads its records, those the WAL still holds, again from the WAL,
// as after a drop. Without a carry it is an ordinary retryable failure.
var ErrCarryLost = errors.New("the carried records cannot be delivered as they were taken in")

// Error is a classified send failure.
type Error struct {
	Class  Class
	Reason string        // short and stable, a metric label: "ThrottlingException", "network"
	Wait   time.Duration // Throttled: how long the destination asked to wait; 0: unknown
	Err    error
}

func (e *Error) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("%s (%s)", e.Reason, e.Class)
	}
	return fmt.Sprintf("%s (%s): %v", e.Reason, e.Class, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Unreachable reports whether the send failed because no connection to the
// destination, or to the HTTP proxy in front of it, could be made: the
// dial was refused, found no route or timed out, or the name did not
// resolve. That says the same of every send of the sink, whatever its
// partition; a timeout, a connection broken midway or an error answered
// (a proxy's 502 included) can be one request's own.
func (e *Error) Unreachable() bool {
	return e.Class == Retryable && NoConnection(e.Err)
}

// NoConnection reports whether err says that no connection to the
// destination, or to the HTTP proxy in front of it, could be made (see
// Unreachable): the request never left.
func NoConnection(err error) bool {
	for err := err; ; {
		var op *net.OpError
		if !errors.As(err, &op) {
			break
		}
		if op.Op == "dial" {
			return true
		}
		if op.Op != "proxyconnect" { // net/http's dial of the proxy wraps the dial's error
			break
		}
		err = op.Err
	}
	var dns *net.DNSError
	return errors.As(err, &dns)
}

// NewRetryable, NewThrottled, NewRecordPermanent and NewSinkPermanent
// classify err.
func NewRetryable(reason string, err error) error {
	return &Error{Class: Retryable, Reason: reason, Err: err}
}

func NewThrottled(reason string, wait time.Duration, err error) error {
	return &Error{Class: Throttled, Reason: reason, Wait: wait, Err: err}
}

func NewRecordPermanent(reason string, err error) error {
	return &Error{Class: RecordPermanent, Reason: reason, Err: err}
}

func NewSinkPermanent(reason string, err error) error {
	return &Error{Class: SinkPermanent, Reason: reason, Err: err}
}

// Classify returns err as an *Error. An error the sink did not classify is
// retryable with reason "unclassified": the drainer never drops a record
// for an error it does not understand.
func Classify(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return &Error{Class: Retryable, Reason: "timeout", Err: err}
	}
	return &Error{Class: Retryable, Reason: "unclassified", Err: err}
}
