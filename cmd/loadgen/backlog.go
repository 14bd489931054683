package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/logfwd/forwarder/wal"
)

const backlogUsage = `Usage: loadgen backlog -data DIR -bytes SIZE [-size 250] [-tag pod.shop]

Fill the WAL in DIR (a forwarder's data_dir; the forwarder must be stopped) with records
like those the forward mode sends, in appends of 10,000, until the WAL file holds SIZE
bytes (a number, or with KiB, MiB or GiB). It measures a start and a drain with a backlog.
`

// cmdBacklog fills a WAL directly: far faster than through an input, for a backlog of
// gigabytes.
func cmdBacklog(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	f := flag.NewFlagSet("loadgen backlog", flag.ContinueOnError)
	f.SetOutput(stderr)
	f.Usage = func() { fmt.Fprint(stderr, backlogUsage); f.PrintDefaults() }
	dir := f.String("data", "", "the forwarder's data_dir")
	sizeArg := f.String("bytes", "", "stop when the WAL file holds this many bytes")
	size := f.Int("size", 250, "approximate bytes of JSON per record")
	tag := f.String("tag", "pod.shop", "the records' tag")
	if err := f.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	target, err := parseBytes(*sizeArg)
	if *dir == "" || err != nil || f.NArg() > 0 || *size < 1 {
		fmt.Fprintf(stderr, "loadgen backlog: need -data DIR and -bytes SIZE (%v)\n", err)
		return 2
	}
	w, err := wal.Open(*dir, wal.Options{})
	if err != nil {
		fmt.Fprintf(stderr, "loadgen backlog: %v\n", err)
		return 1
	}
	p := newPool(1, 1, 1000, *size, len("backlog-0-")+9, true)
	recs := make([]wal.Record, 10000)
	var n, bodyBytes uint64
	start := time.Now()
	for w.Stats().FileBytes < target && ctx.Err() == nil {
		now := time.Now()
		for i := range recs {
			t := &p.tmpl[n%uint64(len(p.tmpl))]
			b := append(recs[i].Body[:0], '{')
			b = append(b, t.json...)
			b = append(b, `"id":"`...)
			b = appendID(b, "backlog", 0, n)
			b = append(b, `"}`...)
			recs[i] = wal.Record{Time: now.UnixNano(), Tag: *tag, Body: b}
			bodyBytes += uint64(len(b))
			n++
		}
		if _, err := w.Append(ctx, recs, wal.AppendOptions{}); err != nil {
			fmt.Fprintf(stderr, "loadgen backlog: append: %v\n", err)
			w.Close()
			return 1
		}
	}
	st := w.Stats()
	if err := w.Close(); err != nil {
		fmt.Fprintf(stderr, "loadgen backlog: close: %v\n", err)
		return 1
	}
	secs := time.Since(start).Seconds()
	fmt.Fprintf(stdout, "appended %d records (%.1f MB of JSON) in %.1f s; WAL file %d bytes, live %d bytes, %.1f file bytes per record\n",
		n, float64(bodyBytes)/1e6, secs, st.FileBytes, st.Bytes, float64(st.FileBytes)/float64(st.Records))
	return 0
}

// parseBytes reads 5GiB, 512MiB, 64KiB or a plain number.
func parseBytes(s string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("size %q: want a positive number, optionally with KiB, MiB or GiB", s)
	}
	return v * mult, nil
}
