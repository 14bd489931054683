package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/url"
	"slices"

	"github.com/logfwd/forwarder/config"
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
	live := func(cfg *config.Config) int {
		q := url.Values{"limit": {"10000"}}
		if *sink != "" {
			q.Set("sink", *sink)
		}
		resp, err := adminGet(cfg, "/dead-letters?"+q.Encode())
		if err != nil {
			fmt.Fprintf(stderr, "%s: the WAL is in use by a running forwarder: %v\n", cmd, err)
			return exitFail
		}
		defer resp.Body.Close()
		n, err := copyLines(stdout, resp.Body)
		if err != nil {
			fmt.Fprintf(stderr, "%s: read the running service's dead letters: %v\n", cmd, err)
			return exitFail
		}
		fmt.Fprintf(stderr, "%s (from the running service)\n", plural(n, "dead letter", "dead letters"))
		if omitted := resp.Header.Get("Dead-Letters-Omitted"); omitted != "" && omitted != "0" {
			fmt.Fprintf(stderr, "%s older ones left out to keep the answer within 16 MiB; stop the service to read them all\n", omitted)
		}
		if damaged := resp.Header.Get("Dead-Letters-Damaged"); damaged != "" {
			fmt.Fprintf(stderr, "%s: %s damaged dead letters left out (their bytes in the WAL do not decode; the service's log names the sink)\n", cmd, damaged)
			return exitFail
		}
		return exitOK
	}
	_, w, code, done := openForInspection(cmd, f, configPath, args, stdout, stderr, live)
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
	code = exitOK
	for _, name := range names {
		err := queue.DeadLetters(w, name, func(d queue.DeadLetter) error {
			n++
			return enc.Encode(struct {
				Sink string `json:"sink"`
				queue.DeadLetter
			}{name, d})
		})
		var damaged *queue.DamagedDeadLettersError
		if errors.As(err, &damaged) {
			// The others are listed, and the other sinks'.
			out.Flush()
			fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
			code = exitFail
			continue
		}
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
	return closeWAL(cmd, w, stderr, code)
}

// copyLines copies r to w and counts its lines.
func copyLines(w io.Writer, r io.Reader) (int, error) {
	out := bufio.NewWriter(w)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 32<<20)
	n := 0
	for sc.Scan() {
		out.Write(sc.Bytes())
		out.WriteByte('\n')
		n++
	}
	if err := sc.Err(); err != nil {
		out.Flush()
		return n, err
	}
	return n, out.Flush()
}
