// Command loadgen sends container-log records to a forwarder and reports
// what it acknowledged, how fast and how late.
//
//	loadgen forward -addr 127.0.0.1:24224 -conns 8 -batch 1000 -size 250 -duration 20s [-ack=true] [-mode packed|forward|message] [-tags 1] [-rate 0]
//	loadgen http -url http://127.0.0.1:8080/v1/logs/pod.shop -clients 8 -batch 1000 -size 250 -duration 20s
//	loadgen backlog -data DIR -bytes 5GiB
//	loadgen standin -listen 127.0.0.1:4599
//
// Every record carries an "id" field, "<run>-<conn>-<n>", unique to the
// run, the connection (or HTTP client) and the record; -ids FILE appends
// the id of every acknowledged record to FILE, one a line, so that a run
// can be checked against what arrived. See BENCHMARKS.md for how the
// figures in it were taken.
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
)

const usage = `Usage:
  loadgen forward [flags]   PackedForward (or Forward, Message) messages over TCP, acks per message
  loadgen http [flags]      NDJSON bodies POSTed to the HTTP input; only 200 answers count
  loadgen backlog [flags]   fill a stopped forwarder's WAL directly, for a start or a drain with a backlog
  loadgen standin [flags]   an S3 and CloudWatch Logs endpoint that accepts everything at once and keeps nothing

Run "loadgen forward -h" or "loadgen http -h" for the flags.
Exit status: 0 success; 1 a connection or request failed (unless -tolerate-errors); 2 usage error.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// options are the flags both modes share.
type options struct {
	batch    int
	size     int
	duration time.Duration
	messages int
	timeout  time.Duration
	runID    string
	seed     int64
	jsonOut  bool
	idsPath  string
	tolerate bool
	progress time.Duration
}

func (o *options) register(f *flag.FlagSet) {
	f.IntVar(&o.batch, "batch", 1000, "records per message or request")
	f.IntVar(&o.size, "size", 250, "approximate bytes of JSON per record")
	f.DurationVar(&o.duration, "duration", 20*time.Second, "how long to send (0: until -messages are sent)")
	f.IntVar(&o.messages, "messages", 0, "messages (requests) per connection (0: no limit)")
	f.DurationVar(&o.timeout, "timeout", time.Minute, "how long to wait for one ack or answer")
	f.StringVar(&o.runID, "run", "", "run id in every record id (default: random)")
	f.Int64Var(&o.seed, "seed", 1, "seed of the record contents")
	f.BoolVar(&o.jsonOut, "json", false, "print the result as one JSON object")
	f.StringVar(&o.idsPath, "ids", "", "append the id of every acknowledged record to this file, one a line")
	f.BoolVar(&o.tolerate, "tolerate-errors", false, "reconnect (resend) after an error, and exit 0 anyway")
	f.DurationVar(&o.progress, "progress", 0, "print the running totals to stderr this often (0: never)")
}

func (o *options) check() error {
	switch {
	case o.batch < 1:
		return errors.New("-batch must be at least 1")
	case o.size < 1:
		return errors.New("-size must be at least 1")
	case o.duration < 0 || o.messages < 0:
		return errors.New("-duration and -messages must not be negative")
	case o.duration == 0 && o.messages == 0:
		return errors.New("one of -duration and -messages must be set")
	case o.timeout <= 0:
		return errors.New("-timeout must be positive")
	case strings.ContainsAny(o.runID, "\"\\\n"):
		return errors.New("-run must not contain quotes, backslashes or newlines")
	}
	if o.runID == "" {
		o.runID = randomRunID()
	}
	return nil
}

// randomRunID is six lower-case letters and digits.
func randomRunID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 6)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	switch args[0] {
	case "backlog":
		return cmdBacklog(ctx, args[1:], stdout, stderr)
	case "standin":
		return cmdStandin(ctx, args[1:], stdout, stderr)
	}
	var g generator
	switch args[0] {
	case "forward":
		g = &forwardGen{}
	case "http":
		g = &httpGen{}
	default:
		fmt.Fprintf(stderr, "loadgen: unknown mode %q\n%s", args[0], usage)
		return 2
	}
	f := flag.NewFlagSet("loadgen "+args[0], flag.ContinueOnError)
	f.SetOutput(stderr)
	var o options
	o.register(f)
	g.register(f)
	if err := f.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if f.NArg() > 0 {
		fmt.Fprintf(stderr, "loadgen %s: unexpected arguments %q\n", args[0], f.Args())
		return 2
	}
	if err := o.check(); err != nil {
		fmt.Fprintf(stderr, "loadgen %s: %v\n", args[0], err)
		return 2
	}
	if err := g.check(&o); err != nil {
		fmt.Fprintf(stderr, "loadgen %s: %v\n", args[0], err)
		return 2
	}
	var ids *idWriter
	if o.idsPath != "" {
		var err error
		if ids, err = openIDs(o.idsPath); err != nil {
			fmt.Fprintf(stderr, "loadgen %s: %v\n", args[0], err)
			return 1
		}
	}
	res := drive(ctx, g, &o, ids, stderr)
	code := 0
	if ids != nil {
		if err := ids.close(); err != nil {
			fmt.Fprintf(stderr, "loadgen %s: ids file: %v\n", args[0], err)
			code = 1
		}
	}
	if o.jsonOut {
		enc := json.NewEncoder(stdout)
		enc.Encode(res)
	} else {
		res.print(stdout)
	}
	if res.errorCount() > 0 && !o.tolerate {
		code = 1
	}
	return code
}

// generator is one mode of sending: forward or http.
type generator interface {
	register(f *flag.FlagSet)
	check(o *options) error
	workers() int
	describe(r *result)
	// work sends messages until stop is closed (after finishing the one in
	// flight) or o.messages are sent, or an error ends the connection
	// without -tolerate-errors.
	work(w int, o *options, st *stats, stop <-chan struct{}, ids *idWriter)
}

// drive runs the workers for the duration and gathers their figures.
func drive(ctx context.Context, g generator, o *options, ids *idWriter, stderr io.Writer) *result {
	n := g.workers()
	sts := make([]*stats, n)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for w := range n {
		sts[w] = newStats()
		wg.Go(func() { g.work(w, o, sts[w], stop, ids) })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	var timer <-chan time.Time
	if o.duration > 0 {
		t := time.NewTimer(o.duration)
		defer t.Stop()
		timer = t.C
	}
	var tick <-chan time.Time
	if o.progress > 0 {
		t := time.NewTicker(o.progress)
		defer t.Stop()
		tick = t.C
	}
	stopped := false
	halt := func() {
		if !stopped {
			close(stop)
			stopped = true
		}
	}
	interrupted := ctx.Done()
wait:
	for {
		select {
		case <-done:
			break wait
		case <-timer:
			halt()
		case <-interrupted:
			// The messages in flight still get their acks.
			halt()
			interrupted = nil
		case <-tick:
			var acked, sent uint64
			for _, s := range sts {
				sent += s.sentRecords.Load()
				acked += s.ackedRecords.Load()
			}
			el := time.Since(start).Seconds()
			fmt.Fprintf(stderr, "loadgen: %.0fs: %d records sent, %d acknowledged (%.0f/s)\n", el, sent, acked, float64(acked)/el)
		}
	}
	elapsed := time.Since(start)
	r := merge(sts, elapsed)
	r.Run = o.runID
	r.Batch, r.Size = o.batch, o.size
	g.describe(r)
	r.rates()
	return r
}
