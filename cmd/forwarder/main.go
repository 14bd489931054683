// Command forwarder receives logs over the Fluent forward protocol and HTTP, makes them
// durable in a write-ahead log on local disk, and sends them to Amazon S3 and Amazon
// CloudWatch Logs. Run "forwarder --help" for its commands.
//
// Exit status: 0 on success, 1 when the command failed, 2 for a usage error.
package main

import (
	"fmt"
	"io"
	"os"
)

const (
	exitOK    = 0 // the command did what it was asked
	exitFail  = 1 // it could not: the reason is on stderr
	exitUsage = 2 // unknown command or flag, or missing or extra arguments
)

// command is a subcommand: its name, a one-line summary for the usage, and its entry point,
// which takes the arguments after its name and returns the exit status.
type command struct {
	name    string
	summary string
	run     func(args []string, stdout, stderr io.Writer) int
}

var commands = []command{
	{"run", "run the service", cmdRun},
	{"dev", "run locally with S3 and CloudWatch Logs emulators (what make run runs)", cmdDev},
	{"check", "validate a configuration file and print every problem with its line", cmdCheck},
	{"wal", "inspect the write-ahead log (stats and dead-letters of a running service too)", cmdWAL},
	{"version", "print the version", cmdVersion},
}

func main() {
	os.Exit(forwarder(os.Args[1:], os.Stdout, os.Stderr))
}

// forwarder runs the command named by args[0] and returns the exit status.
func forwarder(args []string, stdout, stderr io.Writer) int {
	return dispatch("forwarder", topUsage, commands, args, stdout, stderr)
}

const topUsage = `Usage: forwarder <command> [flags]

forwarder receives logs, makes them durable in a write-ahead log on local disk, and sends
them to Amazon S3 and Amazon CloudWatch Logs.
`

// dispatch runs the subcommand of prog named by args[0]. "help", -h and --help print the
// usage; "help NAME" prints that subcommand's.
func dispatch(prog, usage string, cmds []command, args []string, stdout, stderr io.Writer) int {
	printUsage := func(w io.Writer) {
		fmt.Fprint(w, usage)
		fmt.Fprint(w, "\nCommands:\n")
		for _, c := range cmds {
			fmt.Fprintf(w, "  %-12s %s\n", c.name, c.summary)
		}
		fmt.Fprintf(w, "\nRun '%s <command> --help' for a command's flags.\n", prog)
	}
	if len(args) == 0 {
		fmt.Fprintf(stderr, "%s: no command given\n\n", prog)
		printUsage(stderr)
		return exitUsage
	}
	name := args[0]
	switch {
	case isHelpFlag(name):
		printUsage(stdout)
		return exitOK
	case name == "help" && len(args) == 1:
		printUsage(stdout)
		return exitOK
	case name == "help":
		name, args = args[1], []string{args[1], "--help"}
	}
	for _, c := range cmds {
		if c.name == name {
			return c.run(args[1:], stdout, stderr)
		}
	}
	if len(name) > 0 && name[0] == '-' {
		fmt.Fprintf(stderr, "%s: unknown flag %s\n\n", prog, name)
	} else {
		fmt.Fprintf(stderr, "%s: unknown command %q\n\n", prog, name)
	}
	printUsage(stderr)
	return exitUsage
}

func isHelpFlag(arg string) bool {
	return arg == "-h" || arg == "--help" || arg == "-help" || arg == "--h"
}
