package main

import (
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersion(t *testing.T) {
	t.Parallel()
	r := forwarderCmd(t, "version")
	want := "forwarder " + testVersion + " (" + runtime.Version() + ", " + runtime.GOOS + "/" + runtime.GOARCH + ")\n"
	if r.code != exitOK || r.stdout != want {
		t.Errorf("version: exit %d, stdout %q, want exit 0 and %q", r.code, r.stdout, want)
	}
}

func TestResolveVersion(t *testing.T) {
	t.Parallel()
	module := func(v string) *debug.BuildInfo {
		return &debug.BuildInfo{Main: debug.Module{Path: "github.com/logfwd/forwarder", Version: v}}
	}
	tests := []struct {
		name   string
		linked string
		info   *debug.BuildInfo
		want   string
	}{
		{"linked wins", "1.2.3", module("v1.0.0"), "1.2.3"},
		{"module version", "dev", module("v1.0.0"), "v1.0.0"},
		{"devel build", "dev", module("(devel)"), "dev"},
		{"no module version", "dev", module(""), "dev"},
		{"no build info", "dev", nil, "dev"},
	}
	for _, tt := range tests {
		if got := resolveVersion(tt.linked, tt.info, tt.info != nil); got != tt.want {
			t.Errorf("%s: resolveVersion = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"", "run", "check", "version", "wal", "wal stats", "wal verify", "wal dump", "wal drop-cursor"} {
		for _, flag := range []string{"--help", "-h"} {
			args := append(strings.Fields(cmd), flag)
			r := forwarderCmd(t, args...)
			synopsis := "Usage: " + strings.TrimSpace("forwarder "+cmd)
			if r.code != exitOK || !strings.HasPrefix(r.stdout, synopsis) || r.stderr != "" {
				t.Errorf("forwarder %s: exit %d, stdout %q, stderr %q; want exit 0 and usage starting %q on stdout",
					strings.Join(args, " "), r.code, r.stdout, r.stderr, synopsis)
			}
		}
	}
}

func TestHelpListsCommands(t *testing.T) {
	t.Parallel()
	r := forwarderCmd(t, "--help")
	for _, c := range commands {
		if !regexp.MustCompile(`(?m)^  ` + c.name + ` +\S`).MatchString(r.stdout) {
			t.Errorf("top-level usage does not list %q with its summary:\n%s", c.name, r.stdout)
		}
	}
	r = forwarderCmd(t, "wal", "--help")
	for _, c := range walCommands {
		if !strings.Contains(r.stdout, "  "+c.name+" ") {
			t.Errorf("wal usage does not list %q:\n%s", c.name, r.stdout)
		}
	}
	if r := forwarderCmd(t, "help", "check"); r.code != exitOK || !strings.HasPrefix(r.stdout, "Usage: forwarder check") {
		t.Errorf("forwarder help check: exit %d, stdout %q", r.code, r.stdout)
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		want string // on stderr, before the usage
	}{
		{nil, "no command given"},
		{[]string{"bogus"}, `unknown command "bogus"`},
		{[]string{"--bogus"}, "unknown flag --bogus"},
		{[]string{"run", "--bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"check", "extra"}, `unexpected argument "extra"`},
		{[]string{"version", "-x"}, "flag provided but not defined: -x"},
		{[]string{"wal"}, "no command given"},
		{[]string{"wal", "bogus"}, `unknown command "bogus"`},
		{[]string{"wal", "dead-letters", "extra"}, `unexpected argument "extra"`},
		{[]string{"wal", "dump", "--limit", "-1"}, `invalid value "-1" for flag -limit`},
		{[]string{"wal", "drop-cursor"}, "want one cursor NAME, got 0 arguments"},
		{[]string{"wal", "drop-cursor", "a", "b"}, "want one cursor NAME, got 2 arguments"},
	}
	for _, tt := range tests {
		r := forwarderCmd(t, tt.args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tt.want) || !strings.Contains(r.stderr, "Usage: forwarder") || r.stdout != "" {
			t.Errorf("forwarder %s: exit %d, stdout %q, stderr %q; want exit 2 and %q with the usage on stderr",
				strings.Join(tt.args, " "), r.code, r.stdout, r.stderr, tt.want)
		}
	}
}
