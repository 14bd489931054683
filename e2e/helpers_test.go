package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	cwemu "github.com/logfwd/forwarder/emulator/cloudwatchlogs"
	s3emu "github.com/logfwd/forwarder/emulator/s3emu"
	"github.com/logfwd/forwarder/internal/syncbuf"
)

// Credentials for the child's environment: the emulators and moto accept any.
var childEnv = []string{
	"AWS_ACCESS_KEY_ID=AKIDE2ETEST",
	"AWS_SECRET_ACCESS_KEY=e2e-secret",
	"AWS_EC2_METADATA_DISABLED=true",
}

const (
	bucket       = "e2e-archive"
	cwMaxStreams = 64 // max_concurrent_streams in every configuration
	// cwSettle is how old a call in doubt is before its stream is read
	// back (settle): the emulators in the test process make events readable
	// at once, unless a test sets a read delay.
	cwSettle = 200 * time.Millisecond
)

// freeAddr returns a loopback address with a port nobody listens on now,
// and none it returned before: a port closed again may be handed out
// twice, and one configuration's listeners must differ.
func freeAddr(t *testing.T) string {
	t.Helper()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		givenMu.Lock()
		seen := given[addr]
		given[addr] = true
		givenMu.Unlock()
		if !seen {
			return addr
		}
	}
}

var (
	givenMu sync.Mutex
	given   = map[string]bool{} // addresses freeAddr returned
)

// fwdConfig is one forwarder configuration; yaml renders it.
type fwdConfig struct {
	DataDir                  string
	Forward, HTTP, Admin     string
	WALMaxBytes, WALWhenFull string // "" for the defaults
	WALMinFreeBytes          string
	ShutdownTimeout          string // "": 10s
	DrainOnShutdown          bool
	Sinks                    []string
}

func (c fwdConfig) yaml() string {
	var b strings.Builder
	fmt.Fprintf(&b, "data_dir: %q\n", c.DataDir)
	b.WriteString("log: {level: info, format: text}\n")
	shutdown := c.ShutdownTimeout
	if shutdown == "" {
		shutdown = "10s"
	}
	fmt.Fprintf(&b, "shutdown_timeout: %s\ndrain_on_shutdown: %t\n", shutdown, c.DrainOnShutdown)
	if c.WALMaxBytes != "" || c.WALWhenFull != "" || c.WALMinFreeBytes != "" {
		b.WriteString("wal:\n")
		if c.WALMaxBytes != "" {
			fmt.Fprintf(&b, "  max_bytes: %s\n", c.WALMaxBytes)
		}
		if c.WALWhenFull != "" {
			fmt.Fprintf(&b, "  when_full: %s\n", c.WALWhenFull)
		}
		if c.WALMinFreeBytes != "" {
			fmt.Fprintf(&b, "  min_free_bytes: %s\n", c.WALMinFreeBytes)
		}
	}
	fmt.Fprintf(&b, "inputs:\n  forward: {listen: %q}\n  http: {listen: %q}\n", c.Forward, c.HTTP)
	fmt.Fprintf(&b, "admin: {listen: %q}\nsinks:\n", c.Admin)
	for _, s := range c.Sinks {
		b.WriteString(s)
	}
	return b.String()
}

// s3Sink is an s3 sink taking every tag, cutting small objects often.
func s3Sink(name, endpoint, bucket string) string {
	return fmt.Sprintf(`  - name: %s
    type: s3
    match: "**"
    bucket: %s
    region: us-east-1
    endpoint: %q
    path_style: true
    max_object_bytes: 256KiB
    max_object_age: 1s
`, name, bucket, endpoint)
}

// cwSink is a cloudwatch sink for pod.** with one group per namespace and
// the stream logStream names (a template).
func cwSink(name, endpoint, logStream string) string {
	return fmt.Sprintf(`  - name: %s
    type: cloudwatch
    match: "pod.**"
    region: us-east-1
    endpoint: %q
    log_group: "/e2e/${record.ns}"
    log_stream: %q
    flush_interval: 200ms
    max_concurrent_streams: %d
    settle: %s
    read_rate: 200
`, name, endpoint, logStream, cwMaxStreams, cwSettle)
}

// newConfig is the usual configuration: free loopback ports, dataDir, an
// "archive" s3 sink and a "cloudwatch" sink with one stream per pod.
func newConfig(t *testing.T, dataDir, s3URL, cwURL string) fwdConfig {
	return fwdConfig{
		DataDir: dataDir,
		Forward: freeAddr(t), HTTP: freeAddr(t), Admin: freeAddr(t),
		Sinks: []string{s3Sink("archive", s3URL, bucket), cwSink("cloudwatch", cwURL, podStream)},
	}
}

// syncBuffer collects output while the test reads it.
type syncBuffer = syncbuf.Buffer

// forwarder is `forwarder run` in a child process, started again as often
// as a test wants on the same configuration file and data_dir.
type forwarder struct {
	t       *testing.T
	cfg     fwdConfig
	cfgPath string

	mu    sync.Mutex
	cmd   *exec.Cmd
	done  chan struct{}
	runs  []*syncBuffer // stderr of each run, in order
	kills int
	env   []string // added to the child's environment
}

// newForwarder writes cfg next to a fresh temporary directory's data and
// returns a forwarder that is not started yet. When the test ends, a running
// child is killed; when it failed, the tail of the forwarder's log is printed.
func newForwarder(t *testing.T, cfg fwdConfig) *forwarder {
	t.Helper()
	f := &forwarder{t: t, cfgPath: filepath.Join(t.TempDir(), "forwarder.yaml")}
	f.setConfig(cfg)
	t.Cleanup(func() {
		if f.running() {
			f.signal(syscall.SIGKILL)
			<-f.done
		}
		if t.Failed() {
			t.Logf("forwarder log (%d runs):\n%s", len(f.runs), f.tail(60))
		}
	})
	return f
}

// setConfig writes cfg to the configuration file; it applies at the next start.
func (f *forwarder) setConfig(cfg fwdConfig) {
	f.t.Helper()
	f.cfg = cfg
	if err := os.WriteFile(f.cfgPath, []byte(cfg.yaml()), 0o600); err != nil {
		f.t.Fatal(err)
	}
}

func (f *forwarder) running() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.done == nil {
		return false
	}
	select {
	case <-f.done:
		return false
	default:
		return true
	}
}

// start runs the forwarder and waits until it says it started (listeners bound).
func (f *forwarder) start() {
	f.t.Helper()
	if f.running() {
		f.t.Fatal("start: the forwarder is running already")
	}
	cmd := exec.Command(forwarderBin, "run", "-c", f.cfgPath)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	cmd.Env = append(append(os.Environ(), childEnv...), f.env...)
	if err := cmd.Start(); err != nil {
		f.t.Fatalf("start the forwarder: %v", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait() // the status is read from ProcessState
		close(done)
	}()
	f.mu.Lock()
	f.cmd, f.done = cmd, done
	f.runs = append(f.runs, stderr)
	f.mu.Unlock()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(stderr.String(), "msg=started") {
		select {
		case <-done:
			f.t.Fatalf("the forwarder exited at start (%v):\n%s", cmd.ProcessState, f.tail(30))
		default:
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("the forwarder did not start within 30s:\n%s", f.tail(30))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (f *forwarder) signal(sig syscall.Signal) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cmd != nil && f.cmd.Process != nil {
		_ = f.cmd.Process.Signal(sig)
	}
}

// kill SIGKILLs the forwarder and waits until it is gone.
func (f *forwarder) kill() {
	f.t.Helper()
	if !f.running() {
		f.t.Fatalf("kill: the forwarder is not running (%v):\n%s", f.cmd.ProcessState, f.tail(30))
	}
	f.signal(syscall.SIGKILL)
	<-f.done
	f.kills++
}

// stop sends SIGTERM and requires a clean exit (status 0) within 40 s.
func (f *forwarder) stop() {
	f.t.Helper()
	if !f.running() {
		f.t.Fatalf("stop: the forwarder is not running (%v):\n%s", f.cmd.ProcessState, f.tail(30))
	}
	f.signal(syscall.SIGTERM)
	select {
	case <-f.done:
	case <-time.After(40 * time.Second):
		f.signal(syscall.SIGKILL)
		<-f.done
		f.t.Fatalf("the forwarder did not stop within 40s of SIGTERM:\n%s", f.tail(30))
	}
	if code := f.cmd.ProcessState.ExitCode(); code != 0 {
		f.t.Errorf("the forwarder exited with status %d after SIGTERM:\n%s", code, f.tail(30))
	}
}

// tail is the last n lines of the current run's log, preceded by the
// warnings and errors of earlier runs (at most 20).
func (f *forwarder) tail(n int) string {
	f.mu.Lock()
	runs := append([]*syncBuffer(nil), f.runs...)
	f.mu.Unlock()
	if len(runs) == 0 {
		return "(never started)"
	}
	var b strings.Builder
	var earlier []string
	for i, r := range runs[:len(runs)-1] {
		for _, l := range strings.Split(r.String(), "\n") {
			if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
				earlier = append(earlier, fmt.Sprintf("[run %d] %s", i+1, l))
			}
		}
	}
	if len(earlier) > 20 {
		fmt.Fprintf(&b, "... %d earlier warnings and errors\n", len(earlier)-20)
		earlier = earlier[len(earlier)-20:]
	}
	for _, l := range earlier {
		b.WriteString(l + "\n")
	}
	lines := strings.Split(strings.TrimRight(runs[len(runs)-1].String(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	fmt.Fprintf(&b, "[run %d, last %d lines]\n%s", len(runs), len(lines), strings.Join(lines, "\n"))
	return b.String()
}

// logCounts counts the WARN and ERROR lines of every run by message.
func (f *forwarder) logCounts() map[string]int {
	f.mu.Lock()
	runs := append([]*syncBuffer(nil), f.runs...)
	f.mu.Unlock()
	counts := map[string]int{}
	for _, r := range runs {
		for _, l := range strings.Split(r.String(), "\n") {
			var level string
			switch {
			case strings.Contains(l, "level=WARN"):
				level = "WARN"
			case strings.Contains(l, "level=ERROR"):
				level = "ERROR"
			default:
				continue
			}
			counts[level+" "+logMsg(l)]++
		}
	}
	return counts
}

// logMsg is the msg= value of a text log line, cut short.
func logMsg(line string) string {
	i := strings.Index(line, "msg=")
	if i < 0 {
		return line
	}
	s := line[i+4:]
	if strings.HasPrefix(s, `"`) {
		if u, err := strconv.QuotedPrefix(s); err == nil {
			s, _ = strconv.Unquote(u)
		}
	} else if j := strings.IndexByte(s, ' '); j >= 0 {
		s = s[:j]
	}
	if len(s) > 90 {
		s = s[:90] + "..."
	}
	return s
}

// logSummary is logCounts on one line, most frequent first.
func (f *forwarder) logSummary() string {
	counts := f.logCounts()
	if len(counts) == 0 {
		return "no warnings or errors"
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if counts[keys[i]] != counts[keys[j]] {
			return counts[keys[i]] > counts[keys[j]]
		}
		return keys[i] < keys[j]
	})
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%dx %s", counts[k], k))
	}
	return strings.Join(parts, "; ")
}

// logSum sums the integer values of key= in the lines of every run that
// contain msg.
func (f *forwarder) logSum(msg, key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	re := regexp.MustCompile(`\b` + regexp.QuoteMeta(key) + `=(\d+)`)
	n := 0
	for _, r := range f.runs {
		for _, l := range strings.Split(r.String(), "\n") {
			if !strings.Contains(l, msg) {
				continue
			}
			if m := re.FindStringSubmatch(l); m != nil {
				v, _ := strconv.Atoi(m[1])
				n += v
			}
		}
	}
	return n
}

// logCount counts the lines of every run that contain s.
func (f *forwarder) logCount(s string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, r := range f.runs {
		n += strings.Count(r.String(), s)
	}
	return n
}

var adminClient = &http.Client{Timeout: 3 * time.Second}

// adminGet answers the admin server's path: status code and body.
func (f *forwarder) adminGet(path string) (int, []byte, error) {
	res, err := adminClient.Get("http://" + f.cfg.Admin + path)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, b, err
}

// status is the part of /status the tests read.
type status struct {
	WAL struct {
		Bytes    int64             `json:"bytes"`
		MaxBytes int64             `json:"max_bytes"`
		Records  uint64            `json:"records"`
		NextSeq  uint64            `json:"next_seq"`
		Full     bool              `json:"full"`
		Dropped  map[string]uint64 `json:"dropped_records"`
		DiskFull bool              `json:"disk_full"`
		DiskFree int64             `json:"disk_free_bytes"`
		FileFree int64             `json:"file_free_bytes"`
	} `json:"wal"`
	Sinks []sinkStatus `json:"sinks"`
}

type sinkStatus struct {
	Sink         string `json:"sink"`
	State        string `json:"state"`
	Cursor       uint64 `json:"cursor"`
	LagRecords   uint64 `json:"lag_records"`
	Delivered    uint64 `json:"delivered_records"`
	DeadLettered uint64 `json:"dead_lettered_records"`
	LastError    string `json:"last_error"`
	Buffered     int64  `json:"buffered_bytes"`
}

func (f *forwarder) status() (status, error) {
	var st status
	code, b, err := f.adminGet("/status")
	if err != nil {
		return st, err
	}
	if code != http.StatusOK {
		return st, fmt.Errorf("/status: %d %s", code, b)
	}
	return st, json.Unmarshal(b, &st)
}

// metrics reads /metrics into a map from `name{labels}` to value.
func (f *forwarder) metrics() (map[string]float64, error) {
	code, b, err := f.adminGet("/metrics")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("/metrics: %d", code)
	}
	m := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if l == "" || l[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(l[i+1:], 64)
		if err == nil {
			m[l[:i]] = v
		}
	}
	return m, sc.Err()
}

// mustMetrics is metrics, failing the test on an error.
func (f *forwarder) mustMetrics() map[string]float64 {
	f.t.Helper()
	m, err := f.metrics()
	if err != nil {
		f.t.Fatalf("read /metrics: %v\n%s", err, f.tail(20))
	}
	return m
}

// waitDrained waits until every sink has passed every record. /status
// updates a sink's figures about once a second (and shows lag_records 0
// before the first update), so the test wants each sink's cursor at the
// WAL's last sequence number, which /status reads live, as well as
// lag_records 0.
func (f *forwarder) waitDrained(timeout time.Duration) time.Duration {
	f.t.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	var last string
	for {
		st, err := f.status()
		if err == nil {
			done := len(st.Sinks) > 0
			for _, s := range st.Sinks {
				if s.LagRecords != 0 || s.Cursor+1 < st.WAL.NextSeq {
					done = false
				}
			}
			if done {
				return time.Since(start)
			}
			b, _ := json.Marshal(st)
			last = string(b)
		} else {
			last = err.Error()
		}
		if !f.running() {
			f.t.Fatalf("the forwarder exited while draining (%v):\n%s", f.cmd.ProcessState, f.tail(30))
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("the sinks did not drain within %v: %s\n%s", timeout, last, f.tail(30))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitSink waits until the sink has passed every record (see waitDrained).
func (f *forwarder) waitSink(name string, timeout time.Duration) {
	f.t.Helper()
	ok := waitFor(timeout, func() bool {
		st, err := f.status()
		if err != nil {
			return false
		}
		for _, s := range st.Sinks {
			if s.Sink == name {
				return s.LagRecords == 0 && s.Cursor+1 >= st.WAL.NextSeq
			}
		}
		return false
	})
	if !ok {
		st, _ := f.status()
		f.t.Fatalf("sink %s did not pass every record within %v: %+v\n%s", name, timeout, st.Sinks, f.tail(20))
	}
}

// cli runs a forwarder command on this configuration (the service stopped).
func (f *forwarder) cli(args ...string) (stdout, stderr string, code int) {
	f.t.Helper()
	cmd := exec.Command(forwarderBin, append(args, "-c", f.cfgPath)...)
	cmd.Env = append(os.Environ(), childEnv...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		f.t.Fatalf("forwarder %s: %v", strings.Join(args, " "), err)
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode()
}

// deadLetter is one line of `forwarder wal dead-letters`.
type deadLetter struct {
	Sink   string `json:"sink"`
	Reason string `json:"reason"`
	Tag    string `json:"tag"`
	Body   struct {
		ID string `json:"id"`
	} `json:"body"`
}

// deadLetters runs `forwarder wal dead-letters` and returns sink → id → reason.
func (f *forwarder) deadLetters() map[string]map[string]string {
	f.t.Helper()
	out, errOut, code := f.cli("wal", "dead-letters")
	if code != 0 {
		f.t.Fatalf("forwarder wal dead-letters: status %d: %s", code, errOut)
	}
	dl := map[string]map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l == "" {
			continue
		}
		var d deadLetter
		if err := json.Unmarshal([]byte(l), &d); err != nil {
			f.t.Fatalf("forwarder wal dead-letters: line %q: %v", l, err)
		}
		if dl[d.Sink] == nil {
			dl[d.Sink] = map[string]string{}
		}
		dl[d.Sink][d.Body.ID] = d.Reason
	}
	return dl
}

// walCursor is a cursor of `forwarder wal stats --json`.
type walCursor struct {
	Name     string `json:"name"`
	Position uint64 `json:"position"`
	Behind   uint64 `json:"behind"`
	Dropped  uint64 `json:"dropped"`
}

// walStats runs `forwarder wal stats --json` and returns its cursors by name.
func (f *forwarder) walStats() map[string]walCursor {
	f.t.Helper()
	out, errOut, code := f.cli("wal", "stats", "--json")
	if code != 0 {
		f.t.Fatalf("forwarder wal stats: status %d: %s", code, errOut)
	}
	var st struct {
		Cursors []walCursor `json:"cursors"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		f.t.Fatalf("forwarder wal stats --json: %v\n%s", err, out)
	}
	m := map[string]walCursor{}
	for _, c := range st.Cursors {
		m[c.Name] = c
	}
	return m
}

// waitFor polls cond every 50 ms until it holds or timeout passes.
func waitFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// env is one scenario's world: the emulators in the test process, the
// forwarder's configuration and process, and the clients' ledger.
type env struct {
	t     *testing.T
	s3    *s3emu.Server
	s3URL string
	cw    *cwemu.Server
	cwURL string
	f     *forwarder
	led   *ledger
	start time.Time
}

// newEnv starts the emulators and writes the usual configuration, changed
// by edit when set; the forwarder is not started.
func newEnv(t *testing.T, edit func(*fwdConfig)) *env {
	t.Helper()
	e := &env{t: t, led: newLedger(), start: time.Now()}
	e.s3, e.s3URL = startS3(t)
	e.cw, e.cwURL = startCW(t)
	cfg := newConfig(t, filepath.Join(t.TempDir(), "data"), e.s3URL, e.cwURL)
	if edit != nil {
		edit(&cfg)
	}
	e.f = newForwarder(t, cfg)
	return e
}

// settle waits until both sinks passed every record, stops the forwarder
// with SIGTERM and returns its dead letters.
func (e *env) settle(drainTimeout time.Duration) map[string]map[string]string {
	e.t.Helper()
	e.f.waitDrained(drainTimeout)
	e.f.stop()
	return e.f.deadLetters()
}

// account reads both sinks back through the SDK and accounts for every
// record of the ledger.
func (e *env) account(dead map[string]map[string]string) tally {
	e.t.Helper()
	return account(e.led.snapshot(), readS3(e.t, e.s3URL, bucket), readCW(e.t, e.cwURL), dead, "archive", "cloudwatch", inPodStream)
}

// pid is the running forwarder's process id.
func (f *forwarder) pid() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cmd.Process.Pid
}
