//go:build race

package racedetect

// Enabled reports whether the race detector is on.
const Enabled = true
