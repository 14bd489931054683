package s3sink

import (
	"crypto/sha256"
	"fmt"
	"hash"

	"github.com/logfwd/forwarder/sinks"
)

// openObject is what the sink hands the drainer to carry between sends of
// a partition (sinks.Carry): an object being built, its records already
// compressed, member by member. Its members are staged on disk (path set:
// the file's first size bytes, see staging) or, without staging or when
// staging was full as the object began, held in memory (bodies). A
// partition's object can so grow to max_object_bytes in its file, or in
// the memory of its compressed bytes, rather than in that of its records.
// It is never changed: taking in another member makes a new one, so that
// a failed send leaves the carry it was given as it was (a staged file is
// written at the carry's size and cut there, so that a member written by a
// failed send is overwritten by its retry).
type openObject struct {
	first, last uint64
	records     int
	counts      []int32  // records of each member
	bodies      [][]byte // the members' bytes, held in memory; nil when staged
	path        string   // the staged file; "" when held in memory
	size        int64    // bytes of the members
	// hash is the SHA-256 state (encoding.BinaryMarshaler) after a staged
	// object's bytes: its sum is the intent's without reading the file.
	hash  []byte
	lines int64  // uncompressed bytes of the members
	max   int64  // max_object_bytes
	crc   uint32 // CRC-32C of their lines
	gzcrc uint32 // CRC-32 (gzip's) of them: a one-stream gzip object's trailer
	mem   int
	stage *staging // where path is staged
}

var (
	_ sinks.Carry     = (*openObject)(nil)
	_ sinks.Discarder = (*openObject)(nil)
)

// Discard removes the staged file of an object the drainer gives up: its
// records are read again and go in a new object, which starts the file
// anew. Without it the file's bytes would stay counted against
// staging_max_bytes until the partition next begins an object.
func (o *openObject) Discard() {
	if o.staged() && o.stage != nil {
		o.stage.remove(o.path)
	}
}

// Mem is what the object holds in memory: its members' bytes when they
// are not staged, and its own bookkeeping.
func (o *openObject) Mem() int { return o.mem }

// memberOverhead is what holding a member in memory costs besides its
// bytes; stagedMemberOverhead, what a staged member costs (its count).
// objectOverhead is the object's own: the struct, its file name and hash
// state.
const (
	memberOverhead       = 64
	stagedMemberOverhead = 8
	objectOverhead       = 384
)

// Room is what the object can still take in of lines.
func (o *openObject) Room() int { return int(max(o.max-o.lines, 0)) }

func (o *openObject) staged() bool { return o != nil && o.path != "" }

// chain is what o (nil: none yet) hands its next member.
func (o *openObject) chain() chain {
	if o == nil {
		return chain{}
	}
	return chain{crc: o.crc, gzcrc: o.gzcrc, after: true}
}

// members lists the records of each member, for the intent.
func (o *openObject) members() []int {
	out := make([]int, len(o.counts))
	for i, n := range o.counts {
		out[i] = int(n)
	}
	return out
}

// with returns o (nil: none yet) with m, of records first to last, taken
// in memory; the object holds at most maxBytes of lines. m owns its body
// (member.own), an exact copy of the compressor's output, so that the
// object holds only the bytes for as long as it stays open.
func (o *openObject) with(m member, first, last uint64, maxBytes int) *openObject {
	if o == nil {
		o = &openObject{first: first, max: int64(maxBytes), mem: objectOverhead}
	}
	return &openObject{
		first: o.first, last: last, records: o.records + m.records,
		// Appending may write into o's arrays past their lengths: o never
		// sees it, and only the newest carry of a partition is sent on.
		counts: append(o.counts, int32(m.records)),
		bodies: append(o.bodies, m.body),
		size:   o.size + int64(len(m.body)),
		lines:  o.lines + m.lines, max: o.max, crc: m.crc, gzcrc: m.gzcrc,
		mem: o.mem + cap(m.body) + memberOverhead,
	}
}

// withStaged returns o (nil: none yet) with m, which is written to the
// staged file at path after o's members, taken in.
func (o *openObject) withStaged(m member, first, last uint64, maxBytes int, path string, st *staging) (*openObject, error) {
	h := sha256.New()
	if o == nil {
		o = &openObject{first: first, max: int64(maxBytes), path: path, mem: objectOverhead, stage: st}
	} else if err := unmarshalHash(h, o.hash); err != nil {
		return nil, fmt.Errorf("restore object hash: %w", err)
	}
	h.Write(m.body)
	state, err := h.(interface{ MarshalBinary() ([]byte, error) }).MarshalBinary()
	if err != nil {
		return nil, fmt.Errorf("save object hash: %w", err)
	}
	return &openObject{
		first: o.first, last: last, records: o.records + m.records,
		counts: append(o.counts, int32(m.records)),
		path:   o.path, size: o.size + int64(len(m.body)), hash: state,
		lines: o.lines + m.lines, max: o.max, crc: m.crc, gzcrc: m.gzcrc,
		mem: o.mem + stagedMemberOverhead, stage: o.stage,
	}, nil
}

// sum is the SHA-256 of a staged object's bytes followed by tail.
func (o *openObject) sum(tail []byte) ([]byte, error) {
	h := sha256.New()
	if err := unmarshalHash(h, o.hash); err != nil {
		return nil, fmt.Errorf("restore object hash: %w", err)
	}
	h.Write(tail)
	return h.Sum(nil), nil
}

// unmarshalHash restores h (a SHA-256) to a state saved with MarshalBinary.
func unmarshalHash(h hash.Hash, state []byte) error {
	return h.(interface{ UnmarshalBinary([]byte) error }).UnmarshalBinary(state)
}
