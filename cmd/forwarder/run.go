package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/logfwd/forwarder/admin"
	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/inputs"
	"github.com/logfwd/forwarder/internal/diskfree"
	"github.com/logfwd/forwarder/internal/sdnotify"
	"github.com/logfwd/forwarder/queue"
	"github.com/logfwd/forwarder/wal"
)

const runUsage = `Usage: forwarder run [-c FILE]

Run the service. It logs to stderr. SIGTERM or SIGINT stops it within shutdown_timeout
(exit status 0; 1 if the shutdown took longer); a second signal stops it at once. A WAL
that can no longer guarantee durability (a failed fsync) stops it with exit status 1.
`

func cmdRun(args []string, stdout, stderr io.Writer) int {
	f := newFlagSet("run", runUsage)
	configPath := f.configFlag()
	pos, code, done := f.parse(args, stdout, stderr)
	if done {
		return code
	}
	if code, done := f.noArgs(pos, stderr); done {
		return code
	}
	cfg, ok := loadConfig("forwarder run", *configPath, journalErrors(stderr))
	if !ok {
		return exitFail
	}
	problems, awsWarnings, _ := awsSetup(context.Background(), cfg, *configPath)
	if len(problems) > 0 {
		printProblems(journalErrors(stderr), *configPath, problems)
		return exitFail
	}
	log := newLogger(cfg.Log, stderr)
	for _, w := range awsWarnings {
		w.log(log)
	}
	slog.SetDefault(log)
	return serve(cfg, *configPath, log, nil)
}

// running is what extra actors (forwarder dev's status line and demo) may look at.
type running struct {
	w        *wal.WAL
	drainers []*queue.Drainer
	pipeline *inputs.Pipeline
}

// serve runs the service until a signal or a failure stops it, and returns the exit status.
// extras, if set, adds actors that start after the inputs.
func serve(cfg *config.Config, configPath string, log *slog.Logger, extras func(*running) []actor) int {
	// A soft limit: the garbage collector works harder as the heap nears it, so that a
	// backlog or a burst does not double the memory the way the default pacing would.
	debug.SetMemoryLimit(int64(cfg.MemoryLimit))
	timeout := time.Duration(cfg.ShutdownTimeout)
	// Subscribed first, so that a signal during a long start (a WAL compaction) is a
	// clean stop once the group runs.
	signals, releaseSignals := signalsActor(log, timeout, cfg.WAL.Sync == config.SyncInterval)
	defer releaseSignals()
	w, stopped, err := openUnlessStopped(log, func() (*wal.WAL, error) { return openWaitingForLock(cfg, log) })
	if stopped {
		return exitOK
	}
	if err != nil {
		logOpenError(log, cfg, err)
		return exitFail
	}
	if cfg.WAL.Sync == config.SyncInterval {
		log.Warn("wal.sync is interval: records are acknowledged before they are fsynced, so a crash or a power loss can lose acknowledged records (up to about one second of them); set wal.sync: always to acknowledge only what is on disk")
	}
	if err := dropCursors(w, cfg, log); err != nil {
		log.Error("cannot drop the cursors wal.drop_cursors names", "error", err)
		w.Close()
		return exitFail
	}
	logWALState(log, w.Stats(), cfg, configPath)

	// Components start in this order and stop in the reverse one: the WAL is closed last.
	// The admin server joins here when it is built.
	g := &group{log: log, failed: reportFailure(log)}
	if cfg.WAL.Sync == config.SyncInterval {
		g.timeoutLoses = intervalLoss
	}
	g.add(walActor(w, func() bool { return !g.deadline().IsZero() }))
	g.add(leftoverActor(w, cfg, log))
	reg := prometheus.NewRegistry()
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "forwarder_build_info",
		Help: "1, labelled with the forwarder's version and the Go version it was built with."}, []string{"version", "goversion"})
	build.WithLabelValues(version, runtime.Version()).Set(1)
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), build,
		admin.NewWALCollector(w, int64(cfg.WAL.MaxBytes)).Configured(sinkNames(cfg)...))
	drainerList, drainers, err := drainerActors(w, cfg, reg, log, g.deadline)
	if err != nil {
		log.Error("cannot start the sinks", "error", err)
		w.Close()
		return exitFail
	}
	var listening atomic.Bool
	for _, w := range configWarnings(cfg) {
		w.log(log)
	}
	adm := admin.New(cfg.Admin.Listen, admin.Sources{WAL: w, MaxBytes: int64(cfg.WAL.MaxBytes), Drainers: drainers,
		Listening: listening.Load, Gatherer: reg, Version: currentVersion(), Pprof: cfg.Admin.Pprof,
		TokenFile: filepath.Join(cfg.DataDir, admin.TokenFileName)}, log)
	if err := adm.Start(); err != nil {
		log.Error("cannot start the admin server", "error", err)
		w.Close()
		return exitFail
	}
	g.add(actor{name: "admin", run: adm.Serve})
	for _, a := range drainerList {
		g.add(a)
	}
	if cfg.DrainOnShutdown {
		g.add(drainActor(drainers, timeout, sendTimeout(cfg), log))
	}
	ins, pipeline, err := inputActors(w, cfg, reg, log)
	if err != nil {
		log.Error("cannot start the inputs", "error", err)
		w.Close()
		return exitFail
	}
	for _, a := range ins {
		g.add(a)
	}
	listening.Store(true)
	if extras != nil {
		for _, a := range extras(&running{w: w, drainers: drainers, pipeline: pipeline}) {
			g.add(a)
		}
	}
	g.add(signals)
	g.add(actor{name: "readiness", run: func(ctx context.Context) error {
		<-ctx.Done() // the service is stopping: no longer ready
		listening.Store(false)
		return nil
	}})

	// Last added, first stopped: STOPPING=1 as the shutdown begins, asking for
	// shutdown_timeout and a margin for what follows the drain (closing the WAL).
	g.add(systemdActor(w, log, time.Duration(cfg.ShutdownTimeout)+15*time.Second))

	log.Info("started", "version", currentVersion(), "config", configPath, "pid", os.Getpid())
	if err := sdnotify.Ready(fmt.Sprintf("WAL %d records; %d sinks", w.Stats().Records, len(cfg.Sinks))); err != nil {
		log.Warn("cannot tell systemd that the service is ready; under Type=notify it stops the service when TimeoutStartSec passes", "error", err)
	}
	if g.run(context.Background(), timeout) {
		return exitFail
	}
	log.Info("stopped")
	return exitOK
}

// walOptions maps the wal section of the configuration to the WAL's
// options, with each sink's match globs (what drop_oldest counts it lost).
func walOptions(cfg *config.Config, log *slog.Logger) wal.Options {
	c := cfg.WAL
	o := wal.Options{
		MaxBytes:     int64(c.MaxBytes),
		WhenFull:     wal.Block,
		Sync:         wal.SyncAlways,
		DedupWindow:  time.Duration(c.DedupWindow),
		MinFreeBytes: int64(c.MinFreeBytes),
		Logger:       log,
		FirstSeq:     wal.NewFirstSeq(time.Now()),
		Sinks:        sinkNames(cfg),
	}
	if c.WhenFull == config.WhenFullDropOldest {
		o.WhenFull = wal.DropOldest
		o.CursorTags = map[string]func(string) bool{}
		for _, s := range cfg.Sinks {
			// A sink of every tag loses every record after its cursor: counted
			// without decoding what is dropped. (The wal tools' configuration
			// has no globs: nor do they append.)
			if len(s.Match) > 0 && !slices.Contains(s.Match, "**") {
				o.CursorTags[s.Name] = config.NewTagMatcher(s.Match).Match
			}
		}
	}
	if c.Sync == config.SyncInterval {
		o.Sync = wal.SyncInterval
	}
	return o
}

// walLockWait is how long run waits for the WAL's lock that another process holds.
var walLockWait = time.Minute

// openWaitingForLock opens the WAL, waiting up to walLockWait while another process
// holds its lock: a forwarder wal command reading it (a dump into a pager) would
// otherwise make every start fail at once, and a service manager give up restarting.
func openWaitingForLock(cfg *config.Config, log *slog.Logger) (*wal.WAL, error) {
	deadline := time.Now().Add(walLockWait)
	for logged := false; ; logged = true {
		w, err := wal.Open(cfg.DataDir, walOptions(cfg, log))
		if !errors.Is(err, wal.ErrLocked) || time.Now().After(deadline) {
			return w, err
		}
		if !logged {
			log.Warn("the WAL is locked by another process: waiting for it (a forwarder wal command reading it, such as wal dump, or another forwarder with this data_dir)",
				"path", filepath.Join(cfg.DataDir, wal.FileName), "wait_up_to", walLockWait)
		}
		time.Sleep(time.Second)
	}
}

// logOpenError says, on one line, why the WAL could not be opened.
func logOpenError(log *slog.Logger, cfg *config.Config, err error) {
	path := filepath.Join(cfg.DataDir, wal.FileName)
	var corrupt *wal.CorruptionError
	switch {
	case errors.Is(err, wal.ErrLocked):
		log.Error("the WAL is in use by another process: is another forwarder running with this data_dir, or a forwarder wal command still reading it?", "path", path, "waited", walLockWait)
	case errors.As(err, &corrupt):
		log.Error("the WAL file is damaged; the service does not start on a damaged WAL", "path", path, "error", err)
	case errors.Is(err, wal.ErrFormat):
		log.Error("the WAL file was written in a format this version does not read", "path", path, "error", err)
	default:
		log.Error("cannot open the WAL", "path", path, "error", err)
	}
}

// logWALState logs what the WAL holds at start, and a warning for each cursor of a sink
// that is no longer configured: such a cursor keeps every record it has not passed.
func logWALState(log *slog.Logger, st wal.Stats, cfg *config.Config, configPath string) {
	log.Info("wal opened", "path", st.Path, "records", st.Records, "bytes", st.Bytes,
		"max_bytes", cfg.WAL.MaxBytes, "first_seq", st.FirstSeq, "next_seq", st.NextSeq,
		"cursors", len(st.Cursors), "disk_free_bytes", st.DiskFreeBytes, "file_free_bytes", st.FileFreeBytes)
	if min := int64(cfg.WAL.MinFreeBytes); st.DiskFreeBytes >= 0 && st.DiskFreeBytes < min && st.FileFreeBytes < min {
		log.Warn("the WAL's disk has less free than wal.min_free_bytes: appends will wait, and the inputs push back on clients, until the sinks deliver what the WAL holds or space is freed on the file system",
			"path", st.Path, "disk_free_bytes", st.DiskFreeBytes, "file_free_bytes", st.FileFreeBytes, "min_free_bytes", cfg.WAL.MinFreeBytes)
	}
	if kind := fsNetwork(filepath.Dir(st.Path)); kind != "" {
		log.Warn("the WAL is on a network or FUSE file system: its lock (flock) may not keep a second forwarder on another machine out of the same file, and what an fsync makes durable is that file system's to say; give each forwarder a local volume of its own (Kubernetes: ReadWriteOnce, never shared)",
			"path", st.Path, "file_system", kind)
	}
	if size, ok := fsSize(filepath.Dir(st.Path)); ok {
		need := walDiskNeed(cfg)
		if size < need {
			log.Warn("the WAL's file system is smaller than wal.max_bytes needs: the disk fills before the WAL reaches max_bytes, and appends then wait for room (wal.min_free_bytes) however little the WAL holds; lower wal.max_bytes or grow the volume",
				"path", st.Path, "file_system_bytes", size, "needs_bytes", need, "max_bytes", cfg.WAL.MaxBytes, "min_free_bytes", cfg.WAL.MinFreeBytes)
		} else if room := st.DiskFreeBytes + st.FileBytes + dirBytes(filepath.Join(cfg.DataDir, stagingDirName)); st.DiskFreeBytes >= 0 && room < need {
			// Large enough, but shared: what else it holds (a root file system's
			// packages and journal) leaves the WAL less than it may take, and
			// those writers meet the full disk the WAL leaves at min_free_bytes.
			log.Warn("the WAL's file system holds other data: its free space, with what the WAL and S3 staging take now, is less than wal.max_bytes needs; in an outage the WAL fills it down to wal.min_free_bytes, and whatever else writes there (on a root file system: the journal, packages) then finds it full; lower wal.max_bytes to fit the room or give the WAL a file system of its own",
				"path", st.Path, "room_bytes", room, "needs_bytes", need, "disk_free_bytes", st.DiskFreeBytes, "wal_file_bytes", st.FileBytes,
				"max_bytes", cfg.WAL.MaxBytes, "min_free_bytes", cfg.WAL.MinFreeBytes)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(st.Cursors)) {
		if isSink(cfg, name) {
			continue
		}
		pos := st.Cursors[name]
		log.Warn(fmt.Sprintf("wal cursor %q belongs to no configured sink and pins retention: the records after it stay in the WAL until it is removed; if that sink is gone for good, add it to wal.drop_cursors (dropped at the next start), or stop the service and remove the cursor with: forwarder wal drop-cursor %s -c %s",
			name, shellQuote(name), shellQuote(configPath)),
			"cursor", name, "position", pos, "records_behind", lag(st, pos))
	}
}

// dirBytes is the size of the files under dir (0 when there is none).
func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

// fsNetwork names the file system holding a directory when it is a network or FUSE one
// (a variable for tests).
var fsNetwork = diskfree.Network

// fsSize is the size of the file system holding a directory (a variable
// for tests).
var fsSize = diskfree.Size

// walDiskNeed is the room the WAL's volume needs (README.md, Sizing): the
// file takes about 1.25 times the live records at wal.max_bytes, beside
// wal.min_free_bytes kept free and the S3 sinks' staging, which stops
// short of twice wal.min_free_bytes (the WAL's appends keep the room
// between).
func walDiskNeed(cfg *config.Config) int64 {
	need := int64(cfg.WAL.MaxBytes) + int64(cfg.WAL.MaxBytes)/4 + int64(cfg.WAL.MinFreeBytes)
	staged := false
	for _, s := range cfg.Sinks {
		if s.S3 != nil && s.S3.StagingMaxBytes > 0 {
			need += int64(s.S3.StagingMaxBytes)
			staged = true
		}
	}
	if staged {
		need += int64(cfg.WAL.MinFreeBytes)
	}
	return need
}

// dropCursors drops the cursors wal.drop_cursors names (validation keeps configured
// sinks out of it), each with a line saying what it held back. A name with no cursor was
// dropped at an earlier start, or is a typo: the warning about cursors of no sink that
// follows still names every cursor left.
func dropCursors(w *wal.WAL, cfg *config.Config, log *slog.Logger) error {
	for _, name := range cfg.WAL.DropCursors {
		st := w.Stats()
		pos, ok := st.Cursors[name]
		if !ok {
			log.Debug("wal.drop_cursors: no such cursor (dropped at an earlier start?)", "cursor", name)
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := w.DropCursor(ctx, name)
		cancel()
		if err != nil {
			return fmt.Errorf("cursor %q: %w", name, err)
		}
		log.Info("dropped the cursor of a removed sink as wal.drop_cursors says: its records are no longer kept for it", "cursor", name, "position", pos, "records_behind", lag(st, pos))
	}
	return nil
}

// lag is the number of live records after a cursor's position.
func lag(st wal.Stats, pos uint64) uint64 {
	from := max(pos+1, st.FirstSeq)
	if from >= st.NextSeq {
		return 0
	}
	return st.NextSeq - from
}

func isSink(cfg *config.Config, name string) bool {
	return slices.ContainsFunc(cfg.Sinks, func(s config.Sink) bool { return s.Name == name })
}

// sinkNames are the configured sinks' names.
func sinkNames(cfg *config.Config) []string {
	names := []string{} // not nil: none configured is known
	for _, s := range cfg.Sinks {
		names = append(names, s.Name)
	}
	return names
}

// openUnlessStopped opens the WAL with open; a SIGTERM or SIGINT before it returns (a
// compaction of a large file at start can take minutes) ends the start at once: stopped is
// set, and open is left to the process's exit. Nothing was acknowledged yet, and the WAL's
// file is as a kill at any moment leaves it: whole (a compaction replaces it only with its
// finished, fsynced copy).
func openUnlessStopped(log *slog.Logger, open func() (*wal.WAL, error)) (w *wal.WAL, stopped bool, err error) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	type opened struct {
		w   *wal.WAL
		err error
	}
	done := make(chan opened, 1)
	go func() {
		w, err := open()
		done <- opened{w, err}
	}()
	select {
	case o := <-done:
		return o.w, false, o.err
	case sig := <-sigs:
		log.Info("stopped while the WAL was opening (or waiting for its lock): it is left as it was, and a compaction begun is made again at the next start", "signal", sig.String())
		return nil, true, nil
	}
}
