package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// defaultConfigPath is where the packaged service keeps its configuration.
const defaultConfigPath = "/etc/forwarder/forwarder.yaml"

// flagSet is one subcommand's flags and usage text. Flags and positional arguments may come
// in any order ("wal drop-cursor NAME -c FILE"); "--" ends the flags.
type flagSet struct {
	*flag.FlagSet
	usage string // the synopsis and a description; the flags are listed after it
}

func newFlagSet(name, usage string) *flagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // parse reports errors itself, on the right stream
	fs.Usage = func() {}
	return &flagSet{FlagSet: fs, usage: usage}
}

// configFlag adds -c, the configuration file, which most subcommands take.
func (f *flagSet) configFlag() *string {
	return f.String("c", defaultConfigPath, "read the configuration from `FILE`")
}

func (f *flagSet) printUsage(w io.Writer) {
	fmt.Fprint(w, f.usage)
	hasFlags := false
	f.VisitAll(func(*flag.Flag) { hasFlags = true })
	if !hasFlags {
		return
	}
	fmt.Fprint(w, "\nFlags:\n")
	f.SetOutput(w)
	f.PrintDefaults()
	f.SetOutput(io.Discard)
}

// parse parses args and returns the positional arguments. When it returns done, the
// subcommand must return code at once: the usage was asked for (printed to stdout, exitOK)
// or a flag was wrong (error and usage on stderr, exitUsage).
func (f *flagSet) parse(args []string, stdout, stderr io.Writer) (positional []string, code int, done bool) {
	for {
		err := f.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			f.printUsage(stdout)
			return nil, exitOK, true
		}
		if err != nil {
			return nil, f.usageError(stderr, "%v", err), true
		}
		rest := f.Args()
		if len(rest) == 0 {
			return positional, exitOK, false
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(positional, rest...), exitOK, false
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// usageError prints a usage problem and the usage to stderr and returns exitUsage.
func (f *flagSet) usageError(stderr io.Writer, format string, args ...any) int {
	fmt.Fprintf(stderr, "forwarder %s: %s\n\n", f.Name(), fmt.Sprintf(format, args...))
	f.printUsage(stderr)
	return exitUsage
}

// noArgs returns a usage error for positional arguments a subcommand does not take.
func (f *flagSet) noArgs(positional []string, stderr io.Writer) (code int, done bool) {
	if len(positional) > 0 {
		return f.usageError(stderr, "unexpected argument %q", positional[0]), true
	}
	return exitOK, false
}

// shellQuote quotes s for a shell command line shown to the operator, when it needs it.
func shellQuote(s string) string {
	if s != "" && !strings.ContainsAny(s, " \t\n'\"\\$`!*?[]{}()<>|&;#~") {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
