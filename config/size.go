package config

import (
	"fmt"
	"strconv"
	"strings"
)

// Size is a number of bytes. In the file it is written as an integer with an optional unit:
// B; KiB, MiB, GiB, TiB (powers of 1024); KB, MB, GB, TB (powers of 1000). A plain integer is
// bytes. Negative sizes are not allowed.
type Size int64

// Binary size units.
const (
	KiB Size = 1 << (10 * (iota + 1))
	MiB
	GiB
	TiB
)

var sizeUnits = map[string]Size{
	"": 1, "B": 1,
	"KiB": KiB, "MiB": MiB, "GiB": GiB, "TiB": TiB,
	"KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
}

// ParseSize parses a size such as "64MiB", "1GB" or "1048576".
func ParseSize(s string) (Size, error) {
	if strings.HasPrefix(s, "-") {
		return 0, fmt.Errorf("%q is negative", s)
	}
	digits := strings.IndexFunc(s, func(r rune) bool { return r < '0' || r > '9' })
	if digits < 0 {
		digits = len(s)
	}
	number, unit := s[:digits], s[digits:]
	mult, ok := sizeUnits[unit]
	if number == "" || !ok {
		return 0, fmt.Errorf("%q is not a size (write bytes or a number with a unit: 100B, 512KiB, 64MiB, 10GiB, 1GB)", s)
	}
	n, err := strconv.ParseInt(number, 10, 64)
	if err != nil || n > int64(maxSize/mult) {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return Size(n) * mult, nil
}

const maxSize = Size(1<<63 - 1)

// String gives the size in the largest binary unit that holds it exactly, so that it parses
// back to the same value: "64MiB", "10GiB", "1000000000B".
func (s Size) String() string {
	for _, u := range binaryUnits {
		if s != 0 && s%u.size == 0 {
			return strconv.FormatInt(int64(s/u.size), 10) + u.name
		}
	}
	return strconv.FormatInt(int64(s), 10) + "B"
}

// binaryUnits are the binary units, largest first.
var binaryUnits = []struct {
	name string
	size Size
}{{"TiB", TiB}, {"GiB", GiB}, {"MiB", MiB}, {"KiB", KiB}}

// Human is s for people: exact in the largest unit that divides it ("12MiB"), else to one
// decimal in the largest unit it reaches ("9.6MiB" for 10066329 bytes).
func (s Size) Human() string {
	for _, u := range binaryUnits {
		if s != 0 && s%u.size == 0 {
			return strconv.FormatInt(int64(s/u.size), 10) + u.name
		}
		if s >= u.size {
			return strconv.FormatFloat(float64(s)/float64(u.size), 'f', 1, 64) + u.name
		}
	}
	return strconv.FormatInt(int64(s), 10) + "B"
}

// UnmarshalText parses a size written as ParseSize accepts.
func (s *Size) UnmarshalText(text []byte) error {
	v, err := ParseSize(string(text))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// MarshalText writes the size as String does.
func (s Size) MarshalText() ([]byte, error) { return []byte(s.String()), nil }
