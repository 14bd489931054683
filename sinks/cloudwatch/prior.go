package cloudwatch

import (
	"hash/fnv"
	"strconv"
	"strings"
)

// A call in doubt is resolved by reading its stream back (recover.go): an
// event found there ingested at or after the call started is taken for
// the call's. That compares the service's clock with this host's: with the
// host's behind, an identical event (same millisecond, same message) an
// earlier call stored just before looks ingested after the call started,
// and a call that did not land would be taken for delivered, its event
// lost. So the intent of a call also says how many events with each of its
// first millisecond's messages the calls this process sent to the stream
// before it may have stored at that millisecond (those that landed, and
// those whose answer was lost) (Prior, PriorKnown); Recover takes that many
// copies of each as an earlier call's, whatever their ingestion time. A stream's earlier calls are known for the last millisecond they
// reached only, and only in this process: a call beginning before it, the
// first call to a stream after a start, and a millisecond of more than
// maxPriorMessages messages are not known (PriorKnown false), and resolved
// by ingestion time alone.

// maxPriorMessages bounds the messages kept for a stream's last
// millisecond, and maxPriorStreams the streams (their lru): at most about
// 7 MB in all, and a few hundred bytes in an intent.
const (
	maxPriorMessages = 16
	maxPriorStreams  = 20000
)

// streamLast is what this process's calls to a stream stored at the last
// millisecond they reached.
type streamLast struct {
	ms       int64
	overflow bool           // more than maxPriorMessages messages: not known
	counts   map[uint64]int // events by messageHash
}

func messageHash(msg []byte) uint64 {
	h := fnv.New64a()
	h.Write(msg)
	return h.Sum64()
}

// encode and decodeLast keep a streamLast in the sink's lru (strings):
// "ms overflow hash:count ...".
func (l *streamLast) encode() string {
	var b strings.Builder
	b.WriteString(strconv.FormatInt(l.ms, 10))
	if l.overflow {
		b.WriteString(" 1")
	} else {
		b.WriteString(" 0")
	}
	for h, n := range l.counts {
		b.WriteByte(' ')
		b.WriteString(strconv.FormatUint(h, 16))
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(n))
	}
	return b.String()
}

func decodeLast(v string) (streamLast, bool) {
	f := strings.Fields(v)
	if len(f) < 2 {
		return streamLast{}, false
	}
	ms, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return streamLast{}, false
	}
	l := streamLast{ms: ms, overflow: f[1] == "1", counts: make(map[uint64]int, len(f)-2)}
	for _, kv := range f[2:] {
		h, n, ok := strings.Cut(kv, ":")
		hv, err1 := strconv.ParseUint(h, 16, 64)
		nv, err2 := strconv.Atoi(n)
		if !ok || err1 != nil || err2 != nil {
			return streamLast{}, false
		}
		l.counts[hv] = nv
	}
	return l, true
}

// setPrior fills in's Prior from what this process sent to its stream
// before call.
func (s *Sink) setPrior(in *intent, call []event) {
	v, ok := s.last.get(in.partition())
	if !ok {
		return // the stream's first call since the start: not known
	}
	l, ok := decodeLast(v)
	switch {
	case !ok:
		return
	case in.MinTime > l.ms:
		in.PriorKnown = true // no earlier call of this process reached it
		return
	case in.MinTime < l.ms || l.overflow:
		return // earlier millisecond than the last known: not known
	}
	in.PriorKnown = true
	for _, e := range call {
		if e.ts != in.MinTime {
			break // sorted
		}
		h := messageHash(e.msg)
		if n := l.counts[h]; n > 0 {
			if in.Prior == nil {
				in.Prior = map[string]int{}
			}
			in.Prior[strconv.FormatUint(h, 16)] = n
			in.Version = max(in.Version, priorVersion)
		}
	}
}

// noteSent records call, which landed or may have, as the stream's last
// call.
func (s *Sink) noteSent(partition string, call []event) {
	maxTs := call[len(call)-1].ts // sorted
	l := streamLast{ms: maxTs}
	if v, ok := s.last.get(partition); ok {
		if old, ok := decodeLast(v); ok {
			switch {
			case old.ms > maxTs:
				return // the call was all before the last millisecond: nothing changes
			case old.ms == maxTs:
				l = old
			}
		}
	}
	if l.counts == nil {
		l.counts = map[uint64]int{}
	}
	for i := len(call) - 1; i >= 0 && call[i].ts == maxTs && !l.overflow; i-- {
		l.counts[messageHash(call[i].msg)]++
		if len(l.counts) > maxPriorMessages {
			l.overflow, l.counts = true, nil
		}
	}
	s.last.put(partition, l.encode())
}

// unnote takes back from the stream's last millisecond what noteSent
// counted of call's missing events (call's events not found in the
// stream when it was read back): they did not land.
func (s *Sink) unnote(partition string, call []event, missing [][2]uint64) {
	if len(missing) == 0 {
		return
	}
	v, ok := s.last.get(partition)
	if !ok {
		return
	}
	l, ok := decodeLast(v)
	if !ok || l.overflow {
		return
	}
	gone := make(map[[2]uint64]bool, len(missing))
	for _, m := range missing {
		gone[m] = true
	}
	changed := false
	for _, e := range call {
		if e.ts != l.ms || !gone[[2]uint64{e.seq, uint64(e.part)}] {
			continue
		}
		if h := messageHash(e.msg); l.counts[h] > 0 {
			if l.counts[h]--; l.counts[h] == 0 {
				delete(l.counts, h)
			}
			changed = true
		}
	}
	if changed {
		s.last.put(partition, l.encode())
	}
}

// priorCopies is how many events with key k's message earlier calls of
// the process that sent in stored at k's millisecond, as in says.
func (in *intent) priorCopies(k eventKey) int {
	if len(in.Prior) == 0 || k.ts != in.MinTime {
		return 0
	}
	return in.Prior[strconv.FormatUint(messageHash([]byte(k.msg)), 16)]
}
