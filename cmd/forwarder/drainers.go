package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/queue"
	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/sinks/cloudwatch"
	s3sink "github.com/logfwd/forwarder/sinks/s3sink"
	"github.com/logfwd/forwarder/wal"
)

// fingerprint identifies how a sink partitions records on this host: its delivered marks
// are only valid while it stays the same. A sink that knows which of its settings name
// partitions says so; otherwise the whole configuration counts.
func fingerprint(s config.Sink, dest sinks.Sink) string {
	if f, ok := dest.(interface{ Fingerprint() string }); ok {
		return f.Fingerprint()
	}
	b, _ := json.Marshal(struct {
		Sink config.Sink
		Host string
	}{s, hostname()})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// hostname is what ${hostname} renders: this machine's name.
func hostname() string {
	h, err := os.Hostname()
	if err != nil {
		return "localhost"
	}
	return h
}

// sinkDeps is what building a sink's destination needs besides its configuration.
type sinkDeps struct {
	hostname string
	log      *slog.Logger
	reg      prometheus.Registerer
	dataDir  string
	minFree  int64 // wal.min_free_bytes
}

// sinkBuilders make a sink's destination from its configuration, by sink type.
var sinkBuilders = map[string]func(ctx context.Context, s config.Sink, d sinkDeps) (sinks.Sink, error){
	config.SinkCloudWatch: func(ctx context.Context, s config.Sink, d sinkDeps) (sinks.Sink, error) {
		return cloudwatch.New(ctx, s.Name, *s.CloudWatch, cloudwatch.Options{Hostname: d.hostname, Logger: d.log, Registerer: d.reg,
			SharedStreams: !perReplicaStreams(s.CloudWatch)})
	},
	config.SinkS3: func(ctx context.Context, s config.Sink, d sinkDeps) (sinks.Sink, error) {
		return s3sink.New(ctx, s.Name, *s.S3, s3sink.Options{Hostname: d.hostname, Logger: d.log, Registerer: d.reg,
			StagingDir: filepath.Join(d.dataDir, stagingDirName, s.Name), StagingMinFree: 2 * d.minFree, Match: s.Match})
	},
}

// drainerActors returns one actor per configured sink, each draining the WAL into its
// destination from the sink's own cursor.
func drainerActors(w *wal.WAL, cfg *config.Config, reg prometheus.Registerer, log *slog.Logger, stopBy func() time.Time) ([]actor, []*queue.Drainer, error) {
	metrics := queue.NewMetrics(reg)
	removeStaleStaging(cfg, log)
	var actors []actor
	var drainers []*queue.Drainer
	buffers := cfg.SinkBuffers()
	for _, s := range cfg.Sinks {
		build, ok := sinkBuilders[s.Type]
		if !ok {
			return nil, nil, fmt.Errorf("sink %q (line %d): no sink of type %q", s.Name, s.Line, s.Type)
		}
		dest, err := build(context.Background(), s, sinkDeps{hostname: hostname(), log: log, reg: reg, dataDir: cfg.DataDir, minFree: int64(cfg.WAL.MinFreeBytes)})
		if err != nil {
			return nil, nil, fmt.Errorf("sink %q (line %d): %w", s.Name, s.Line, err)
		}
		if s.S3 != nil && s.S3.StagingMaxBytes == 0 {
			objectMemoryNotice(log, cfg, s, buffers[s.Name])
		}
		renamedNotice(w, cfg, s, fingerprint(s, dest), log)
		typeChangedNotice(w, s, log)
		d := queue.New(w, s.Name, dest, queue.Options{
			MatchGlobs:       s.Match,
			Fingerprint:      fingerprint(s, dest),
			ShutdownTimeout:  sendTimeout(cfg),
			StopBy:           stopBy,
			MaxBufferedBytes: buffers[s.Name],
			Metrics:          metrics,
			Logger:           log,
		})
		actors = append(actors, actor{name: "sink " + s.Name, run: d.Run, team: "sinks"})
		drainers = append(drainers, d)
	}
	return actors, drainers, nil
}

// stagingDirName is the directory under data_dir where S3 sinks stage open
// objects, one directory per sink (see s3sink.Options.StagingDir).
const stagingDirName = "s3-staging"

// removeStaleStaging removes the staging directories (under
// <data_dir>/s3-staging) of S3 sinks that no longer stage: whose
// staging_max_bytes is 0 now, or that are no longer configured. Staged
// files hold the members of objects that were open when the last run
// stopped; their records are still in the WAL (a sink's cursor passes a
// record only once its object is uploaded), and a sink that stages removes
// its own leftovers before it starts (s3sink's Recover). Without this, what
// a sink staged before its staging was turned off would take disk for good.
// A directory that cannot be removed is warned about; the service starts.
func removeStaleStaging(cfg *config.Config, log *slog.Logger) {
	root := filepath.Join(cfg.DataDir, stagingDirName)
	ents, err := os.ReadDir(root)
	if err != nil {
		if !os.IsNotExist(err) {
			log.Warn("cannot read the S3 staging directory", "dir", root, "error", err)
		}
		return
	}
	stages := map[string]bool{}
	configured := map[string]bool{}
	for _, s := range cfg.Sinks {
		if s.S3 == nil {
			continue
		}
		configured[s.Name] = true
		if s.S3.StagingMaxBytes > 0 {
			stages[s.Name] = true
		}
	}
	for _, e := range ents {
		if stages[e.Name()] {
			continue
		}
		dir := filepath.Join(root, e.Name())
		files, bytes := 0, int64(0)
		_ = filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				files++
				if info, err := d.Info(); err == nil {
					bytes += info.Size()
				}
			}
			return nil
		})
		why := "staging_max_bytes is 0 now: the records of the objects it held open are read again from the WAL"
		if !configured[e.Name()] {
			why = "no S3 sink of that name is configured"
		}
		if err := os.RemoveAll(dir); err != nil {
			log.Warn("cannot remove what an S3 sink staged in an earlier run", "dir", dir, "reason", why, "error", err)
			continue
		}
		log.Info("removed what an S3 sink staged in an earlier run", "dir", dir, "reason", why, "files", files, "bytes", bytes)
	}
}

// objectMemoryNotice says at start when an S3 sink without staging
// (staging_max_bytes: 0) likely cannot hold an object of max_object_bytes
// in its memory share: an object is held compressed
// until it is uploaded (a carry), and the largest is finished early when
// half the share is held. It assumes logs compress at least fourfold with
// gzip or zstd.
func objectMemoryNotice(log *slog.Logger, cfg *config.Config, s config.Sink, share int) {
	ratio := int64(4)
	if s.S3.Compression == config.CompressionNone {
		ratio = 1
	}
	held := int64(s.S3.MaxObjectBytes) / ratio
	if held <= int64(share/2) {
		return
	}
	need := (int64(cfg.MemoryLimit)*2*held/int64(share) + int64(config.MiB) - 1) / int64(config.MiB)
	log.Info("objects are held compressed until uploaded and the largest is finished early once half the sink's memory share is held: objects may stay below max_object_bytes; raise memory_limit for larger ones",
		"sink", s.Name, "memory_share", config.Size(share), "compression", s.S3.Compression, "max_object_bytes", s.S3.MaxObjectBytes,
		"memory_limit_for_max_object_bytes", fmt.Sprintf("%dMiB", need))
}

// renamedNotice warns when sink s is new to the WAL (it has no cursor) and the cursor of a
// sink no longer configured stored the same fingerprint: most likely s was renamed, and a
// renamed sink starts over from the oldest record the WAL holds.
func renamedNotice(w *wal.WAL, cfg *config.Config, s config.Sink, fp string, log *slog.Logger) {
	st := w.Stats()
	if _, ok := st.Cursors[s.Name]; ok {
		return
	}
	for _, name := range slices.Sorted(maps.Keys(st.Cursors)) {
		if isSink(cfg, name) {
			continue
		}
		if stored, err := queue.StoredFingerprint(w, name); err != nil || string(stored) != fp {
			continue
		}
		log.Warn(fmt.Sprintf("sink %q is new, and the cursor %q, of a sink no longer configured, has its key or stream names: if the sink was renamed, it starts over from the oldest record in the WAL and sends again what it delivered under its old name (an S3 sink renders the old name's keys: an object built the same counts as delivered, and the first one cut otherwise pauses the sink); give it back the name %q to go on where it was", s.Name, name, name),
			"sink", s.Name, "cursor", name, "position", st.Cursors[name])
	}
}

// otherType is, by sink type, the other type: the prefix of its sink
// state's intents and what they are.
var otherType = map[string]struct{ name, prefix, what string }{
	config.SinkS3:         {config.SinkCloudWatch, cloudwatch.IntentPrefix, "PutLogEvents calls"},
	config.SinkCloudWatch: {config.SinkS3, s3sink.IntentPrefix, "uploads"},
}

// typeChangedNotice warns when sink s was of another type before this
// start (its stored fingerprint, or the other type's intents, say so): it
// goes on from the cursor the sink of the other type left, and what that
// one left interrupted (its intents), which s cannot finish, is given up:
// their records, after the cursor, s sends itself. Kept, they would be
// taken for damaged work if the type were changed back.
func typeChangedNotice(w *wal.WAL, s config.Sink, log *slog.Logger) {
	o, ok := otherType[s.Type]
	if !ok {
		return
	}
	was := ""
	if stored, err := queue.StoredFingerprint(w, s.Name); err == nil && len(stored) > 0 {
		was = config.SinkS3 // a SHA-256 in hex
		if strings.HasPrefix(string(stored), config.SinkCloudWatch+"\x00") {
			was = config.SinkCloudWatch
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := queue.ForgetSinkState(ctx, w, s.Name, []byte(o.prefix))
	if err != nil {
		log.Warn(fmt.Sprintf("could not give up the interrupted %s a sink of the same name and another type left", o.what), "sink", s.Name, "error", err)
	}
	if was != o.name && n == 0 {
		return
	}
	log.Warn(fmt.Sprintf("sink %q was of type %s before this start: of type %s now, it goes on from the cursor the %s sink left, so what that one delivered up to its cursor is not sent to the new destination, what its partitions delivered beyond it is (give the sink a new name to send it everything the WAL holds); %d interrupted %s of the %s sink are given up, their records sent by the %s sink",
		s.Name, o.name, s.Type, o.name, n, o.what, o.name, s.Type), "sink", s.Name, "given_up", n)
}
