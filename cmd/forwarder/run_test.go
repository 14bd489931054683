package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fluent/fluent-logger-golang/fluent"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/internal/nettest"
	"github.com/logfwd/forwarder/sinks/s3sink"
	"github.com/logfwd/forwarder/wal"
)

func TestRunStopsOnSignal(t *testing.T) {
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			// A WAL that fits any test directory's file system (the test
			// data may be on a tmpfs of 4 GiB): no warning of its size.
			path, dataDir := writeConfig(t, shortShutdownYAML, "wal: {max_bytes: 1GiB}\n", inputsYAML, adminYAML)
			log := startStop(t, path, dataDir, sig, 5*time.Second)
			for _, want := range []string{
				"level=INFO msg=\"wal opened\" path=" + filepath.Join(dataDir, wal.FileName) + " records=0 bytes=0",
				"level=INFO msg=\"shutting down\" signal=" + sig.String(),
				"level=INFO msg=listening input=http address=127.0.0.1:",
				"level=INFO msg=listening input=forward address=127.0.0.1:",
				"level=INFO msg=stopped",
			} {
				if !strings.Contains(log, want) {
					t.Errorf("log lacks %q:\n%s", want, log)
				}
			}
			// The configuration has no sinks, which is the one warning.
			if strings.Count(log, "level=WARN") != 1 || !strings.Contains(log, `level=WARN msg="no sinks: `) || strings.Contains(log, "level=ERROR") {
				t.Errorf("a clean run logged a warning or an error:\n%s", log)
			}
		})
	}
}

// SIGHUP (systemctl kill -s HUP, a closed terminal) does not end the
// service, which says why; SIGTERM still stops it.
func TestRunIgnoresSIGHUP(t *testing.T) {
	t.Parallel()
	path, dataDir := writeConfig(t, shortShutdownYAML, inputsYAML, adminYAML)
	s := startService(t, path)
	s.waitFor("msg=started", filepath.Join(dataDir, wal.FileName))
	s.signal(syscall.SIGHUP)
	s.waitFor("SIGHUP ignored: the configuration is read at start only", filepath.Join(dataDir, wal.FileName))
	s.signal(syscall.SIGHUP)
	s.signal(syscall.SIGTERM)
	if code := s.wait(5 * time.Second); code != exitOK {
		t.Fatalf("exit status %d, want 0; stderr:\n%s", code, s.stderr.String())
	}
	if !strings.Contains(s.stderr.String(), "msg=stopped") {
		t.Errorf("no orderly stop:\n%s", s.stderr.String())
	}
}

// A second SIGTERM while the stop waits (a drain of a sink that cannot reach its
// destination) ends the process at once, exit status 1, with a line saying so; what was
// stored stays in the WAL.
func TestRunSecondSignalExits(t *testing.T) {
	t.Parallel()
	addr := nettest.ClosedAddr(t)
	inputs := "inputs:\n  forward: {listen: \"" + addr + "\"}\n"
	path, dataDir := writeConfig(t, "shutdown_timeout: 2m\ndrain_on_shutdown: true\n", inputs, adminYAML, sinkYAML)
	s := startService(t, path)
	s.waitFor("msg=started", filepath.Join(dataDir, wal.FileName))
	postForward(t, addr, "pod.web", 1)
	s.signal(syscall.SIGTERM)
	s.waitFor("msg=\"shutting down\"", filepath.Join(dataDir, wal.FileName))
	time.Sleep(500 * time.Millisecond) // the stop is under way: the drain waits for the sink
	select {
	case <-s.done:
		t.Fatalf("the service stopped before the second signal; stderr:\n%s", s.stderr.String())
	default:
	}
	s.signal(syscall.SIGTERM)
	if code := s.wait(5 * time.Second); code != exitFail {
		t.Fatalf("exit status %d after a second SIGTERM, want %d; stderr:\n%s", code, exitFail, s.stderr.String())
	}
	if want := `level=WARN msg="signal while stopping: exiting now, without waiting for the stop to end; what the sinks had not delivered stays in the WAL and is sent at the next start on this data_dir" signal=terminated`; !strings.Contains(s.stderr.String(), want) {
		t.Fatalf("log lacks %q:\n%s", want, s.stderr.String())
	}
	if r := forwarderCmd(t, "wal", "dump", "-c", path); r.code != exitOK || strings.Count(r.stdout, `"tag":"pod.web"`) != 1 {
		t.Fatalf("dump: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// TestStopWhileTheWALOpens: a SIGTERM while the WAL opens (a long compaction at start) ends
// the start at once, said in the log, rather than once the open is over; an open that
// returns first is the WAL's, with no signal seen. Not parallel: it signals the test
// process, whose other signal handlers must not be listening.
func TestStopWhileTheWALOpens(t *testing.T) {
	log, logs := testLogger()
	release := make(chan struct{})
	defer close(release)
	entered := make(chan struct{})
	result := make(chan bool, 1)
	go func() {
		_, stopped, err := openUnlessStopped(log, func() (*wal.WAL, error) {
			close(entered)
			<-release
			return nil, fmt.Errorf("released")
		})
		result <- stopped && err == nil
	}()
	<-entered
	time.Sleep(20 * time.Millisecond) // subscribed to the signals before open is called
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case ok := <-result:
		if !ok {
			t.Fatal("not stopped by SIGTERM")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a SIGTERM while the WAL opened did not end the start within 5s")
	}
	want := `level=INFO msg="stopped while the WAL was opening (or waiting for its lock): it is left as it was, and a compaction begun is made again at the next start" signal=terminated`
	if !strings.Contains(logs.String(), want) {
		t.Errorf("log lacks %q:\n%s", want, logs)
	}

	w, stopped, err := openUnlessStopped(log, func() (*wal.WAL, error) { return wal.Open(t.TempDir(), wal.Options{}) })
	if stopped || err != nil || w == nil {
		t.Fatalf("open without a signal: stopped %v, error %v", stopped, err)
	}
	w.Close()
}

// TestRunWarnsAboutARenamedSink: a sink renamed between two runs starts over from the oldest
// record in the WAL (a new cursor); the start says so, naming the old cursor whose
// partitioning it has, and how to go on where it was.
func TestRunWarnsAboutARenamedSink(t *testing.T) {
	t.Parallel()
	path, dataDir := writeConfig(t, shortShutdownYAML, inputsYAML, adminYAML, sinkYAML)
	runUntilTheSinkRuns(t, path, dataDir)
	if log := startStop(t, path, dataDir, syscall.SIGTERM, 5*time.Second); strings.Contains(log, "is new, and the cursor") {
		t.Fatalf("a restart as it was warned:\n%s", log)
	}
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(string(text), "name: archive", "name: archive-2", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	log := startStop(t, path, dataDir, syscall.SIGTERM, 5*time.Second)
	want := `level=WARN msg="sink \"archive-2\" is new, and the cursor \"archive\", of a sink no longer configured, has its key or stream names: if the sink was renamed, it starts over from the oldest record in the WAL`
	if !strings.Contains(log, want) || !regexp.MustCompile(`give it back the name \\"archive\\" to go on where it was" sink=archive-2 cursor=archive position=[0-9]+\n`).MatchString(log) {
		t.Errorf("log lacks the warning %q:\n%s", want, log)
	}
}

func TestRunJSONLog(t *testing.T) {
	t.Parallel()
	path, dataDir := writeConfig(t, "log: {level: debug, format: json}\n", shortShutdownYAML, inputsYAML, adminYAML)
	s := startService(t, path)
	s.waitFor(`"msg":"started"`, filepath.Join(dataDir, wal.FileName))
	s.signal(syscall.SIGTERM)
	if code := s.wait(5 * time.Second); code != exitOK {
		t.Fatalf("exit status %d, want 0; stderr:\n%s", code, s.stderr.String())
	}
	if !strings.Contains(s.stderr.String(), `"level":"INFO","msg":"shutting down"`) {
		t.Errorf("no JSON shutdown line:\n%s", s.stderr.String())
	}
	// Durations as text, not integers of nanoseconds.
	if !regexp.MustCompile(`"shutdown_timeout":"[0-9.]+m?s"`).MatchString(s.stderr.String()) {
		t.Errorf("shutdown_timeout is not written as a duration:\n%s", s.stderr.String())
	}
}

func TestRunSyncIntervalWarns(t *testing.T) {
	t.Parallel()
	path, dataDir := writeConfig(t, "wal: {sync: interval}\n", shortShutdownYAML, inputsYAML, adminYAML, sinkYAML)
	log := startStop(t, path, dataDir, syscall.SIGTERM, 5*time.Second)
	want := "level=WARN msg=\"wal.sync is interval: records are acknowledged before they are fsynced, so a crash or a power loss can lose acknowledged records (up to about one second of them)"
	if n := strings.Count(log, want); n != 1 {
		t.Errorf("the loss warning appears %d times, want once:\n%s", n, log)
	}
}

func TestRunWarnsAboutUnconfiguredCursor(t *testing.T) {
	t.Parallel()
	path, dataDir := writeConfig(t, shortShutdownYAML, inputsYAML, adminYAML, sinkYAML)
	fillWAL(t, dataDir, "archive", "old")
	log := startStop(t, path, dataDir, syscall.SIGTERM, 5*time.Second)
	for _, want := range []string{
		"msg=\"wal opened\" path=" + filepath.Join(dataDir, wal.FileName) + " records=3",
		"first_seq=1 next_seq=4 cursors=2",
		`level=WARN msg="wal cursor \"old\" belongs to no configured sink and pins retention`,
		"forwarder wal drop-cursor old -c " + path + `" cursor=old position=0 records_behind=3`,
	} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	if strings.Contains(log, `cursor \"archive\"`) {
		t.Errorf("warned about the configured sink's cursor:\n%s", log)
	}
}

// wal.drop_cursors drops a removed sink's cursor at start (the way to do it on a
// StatefulSet, by a rollout), and passes over a name with no cursor.
func TestRunDropsCursorsAsConfigured(t *testing.T) {
	t.Parallel()
	path, dataDir := writeConfig(t, "wal: {drop_cursors: [old, gone]}\n", shortShutdownYAML, inputsYAML, adminYAML, sinkYAML)
	fillWAL(t, dataDir, "archive", "old")
	log := startStop(t, path, dataDir, syscall.SIGTERM, 5*time.Second)
	want := `level=INFO msg="dropped the cursor of a removed sink as wal.drop_cursors says: its records are no longer kept for it" cursor=old position=0 records_behind=3`
	if !strings.Contains(log, want) {
		t.Errorf("log lacks %q:\n%s", want, log)
	}
	if strings.Contains(log, "pins retention") || strings.Contains(log, "level=ERROR") {
		t.Errorf("warned about a dropped cursor, or failed:\n%s", log)
	}
	w, err := wal.Open(dataDir, wal.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, ok := w.Cursor("old"); ok {
		t.Error("the cursor is still in the WAL")
	}
	if _, ok := w.Cursor("archive"); !ok {
		t.Error("the configured sink's cursor is gone")
	}
}

// run waits for the WAL's lock another process holds (a wal command reading
// it), saying so, and starts once it is free.
func TestRunWALLocked(t *testing.T) {
	t.Parallel()
	path, dataDir := writeConfig(t, shortShutdownYAML, inputsYAML, adminYAML, sinkYAML)
	fillWAL(t, dataDir, "archive")
	w, err := wal.Open(dataDir, wal.Options{ReadOnly: true}) // as wal dump holds it
	if err != nil {
		t.Fatal(err)
	}
	svc := startService(t, path)
	svc.waitFor("the WAL is locked by another process: waiting for it", path)
	if strings.Contains(svc.stderr.String(), "msg=started") {
		t.Fatalf("started on a locked WAL:\n%s", svc.stderr.String())
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	svc.waitFor("msg=started", path)
	svc.signal(syscall.SIGTERM)
	if code := svc.wait(30 * time.Second); code != exitOK {
		t.Errorf("exit %d after the lock was freed:\n%s", code, svc.stderr.String())
	}
}

// The wait for the lock is bounded: a WAL another process keeps open fails
// the start, with the wait said, rather than hanging it.
func TestOpenWaitingForLock(t *testing.T) {
	_, dataDir := writeConfig(t)
	held, err := wal.Open(dataDir, wal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	defer func(d time.Duration) { walLockWait = d }(walLockWait)
	walLockWait = 1500 * time.Millisecond
	var logs syncBuffer
	cfg := config.Default()
	cfg.DataDir = dataDir
	began := time.Now()
	w, err := openWaitingForLock(cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if w != nil || !errors.Is(err, wal.ErrLocked) || time.Since(began) < walLockWait || time.Since(began) > walLockWait+5*time.Second {
		t.Errorf("open of a WAL held for good: %v after %s, want ErrLocked after about %s", err, time.Since(began), walLockWait)
	}
	if n := strings.Count(logs.String(), "the WAL is locked by another process: waiting for it"); n != 1 {
		t.Errorf("%d warnings, want one:\n%s", n, logs.String())
	}
}

func TestRunBadConfig(t *testing.T) {
	t.Parallel()
	path, _ := writeConfig(t, "wal: {when_full: drop}\n")
	r := forwarderCmd(t, "run", "-c", path)
	want := path + `:2: wal.when_full: "drop" is not one of block, drop_oldest`
	if r.code != exitFail || !strings.Contains(r.stderr, want) {
		t.Errorf("run with a bad config: exit %d, stderr %q; want exit 1 and %q", r.code, r.stderr, want)
	}
}

func TestWALCommandsWhileRunning(t *testing.T) {
	t.Parallel()
	admin := freeAddr(t)
	path, dataDir := writeConfig(t, shortShutdownYAML, inputsYAML, "admin: {listen: \""+admin+"\"}\n", sinkYAML)
	walPath := filepath.Join(dataDir, wal.FileName)
	s := startService(t, path)
	s.waitFor("msg=started", walPath)
	for _, sub := range []string{"verify", "dump"} {
		r := forwarderCmd(t, "wal", sub, "-c", path)
		want := "forwarder wal " + sub + ": " + walPath + " is in use by a running forwarder; stop it first, or read the live state from http://" + admin + "/status\n"
		if r.code != exitFail || r.stderr != want {
			t.Errorf("wal %s on a running service: exit %d, stderr %q; want exit 1 and %q", sub, r.code, r.stderr, want)
		}
	}
	// drop-cursor names what the running service can do instead.
	r := forwarderCmd(t, "wal", "drop-cursor", "old", "-c", path)
	if want := "forwarder wal drop-cursor: " + walPath + " is in use by a running forwarder; stop it first, or list the cursor under wal.drop_cursors in the configuration, which the service drops at its next start\n"; r.code != exitFail || r.stderr != want {
		t.Errorf("wal drop-cursor on a running service: exit %d, stderr %q; want exit 1 and %q", r.code, r.stderr, want)
	}
	// stats and dead-letters read a running service through its admin server.
	r = forwarderCmd(t, "wal", "stats", "-c", path)
	if r.code != exitOK || !strings.Contains(r.stdout, walPath) || !regexp.MustCompile(`\n  archive  [0-9]+ +0 `).MatchString(r.stdout) ||
		!strings.HasPrefix(r.stdout, "from the running service at http://"+admin+":\n") || !strings.Contains(r.stdout, "\ndisk free: ") {
		t.Errorf("wal stats on a running service: exit %d\nstdout:\n%s\nstderr %q", r.code, r.stdout, r.stderr)
	}
	r = forwarderCmd(t, "wal", "stats", "--json", "-c", path)
	var st walStats
	if err := json.Unmarshal([]byte(r.stdout), &st); r.code != exitOK || err != nil || st.Path != walPath || len(st.Cursors) != 1 || st.Cursors[0].Name != "archive" || !st.Cursors[0].Configured ||
		st.FromService != "http://"+admin || st.DiskFree <= 0 {
		t.Errorf("wal stats --json on a running service: exit %d, %v\nstdout:\n%s\nstderr %q", r.code, err, r.stdout, r.stderr)
	}
	r = forwarderCmd(t, "wal", "dead-letters", "-c", path)
	if r.code != exitOK || r.stdout != "" || r.stderr != "0 dead letters (from the running service)\n" {
		t.Errorf("wal dead-letters on a running service: exit %d\nstdout %q\nstderr %q", r.code, r.stdout, r.stderr)
	}
	// From this machine but without the token in data_dir (a mesh's
	// sidecar passing another pod's request looks local): refused.
	if fi, err := os.Stat(filepath.Join(dataDir, "admin.token")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the admin token file: %v, %v; want mode 0600", fi, err)
	}
	for _, auth := range []string{"", "Bearer wrong"} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+admin+"/dead-letters", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("/dead-letters with Authorization %q: %s, want 403", auth, resp.Status)
		}
	}
	r = forwarderCmd(t, "wal", "dead-letters", "--sink", "nope", "-c", path)
	if r.code != exitFail || !strings.Contains(r.stderr, `the WAL has no sink \"nope\"`) {
		t.Errorf("wal dead-letters of an unknown sink on a running service: exit %d, stderr %q", r.code, r.stderr)
	}
	s.signal(syscall.SIGTERM)
	if code := s.wait(5 * time.Second); code != exitOK {
		t.Fatalf("exit status %d, want 0; stderr:\n%s", code, s.stderr.String())
	}
	if r := forwarderCmd(t, "wal", "stats", "-c", path); r.code != exitOK {
		t.Errorf("wal stats after the service stopped: exit %d, stderr %q", r.code, r.stderr)
	}
}

// The wal commands read only data_dir, wal, admin and the sinks' names: a variable used
// elsewhere in the file that is unset where they run is no problem for them.
func TestWALCommandsNeedOnlyTheirKeys(t *testing.T) {
	t.Parallel()
	path, dataDir := writeConfig(t, "inputs:\n  forward: {listen: \"${env.FORWARD_LISTEN_UNSET}\"}\n", adminYAML, sinkYAML,
		"  - name: pods\n    type: cloudwatch\n    region: ${env.REGION_UNSET}\n    log_group: g\n    log_stream: s\n")
	fillWAL(t, dataDir, "archive", "pods")
	r := forwarderCmd(t, "wal", "stats", "-c", path)
	if r.code != exitOK || !strings.Contains(r.stdout, "  pods     0") {
		t.Errorf("wal stats with unset variables elsewhere: exit %d\nstdout:\n%s\nstderr %q", r.code, r.stdout, r.stderr)
	}
	if r := forwarderCmd(t, "check", "-c", path); r.code != exitFail || !strings.Contains(r.stderr, "environment variable FORWARD_LISTEN_UNSET is not set") {
		t.Errorf("check with unset variables: exit %d, stderr %q", r.code, r.stderr)
	}
	bad, _ := writeConfig(t, "wal: {max_bytes: \"${env.WAL_MAX_UNSET}\"}\n")
	if r := forwarderCmd(t, "wal", "stats", "-c", bad); r.code != exitFail || !strings.Contains(r.stderr, "environment variable WAL_MAX_UNSET is not set") {
		t.Errorf("wal stats with an unset variable in wal: exit %d, stderr %q", r.code, r.stderr)
	}
}

// freeAddr returns a loopback address with a port that was free a moment
// ago, and none it returned before: a port closed again may be handed out
// twice, and one configuration's listeners must differ.
func freeAddr(t *testing.T) string {
	t.Helper()
	for {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
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

// fillWAL creates the WAL in dataDir with three records, one of them not JSON, each in its
// own entry, and the given cursors; the first cursor is moved past record 1.
func fillWAL(t *testing.T, dataDir string, cursors ...string) {
	t.Helper()
	ctx := context.Background()
	w, err := wal.Open(dataDir, wal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}()
	for _, name := range cursors {
		if _, err := w.RegisterCursor(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range testRecords {
		if _, err := w.Append(ctx, []wal.Record{r}, wal.AppendOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if len(cursors) > 0 {
		var b wal.Batch
		b.SetCursor(cursors[0], 1)
		if err := w.Commit(ctx, &b); err != nil {
			t.Fatal(err)
		}
	}
}

var testRecords = []wal.Record{
	{Time: time.Date(2024, 1, 2, 3, 4, 5, 123456789, time.UTC).UnixNano(), Tag: "app.web", Body: []byte(`{"msg":"hello","n":1}`)},
	{Time: time.Date(2024, 1, 2, 3, 4, 6, 0, time.UTC).UnixNano(), Tag: "app.db", Body: []byte(`not json <&> "quoted"`)},
	{Time: time.Date(2024, 1, 2, 3, 4, 7, 500000000, time.UTC).UnixNano(), Tag: "pod.x", Body: []byte(`{"kubernetes":{"pod_name":"web-1"},"a":[1,2]}`)},
}

// The service takes records from a real forward client, acknowledges them once they are in
// the WAL, and they are there after it stops.
func TestRunAcceptsForwardRecords(t *testing.T) {
	t.Parallel()
	addr := nettest.ClosedAddr(t)
	inputs := "inputs:\n  forward: {listen: \"" + addr + "\"}\n"
	path, dataDir := writeConfig(t, shortShutdownYAML, inputs, adminYAML, sinkYAML)
	s := startService(t, path)
	s.waitFor("msg=started", filepath.Join(dataDir, wal.FileName))
	postForward(t, addr, "pod.web", 5)
	s.signal(syscall.SIGTERM)
	if code := s.wait(5 * time.Second); code != exitOK {
		t.Fatalf("exit status %d; stderr:\n%s", code, s.stderr.String())
	}
	r := forwarderCmd(t, "wal", "dump", "-c", path)
	if r.code != exitOK || strings.Count(r.stdout, `"tag":"pod.web"`) != 5 || !strings.Contains(r.stdout, `"body":{"i":4}`) {
		t.Fatalf("dump: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// Under systemd (Type=notify) the service says READY=1 once it listens, pings the
// watchdog, and says STOPPING=1 when it begins to stop, asking for shutdown_timeout (5 s
// here) and 15 s more before systemd's SIGKILL.
func TestRunNotifiesSystemd(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	got := make(chan string, 100)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, _, err := conn.ReadFromUnix(buf)
			if err != nil {
				close(got)
				return
			}
			got <- string(buf[:n])
		}
	}()
	path, dataDir := writeConfig(t, shortShutdownYAML, inputsYAML, adminYAML)
	s := startService(t, path, "NOTIFY_SOCKET="+sock, "WATCHDOG_USEC=200000")
	s.waitFor("msg=started", filepath.Join(dataDir, wal.FileName))
	want := []string{"READY=1", "WATCHDOG=1"}
	deadline := time.After(10 * time.Second)
	for len(want) > 0 {
		select {
		case m := <-got:
			if strings.Contains(m, want[0]) {
				want = want[1:]
			}
		case <-deadline:
			t.Fatalf("never got %q; stderr:\n%s", want[0], s.stderr.String())
		}
	}
	s.signal(syscall.SIGTERM)
	stopping := ""
	for stopping == "" {
		select {
		case m := <-got:
			if strings.Contains(m, "STOPPING=1") {
				stopping = m
			}
		case <-deadline:
			t.Fatal("never got STOPPING=1")
		}
	}
	if !strings.Contains(stopping, "EXTEND_TIMEOUT_USEC=20000000") {
		t.Errorf("STOPPING=1 without the time the stop may take: %q", stopping)
	}
	if code := s.wait(10 * time.Second); code != exitOK {
		t.Fatalf("exit %d", code)
	}
}

// memory_limit sets the runtime's soft limit (seen in /metrics) and sizes the sinks'
// shares; an S3 sink without staging (staging_max_bytes: 0) whose share likely cannot
// hold an object of max_object_bytes (compressed fourfold, or not at all with
// compression: none) says so at start, with the memory_limit that would. A staging sink
// holds its open objects on disk, and says nothing.
func TestRunMemoryLimit(t *testing.T) {
	t.Parallel()
	cwYAML := `  - name: logs
    type: cloudwatch
    region: us-east-1
    endpoint: "http://127.0.0.1:1"
    log_group: g
    log_stream: s
`
	notice := "msg=\"objects are held compressed until uploaded and the largest is finished early once half the sink's memory share is held: objects may stay below max_object_bytes; raise memory_limit for larger ones\" sink=archive"
	for _, c := range []struct {
		memory string
		sink   string // added to the S3 sink
		limit  string // go_gc_gomemlimit_bytes
		logged string // "": no notice
	}{
		{"", "", "1.34217728e+08", ""},
		{"memory_limit: 64MiB\n", "    staging_max_bytes: 0\n", "6.7108864e+07", notice + " memory_share=16MiB compression=gzip max_object_bytes=64MiB memory_limit_for_max_object_bytes=128MiB"},
		{"", "    compression: none\n    staging_max_bytes: 0\n", "1.34217728e+08", notice + " memory_share=32MiB compression=none max_object_bytes=64MiB memory_limit_for_max_object_bytes=512MiB"},
		{"memory_limit: 64MiB\n", "    compression: none\n", "6.7108864e+07", ""},
	} {
		adminAddr := freePort(t)
		path, dataDir := writeConfig(t, c.memory, shortShutdownYAML, inputsYAML, fmt.Sprintf("admin: {listen: %q}\n", adminAddr), sinkYAML+c.sink, cwYAML)
		s := startService(t, path, "AWS_ACCESS_KEY_ID=AKIDTEST", "AWS_SECRET_ACCESS_KEY=secret", "AWS_EC2_METADATA_DISABLED=true")
		s.waitFor("msg=started", filepath.Join(dataDir, wal.FileName))
		res, err := http.Get("http://" + adminAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if want := "\ngo_gc_gomemlimit_bytes " + c.limit + "\n"; !strings.Contains(string(body), want) {
			t.Errorf("%q: /metrics lacks %q", c.memory, strings.TrimSpace(want))
		}
		s.signal(syscall.SIGTERM)
		if code := s.wait(10 * time.Second); code != exitOK {
			t.Fatalf("exit status %d; stderr:\n%s", code, s.stderr.String())
		}
		log := s.stderr.String()
		if c.logged != "" && !strings.Contains(log, c.logged) {
			t.Errorf("%q: log lacks %q:\n%s", c.memory, c.logged, log)
		}
		if c.logged == "" && strings.Contains(log, notice) {
			t.Errorf("%q: the object size notice with enough memory:\n%s", c.memory, log)
		}
		staging := filepath.Join(dataDir, "s3-staging", "archive")
		if _, err := os.Stat(staging); (err == nil) == strings.Contains(c.sink, "staging_max_bytes: 0") {
			t.Errorf("%q %q: staging directory %s: %v", c.memory, c.sink, staging, err)
		}
	}
}

// An S3 key without ${hostname} or ${uuid} is warned about at start, as check does.
func TestRunWarnsAboutKeysReplicasShare(t *testing.T) {
	t.Parallel()
	path, dataDir := writeConfig(t, shortShutdownYAML, inputsYAML, adminYAML, sinkYAML, "    key: \"logs/${tag}/${seq}.json.gz\"\n")
	log := startStop(t, path, dataDir, syscall.SIGTERM, 10*time.Second)
	const warn = `level=WARN msg="sinks[archive].key has neither ${hostname} nor ${uuid}, so its keys are this forwarder's alone only while no other forwarder writes to bucket test-bucket: `
	if !strings.Contains(log, warn) || !strings.Contains(log, "put ${hostname} in the key\" sink=archive") {
		t.Errorf("no warning about the key:\n%s", log)
	}
}

// An input on an address other machines can reach is warned about at start when it
// takes records without authentication, and when it has no TLS (whatever authenticates
// its clients, records and secrets cross the network in clear); on loopback it is not.
// So are Go's profiles on an admin listener other machines can reach.
func TestRunWarnsAboutOpenInputs(t *testing.T) {
	t.Parallel()
	const forwardWarn = `level=WARN msg="the forward input accepts records from anyone who can reach it`
	const httpWarn = `level=WARN msg="the HTTP input accepts records from anyone who can reach it`
	const forwardTLSWarn = `level=WARN msg="the forward input has no TLS: records`
	const httpTLSWarn = `level=WARN msg="the HTTP input has no TLS: records and the bearer token`
	const pprofWarn = `level=WARN msg="admin.pprof serves Go's profiles to anyone who can reach the admin listener`
	const loopbackInputs = "inputs:\n  forward: {listen: \"127.0.0.1:0\"}\n  http: {listen: \"[::1]:0\"}\n"
	cert, key := selfSignedFiles(t)
	tls := fmt.Sprintf("{cert_file: %q, key_file: %q}", cert, key)
	for _, c := range []struct {
		name, inputs, admin            string
		warned, tlsWarned, pprofWarned bool
	}{
		{"open", "inputs:\n  forward: {listen: \"0.0.0.0:0\"}\n  http: {listen: \"0.0.0.0:0\"}\n", adminYAML, true, true, false},
		{"authenticated in clear", "inputs:\n  forward: {listen: \"0.0.0.0:0\", shared_key: k}\n  http: {listen: \"0.0.0.0:0\", token: t}\n", adminYAML, false, true, false},
		{"authenticated with TLS", "inputs:\n  forward: {listen: \"0.0.0.0:0\", shared_key: k, tls: " + tls + "}\n  http: {listen: \"0.0.0.0:0\", token: t, tls: " + tls + "}\n", adminYAML, false, false, false},
		{"loopback", loopbackInputs, adminYAML, false, false, false},
		{"open pprof", loopbackInputs, "admin: {listen: \"0.0.0.0:0\", pprof: true}\n", false, false, true},
		{"loopback pprof", loopbackInputs, "admin: {listen: \"127.0.0.1:0\", pprof: true}\n", false, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			path, dataDir := writeConfig(t, shortShutdownYAML, c.inputs, c.admin)
			log := startStop(t, path, dataDir, syscall.SIGTERM, 10*time.Second)
			for _, w := range []string{forwardWarn, httpWarn} {
				if got := strings.Contains(log, w); got != c.warned {
					t.Errorf("warning %q logged: %v, want %v:\n%s", w, got, c.warned, log)
				}
			}
			for _, w := range []string{forwardTLSWarn, httpTLSWarn} {
				if got := strings.Contains(log, w); got != c.tlsWarned {
					t.Errorf("warning %q logged: %v, want %v:\n%s", w, got, c.tlsWarned, log)
				}
			}
			if got := strings.Contains(log, pprofWarn); got != c.pprofWarned {
				t.Errorf("warning %q logged: %v, want %v:\n%s", pprofWarn, got, c.pprofWarned, log)
			}
		})
	}
}

// What S3 sinks staged in an earlier run is removed at start when the sink no longer
// stages (staging_max_bytes: 0) or is no longer configured, each said in the log; a
// sink that stages removes its own leftovers and keeps its directory.
func TestRunRemovesStaleStaging(t *testing.T) {
	t.Parallel()
	keptYAML := `  - name: kept
    type: s3
    bucket: test-bucket
    region: us-east-1
    endpoint: "http://127.0.0.1:1"
    path_style: true
    key: "k/${hostname}/${tag}/${seq}.json.gz"
`
	path, dataDir := writeConfig(t, shortShutdownYAML, inputsYAML, adminYAML, sinkYAML+"    staging_max_bytes: 0\n", keptYAML)
	sizes := map[string]int{"archive": 1000, "gone": 2000, "kept": 3000}
	for name, size := range sizes {
		dir := filepath.Join(dataDir, "s3-staging", name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "0123456789abcdef"), make([]byte, size), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s := startService(t, path, "AWS_ACCESS_KEY_ID=AKIDTEST", "AWS_SECRET_ACCESS_KEY=secret", "AWS_EC2_METADATA_DISABLED=true")
	s.waitFor("msg=started", filepath.Join(dataDir, wal.FileName))
	// The staging sink removes its leftovers as its drainer starts, after
	// the service has: a stop before that leaves them to the next start.
	s.waitForLine(func(l string) bool { return strings.Contains(l, "removed the staged objects a previous run left") })
	s.signal(syscall.SIGTERM)
	if code := s.wait(10 * time.Second); code != exitOK {
		t.Fatalf("exit status %d; stderr:\n%s", code, s.stderr.String())
	}
	log := s.stderr.String()
	for _, c := range []struct{ name, reason string }{
		{"archive", "staging_max_bytes is 0 now"},
		{"gone", "no S3 sink of that name is configured"},
	} {
		dir := filepath.Join(dataDir, "s3-staging", c.name)
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("%s is still there (%v)", dir, err)
		}
		re := regexp.MustCompile(fmt.Sprintf(`msg="removed what an S3 sink staged in an earlier run" dir=%s reason="%s[^"]*" files=1 bytes=%d\n`,
			regexp.QuoteMeta(dir), regexp.QuoteMeta(c.reason), sizes[c.name]))
		if !re.MatchString(log) {
			t.Errorf("log lacks %s:\n%s", re, log)
		}
	}
	// The sink that stages removed its own leftovers, and said so, keeping its directory.
	kept := filepath.Join(dataDir, "s3-staging", "kept")
	if want := fmt.Sprintf("dir=%s files=1", kept); !strings.Contains(log, "removed the staged objects a previous run left") || !strings.Contains(log, want) {
		t.Errorf("log lacks the staging sink's own removal (%s):\n%s", want, log)
	}
	if strings.Contains(log, "removed what an S3 sink staged in an earlier run\" dir="+kept) {
		t.Errorf("the staging sink's directory was removed at start:\n%s", log)
	}
	ents, err := os.ReadDir(kept)
	if err != nil || len(ents) != 0 {
		t.Errorf("the staging sink's directory: %v, %d entries left, want it empty", err, len(ents))
	}
}

// runUntilTheSinkRuns runs the service of the configuration at path until
// its one sink runs (it has stored its partitioning), and stops it.
func runUntilTheSinkRuns(t *testing.T, path, dataDir string) {
	t.Helper()
	if log := runUntilRunning(t, path, dataDir); strings.Contains(log, "is new, and the cursor") || strings.Contains(log, "before this start: of type") {
		t.Fatalf("first run warned:\n%s", log)
	}
}

// runUntilRunning runs the service until its one sink runs (it has stored
// its partitioning and fingerprint), stops it and returns its log.
func runUntilRunning(t *testing.T, path, dataDir string) string {
	t.Helper()
	s := startService(t, path)
	s.waitFor(`msg="admin listening"`, filepath.Join(dataDir, wal.FileName))
	admin := regexp.MustCompile(`msg="admin listening" address=(\S+)`).FindStringSubmatch(s.stderr.String())
	if admin == nil {
		t.Fatalf("no admin address:\n%s", s.stderr.String())
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var st struct {
			Sinks []struct {
				State string `json:"state"`
			} `json:"sinks"`
		}
		if res, err := http.Get("http://" + admin[1] + "/status"); err == nil {
			json.NewDecoder(res.Body).Decode(&st)
			res.Body.Close()
		}
		if len(st.Sinks) == 1 && st.Sinks[0].State != "starting" && st.Sinks[0].State != "recovering" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sink does not run after 10s: %+v", st)
		}
	}
	s.signal(syscall.SIGTERM)
	if code := s.wait(5 * time.Second); code != exitOK {
		t.Fatalf("exit %d:\n%s", code, s.stderr.String())
	}
	return s.stderr.String()
}

// TestRunWarnsAboutASinkOfAnotherType: a sink whose type changed under its
// name is warned about at start (it goes on from the cursor the other
// type's sink left), and what that sink left interrupted is given up, not
// kept to be taken for damaged work later.
func TestRunWarnsAboutASinkOfAnotherType(t *testing.T) {
	t.Parallel()
	path, dataDir := writeConfig(t, shortShutdownYAML, inputsYAML, adminYAML, sinkYAML)
	runUntilTheSinkRuns(t, path, dataDir)
	// An upload the S3 sink left interrupted (its intent).
	w, err := wal.Open(dataDir, wal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var b wal.Batch
	b.Put("archive", []byte("s/"+s3sink.IntentPrefix+"logs/x.json.gz"), []byte(`{"v":1}`))
	if err := w.Commit(context.Background(), &b); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	cw := `sinks:
  - name: archive
    type: cloudwatch
    region: us-east-1
    endpoint: "http://127.0.0.1:1"
    log_group: g
    log_stream: "s-${hostname}"
`
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(string(text), sinkYAML, cw, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	// Until the sink runs: it has stored its fingerprint, which the next
	// start reads.
	log := runUntilRunning(t, path, dataDir)
	want := `level=WARN msg="sink \"archive\" was of type s3 before this start: of type cloudwatch now, it goes on from the cursor the s3 sink left`
	if !strings.Contains(log, want) || !strings.Contains(log, "given_up=1") {
		t.Errorf("log lacks the warning %q with given_up=1:\n%s", want, log)
	}
	if w, err = wal.Open(dataDir, wal.Options{ReadOnly: true}); err != nil {
		t.Fatal(err)
	}
	left := 0
	w.ScanState("archive", []byte("s/"+s3sink.IntentPrefix), func(k, v []byte) error { left++; return nil })
	w.Close()
	if left != 0 {
		t.Errorf("%d intents of the S3 sink left", left)
	}
	// Started again as it is now: no warning.
	if log := startStop(t, path, dataDir, syscall.SIGTERM, 5*time.Second); strings.Contains(log, "before this start: of type") {
		t.Errorf("warned again at the next start:\n%s", log)
	}
}

// A file system smaller than wal.max_bytes needs gets a warning at start:
// the disk would fill first, and appends wait for wal.min_free_bytes
// however little the WAL holds.
func TestLogWALStateWarnsOfASmallVolume(t *testing.T) {
	cfg := &config.Config{}
	cfg.WAL.MaxBytes, cfg.WAL.MinFreeBytes = 1<<30, 64<<20
	cfg.Sinks = []config.Sink{{Name: "archive", Type: config.SinkS3, S3: &config.S3{StagingMaxBytes: 128 << 20}}}
	// Staging stops short of twice wal.min_free_bytes: a volume of
	// this size stages up to staging_max_bytes.
	need := int64(1<<30 + 1<<28 + 2*64<<20 + 128<<20)
	if got := walDiskNeed(cfg); got != need {
		t.Fatalf("walDiskNeed %d, want %d", got, need)
	}
	cfg.Sinks[0].S3.StagingMaxBytes = 0
	if got, want := walDiskNeed(cfg), int64(1<<30+1<<28+64<<20); got != want {
		t.Fatalf("walDiskNeed without staging %d, want %d", got, want)
	}
	cfg.Sinks[0].S3.StagingMaxBytes = 128 << 20
	old := fsSize
	defer func() { fsSize = old }()
	for _, size := range []int64{100 << 20, need - 1, need} {
		fsSize = func(string) (int64, bool) { return size, true }
		var logs syncBuffer
		logWALState(slog.New(slog.NewTextHandler(&logs, nil)), wal.Stats{Path: "/data/wal.db", DiskFreeBytes: -1}, cfg, "c.yaml")
		warned := strings.Contains(logs.String(), "smaller than wal.max_bytes needs")
		if warned != (size < need) {
			t.Errorf("file system of %d bytes, %d needed: warned %v\n%s", size, need, warned, logs.String())
		}
	}

	// Large enough, but holding other data (a root file system): the room is what is
	// free, with what the WAL file and S3 staging take.
	fsSize = func(string) (int64, bool) { return 4 * need, true }
	cfg.DataDir = t.TempDir()
	staged := filepath.Join(cfg.DataDir, stagingDirName, "archive")
	if err := os.MkdirAll(staged, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(staged, "obj"), make([]byte, 1000), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, free := range []int64{1 << 30, need - 1<<20 - 1000 - 1, need - 1<<20 - 1000, -1} {
		var logs syncBuffer
		logWALState(slog.New(slog.NewTextHandler(&logs, nil)), wal.Stats{Path: "/data/wal.db", DiskFreeBytes: free, FileBytes: 1 << 20}, cfg, "c.yaml")
		warned := strings.Contains(logs.String(), "the WAL's file system holds other data")
		if want := free >= 0 && free+1<<20+1000 < need; warned != want {
			t.Errorf("%d bytes free, a WAL file of 1 MiB, 1000 staged, %d needed: warned %v\n%s", free, need, warned, logs.String())
		}
	}
}

// A WAL on a network or FUSE file system gets a warning at start: the lock and the
// fsyncs are that file system's.
func TestLogWALStateWarnsOfANetworkFileSystem(t *testing.T) {
	old := fsNetwork
	defer func() { fsNetwork = old }()
	for _, kind := range []string{"", "nfs"} {
		fsNetwork = func(string) string { return kind }
		var logs syncBuffer
		logWALState(slog.New(slog.NewTextHandler(&logs, nil)), wal.Stats{Path: "/data/wal.db", DiskFreeBytes: -1}, config.Default(), "c.yaml")
		warned := strings.Contains(logs.String(), `the WAL is on a network or FUSE file system`) && strings.Contains(logs.String(), "file_system="+kind)
		if warned != (kind != "") {
			t.Errorf("file system %q: warned %v\n%s", kind, warned, logs.String())
		}
	}
}

// postForward sends n records {"i": 0..n-1} of tag to the forward input at addr with a real
// forward client, each acknowledged.
func postForward(t *testing.T, addr, tag string, n int) {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	logger, err := fluent.New(fluent.Config{FluentHost: host, FluentPort: p, RequestAck: true, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer logger.Close()
	for i := range n {
		if err := logger.Post(tag, map[string]any{"i": i}); err != nil {
			t.Fatalf("post %d: %v", i, err)
		}
	}
}

// The WAL knows the configured sinks, whose cursors their deliveries move (the
// max_bytes warning and the early cuts of a full WAL tell them from a removed sink's);
// none configured is known as none, not as unknown.
func TestWALOptionsNameTheSinks(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.DiscardHandler)
	cfg := &config.Config{Sinks: []config.Sink{{Name: "archive", Type: config.SinkS3}, {Name: "cw", Type: config.SinkCloudWatch}}}
	if got := walOptions(cfg, log).Sinks; !slices.Equal(got, []string{"archive", "cw"}) {
		t.Errorf("Sinks %q, want archive and cw", got)
	}
	if got := walOptions(&config.Config{}, log).Sinks; got == nil || len(got) != 0 {
		t.Errorf("no sinks configured: Sinks %#v, want empty, not nil", got)
	}
}
