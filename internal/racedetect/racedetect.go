// Package racedetect tells tests whether the race detector is on, so that
// the few whose volume of data it slows several times over run without it
// instead: make test runs them in a run of their own without -race (see
// README.md, Development).
package racedetect

import "testing"

// Heavy skips t under the race detector, saying where it runs instead.
func Heavy(t testing.TB) {
	t.Helper()
	if Enabled {
		t.Skip("heavy: make test runs it without -race, in a run of its own (README.md, Development)")
	}
}
