package inputs

import "strings"

// MaxClientChunkID is the longest id a client may give a request, a forward
// chunk id or an HTTP Idempotency-Key, in bytes. The WAL's limit
// (wal.MaxChunkID) leaves room for the prefix an input puts before it.
const MaxClientChunkID = 1024

// Both inputs keep their ids in the WAL's one table of chunk ids; these
// prefixes keep a forward chunk id from ever being taken for an HTTP
// Idempotency-Key, or the other way round.
const (
	httpPrefix    = "http:"
	forwardPrefix = "forward:"
)

// HTTPChunkID is the WAL's id for an Idempotency-Key: "http:" and the key.
func HTTPChunkID(key string) string { return httpPrefix + key }

// ForwardChunkID is the WAL's id for a forward chunk id: the id as it is,
// as versions before these prefixes stored it (so that a chunk sent again
// across an upgrade is still acknowledged without being stored twice),
// unless it starts with "http:" or "forward:", which gets "forward:" before
// it. Forward ids thus never start with "http:", and no two ids of either
// input share a WAL id: an id without a prefix is a forward one as it is,
// one with "forward:" is a forward one with the prefix removed, and one
// with "http:" is an Idempotency-Key.
func ForwardChunkID(chunk string) string {
	if strings.HasPrefix(chunk, httpPrefix) || strings.HasPrefix(chunk, forwardPrefix) {
		return forwardPrefix + chunk
	}
	return chunk
}
