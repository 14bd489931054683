package httpin

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"
)

// bearer checks the Authorization header against the configured token.
// Both sides are hashed first so that the comparison takes the same time
// whatever the length of what the client sent.
type bearer struct {
	sum [sha256.Size]byte
}

func newBearer(token string) *bearer {
	return &bearer{sum: sha256.Sum256([]byte(token))}
}

// allows reports whether r carries "Authorization: Bearer <token>".
func (b *bearer) allows(r *http.Request) bool {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(token)))
	return subtle.ConstantTimeCompare(got[:], b.sum[:]) == 1
}
