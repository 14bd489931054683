package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"

	"github.com/logfwd/forwarder/queue"
)

const walDeadLettersUsage = `Usage: forwarder wal dead-letters [--sink NAME] [-c FILE]

Print the records that a sink's destination refused for good (too old, too large, invalid),
one JSON object a line, oldest first: seq, time, tag, reason, dead_lettered_at and the
record's body. Each sink keeps the newest dead letters up to a bound.
`

func cmdWALDeadLetters(args []string, stdout, stderr io.Writer) int {
	const cmd = "forwarder wal dead-letters"
	f := newFlagSet("wal dead-letters", walDeadLettersUsage)
	configPath := f.configFlag()
	sink := f.String("sink", "", "only the dead letters of sink `NAME`")
	_, w, code, done := openForInspection(cmd, f, configPath, args, stdout, stderr)
	if done {
		return code
	}
	// Every cursor the WAL knows, configured or not: a removed sink's dead
	// letters are still worth seeing.
	names := slices.Sorted(maps.Keys(w.Stats().Cursors))
	if *sink != "" {
		if !slices.Contains(names, *sink) {
			fmt.Fprintf(stderr, "%s: the WAL has no sink %q (it has: %v)\n", cmd, *sink, names)
			return closeWAL(cmd, w, stderr, exitFail)
		}
		names = []string{*sink}
	}
	out := bufio.NewWriter(stdout)
	enc := json.NewEncoder(out)
	n := 0
	for _, name := range names {
		err := queue.DeadLetters(w, name, func(d queue.DeadLetter) error {
			n++
			return enc.Encode(struct {
				Sink string `json:"sink"`
				queue.DeadLetter
			}{name, d})
		})
		if err != nil {
			out.Flush()
			fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
			return closeWAL(cmd, w, stderr, exitFail)
		}
	}
	if err := out.Flush(); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
		return closeWAL(cmd, w, stderr, exitFail)
	}
	fmt.Fprintf(stderr, "%s\n", plural(n, "dead letter", "dead letters"))
	return closeWAL(cmd, w, stderr, exitOK)
}
