package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/logfwd/forwarder/wal"
)

const walDumpUsage = `Usage: forwarder wal dump [-c FILE] [--from SEQ] [--limit N]

Print the WAL's records, oldest first, one JSON object a line:
  {"seq":N,"time":"RFC 3339, UTC","tag":"...","body":{...}}
A body that is not valid JSON is printed as a JSON string. A damaged entry is skipped
and reported on stderr, and the dump goes on after it (exit status 1); so are the
placeholders a running service put in place of a damaged entry's lost records.
`

// dumpChunk is how many records dump reads at a time.
const dumpChunk = 10000

// dumpLine is one line of "wal dump".
type dumpLine struct {
	Seq  uint64          `json:"seq"`
	Time string          `json:"time"`
	Tag  string          `json:"tag"`
	Body json.RawMessage `json:"body"`
}

func cmdWALDump(args []string, stdout, stderr io.Writer) int {
	const cmd = "forwarder wal dump"
	f := newFlagSet("wal dump", walDumpUsage)
	configPath := f.configFlag()
	from := f.Uint64("from", 0, "start at sequence number `SEQ` (default: the oldest live record)")
	limit := f.Uint64("limit", 0, "print at most `N` records (0: all)")
	_, w, code, done := openForInspection(cmd, f, configPath, args, stdout, stderr, nil)
	if done {
		return code
	}
	out := bufio.NewWriterSize(stdout, 256<<10)
	skipped, err := dump(out, w, *from, *limit, func(first, last uint64, err error) {
		out.Flush() // the records before the damage come first
		fmt.Fprintf(stderr, "%s: skipped records %d-%d: %v\n", cmd, first, last, err)
	})
	if ferr := out.Flush(); err == nil {
		err = ferr
	}
	code = exitOK
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
		code = exitFail
	}
	if skipped > 0 {
		fmt.Fprintf(stderr, "%s: %s skipped\n", cmd, plural(skipped, "damaged entry", "damaged entries"))
		code = exitFail
	}
	return closeWAL(cmd, w, stderr, code)
}

// dump writes the records from seq from on, at most limit of them (0: all), as JSON lines.
// It skips a damaged entry whose extent is known, telling skip, and goes on after it: a
// dump is how records are saved from a damaged WAL. It returns how many it skipped.
func dump(out io.Writer, w *wal.WAL, from, limit uint64, skip func(first, last uint64, err error)) (skipped int, err error) {
	next := max(from, w.Stats().FirstSeq)
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	var written uint64
	for limit == 0 || written < limit {
		n := uint64(dumpChunk)
		if limit > 0 {
			n = min(limit-written, n)
		}
		recs, err := w.Read(next, int(n), 0)
		var damage *wal.CorruptionError
		if errors.As(err, &damage) && damage.FirstSeq == 0 {
			// A damaged page of the file's tree, no entry's extent known:
			// the records before it are read in smaller reads, and the
			// reading goes on where the tree can be read again.
			if k := readableFrom(w, next, n); k > 0 {
				recs, err = w.Read(next, int(k), 0)
			} else {
				resume := resumeAfter(w, next)
				skip(next, resume-1, err)
				skipped++
				if resume >= w.Stats().NextSeq {
					return skipped, nil
				}
				next = resume
				continue
			}
		}
		if errors.As(err, &damage) && damage.FirstSeq > next {
			// Read up to the damaged entry.
			recs, err = w.Read(next, int(min(n, damage.FirstSeq-next)), 0)
		}
		if errors.As(err, &damage) && damage.FirstSeq != 0 && damage.FirstSeq <= next && damage.LastSeq >= next {
			skip(damage.FirstSeq, damage.LastSeq, err)
			skipped++
			next = damage.LastSeq + 1
			continue
		}
		if err != nil {
			return skipped, fmt.Errorf("read records from %d: %w", next, err)
		}
		if len(recs) == 0 {
			return skipped, nil
		}
		lost := [2]uint64{} // a run of placeholders (wal.ReplaceDamaged), told as skipped
		tellLost := func() {
			if lost[0] != 0 {
				skip(lost[0], lost[1], errReplaced)
				skipped++
				lost = [2]uint64{}
			}
		}
		for _, r := range recs {
			if r.Tag == wal.DamagedTag {
				if lost[0] == 0 {
					lost[0] = r.Seq
				}
				lost[1] = r.Seq
				continue
			}
			tellLost()
			line := dumpLine{
				Seq:  r.Seq,
				Time: time.Unix(0, r.Time).UTC().Format(time.RFC3339Nano),
				Tag:  r.Tag,
				Body: r.Body,
			}
			if !json.Valid(r.Body) {
				line.Body = jsonString(r.Body)
			}
			if err := enc.Encode(line); err != nil {
				return skipped, err
			}
		}
		tellLost()
		written += uint64(len(recs))
		next = recs[len(recs)-1].Seq + 1
	}
	return skipped, nil
}

// readableFrom is how many records from next, up to n, read without error
// (0: none), found by halving.
func readableFrom(w *wal.WAL, next, n uint64) uint64 {
	lo, hi := uint64(0), n // lo reads; hi does not
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if _, err := w.Read(next, int(mid), 0); err == nil {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// resumeAfter is the first record after next from which a read succeeds
// (w's next sequence number when none does): past a damaged page, found by
// steps that double, then halving.
func resumeAfter(w *wal.WAL, next uint64) uint64 {
	end := w.Stats().NextSeq
	reads := func(seq uint64) bool { _, err := w.Read(seq, 1, 0); return err == nil }
	bad, step := next, uint64(1)
	for {
		try := bad + step
		if try >= end {
			if !reads(end - 1) {
				return end
			}
			try = end - 1
		}
		if reads(try) {
			for try-bad > 1 { // bad fails, try reads
				mid := bad + (try-bad)/2
				if reads(mid) {
					try = mid
				} else {
					bad = mid
				}
			}
			return try
		}
		bad, step = try, 2*step
	}
}

// errReplaced is what dump says of records a running service replaced by placeholders.
var errReplaced = errors.New("their entry was found damaged and replaced by placeholders: the records are lost")

// jsonString encodes b as a JSON string; invalid UTF-8 becomes U+FFFD.
func jsonString(b []byte) json.RawMessage {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(string(b)) // a string always encodes
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}
