package main

import (
	"fmt"
	"io"
)

const walVerifyUsage = `Usage: forwarder wal verify [-c FILE]

Read every entry of the WAL and check its checksum and framing, that sequence numbers are
dense, and bbolt's page consistency. Print each problem on its own line and exit 1 if there
is any; print "OK" otherwise.
`

func cmdWALVerify(args []string, stdout, stderr io.Writer) int {
	const cmd = "forwarder wal verify"
	f := newFlagSet("wal verify", walVerifyUsage)
	configPath := f.configFlag()
	_, w, code, done := openForInspection(cmd, f, configPath, args, stdout, stderr, nil)
	if done {
		return code
	}
	rep := w.Verify()
	fmt.Fprintf(stdout, "%s: checked %s, %s\n", w.Path(),
		plural(rep.Entries, "entry", "entries"), plural(int(rep.Records), "record", "records"))
	for _, p := range rep.Problems {
		fmt.Fprintln(stdout, p)
	}
	code = exitOK
	if len(rep.Problems) > 0 {
		fmt.Fprintln(stdout, plural(len(rep.Problems), "problem", "problems"))
		code = exitFail
	} else {
		fmt.Fprintln(stdout, "OK")
	}
	return closeWAL(cmd, w, stderr, code)
}
