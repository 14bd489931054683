package config

import (
	"testing"
	"time"
)

func TestParseSize(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Size
	}{
		{"0", 0},
		{"100", 100},
		{"100B", 100},
		{"512KiB", 512 << 10},
		{"64MiB", 64 << 20},
		{"10GiB", 10 << 30},
		{"2TiB", 2 << 40},
		{"1KB", 1000},
		{"5MB", 5e6},
		{"1GB", 1e9},
		{"3TB", 3e12},
	} {
		got, err := ParseSize(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{"", "B", "12XB", "1.5GiB", "-1", "-1MiB", "64 MiB", "64mib", "+1", "9999999999TiB", "99999999999999999999"} {
		if got, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) = %d, want an error", in, got)
		}
	}
}

func TestSizeString(t *testing.T) {
	for _, c := range []struct {
		size Size
		want string
	}{
		{0, "0B"},
		{100, "100B"},
		{KiB, "1KiB"},
		{64 * MiB, "64MiB"},
		{10 * GiB, "10GiB"},
		{1536 * MiB, "1536MiB"},
		{1e9, "1000000000B"},
		{TiB, "1TiB"},
	} {
		if got := c.size.String(); got != c.want {
			t.Errorf("Size(%d).String() = %q, want %q", int64(c.size), got, c.want)
		}
		if back, err := ParseSize(c.want); err != nil || back != c.size {
			t.Errorf("ParseSize(%q) = %d, %v; want %d back", c.want, back, err, c.size)
		}
	}
}

func TestDuration(t *testing.T) {
	for _, c := range []struct {
		in   string
		want time.Duration
		str  string
	}{
		{"0", 0, "0s"},
		{"5s", 5 * time.Second, "5s"},
		{"10m", 10 * time.Minute, "10m"},
		{"1h", time.Hour, "1h"},
		{"1h30m", 90 * time.Minute, "1h30m"},
		{"1h0m5s", time.Hour + 5*time.Second, "1h0m5s"},
		{"250ms", 250 * time.Millisecond, "250ms"},
	} {
		var d Duration
		if err := d.UnmarshalText([]byte(c.in)); err != nil || time.Duration(d) != c.want {
			t.Errorf("%q: got %v, %v; want %v", c.in, time.Duration(d), err, c.want)
		}
		if got := d.String(); got != c.str {
			t.Errorf("%q: String() = %q, want %q", c.in, got, c.str)
		}
	}
	for _, in := range []string{"", "30", "5 minutes", "-5s", "1d"} {
		var d Duration
		if err := d.UnmarshalText([]byte(in)); err == nil {
			t.Errorf("%q: got %v, want an error", in, d)
		}
	}
}

func TestSizeHuman(t *testing.T) {
	for s, want := range map[Size]string{0: "0B", 512: "512B", 12 * MiB: "12MiB", 10066329: "9.6MiB", 1536: "1.5KiB", 3 * GiB / 2: "1.5GiB"} {
		if got := s.Human(); got != want {
			t.Errorf("Size(%d).Human() = %q, want %q", int64(s), got, want)
		}
	}
}
