package s3sink

import (
	"bytes"

	"github.com/logfwd/forwarder/sinks"
)

// openObject is what the sink hands the drainer to carry between sends of
// a partition (sinks.Carry): an object being built, its records already
// compressed, member by member. A partition's object can so grow to
// max_object_bytes in the memory of its compressed bytes rather than in
// that of its records. It is never changed: taking in another member makes
// a new one, so that a failed send leaves the carry it was given as it was.
type openObject struct {
	first, last uint64
	records     int
	members     []member
	lines       int64  // uncompressed bytes of the members
	max         int64  // max_object_bytes
	crc         uint32 // CRC-32C of their lines
	mem         int
}

var _ sinks.Carry = (*openObject)(nil)

func (o *openObject) Mem() int { return o.mem }

// memberOverhead is what holding a member costs besides its bytes.
const memberOverhead = 64

// Room is what the object can still take in of lines.
func (o *openObject) Room() int { return int(max(o.max-o.lines, 0)) }

// with returns o (nil: none yet) with m, of records first to last, taken
// in; the object holds at most maxBytes of lines.
func (o *openObject) with(m member, first, last uint64, maxBytes int) *openObject {
	if o == nil {
		o = &openObject{first: first, max: int64(maxBytes)}
	}
	if cap(m.body) > len(m.body)+len(m.body)/8 {
		// The compressor's buffer was sized for a poor ratio: hold only
		// the bytes, for as long as the object stays open.
		m.body = bytes.Clone(m.body)
	}
	return &openObject{
		first: o.first, last: last, records: o.records + m.records,
		// Appending may write into o's array past its length: o never
		// sees it, and only the newest carry of a partition is sent on.
		members: append(o.members, m),
		lines:   o.lines + m.lines, max: o.max, crc: m.crc,
		mem: o.mem + cap(m.body) + memberOverhead,
	}
}
