package inputs

import (
	"strings"
	"testing"

	"github.com/logfwd/forwarder/wal"
)

// No forward chunk id and Idempotency-Key share a WAL id, whatever they
// hold; a forward id without a prefix is stored as it always was.
func TestChunkIDsNeverCollide(t *testing.T) {
	ids := []string{"", "a", "zz", "http:", "http:zz", "http:http:zz", "forward:", "forward:zz", "forward:http:zz", "HTTP:zz", "https://x", "forward", "http"}
	seen := map[string]string{}
	for _, id := range ids {
		for input, wid := range map[string]string{"forward": ForwardChunkID(id), "http": HTTPChunkID(id)} {
			if id == "" && input == "forward" {
				continue // no chunk id: nothing is stored
			}
			if other, ok := seen[wid]; ok {
				t.Errorf("%s id %q is WAL id %q, as is %s", input, id, wid, other)
			}
			seen[wid] = input + " " + id
		}
	}
	for _, id := range []string{"a", "zz", "HTTP:zz", "x-http:y", "bW9yZQ=="} {
		if got := ForwardChunkID(id); got != id {
			t.Errorf("forward id %q stored as %q, want it as it is", id, got)
		}
	}
	// The longest ids clients may send fit in the WAL with their prefix.
	long := strings.Repeat("k", MaxClientChunkID)
	for _, wid := range []string{ForwardChunkID("forward:" + long[8:]), ForwardChunkID("http:" + long[5:]), HTTPChunkID(long)} {
		if len(wid) > wal.MaxChunkID {
			t.Errorf("WAL id of %d bytes, over wal.MaxChunkID (%d)", len(wid), wal.MaxChunkID)
		}
	}
}
