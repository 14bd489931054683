package cloudwatch

import (
	"fmt"
	"testing"
	"time"
)

// TestGroupOutcomes: another group's recent success makes a refusal
// scoped; its own, an old one, or one refused since do not; the bound
// drops old outcomes first, keeping the recent evidence.
func TestGroupOutcomes(t *testing.T) {
	var g groupOutcomes
	now := time.Unix(1_800_000_000, 0)
	g.note("a", false, now)
	switch {
	case g.othersTake("a", now):
		t.Error("a group's own success counts for it")
	case !g.othersTake("b", now.Add(deniedWindow)):
		t.Error("another group's success within the window does not count")
	case g.othersTake("b", now.Add(deniedWindow+time.Second)):
		t.Error("a success older than the window counts")
	}
	g.note("a", true, now.Add(time.Second))
	if g.othersTake("b", now.Add(2*time.Second)) {
		t.Error("a group refused since its success counts")
	}
	// Full of old outcomes, then a recent success: a new group's outcome
	// drops the old ones, not the recent one.
	later := now.Add(time.Hour)
	g.note("recent", false, later)
	for i := len(g.last); i < maxGroupOutcomes; i++ {
		g.note(fmt.Sprint("old", i), false, now)
	}
	g.note("new", true, later)
	if !g.othersTake("new", later) {
		t.Error("the recent success was dropped with the old outcomes")
	}
	if n := len(g.last); n > 3 {
		t.Errorf("%d outcomes kept", n)
	}
}
