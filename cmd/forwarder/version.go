package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// version is set at build time: go build -ldflags "-X main.version=1.2.3".
var version = "dev"

const versionUsage = `Usage: forwarder version

Print the forwarder's version, the Go version it was built with, and its platform.
`

func cmdVersion(args []string, stdout, stderr io.Writer) int {
	f := newFlagSet("version", versionUsage)
	pos, code, done := f.parse(args, stdout, stderr)
	if done {
		return code
	}
	if code, done := f.noArgs(pos, stderr); done {
		return code
	}
	fmt.Fprintf(stdout, "forwarder %s (%s, %s/%s)\n", currentVersion(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return exitOK
}

func currentVersion() string {
	info, ok := debug.ReadBuildInfo()
	return resolveVersion(version, info, ok)
}

// resolveVersion prefers the version set at link time; without one, a binary built with
// "go install module@version" knows its module's version.
func resolveVersion(linked string, info *debug.BuildInfo, ok bool) string {
	if linked != "dev" || !ok || info == nil {
		return linked
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	return linked
}
