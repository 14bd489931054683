package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/wal"
)

const walStatsUsage = `Usage: forwarder wal stats [-c FILE] [--json]

Print what the WAL holds: its file, live bytes against wal.max_bytes, its records, and
each cursor with how many records it is behind. A cursor of a sink that is not in the
configuration is marked "not configured": it keeps every record it has not passed.
`

// walStats is the output of "wal stats --json".
type walStats struct {
	Path string `json:"path"`
	// FromService is the admin server the figures came from, when a
	// running service holds the WAL; empty when read from the file.
	FromService string `json:"from_service,omitempty"`
	FileBytes   int64  `json:"file_bytes"`      // bbolt's high-water mark
	FileFree    int64  `json:"file_free_bytes"` // free pages inside the file, reused before it grows
	DiskFree    int64  `json:"disk_free_bytes"` // -1: not known
	// DamagedRecords: records of damaged entries replaced by placeholders
	// since the service started (a running service's figure; 0 from the file).
	DamagedRecords uint64        `json:"damaged_records"`
	LiveBytes      int64         `json:"live_bytes"`
	MaxBytes       int64         `json:"max_bytes"` // 0: no limit
	Records        uint64        `json:"records"`
	FirstSeq       uint64        `json:"first_seq"` // == next_seq when there are no records
	NextSeq        uint64        `json:"next_seq"`
	Cursors        []cursorStats `json:"cursors"`
	// SinksWithoutCursor are configured sinks that have not registered a cursor yet.
	SinksWithoutCursor []string `json:"sinks_without_cursor"`
}

type cursorStats struct {
	Name       string `json:"name"`
	Position   uint64 `json:"position"`   // every record up to it is done for the sink
	Behind     uint64 `json:"behind"`     // live records after the position
	Configured bool   `json:"configured"` // a sink of that name is in the configuration
	Dropped    uint64 `json:"dropped"`    // records when_full: drop_oldest deleted before the sink had them
}

func cmdWALStats(args []string, stdout, stderr io.Writer) int {
	const cmd = "forwarder wal stats"
	f := newFlagSet("wal stats", walStatsUsage)
	configPath := f.configFlag()
	asJSON := f.Bool("json", false, "print the statistics as one JSON object")
	show := func(s walStats) int {
		if *asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			if err := enc.Encode(s); err != nil {
				fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
				return exitFail
			}
			return exitOK
		}
		printWALStats(stdout, s, *configPath)
		return exitOK
	}
	live := func(cfg *config.Config) int {
		resp, err := adminGet(cfg, "/wal")
		if err != nil {
			fmt.Fprintf(stderr, "%s: the WAL is in use by a running forwarder: %v\n", cmd, err)
			return exitFail
		}
		defer resp.Body.Close()
		st, err := decodeWALStats(resp.Body)
		if err != nil {
			fmt.Fprintf(stderr, "%s: read the running service's WAL statistics: %v\n", cmd, err)
			return exitFail
		}
		s := newWALStats(st, cfg)
		s.FromService, _ = adminBase(cfg.Admin.Listen)
		return show(s)
	}
	cfg, w, code, done := openForInspection(cmd, f, configPath, args, stdout, stderr, live)
	if done {
		return code
	}
	s := newWALStats(w.Stats(), cfg)
	if code := closeWAL(cmd, w, stderr, exitOK); code != exitOK {
		return code
	}
	return show(s)
}

func newWALStats(st wal.Stats, cfg *config.Config) walStats {
	s := walStats{
		Path:               st.Path,
		FileBytes:          st.FileBytes,
		FileFree:           st.FileFreeBytes,
		DiskFree:           st.DiskFreeBytes,
		DamagedRecords:     st.DamagedRecords,
		LiveBytes:          st.Bytes,
		MaxBytes:           int64(cfg.WAL.MaxBytes),
		Records:            st.Records,
		FirstSeq:           st.FirstSeq,
		NextSeq:            st.NextSeq,
		Cursors:            []cursorStats{},
		SinksWithoutCursor: []string{},
	}
	for _, name := range slices.Sorted(maps.Keys(st.Cursors)) {
		pos := st.Cursors[name]
		s.Cursors = append(s.Cursors, cursorStats{
			Name:       name,
			Position:   pos,
			Behind:     lag(st, pos),
			Configured: isSink(cfg, name),
			Dropped:    st.Dropped[name],
		})
	}
	for _, sink := range cfg.Sinks {
		if _, ok := st.Cursors[sink.Name]; !ok {
			s.SinksWithoutCursor = append(s.SinksWithoutCursor, sink.Name)
		}
	}
	return s
}

func printWALStats(out io.Writer, s walStats, configPath string) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	if s.FromService != "" {
		fmt.Fprintf(out, "from the running service at %s:\n", s.FromService)
	}
	fmt.Fprintf(tw, "file:\t%s\n", s.Path)
	fmt.Fprintf(tw, "file size:\t%s (its high-water mark; %s of free pages inside, reused before it grows)\n", formatBytes(s.FileBytes), formatBytes(s.FileFree))
	if s.DiskFree >= 0 {
		fmt.Fprintf(tw, "disk free:\t%s\n", formatBytes(s.DiskFree))
	}
	limit := "no max_bytes"
	if s.MaxBytes > 0 {
		limit = fmt.Sprintf("%.1f%% of max_bytes %s", 100*float64(s.LiveBytes)/float64(s.MaxBytes), config.Size(s.MaxBytes))
	}
	fmt.Fprintf(tw, "live bytes:\t%s, %s\n", formatBytes(s.LiveBytes), limit)
	fmt.Fprintf(tw, "records:\t%d\n", s.Records)
	if s.Records > 0 {
		fmt.Fprintf(tw, "first seq:\t%d\n", s.FirstSeq)
	}
	fmt.Fprintf(tw, "next seq:\t%d\n", s.NextSeq)
	if s.DamagedRecords > 0 {
		fmt.Fprintf(tw, "damaged records:\t%d lost to damaged entries since the service started (see its log)\n", s.DamagedRecords)
	}
	tw.Flush()

	if len(s.Cursors) == 0 {
		fmt.Fprintln(out, "cursors: none")
	} else {
		fmt.Fprintln(out, "cursors:")
		tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  NAME\tPOSITION\tBEHIND\tDROPPED")
		unconfigured := false
		for _, c := range s.Cursors {
			fmt.Fprintf(tw, "  %s\t%d\t%d\t%d", c.Name, c.Position, c.Behind, c.Dropped)
			if !c.Configured {
				fmt.Fprint(tw, "\tnot configured")
				unconfigured = true
			}
			fmt.Fprintln(tw)
		}
		tw.Flush()
		if unconfigured {
			fmt.Fprintf(out, "A cursor that is not configured keeps every record after it; if its sink is gone for good, remove it with: forwarder wal drop-cursor NAME -c %s\n", shellQuote(configPath))
		}
	}
	if len(s.SinksWithoutCursor) > 0 {
		fmt.Fprintf(out, "sinks without a cursor yet: %s\n", strings.Join(s.SinksWithoutCursor, ", "))
	}
}

// formatBytes gives a byte count exactly and in binary units: "1536 bytes (1.5 KiB)".
func formatBytes(n int64) string {
	if n < 1024 {
		return plural(int(n), "byte", "bytes")
	}
	v, unit := float64(n), ""
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB", "PiB"} {
		if v < 1024 {
			break
		}
		v, unit = v/1024, u
	}
	return fmt.Sprintf("%d bytes (%.1f %s)", n, v, unit)
}

// decodeWALStats reads /wal's answer: its keys in snake_case, or a running
// service of a version before them, whose keys were wal.Stats' field names.
func decodeWALStats(r io.Reader) (wal.Stats, error) {
	body, err := io.ReadAll(r)
	if err != nil {
		return wal.Stats{}, err
	}
	var st wal.Stats
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(body, &keys); err != nil {
		return st, err
	}
	if _, ok := keys["next_seq"]; ok {
		err := json.Unmarshal(body, &st)
		return st, err
	}
	var old struct { // the field names, without tags
		Path              string
		FirstSeq, NextSeq uint64
		Records           uint64
		Bytes, FileBytes  int64
		Cursors, Dropped  map[string]uint64
		Commits           uint64
		DiskFreeBytes     int64
		FileFreeBytes     int64
		MemoryReads       uint64
		FileReads         uint64
	}
	if err := json.Unmarshal(body, &old); err != nil || old.Path == "" {
		return st, fmt.Errorf("the answer names no WAL file: %.200s", body)
	}
	return wal.Stats{Path: old.Path, FirstSeq: old.FirstSeq, NextSeq: old.NextSeq, Records: old.Records, Bytes: old.Bytes,
		FileBytes: old.FileBytes, Cursors: old.Cursors, Dropped: old.Dropped, Commits: old.Commits,
		DiskFreeBytes: old.DiskFreeBytes, FileFreeBytes: old.FileFreeBytes, MemoryReads: old.MemoryReads, FileReads: old.FileReads}, nil
}
