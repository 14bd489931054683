package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// stats are one worker's figures. The counters are atomic so that
// -progress can read them while the worker runs; the rest is read only
// once the worker is done.
type stats struct {
	sentRecords  atomic.Uint64
	ackedRecords atomic.Uint64
	sentMessages uint64
	ackedMsgs    uint64
	sentBytes    uint64 // record JSON
	ackedBytes   uint64 // record JSON
	latencies    []time.Duration
	errors       map[string]int
}

func newStats() *stats { return &stats{errors: map[string]int{}} }

func (s *stats) fail(kind string) { s.errors[kind]++ }

// result is what a run reports; with -json, this object.
type result struct {
	Mode        string  `json:"mode"`   // forward or http
	Target      string  `json:"target"` // address or URL
	Format      string  `json:"format,omitempty"`
	Connections int     `json:"connections"`
	Batch       int     `json:"batch"`
	Size        int     `json:"size"`
	Acks        bool    `json:"acks"`
	Run         string  `json:"run"`
	Seconds     float64 `json:"seconds"`

	SentRecords   uint64 `json:"sent_records"`
	AckedRecords  uint64 `json:"acked_records"`
	SentMessages  uint64 `json:"sent_messages"`
	AckedMessages uint64 `json:"acked_messages"`
	AckedBytes    uint64 `json:"acked_bytes"` // record JSON

	// Rates of acknowledged records (of sent ones without acks).
	RecordsPerSec float64 `json:"records_per_sec"`
	MBPerSec      float64 `json:"mb_per_sec"` // 10^6 bytes of record JSON
	AvgRecord     float64 `json:"avg_record_bytes"`

	// Ack (answer) latency of a message (request), from its first byte
	// written to its ack read.
	P50ms float64 `json:"p50_ms"`
	P99ms float64 `json:"p99_ms"`
	MaxMs float64 `json:"max_ms"`

	Errors map[string]int `json:"errors"`

	sentBytes uint64 // record JSON
}

func merge(sts []*stats, elapsed time.Duration) *result {
	r := &result{Connections: len(sts), Seconds: elapsed.Seconds(), Errors: map[string]int{}}
	var lat []time.Duration
	for _, s := range sts {
		r.SentRecords += s.sentRecords.Load()
		r.AckedRecords += s.ackedRecords.Load()
		r.SentMessages += s.sentMessages
		r.AckedMessages += s.ackedMsgs
		r.AckedBytes += s.ackedBytes
		r.sentBytes += s.sentBytes
		lat = append(lat, s.latencies...)
		for k, v := range s.errors {
			r.Errors[k] += v
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	r.P50ms = ms(percentile(lat, 0.50))
	r.P99ms = ms(percentile(lat, 0.99))
	if len(lat) > 0 {
		r.MaxMs = ms(lat[len(lat)-1])
	}
	return r
}

// rates fills in the rates: of acknowledged records, or of sent ones
// when no acks were asked for.
func (r *result) rates() {
	recs, bytes := r.AckedRecords, r.AckedBytes
	if !r.Acks {
		recs, bytes = r.SentRecords, r.sentBytes
	}
	if r.Seconds > 0 {
		r.RecordsPerSec = float64(recs) / r.Seconds
		r.MBPerSec = float64(bytes) / 1e6 / r.Seconds
	}
	if recs > 0 {
		r.AvgRecord = float64(bytes) / float64(recs)
	}
}

// percentile is the nearest-rank percentile of sorted durations.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func (r *result) errorCount() int {
	n := 0
	for _, v := range r.Errors {
		n += v
	}
	return n
}

func (r *result) print(w io.Writer) {
	what := "connections"
	if r.Mode == "http" {
		what = "clients"
	}
	format := ""
	if r.Format != "" {
		format = r.Format + ", "
	}
	acks := "acks"
	if !r.Acks {
		acks = "no acks"
	}
	fmt.Fprintf(w, "%s %s: %d %s, %sbatch %d, size %d, %s, run %s, %.1fs\n",
		r.Mode, r.Target, r.Connections, what, format, r.Batch, r.Size, acks, r.Run, r.Seconds)
	fmt.Fprintf(w, "sent          %d records in %d messages\n", r.SentRecords, r.SentMessages)
	if r.Acks {
		fmt.Fprintf(w, "acknowledged  %d records in %d messages\n", r.AckedRecords, r.AckedMessages)
	}
	fmt.Fprintf(w, "rate          %.0f records/s, %.1f MB/s of record JSON (%.0f bytes a record)\n", r.RecordsPerSec, r.MBPerSec, r.AvgRecord)
	if r.Acks {
		fmt.Fprintf(w, "ack latency   p50 %.1f ms, p99 %.1f ms, max %.1f ms\n", r.P50ms, r.P99ms, r.MaxMs)
	}
	if len(r.Errors) == 0 {
		fmt.Fprintf(w, "errors        none\n")
		return
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(r.Errors)) {
		parts = append(parts, fmt.Sprintf("%s: %d", k, r.Errors[k]))
	}
	fmt.Fprintf(w, "errors        %s\n", strings.Join(parts, ", "))
}

// errKind names an I/O error for the error counts: the operation and
// what went wrong ("write: reset", "ack: timeout").
func errKind(op string, err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return op + ": refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return op + ": reset"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return op + ": closed by the server"
	case errors.As(err, &ne) && ne.Timeout():
		return op + ": timeout"
	}
	return op + ": other"
}

// idWriter appends acknowledged ids to a file. Workers collect ids in
// their own buffer and hand it over in large pieces.
type idWriter struct {
	mu  sync.Mutex
	f   *os.File
	w   *bufio.Writer
	err error
}

func openIDs(path string) (*idWriter, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &idWriter{f: f, w: bufio.NewWriterSize(f, 1<<20)}, nil
}

// write takes lines of ids; b may be reused once it returns.
func (w *idWriter) write(b []byte) {
	if w == nil || len(b) == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, err := w.w.Write(b); err != nil && w.err == nil {
		w.err = err
	}
}

func (w *idWriter) close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.w.Flush(); err != nil && w.err == nil {
		w.err = err
	}
	if err := w.f.Close(); err != nil && w.err == nil {
		w.err = err
	}
	return w.err
}

// idBuf is a worker's ids not yet handed to the idWriter.
type idBuf struct {
	w   *idWriter
	b   []byte
	run string
	c   int
}

// add records the ids of records first to first+n-1 as acknowledged.
func (ib *idBuf) add(first uint64, n int) {
	if ib.w == nil {
		return
	}
	for i := range uint64(n) {
		ib.b = appendID(ib.b, ib.run, ib.c, first+i)
		ib.b = append(ib.b, '\n')
	}
	if len(ib.b) >= 256<<10 {
		ib.flush()
	}
}

func (ib *idBuf) flush() {
	ib.w.write(ib.b)
	ib.b = ib.b[:0]
}
