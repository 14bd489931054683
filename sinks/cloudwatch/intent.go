package cloudwatch

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/logfwd/forwarder/sinks"
)

// intentPrefix starts the sink-state key of every intent:
// call/<group>\x00<stream>\x00<seq of the call's first event, 20 digits>.<its part>,
// and .<attempt> after it for an attempt above 0 (intent.Attempt).
const intentPrefix = IntentPrefix

// IntentPrefix starts the keys of the sink's state under which it keeps
// its interrupted work (see intentPrefix).
const IntentPrefix = "call/"

// intentVersion is the version of the intents this build writes. Version 1
// intents (digest: digestEvents) are still read, so that an upgrade
// resolves the calls an older build left in doubt.
const intentVersion = 2

// attemptVersion is the version of an intent with an Attempt: version 2
// in all but that, so that a build that does not know attempts says so
// rather than take its key for a damaged one.
const attemptVersion = 3

// priorVersion is the version of an intent whose Prior counts copies
// earlier calls stored (prior.go): a build that does not know Prior would
// resolve the call by ingestion time alone, which may take such a copy for
// the call's (a loss), so it refuses the intent instead.
const priorVersion = 4

// intent is committed to the sink's state before a PutLogEvents call and
// deleted in the transaction that records its batch as delivered. It names
// the call's events without holding them: they are the events of the
// stream's records from first to last whose (timestamp, seq, part) lies
// from (min_ts, from_seq, from_part) to (max_ts, to_seq, to_part), which
// is how a batch's sorted events are cut into calls (see doc.go).
type intent struct {
	Version    int    `json:"v"`
	Group      string `json:"group"`
	Stream     string `json:"stream"`
	BatchFirst uint64 `json:"batch_first"` // sequence number of the batch's first record
	First      uint64 `json:"first"`       // smallest and largest sequence numbers of the call's records
	Last       uint64 `json:"last"`
	Events     int    `json:"events"`
	MinTime    int64  `json:"min_ts"` // milliseconds, of the call's first and last events
	MaxTime    int64  `json:"max_ts"`
	FromSeq    uint64 `json:"from_seq"` // the call's first event: its record and part
	FromPart   int    `json:"from_part"`
	ToSeq      uint64 `json:"to_seq"` // the call's last event
	ToPart     int    `json:"to_part"`
	SHA256     string `json:"sha256"`          // hex; see intent.matches
	Token      string `json:"token,omitempty"` // version 2: the sequence token in the body SHA256 is of
	Started    int64  `json:"started"`         // Unix milliseconds when the call started
	// Attempt tells apart the call that sends again the Missing events of
	// a delivered call beginning at the same event: its intent is another,
	// so that the delivered one, which says which events landed, is kept.
	Attempt int `json:"attempt,omitempty"`
	// Delivered: the call landed (its answer came back and a later call of
	// the batch is still to be made, or Recover found its events in the
	// stream). Its events are not sent again, except Missing.
	Delivered bool `json:"delivered,omitempty"`
	// Missing are the events (record, part) of a delivered call that
	// Recover did not find in the stream: they are sent again.
	Missing [][2]uint64 `json:"missing,omitempty"`
	// Rejected are the call's records the service rejected in its answer,
	// dead-lettered when the batch is delivered.
	Rejected []sinks.Rejection `json:"rejected,omitempty"`
	// PriorKnown: Prior says, by message (the hex of messageHash), how
	// many events the calls this process sent to the stream before this
	// one stored at MinTime (prior.go). Not known: resolved by ingestion
	// time alone.
	PriorKnown bool           `json:"prior_known,omitempty"`
	Prior      map[string]int `json:"prior,omitempty"`
}

func (in *intent) partition() string { return in.Group + "\x00" + in.Stream }

func (in *intent) key() []byte {
	if in.Attempt > 0 {
		return fmt.Appendf(nil, "%s%s\x00%020d.%d.%d", intentPrefix, in.partition(), in.FromSeq, in.FromPart, in.Attempt)
	}
	return fmt.Appendf(nil, "%s%s\x00%020d.%d", intentPrefix, in.partition(), in.FromSeq, in.FromPart)
}

// sameCall reports whether in and other are intents of one call (other a
// retry of it, or it delivered).
func (in *intent) sameCall(other *intent) bool {
	return in.FromSeq == other.FromSeq && in.FromPart == other.FromPart && in.Attempt == other.Attempt
}

// after makes in's Attempt follow every delivered intent of known that
// begins at in's first event: in sends again events one of them did not
// land, and must not replace it.
func (in *intent) after(known []*intent) {
	for _, k := range known {
		if k.Delivered && k.FromSeq == in.FromSeq && k.FromPart == in.FromPart {
			in.Attempt = max(in.Attempt, k.Attempt+1)
			in.Version = max(in.Version, attemptVersion)
		}
	}
}

// newIntent describes call, a slice of a batch's sorted events, whose
// PutLogEvents body is body.
func newIntent(partition string, batchFirst uint64, call []event, body putBody, startedMs int64) *intent {
	group, stream := splitPartition(partition)
	first, last := call[0].seq, call[0].seq
	for _, e := range call {
		first, last = min(first, e.seq), max(last, e.seq)
	}
	from, to := call[0], call[len(call)-1]
	return &intent{Version: intentVersion, Group: group, Stream: stream, BatchFirst: batchFirst,
		First: first, Last: last, Events: len(call), MinTime: from.ts, MaxTime: to.ts,
		FromSeq: from.seq, FromPart: from.part, ToSeq: to.seq, ToPart: to.part,
		SHA256: body.sum, Token: body.token, Started: startedMs}
}

// covers reports whether e is one of the call's events.
func (in *intent) covers(e *event) bool {
	if e.seq < in.First || e.seq > in.Last {
		return false
	}
	return !eventBefore(e.ts, e.seq, e.part, in.MinTime, in.FromSeq, in.FromPart) &&
		!eventBefore(in.MaxTime, in.ToSeq, in.ToPart, e.ts, e.seq, e.part)
}

// delivered reports whether e is an event of a delivered call that is not
// to be sent again.
func (in *intent) delivered(e *event) bool {
	if !in.Delivered || !in.covers(e) {
		return false
	}
	for _, m := range in.Missing {
		if m[0] == e.seq && m[1] == uint64(e.part) {
			return false
		}
	}
	return true
}

// eventBefore orders events as a batch's calls are cut: by timestamp, then
// record, then part.
func eventBefore(ts int64, seq uint64, part int, ts2 int64, seq2 uint64, part2 int) bool {
	switch {
	case ts != ts2:
		return ts < ts2
	case seq != seq2:
		return seq < seq2
	}
	return part < part2
}

// matches reports whether call, rebuilt from the WAL, is the call in was
// written for: the same count and digest. Version 2's (and 3's) digest is the hex
// SHA-256 of the call's PutLogEvents body with the intent's token (the
// payload hash it was signed with, unless the service asked for another
// token while it was made); version 1's is digestEvents.
func (in *intent) matches(call []event) bool {
	if len(call) != in.Events {
		return false
	}
	if in.Version == 1 {
		return digestEvents(call) == in.SHA256
	}
	b := appendPutBody(nil, in.Group, in.Stream, in.Token, call)
	return bodySum(b) == in.SHA256
}

// digestEvents is the digest of version 1 intents: the hex SHA-256 of the
// events in order, each as its timestamp (8 bytes, big-endian), its
// message's length (8 bytes, big-endian) and the message.
func digestEvents(evs []event) string {
	h := sha256.New()
	var n [16]byte
	for _, e := range evs {
		binary.BigEndian.PutUint64(n[:8], uint64(e.ts))
		binary.BigEndian.PutUint64(n[8:], uint64(len(e.msg)))
		h.Write(n[:])
		h.Write(e.msg)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// putIntent commits in durably.
func putIntent(ctx context.Context, st sinks.State, in *intent) error {
	v, err := json.Marshal(in)
	if err != nil {
		return err
	}
	if err := st.Put(ctx, in.key(), v); err != nil {
		return fmt.Errorf("commit intent of a call to stream %q of group %q: %w", in.Stream, in.Group, err)
	}
	return nil
}

// intents are the intents in the sink's state, by partition, as this
// process knows them: what Recover loaded and what Send committed.
type intents struct {
	mu     sync.Mutex
	byPart map[string][]*intent
}

func (is *intents) of(partition string) []*intent {
	is.mu.Lock()
	defer is.mu.Unlock()
	return append([]*intent(nil), is.byPart[partition]...)
}

// add records in, replacing an intent of the same call (a retry).
func (is *intents) add(in *intent) {
	is.mu.Lock()
	defer is.mu.Unlock()
	if is.byPart == nil {
		is.byPart = map[string][]*intent{}
	}
	p := in.partition()
	list := is.byPart[p]
	for i, old := range list {
		if old.sameCall(in) {
			list[i] = in
			return
		}
	}
	is.byPart[p] = append(list, in)
}

// done removes the partition's intents whose records are all at or
// before last and returns their keys.
func (is *intents) done(partition string, last uint64) [][]byte {
	is.mu.Lock()
	defer is.mu.Unlock()
	var keys [][]byte
	kept := is.byPart[partition][:0]
	for _, in := range is.byPart[partition] {
		if in.Last <= last {
			keys = append(keys, in.key())
		} else {
			kept = append(kept, in)
		}
	}
	if len(kept) == 0 {
		delete(is.byPart, partition)
	} else {
		is.byPart[partition] = kept
	}
	return keys
}

// rejected reports whether one of the partition's intents holds events
// the service refused of records at or before last: a delivered mark would
// skip those records, which must be dead-lettered instead.
func (is *intents) rejected(partition string, last uint64) bool {
	is.mu.Lock()
	defer is.mu.Unlock()
	for _, in := range is.byPart[partition] {
		for _, rj := range in.Rejected {
			// By the rejected record, not the call's last: a call reaching
			// past last may hold a refused record before it.
			if rj.Seq <= last {
				return true
			}
		}
	}
	return false
}

// has reports whether in is still one of the intents.
func (is *intents) has(in *intent) bool {
	is.mu.Lock()
	defer is.mu.Unlock()
	for _, x := range is.byPart[in.partition()] {
		if x == in {
			return true
		}
	}
	return false
}

func (is *intents) remove(in *intent) {
	is.mu.Lock()
	defer is.mu.Unlock()
	p := in.partition()
	list := is.byPart[p]
	for i, old := range list {
		if old == in {
			is.byPart[p] = append(list[:i:i], list[i+1:]...)
			break
		}
	}
	if len(is.byPart[p]) == 0 {
		delete(is.byPart, p)
	}
}

func (is *intents) reset() {
	is.mu.Lock()
	is.byPart = nil
	is.mu.Unlock()
}

// loadIntents reads every intent in st, oldest call first.
func loadIntents(st sinks.State) ([]*intent, error) {
	var all []*intent
	err := st.Scan([]byte(intentPrefix), func(k, v []byte) error {
		in := new(intent)
		if err := json.Unmarshal(v, in); err != nil {
			return fmt.Errorf("intent %q is damaged: %w", strings.ToValidUTF8(string(k), "?"), err)
		}
		if in.Version < 1 || in.Version > priorVersion {
			return fmt.Errorf("intent %q has format version %d, this build reads 1 to %d", strings.ToValidUTF8(string(k), "?"), in.Version, priorVersion)
		}
		if in.Events < 1 || in.First > in.Last || string(in.key()) != string(k) {
			return fmt.Errorf("intent %q is damaged: it does not describe a call", strings.ToValidUTF8(string(k), "?"))
		}
		all = append(all, in)
		return nil
	})
	sort.SliceStable(all, func(i, j int) bool { return all[i].Started < all[j].Started })
	return all, err
}
