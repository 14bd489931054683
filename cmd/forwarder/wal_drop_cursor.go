package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/logfwd/forwarder/wal"
)

const walDropCursorUsage = `Usage: forwarder wal drop-cursor NAME [-c FILE] [--force]

Remove the cursor NAME, with its sink's state, so that it no longer keeps records in the
WAL: the records no other cursor still needs are deleted. This is for a sink that was
removed from the configuration. It refuses a sink that is still configured unless --force:
that sink would lose the records only it still needs (they never reach it), send again
at its next start every record still in the WAL, and forget its pending state.
`

func cmdWALDropCursor(args []string, stdout, stderr io.Writer) int {
	const cmd = "forwarder wal drop-cursor"
	f := newFlagSet("wal drop-cursor", walDropCursorUsage)
	configPath := f.configFlag()
	force := f.Bool("force", false, "drop the cursor even if NAME is a sink in the configuration")
	pos, code, done := f.parse(args, stdout, stderr)
	if done {
		return code
	}
	if len(pos) != 1 {
		return f.usageError(stderr, "want one cursor NAME, got %d arguments", len(pos))
	}
	name := pos[0]
	cfg, ok := loadWALConfig(cmd, *configPath, stderr)
	if !ok {
		return exitFail
	}
	w := openWAL(cmd, cfg, false, stderr)
	if w == nil {
		return exitFail
	}
	before := w.Stats()
	position, ok := before.Cursors[name]
	if !ok {
		names := "there are none"
		if len(before.Cursors) > 0 {
			names = "there are: " + strings.Join(slices.Sorted(maps.Keys(before.Cursors)), ", ")
		}
		fmt.Fprintf(stderr, "%s: the WAL has no cursor %q; %s\n", cmd, name, names)
		return closeWAL(cmd, w, stderr, exitFail)
	}
	if isSink(cfg, name) && !*force {
		fmt.Fprintf(stderr, "%s: %q is a sink in %s; dropping its cursor would delete up to %s that only it still needs (they would never reach it), make it send again at its next start every record still in the WAL, and forget its pending state. Remove the sink from the configuration first, or pass --force\n",
			cmd, name, *configPath, plural(int(onlyPinned(before, name)), "record", "records"))
		return closeWAL(cmd, w, stderr, exitFail)
	}
	if err := w.DropCursor(context.Background(), name); err != nil {
		fmt.Fprintf(stderr, "%s: drop cursor %q: %v\n", cmd, name, err)
		return closeWAL(cmd, w, stderr, exitFail)
	}
	// Close first: retention runs in the writer and finishes before Close returns.
	if code := closeWAL(cmd, w, stderr, exitOK); code != exitOK {
		return code
	}
	fmt.Fprintf(stdout, "dropped cursor %q at position %d, %s behind\n", name, position,
		plural(int(lag(before, position)), "record", "records"))

	w, err := wal.Open(cfg.DataDir, wal.Options{ReadOnly: true, Logger: toolLogger(stderr)})
	if err != nil {
		fmt.Fprintf(stderr, "%s: reopen wal to count what was freed: %v\n", cmd, err)
		return exitOK // the cursor is gone; only the count is missing
	}
	after := w.Stats()
	freedRecords := before.Records - after.Records
	freedBytes := before.Bytes - after.Bytes
	switch {
	case freedRecords > 0:
		fmt.Fprintf(stdout, "it pinned %s, %s, which retention has now deleted\n",
			plural(int(freedRecords), "record", "records"), formatBytes(freedBytes))
	case len(after.Cursors) == 0:
		fmt.Fprintln(stdout, "no cursor is left, so the WAL keeps its records until a sink registers one")
	default:
		fmt.Fprintln(stdout, "it pinned no records: the other cursors still need every live record")
	}
	return closeWAL(cmd, w, stderr, exitOK)
}

// onlyPinned is how many of the WAL's records no cursor but name still
// needs: those retention deletes once it is dropped. None when it is the
// only cursor (the WAL then keeps every record until a sink registers one).
func onlyPinned(st wal.Stats, name string) uint64 {
	pos := st.Cursors[name]
	others := false
	var lowest uint64
	for n, p := range st.Cursors {
		if n != name && (!others || p < lowest) {
			lowest, others = p, true
		}
	}
	if !others || lowest <= pos {
		return 0
	}
	return lag(st, pos) - lag(st, lowest)
}
