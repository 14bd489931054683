package config

import (
	"fmt"
	"strings"
	"time"
)

// Duration is a time.Duration written in Go's syntax: "5s", "10m", "1h30m". A number without a
// unit is not a duration (except 0), and negative durations are not allowed.
type Duration time.Duration

// String gives the duration without trailing zero units: "30s", "10m", "1h30m".
func (d Duration) String() string {
	s := time.Duration(d).String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// UnmarshalText parses a duration as time.ParseDuration does, refusing negative ones.
func (d *Duration) UnmarshalText(text []byte) error {
	v, err := time.ParseDuration(string(text))
	if err != nil {
		return fmt.Errorf("%q is not a duration (write a number with a unit: 500ms, 30s, 5m, 1h30m)", text)
	}
	if v < 0 {
		return fmt.Errorf("%q is negative", text)
	}
	*d = Duration(v)
	return nil
}

// MarshalText writes the duration as String does.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }
