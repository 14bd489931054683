package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/logfwd/forwarder/config"
	cwemu "github.com/logfwd/forwarder/emulator/cloudwatchlogs"
	s3emu "github.com/logfwd/forwarder/emulator/s3emu"
	"github.com/logfwd/forwarder/queue"
	"github.com/logfwd/forwarder/wal"
)

const devUsage = `Usage: forwarder dev [--demo] [--rate N] [--reset]
       forwarder dev ls

Run the forwarder on this machine with local S3 and CloudWatch Logs emulators in the same
process: nothing reaches AWS. Data stays under ./dev-data between runs (--reset clears it).
Ports, all on 127.0.0.1: forward 24224, HTTP 8080, admin 9880, S3 4566, CloudWatch Logs 4567
(--port-offset N adds N to each, for a second instance; give dev ls the same).
--demo generates sample pod logs. "forwarder dev ls", from another terminal, lists what
arrived in each emulator of a running dev instance.
`

const (
	devDir    = "dev-data"
	devBucket = "forwarder-dev"
)

// devPorts are a dev instance's loopback addresses: the fixed ports, all moved by
// --port-offset, so that a second instance (a test beside a developer's) can run.
type devPorts struct {
	s3, cw, http, forward, admin string
}

func newDevPorts(offset int) (devPorts, error) {
	if offset < 0 || offset > 40000 {
		return devPorts{}, fmt.Errorf("--port-offset %d is not from 0 to 40000", offset)
	}
	at := func(port int) string { return fmt.Sprintf("127.0.0.1:%d", port+offset) }
	return devPorts{s3: at(4566), cw: at(4567), http: at(8080), forward: at(24224), admin: at(9880)}, nil
}

// free reports the first of the ports something listens on.
func (p devPorts) free() error {
	for _, addr := range []string{p.s3, p.cw, p.http, p.forward, p.admin} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("%s is in use", addr)
		}
		ln.Close()
	}
	return nil
}

// devConfig is the dev pipeline: config.yaml's, with the emulators' endpoints.
func devConfig(dir string, ports devPorts, s3URL, cwURL string) (*config.Config, error) {
	return config.Parse([]byte(fmt.Sprintf(`data_dir: %q
log: {level: warn}
shutdown_timeout: 5s
wal: {max_bytes: 1GiB}
inputs:
  forward: {listen: %q}
  http: {listen: %q}
admin: {listen: %q}
sinks:
  - name: archive
    type: s3
    match: "**"
    bucket: %s
    region: us-east-1
    endpoint: %q
    path_style: true
    max_object_bytes: 8MiB
    max_object_age: 10s
  - name: cloudwatch
    type: cloudwatch
    match: ["kube.**", "pod.**"]
    region: us-east-1
    endpoint: %q
    log_group: "/eks/${record.kubernetes.namespace_name|default}"
    log_stream: "${record.kubernetes.pod_name|unknown}-${hostname}"
    flush_interval: 1s
`, filepath.Join(dir, "wal"), ports.forward, ports.http, ports.admin, devBucket, s3URL, cwURL)), "(forwarder dev)")
}

func cmdDev(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "ls" {
		return cmdDevLs(args[1:], stdout, stderr)
	}
	f := newFlagSet("dev", devUsage)
	demo := f.Bool("demo", false, "generate sample pod logs")
	rate := f.Int("rate", 20, "records a second that --demo generates")
	reset := f.Bool("reset", false, "delete ./dev-data first")
	offset := f.Int("port-offset", 0, "add `N` to every port (for a second instance)")
	pos, code, done := f.parse(args, stdout, stderr)
	if done {
		return code
	}
	if code, done := f.noArgs(pos, stderr); done {
		return code
	}
	if *rate < 1 || *rate > maxDemoRate {
		fmt.Fprintf(stderr, "forwarder dev: --rate %d: the demo sends 1 to %d records a second\n", *rate, maxDemoRate)
		return exitUsage
	}
	ports, err := newDevPorts(*offset)
	if err != nil {
		fmt.Fprintf(stderr, "forwarder dev: %v\n", err)
		return exitUsage
	}
	if devDirInUse() {
		fmt.Fprintf(stderr, "forwarder dev: ./%s is in use by another forwarder dev; stop it first, or run the second one from another directory (with --port-offset N)\n", devDir)
		return exitFail
	}
	if *reset {
		// Not before the ports are known free: a reset that then cannot
		// start would only have deleted the data.
		if err := ports.free(); err != nil {
			fmt.Fprintf(stderr, "forwarder dev: %v; nothing was deleted (stop what listens there, or use --port-offset)\n", err)
			return exitFail
		}
		if err := os.RemoveAll(devDir); err != nil {
			fmt.Fprintf(stderr, "forwarder dev: %v\n", err)
			return exitFail
		}
	}
	if err := os.MkdirAll(devDir, 0o750); err != nil {
		fmt.Fprintf(stderr, "forwarder dev: %v\n", err)
		return exitFail
	}
	// Static dummy credentials: the SDK never looks for real ones or probes
	// instance metadata.
	for k, v := range map[string]string{"AWS_ACCESS_KEY_ID": "dev", "AWS_SECRET_ACCESS_KEY": "dev", "AWS_REGION": "us-east-1",
		"AWS_EC2_METADATA_DISABLED": "true"} {
		os.Setenv(k, v)
	}
	s3, err := s3emu.New(s3emu.Options{Dir: filepath.Join(devDir, "s3")})
	if err != nil {
		fmt.Fprintf(stderr, "forwarder dev: S3 emulator: %v (is another forwarder dev using ./%s?)\n", err, devDir)
		return exitFail
	}
	defer s3.Close()
	s3URL, err := s3.Start(ports.s3)
	if err != nil {
		fmt.Fprintf(stderr, "forwarder dev: S3 emulator on %s: %v (is another forwarder dev running? --port-offset runs a second one)\n", ports.s3, err)
		return exitFail
	}
	if err := s3.CreateBucket(devBucket); err != nil {
		fmt.Fprintf(stderr, "forwarder dev: create bucket: %v\n", err)
		return exitFail
	}
	// Creation has AWS's quotas, so that dev shows what many new streams
	// do; reads do not, so that forwarder dev ls can read every stream.
	quotas := map[string]int{}
	for _, op := range []string{"CreateLogGroup", "CreateLogStream", "PutRetentionPolicy"} {
		quotas[op] = cwemu.AWSQuota(op, "us-east-1")
	}
	cw := cwemu.New(cwemu.Options{Quotas: quotas})
	defer cw.Close()
	cwURL, err := cw.Start(ports.cw)
	if err != nil {
		fmt.Fprintf(stderr, "forwarder dev: CloudWatch Logs emulator on %s: %v\n", ports.cw, err)
		return exitFail
	}
	cfg, err := devConfig(devDir, ports, s3URL, cwURL)
	if err != nil {
		fmt.Fprintf(stderr, "forwarder dev: %v\n", err)
		return exitFail
	}
	printDevHelp(stdout, selfName(), ports, *offset, s3URL, cwURL)
	log := newLogger(cfg.Log, stderr)
	return serve(cfg, "(forwarder dev)", log, func(r *running) []actor {
		actors := []actor{{name: "status line", run: func(ctx context.Context) error {
			return statusLine(ctx, stdout, r, cw)
		}}}
		if *demo {
			actors = append(actors, actor{name: "demo", run: func(ctx context.Context) error { return demoLogs(ctx, r, *rate) }})
		}
		return actors
	})
}

// selfName is how to run this binary again from the current directory:
// the path it was started by when that has a directory (make run starts
// ./bin/forwarder, which is not on PATH), else its name.
func selfName() string {
	if len(os.Args) > 0 && strings.ContainsRune(os.Args[0], '/') {
		return os.Args[0]
	}
	return "forwarder"
}

// devDirInUse reports whether a running forwarder dev holds ./dev-data (its WAL's lock):
// another one, or --reset, would take its data from under it.
func devDirInUse() bool {
	dir := filepath.Join(devDir, "wal") // devConfig's data_dir
	if _, err := os.Stat(filepath.Join(dir, wal.FileName)); err != nil {
		return false
	}
	w, err := wal.Open(dir, wal.Options{ReadOnly: true, LockTimeout: 100 * time.Millisecond})
	if err == nil {
		w.Close()
	}
	return errors.Is(err, wal.ErrLocked)
}

func printDevHelp(w io.Writer, self string, ports devPorts, offset int, s3URL, cwURL string) {
	_, fwdPort, _ := net.SplitHostPort(ports.forward)
	ls := self + " dev ls"
	if offset != 0 {
		ls += fmt.Sprintf(" --port-offset %d", offset)
	}
	fmt.Fprintf(w, `forwarder dev: S3 emulator at %s (bucket %s), CloudWatch Logs emulator at %s; data in ./%s

Send a record over HTTP:
  curl -X POST http://%s/v1/logs/pod.shop --data-binary '{"log":"hello","kubernetes":{"namespace_name":"shop","pod_name":"web-1"}}'
Send one with a forward client (Debian's python3-fluent-logger):
  /usr/bin/python3 -c "from fluent import sender; s = sender.FluentSender('pod', port=%s); print('sent' if s.emit('shop', {'log': 'hi', 'kubernetes': {'namespace_name': 'shop', 'pod_name': 'web-1'}}) else s.last_error)"
See what arrived:
  %s
  export AWS_ACCESS_KEY_ID=dev AWS_SECRET_ACCESS_KEY=dev AWS_DEFAULT_REGION=us-east-1  # the aws CLI wants some; the emulators take any
  aws --endpoint-url %s s3 ls s3://%s --recursive
  aws --endpoint-url %s logs describe-log-streams --log-group-name /eks/shop
Status: http://%s/status   Metrics: http://%s/metrics   Ctrl-C stops.

`, s3URL, devBucket, cwURL, devDir, ports.http, fwdPort, ls, s3URL, devBucket, cwURL, ports.admin, ports.admin)
}

// statusLine shows, every second, records in, the WAL's size and each sink's progress:
// redrawn in place on a terminal, one line a few seconds otherwise.
func statusLine(ctx context.Context, out io.Writer, r *running, cw *cwemu.Server) error {
	tty := isTerminal(out)
	every := time.Second
	if !tty {
		every = 10 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	first := r.w.Stats().NextSeq // records are numbered from the clock: count from here
	for {
		select {
		case <-ctx.Done():
			if tty {
				fmt.Fprintln(out)
			}
			return nil
		case <-t.C:
		}
		var sinks []queue.Status
		for _, d := range r.drainers {
			sinks = append(sinks, d.Status())
		}
		line := statusText(r.w.Stats(), first, sinks)
		if tty {
			fmt.Fprintf(out, "\r\033[K%s", line)
		} else {
			fmt.Fprintln(out, line)
		}
	}
}

// statusText is the dev status line: the records taken since first (the
// WAL's next sequence number at the start), what the WAL holds, and each
// sink's state.
func statusText(st wal.Stats, first uint64, sinks []queue.Status) string {
	var b strings.Builder
	fmt.Fprintf(&b, "in %d records | wal %d records, %s", st.NextSeq-min(first, st.NextSeq), st.Records, humanBytes(st.Bytes))
	for _, s := range sinks {
		fmt.Fprintf(&b, " | %s: %s, delivered %d, lag %d", s.Sink, s.State, s.Delivered, s.LagRecords)
		if s.DeadLettered > 0 {
			fmt.Fprintf(&b, ", dead %d", s.DeadLettered)
		}
	}
	return b.String()
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// maxDemoRate is the most records a second --demo sends (one append each).
const maxDemoRate = 100_000

// demoLogs stores sample Kubernetes pod logs at rate records a second (1 to
// maxDemoRate).
func demoLogs(ctx context.Context, r *running, rate int) error {
	pods := []string{"web-7d9f8b6c4-x2k9p", "web-7d9f8b6c4-q8r4t", "api-5c6d7e8f9-m3n4b", "worker-6b7c8d9e0-z1y2x"}
	nss := []string{"shop", "shop", "payments", "jobs"}
	msgs := []string{"GET /api/v1/items 200 12ms", "POST /api/v1/orders 201 48ms", "cache miss key=cart:1234", "job email completed in 1.2s", "upstream timeout, retrying"}
	t := time.NewTicker(time.Second / time.Duration(rate))
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		p := rand.IntN(len(pods))
		body := fmt.Sprintf(`{"log":"%s %s","stream":"stdout","kubernetes":{"namespace_name":%q,"pod_name":%q}}`,
			time.Now().UTC().Format(time.RFC3339Nano), msgs[rand.IntN(len(msgs))], nss[p], pods[p])
		rec := []wal.Record{{Time: time.Now().UnixNano(), Tag: "pod." + nss[p], Body: []byte(body)}}
		if _, err := r.pipeline.Store(ctx, "demo", rec, wal.AppendOptions{}); err != nil && ctx.Err() == nil {
			return fmt.Errorf("demo: %w", err)
		}
	}
}
