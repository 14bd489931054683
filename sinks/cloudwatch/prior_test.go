package cloudwatch

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/logfwd/forwarder/sinks"
)

// What a call's intent says of the identical events earlier calls of the
// process stored at its first millisecond.
func TestPrior(t *testing.T) {
	s := &Sink{last: newLRU(10)}
	const p = "g\x00s"
	ev := func(ts int64, msg string) event { return event{ts: ts, msg: []byte(msg)} }
	prior := func(call ...event) *intent {
		in := &intent{Group: "g", Stream: "s", MinTime: call[0].ts}
		s.setPrior(in, call)
		return in
	}
	if in := prior(ev(10, "a")); in.PriorKnown {
		t.Errorf("the stream's first call: %+v, want not known", in)
	}
	s.noteSent(p, []event{ev(9, "x"), ev(10, "a"), ev(10, "a"), ev(10, "b")})
	if in := prior(ev(11, "a")); !in.PriorKnown || len(in.Prior) != 0 {
		t.Errorf("a call after the last millisecond: %+v, want known and none", in)
	}
	in := prior(ev(10, "a"), ev(10, "c"), ev(12, "b"))
	if !in.PriorKnown || len(in.Prior) != 1 || in.priorCopies(eventKey{10, "a"}) != 2 || in.priorCopies(eventKey{10, "c"}) != 0 || in.priorCopies(eventKey{12, "b"}) != 0 {
		t.Errorf("a call beginning at the last millisecond: %+v, want a: 2", in)
	}
	if in.Version != priorVersion {
		t.Errorf("an intent with Prior in format version %d, want %d (a build that ignores Prior must refuse it)", in.Version, priorVersion)
	}
	if in := prior(ev(10, "c")); in.Version == priorVersion {
		t.Errorf("an intent with no Prior in format version %d", in.Version)
	}
	if in := prior(ev(9, "x")); in.PriorKnown {
		t.Errorf("a call beginning before the last millisecond: %+v, want not known", in)
	}
	s.noteSent(p, []event{ev(5, "old")}) // all before the last millisecond: nothing changes
	s.noteSent(p, []event{ev(10, "a"), ev(10, "b")})
	if in := prior(ev(10, "a"), ev(10, "b")); in.priorCopies(eventKey{10, "a"}) != 3 || in.priorCopies(eventKey{10, "b"}) != 2 {
		t.Errorf("after another call of the same millisecond: %+v, want a: 3, b: 2", in)
	}
	var many []event
	for i := range maxPriorMessages + 1 {
		many = append(many, ev(20, strconv.Itoa(i)))
	}
	s.noteSent(p, many)
	if in := prior(ev(20, "0")); in.PriorKnown {
		t.Errorf("a millisecond of %d messages: %+v, want not known", len(many), in)
	}
	if in := prior(ev(21, "0")); !in.PriorKnown {
		t.Errorf("after a millisecond of too many messages: %+v, want known", in)
	}
	if l, ok := decodeLast(fmt.Sprint("7 0 ", strconv.FormatUint(messageHash([]byte("m")), 16), ":4")); !ok || l.ms != 7 || l.counts[messageHash([]byte("m"))] != 4 {
		t.Errorf("decodeLast: %+v %v", l, ok)
	}
	if _, ok := decodeLast("7 0 zz:1"); ok {
		t.Error("decodeLast took a damaged value")
	}
}

// A delivered call that reaches past last but holds a refused record at
// or before it makes rejected true: a delivered mark up to last would skip
// that record instead of dead-lettering it.
func TestRejectedByRecord(t *testing.T) {
	var is intents
	const p = "g\x00s"
	is.add(&intent{Group: "g", Stream: "s", First: 10, Last: 30, Delivered: true, Rejected: []sinks.Rejection{{Seq: 12, Reason: "too_old"}}})
	if !is.rejected(p, 20) {
		t.Error("a refused record at 12, a call to 30: not rejected up to 20")
	}
	if is.rejected(p, 11) {
		t.Error("rejected up to 11, before the refused record")
	}
}

// The intents of format versions 1 to 4 are read; a newer one is refused,
// naming the versions this build reads.
func TestIntentVersionsRead(t *testing.T) {
	for v, ok := range map[int]bool{1: true, 2: true, 3: true, 4: true, 5: false} {
		in := &intent{Version: v, Group: "g", Stream: "s", First: 1, Last: 1, Events: 1, FromSeq: 1, ToSeq: 1}
		if v == 3 {
			in.Attempt = 1
		}
		st := &memState{m: map[string][]byte{}}
		if err := putIntent(context.Background(), st, in); err != nil {
			t.Fatal(err)
		}
		_, err := loadIntents(st)
		if ok && err != nil || !ok && (err == nil || !strings.Contains(err.Error(), "has format version 5, this build reads 1 to 4")) {
			t.Errorf("version %d: %v", v, err)
		}
	}
}
