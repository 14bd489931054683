package httpin

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// msThreshold: an epoch number above it is in milliseconds, not seconds
// (1e11 seconds is the year 5138; 1e11 milliseconds is March 1973); above
// usThreshold in microseconds, above nsThreshold in nanoseconds, by the
// same steps.
const (
	msThreshold = 1e11
	usThreshold = 1e14
	nsThreshold = 1e17
)

// unitOf is the nanoseconds of the unit a non-negative epoch number of
// whole units is in, told by its magnitude, and the digits of a fraction
// that count below it.
func unitOf(whole int64, fracNonZero bool) (unit int64, fracDigits int) {
	above := func(th int64) bool { return whole > th || whole == th && fracNonZero }
	switch {
	case above(nsThreshold):
		return 1, 0
	case above(usThreshold):
		return 1e3, 3
	case above(msThreshold):
		return 1e6, 6
	}
	return 1e9, 9
}

var errTimeRange = errors.New("out of range")

// eventTime reads the time field's value, compact JSON as scanned, as Unix
// nanoseconds: an RFC 3339 string (fractional seconds optional; also with
// a space for the T, in lower case, with an offset without its colon, or
// without an offset: UTC), or a number of seconds since the epoch
// (fractional allowed), or of milliseconds when it is above 1e11,
// microseconds above 1e14, nanoseconds above 1e17. A null value counts as
// no time field (ok false).
func eventTime(v []byte) (ns int64, ok bool, err error) {
	switch v[0] {
	case 'n':
		return 0, false, nil
	case '"':
		s, err := unquote(v)
		if err != nil {
			return 0, false, err
		}
		t, err := parseTime(s)
		if err != nil {
			return 0, false, fmt.Errorf("%s is not an RFC 3339 time", clip(v))
		}
		// UnixNano is undefined outside these years.
		if y := t.Year(); y < 1678 || y > 2261 {
			return 0, false, fmt.Errorf("%s is %w (years 1678 to 2261)", clip(v), errTimeRange)
		}
		return t.UnixNano(), true, nil
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		ns, err := epochNanos(v)
		if err != nil {
			return 0, false, fmt.Errorf("%s is %w", clip(v), err)
		}
		return ns, true, nil
	}
	return 0, false, fmt.Errorf("%s is neither an RFC 3339 string nor a number of epoch seconds or milliseconds", clip(v))
}

// timeLayouts are the forms of RFC 3339 that clients write besides the
// strict one, once upper-cased and with a T in place of a space: an offset
// without its colon (strftime's %z), and none (a naive time, taken as UTC).
// Fractional seconds are read in every one.
var timeLayouts = []string{"2006-01-02T15:04:05Z0700", "2006-01-02T15:04:05"}

func parseTime(s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err == nil {
		return t, nil
	}
	u := strings.ToUpper(s) // RFC 3339 allows t and z
	if len(u) > 10 && u[10] == ' ' {
		u = u[:10] + "T" + u[11:]
	}
	if t, err2 := time.Parse(time.RFC3339Nano, u); err2 == nil {
		return t, nil
	}
	for _, l := range timeLayouts {
		if t, err2 := time.Parse(l, u); err2 == nil {
			return t, nil
		}
	}
	return time.Time{}, err
}

func unquote(v []byte) (string, error) {
	inner := v[1 : len(v)-1]
	for _, c := range inner {
		if c == '\\' {
			var s string
			err := json.Unmarshal(v, &s)
			return s, err
		}
	}
	return string(inner), nil
}

// epochNanos converts a JSON number (as scanned: valid) of epoch seconds,
// or milliseconds, microseconds or nanoseconds above msThreshold, usThreshold,
// nsThreshold, to nanoseconds. Plain decimals are
// converted exactly (digits past the nanosecond are dropped); numbers with
// an exponent go through float64.
func epochNanos(v []byte) (int64, error) {
	num := v
	neg := false
	if num[0] == '-' {
		neg, num = true, num[1:]
	}
	i := digits(num, 0)
	intPart, frac := num[:i], []byte(nil)
	if i < len(num) && num[i] == '.' {
		j := digits(num, i+1)
		frac, i = num[i+1:j], j
	}
	if i < len(num) { // an exponent
		f, err := strconv.ParseFloat(string(v), 64)
		if err != nil {
			return 0, errTimeRange
		}
		return floatNanos(f)
	}
	// JSON has no leading zeros, so more than 19 digits is more than an
	// int64 of nanoseconds, past the year 2262.
	if len(intPart) > 19 {
		return 0, errTimeRange
	}
	whole, err := strconv.ParseInt(string(intPart), 10, 64)
	if err != nil {
		return 0, errTimeRange
	}
	unit, fracDigits := int64(1e9), 9
	if !neg {
		unit, fracDigits = unitOf(whole, nonZero(frac))
	}
	if whole > math.MaxInt64/unit {
		return 0, errTimeRange
	}
	ns := whole * unit
	var part int64
	for k := range fracDigits {
		part *= 10
		if k < len(frac) {
			part += int64(frac[k] - '0')
		}
	}
	if ns > math.MaxInt64-part {
		return 0, errTimeRange
	}
	ns += part
	if neg {
		ns = -ns
	}
	return ns, nil
}

func floatNanos(f float64) (int64, error) {
	ns := f * 1e9
	switch {
	case f > nsThreshold:
		ns = f
	case f > usThreshold:
		ns = f * 1e3
	case f > msThreshold:
		ns = f * 1e6
	}
	if math.IsNaN(ns) || ns >= 0x1p63 || ns < -0x1p63 {
		return 0, errTimeRange
	}
	return int64(ns), nil
}

func nonZero(digits []byte) bool {
	for _, c := range digits {
		if c != '0' {
			return true
		}
	}
	return false
}

// clip shortens a client's value for an error message.
func clip(v []byte) string {
	const max = 64
	if len(v) > max {
		return string(v[:max]) + "..."
	}
	return string(v)
}
