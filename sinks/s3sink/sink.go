package s3sink

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/internal/awserr"
	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/template"
)

// Options are what a Sink needs besides its configuration.
type Options struct {
	// Hostname is what ${hostname} renders. Default: os.Hostname().
	Hostname string
	Logger   *slog.Logger
	// Registerer gets the sink's metrics; sinks share the vectors, labelled
	// by sink name. Nil: not registered.
	Registerer prometheus.Registerer
	// AWS, when set, replaces the standard chain (environment, shared
	// files, roles) as the source of credentials and settings: tests pass
	// static credentials. The sink's region, when set, wins.
	AWS *aws.Config
	// Client replaces the client New would build; the sink's endpoint,
	// path_style and region are then the client's business.
	Client *s3.Client
	// StagingDir is where open objects' members are staged, up to the
	// sink's staging_max_bytes: <data_dir>/s3-staging/<sink name>. Empty,
	// or staging_max_bytes 0: they are held in memory.
	StagingDir string
	// StagingMinFree is the space staging leaves free on its file system
	// (twice wal.min_free_bytes: the WAL's appends keep the room between,
	// its other commits the last of it). 0: no bound but staging_max_bytes.
	StagingMinFree int64
	// Match are the sink's match globs (the drainer applies them): each
	// intent keeps them, so that Recover rebuilds an object begun under
	// other globs than today's. Nil: intents do not keep them.
	Match []string
}

// s3API is the part of the S3 client the sink uses.
type s3API interface {
	PutObject(ctx context.Context, in *s3.PutObjectInput, opts ...func(*s3.Options)) (*s3.PutObjectOutput, error)
	CreateMultipartUpload(ctx context.Context, in *s3.CreateMultipartUploadInput, opts ...func(*s3.Options)) (*s3.CreateMultipartUploadOutput, error)
	UploadPart(ctx context.Context, in *s3.UploadPartInput, opts ...func(*s3.Options)) (*s3.UploadPartOutput, error)
	CompleteMultipartUpload(ctx context.Context, in *s3.CompleteMultipartUploadInput, opts ...func(*s3.Options)) (*s3.CompleteMultipartUploadOutput, error)
	AbortMultipartUpload(ctx context.Context, in *s3.AbortMultipartUploadInput, opts ...func(*s3.Options)) (*s3.AbortMultipartUploadOutput, error)
	ListMultipartUploads(ctx context.Context, in *s3.ListMultipartUploadsInput, opts ...func(*s3.Options)) (*s3.ListMultipartUploadsOutput, error)
	HeadObject(ctx context.Context, in *s3.HeadObjectInput, opts ...func(*s3.Options)) (*s3.HeadObjectOutput, error)
	GetObject(ctx context.Context, in *s3.GetObjectInput, opts ...func(*s3.Options)) (*s3.GetObjectOutput, error)
}

var _ s3API = (*s3.Client)(nil)

// Sink writes batches to S3 as JSON-lines objects under deterministic keys
// (see the package documentation). It implements sinks.Sink and
// sinks.Recoverer; its methods are safe for concurrent use.
type Sink struct {
	name     string
	cfg      config.S3
	bucket   string
	hostname string
	match    []string // Options.Match
	keys     *keyRenderer
	enc      *encoder
	api      s3API
	tr       *http.Transport // the transport New built, closed by Close; nil with Options.Client
	log      *slog.Logger
	m        *metrics
	// fallbacks warns of keys that rendered the fallback for a missing field.
	fallbacks *template.FallbackLog
	// keysChanged: keys whose values were shortened (keyRenderer.render).
	keysChanged *template.ChangedLog
	staging     *staging // nil: open objects are held in memory

	maxBytes    int
	memberBytes int // the largest batch: a member of an object (see openObject)
	threshold   int64
	partSize    int64 // smallest part of a multipart upload

	mu sync.Mutex
	// open holds the intent of each partition's batch whose send has begun
	// and not yet succeeded. A retry of the same batch reuses its ${uuid};
	// a different batch of the partition finds it stale (its records were
	// dropped from the WAL while it waited) and removes it.
	open map[string]*intent
	// taken, once set, is the refusal of a key that holds another
	// writer's object: every send fails with it until a restart, so that
	// the sink stays paused (one error line) instead of resuming whenever
	// another partition gets through. Keys unique to this forwarder need a
	// new key template, which needs a restart.
	taken error
}

var (
	_ sinks.Sink      = (*Sink)(nil)
	_ sinks.Recoverer = (*Sink)(nil)
)

const (
	minPartSize       = 5 << 20 // S3's smallest part but the last
	maxParts          = 10000   // S3's largest part number
	uploadConcurrency = 16
	// An object is built of about membersPerObject members, each of at most
	// maxMemberBytes of lines: the drainer holds a member's records until
	// they are compressed, then only the compressed bytes.
	membersPerObject = 8
	maxMemberBytes   = 8 << 20
)

// New returns the S3 sink called name (its name in the configuration, for
// metrics and messages). It reads no credentials yet: the first upload
// does. ctx bounds the loading of the AWS configuration.
func New(ctx context.Context, name string, cfg config.S3, opts Options) (*Sink, error) {
	if cfg.Bucket == "" {
		return nil, errors.New("bucket is required")
	}
	// Settings left zero take config's defaults (config.Load fills them;
	// a hand-built config.S3 gets them here).
	def := config.DefaultS3()
	if cfg.Compression == "" {
		cfg.Compression = def.Compression
	}
	if cfg.CompressionLevel == 0 && cfg.Compression != config.CompressionNone {
		cfg.CompressionLevel = def.CompressionLevel
	}
	if cfg.MaxObjectBytes <= 0 {
		cfg.MaxObjectBytes = def.MaxObjectBytes
	}
	if cfg.MaxObjectAge <= 0 {
		cfg.MaxObjectAge = def.MaxObjectAge
	}
	if cfg.MaxOpenObjects <= 0 {
		cfg.MaxOpenObjects = def.MaxOpenObjects
	}
	if cfg.MaxPartitions <= 0 {
		cfg.MaxPartitions = def.MaxPartitions
	}
	if cfg.MultipartThreshold <= 0 {
		cfg.MultipartThreshold = def.MultipartThreshold
	}
	if opts.Hostname == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("host name for ${hostname}: %w", err)
		}
		opts.Hostname = h
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	keys, err := newKeyRenderer(cfg.Key, opts.Hostname, keyRulesSanitised)
	if err != nil {
		return nil, err
	}
	enc, err := newEncoder(encoding{Compression: cfg.Compression, Level: cfg.CompressionLevel, TimeKey: cfg.TimeKey, TagKey: cfg.TagKey,
		OneStream: cfg.Compression == config.CompressionGzip})
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(opts.Registerer, name)
	if err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	s := &Sink{
		name: name, cfg: cfg, bucket: cfg.Bucket, hostname: opts.Hostname, match: opts.Match, keys: keys, enc: enc,
		fallbacks:   &template.FallbackLog{Log: opts.Logger.With("sink", name), What: "key"},
		keysChanged: &template.ChangedLog{Log: opts.Logger.With("sink", name), What: "key", T: keys.tmpl},
		log:         opts.Logger, m: m, open: map[string]*intent{},
		maxBytes: int(min(int64(cfg.MaxObjectBytes), 1<<40)), threshold: int64(cfg.MultipartThreshold), partSize: minPartSize,
	}
	s.memberBytes = min(max(s.maxBytes/membersPerObject, 1), maxMemberBytes)
	if opts.StagingDir != "" && cfg.StagingMaxBytes > 0 {
		if s.staging, err = newStaging(opts.StagingDir, int64(cfg.StagingMaxBytes), opts.StagingMinFree, opts.Logger.With("sink", name), m); err != nil {
			return nil, err
		}
	}
	if opts.Client != nil {
		s.api = opts.Client
		return s, nil
	}
	s.api, s.tr, err = newClient(ctx, cfg, opts.AWS, opts.Logger.With("sink", name))
	if err != nil {
		return nil, err
	}
	return s, nil
}

// newClient builds the S3 client: credentials and settings from the
// standard chain (or base), the sink's region, endpoint and addressing,
// and no retries of its own: the drainer retries, with backoff, across
// partitions.
func newClient(ctx context.Context, cfg config.S3, base *aws.Config, log *slog.Logger) (*s3.Client, *http.Transport, error) {
	var ac aws.Config
	if base != nil {
		ac = base.Copy()
	} else {
		opts := []func(*awsconfig.LoadOptions) error{awsconfig.WithLogger(awserr.Logger(log))}
		if cfg.Region != "" {
			opts = append(opts, awsconfig.WithRegion(cfg.Region))
		}
		var err error
		if ac, err = awsconfig.LoadDefaultConfig(ctx, opts...); err != nil {
			return nil, nil, fmt.Errorf("load AWS configuration: %w", err)
		}
	}
	if cfg.Region != "" {
		ac.Region = cfg.Region
	}
	if ac.Region == "" {
		return nil, nil, errors.New("no AWS region: set region in the sink, or AWS_REGION")
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 2 * uploadConcurrency
	tr.ResponseHeaderTimeout = 2 * time.Minute
	cl := s3.NewFromConfig(ac, func(o *s3.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
		o.UsePathStyle = cfg.PathStyle
		o.HTTPClient = &http.Client{Transport: tr}
		o.Retryer = retry.NewStandard(func(so *retry.StandardOptions) {
			so.MaxAttempts = 1
			so.RateLimiter = ratelimit.None
		})
		// The sink sends its own checksums (SHA-256 of an object, MD5 of
		// a part): the SDK need not add CRC32 ones.
		o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	})
	return cl, tr, nil
}

// Fingerprint identifies how the sink partitions records: its key
// template and host name, and nothing else (compression, limits or
// headers can change without it). It is meant for queue.Options.Fingerprint.
func (s *Sink) Fingerprint() string {
	sum := sha256.Sum256([]byte("s3 key\x00" + s.cfg.Key + "\x00" + s.hostname))
	return hex.EncodeToString(sum[:])
}

// partitioning is what Partitioning describes: the key template, the
// host name and the rules keys were rendered with.
type partitioning struct {
	Key      string `json:"key"`
	Hostname string `json:"hostname"`
	KeyRules int    `json:"key_rules"`
}

var _ sinks.Repartitioner = (*Sink)(nil)

// Partitioning describes how the sink partitions records (see
// sinks.Repartitioner).
func (s *Sink) Partitioning() []byte {
	b, _ := json.Marshal(partitioning{Key: s.cfg.Key, Hostname: s.hostname, KeyRules: keyRulesSanitised})
	return b
}

// Router routes records as a sink of partitioning desc did. The function
// it returns is for one goroutine at a time.
func (s *Sink) Router(desc []byte, st sinks.State) (func(*sinks.Record) string, error) {
	var p partitioning
	if err := json.Unmarshal(desc, &p); err != nil {
		return nil, fmt.Errorf("read the partitioning of an earlier configuration: %w", err)
	}
	if p.Key == "" {
		return nil, errors.New("the partitioning of an earlier configuration is not an S3 sink's (a sink of another type had the name)")
	}
	keys, err := newKeyRenderer(p.Key, p.Hostname, p.KeyRules)
	if err != nil {
		return nil, fmt.Errorf("the key of an earlier configuration: %w", err)
	}
	return func(r *sinks.Record) string { return routed(st, keys, r) }, nil
}

// Close releases the idle connections of the client New built.
func (s *Sink) Close() {
	if s.tr != nil {
		s.tr.CloseIdleConnections()
	}
}

// Limits: a batch is a member of an object (an eighth of
// max_object_bytes of lines before compression, at most 8 MiB); an object
// is carried from batch to batch until it holds max_object_bytes, until
// max_object_age, or until the drainer asks for it (memory,
// max_open_objects).
func (s *Sink) Limits() sinks.Limits {
	return sinks.Limits{
		MaxRecords:    1_000_000,
		MaxBytes:      s.memberBytes,
		MaxFinalBytes: s.maxBytes,
		MaxAge:        time.Duration(s.cfg.MaxObjectAge),
		Concurrency:   uploadConcurrency,
		MaxOpen:       s.cfg.MaxOpenObjects,
		MaxPartitions: s.cfg.MaxPartitions,
	}
}

// Partition is r's object key with markers for ${seq} and ${uuid}: records
// of one tag, time bucket (the key's %Y..%S) and rendered fields share it.
func (s *Sink) Partition(r *sinks.Record) string {
	p, notes := s.keys.partition(r)
	if notes&template.Missing != 0 {
		s.m.fallbacks.Inc()
		s.fallbacks.Note(s.keys.tmpl, &template.Data{Tag: r.Tag, Body: r.Body, Time: time.Unix(0, r.Time)}, fallback)
	}
	if notes&(template.Sanitised|template.Shortened) != 0 {
		s.m.sanitised.Inc()
	}
	if notes&template.Shortened != 0 {
		var rendered []byte // only for a line that is due
		var shown string
		if s.keysChanged.Due() {
			rendered, shown = []byte("(values too long for the key)"), objectKey(p, 0, "${uuid}")
		}
		s.keysChanged.Note(r.Tag, rendered, shown, "values too long for S3's 1,024 bytes are shortened (cut, with a hash of the whole value); ${seq} shown as zeros")
	}
	return p
}

// Size is the length of r's JSON line with its newline, before
// compression.
func (s *Sink) Size(r *sinks.Record) int { return s.enc.size(r) }

// Send compresses a batch as a member of its partition's object. Unless
// the batch is final, the object is full (max_object_bytes) or staging has
// no room for the member, it stages the member (see staging) and hands the
// object back to be carried (sinks.Outcome.Carry). Otherwise
// it builds the object's bytes, commits the intent, uploads, and hands the
// intent back for the drainer to delete with the object's delivery.
func (s *Sink) Send(ctx context.Context, b *sinks.Batch) (sinks.Outcome, error) {
	if strings.HasPrefix(b.Partition, tooLong) {
		return sinks.Outcome{}, sinks.NewRecordPermanent("key_too_long",
			fmt.Errorf("the key template renders a key over S3's %d bytes for these records", maxKeyLen))
	}
	s.mu.Lock()
	taken := s.taken
	s.mu.Unlock()
	if taken != nil {
		return sinks.Outcome{}, taken
	}
	open, ok := b.Carry.(*openObject)
	if b.Carry != nil && !ok {
		return sinks.Outcome{}, fmt.Errorf("s3 sink %s: carry of type %T", s.name, b.Carry)
	}
	var first, last uint64
	switch {
	case open != nil:
		first, last = open.first, open.last
	case len(b.Records) == 0:
		return sinks.Outcome{}, nil // nothing to deliver
	default:
		first = b.First()
	}
	if n := len(objectKey(b.Partition, first, uuidLike)); n > maxKeyLen {
		s.forget(b.Partition)
		if open.staged() {
			s.staging.remove(open.path) // the drainer gives the carry up
		}
		return sinks.Outcome{}, sinks.NewRecordPermanent("key_too_long",
			fmt.Errorf("object key of %d bytes is over S3's %d: %.100q...", n, maxKeyLen, objectKey(b.Partition, first, "")))
	}
	var m *member
	if len(b.Records) > 0 {
		mb, err := s.enc.compressScratch(b.Records, open.chain())
		if err != nil {
			return sinks.Outcome{}, sinks.NewRetryable("encode", err)
		}
		m, last = &mb, b.Last()
		lines := m.lines
		if open != nil {
			lines += open.lines
		}
		if !b.Final && lines < int64(s.maxBytes) && !s.begun(b.Partition, first, last) {
			if c, err := s.carry(open, m, b.Partition, first, last); c != nil || err != nil {
				return sinks.Outcome{Carry: c}, err
			}
			// Staging had no room for the member: the object is finished
			// now, with it.
		}
		// The object's last member is uploaded, and the HTTP transport may
		// still read a request's body after the call returns.
		m.own()
	}
	obj, counts, err := s.finishing(open, m)
	if err != nil {
		return sinks.Outcome{}, sinks.NewRetryable("encode", err)
	}
	in := s.intentFor(ctx, b.State, b.Partition, first, last, open.recordsWith(m))
	if len(counts) > 1 {
		in.Members = counts
	}
	in.setObject(obj)
	ik := intentKey(in.Key)
	if err := putIntent(ctx, b.State, ik, in); err != nil {
		return sinks.Outcome{}, sinks.NewRetryable("state", err)
	}
	already, err := s.uploadObject(ctx, b.State, ik, in, obj, open)
	if err != nil {
		err = s.classify(err)
		switch {
		case sinks.Classify(err).Class == sinks.RecordPermanent:
			// S3 stored nothing and the drainer dead-letters the records.
			s.forget(b.Partition)
			if open.staged() {
				s.staging.remove(open.path) // the drainer gives the carry up
			}
			_ = b.State.Delete(ctx, ik) // a left-over intent only costs Recover one more refusal
		case keyTaken(err):
			s.mu.Lock()
			s.taken = err
			s.mu.Unlock()
		}
		return sinks.Outcome{}, err
	}
	s.forget(b.Partition)
	if open.staged() {
		s.staging.remove(open.path)
	}
	if already {
		s.log.Debug("the object was in S3 already: an earlier attempt's upload landed although its answer was lost", "key", in.Key)
	} else {
		s.m.uncompressed.Add(float64(obj.lines))
	}
	return sinks.Outcome{DeleteState: [][]byte{ik}}, nil
}

// carry takes member m, of records first to last, into open (nil: a new
// object), staged when the sink stages, and returns the object to carry.
// It returns nil when open is staged and staging has no room for m (or
// cannot write it): the object is then to be finished now, with m. A new
// object that staging has no room for is held in memory. A member held in
// memory is made to own its body; a staged one's scratch is released.
func (s *Sink) carry(open *openObject, m *member, partition string, first, last uint64) (*openObject, error) {
	switch {
	case s.staging == nil || open != nil && !open.staged():
		m.own()
		return open.with(*m, first, last, s.maxBytes), nil
	}
	path, off := s.staging.path(partition), int64(0)
	if open != nil {
		path, off = open.path, open.size
	}
	if err := s.staging.stage(path, off, m.body); err != nil {
		if open != nil {
			s.staging.full(err, "objects are finished early, before max_object_bytes or max_object_age")
			return nil, nil
		}
		s.staging.full(err, "new objects are held in memory, and finished early when the sink's memory share runs short")
		m.own()
		return open.with(*m, first, last, s.maxBytes), nil
	}
	c, err := open.withStaged(*m, first, last, s.maxBytes, path, s.staging)
	m.release()
	if err != nil {
		return nil, sinks.NewRetryable("encode", err)
	}
	return c, nil
}

// finishing is the object open (nil: none) with m (nil: none) as its last
// member, and the records of each member. The bytes of a staged object
// stay in its file: only m, and the object's trailer, are held.
func (s *Sink) finishing(open *openObject, m *member) (*object, []int, error) {
	if open == nil {
		return s.enc.join([]member{*m}), []int{m.records}, nil
	}
	lines, gzcrc := open.lines, open.gzcrc
	if m != nil {
		lines, gzcrc = lines+m.lines, m.gzcrc
	}
	trailer := s.enc.trailer(gzcrc, lines)
	if !open.staged() {
		// The members are not joined: the object is read from them in turn
		// (bodyOf), its SHA-256 taken over them in turn.
		obj := &object{parts: make([][]byte, 0, len(open.bodies)+2), lines: open.lines, linesCRC32: open.crc}
		obj.parts = append(obj.parts, open.bodies...)
		counts := open.members()
		if m != nil {
			obj.parts, counts = append(obj.parts, m.body), append(counts, m.records)
			obj.lines, obj.linesCRC32 = open.lines+m.lines, m.crc
		}
		if trailer != nil {
			obj.parts = append(obj.parts, trailer)
		}
		h := sha256.New()
		for _, p := range obj.parts {
			h.Write(p)
			obj.size += int64(len(p))
		}
		obj.sha256 = hex.EncodeToString(h.Sum(nil))
		return obj, counts, nil
	}
	obj := &object{size: open.size, lines: open.lines, linesCRC32: open.crc}
	counts := open.members()
	if m != nil {
		obj.tail, obj.lines, obj.linesCRC32 = m.body, open.lines+m.lines, m.crc
		counts = append(counts, m.records)
	}
	if trailer != nil {
		// m owns its body, with room for the trailer (member.own).
		obj.tail = append(obj.tail, trailer...)
	}
	obj.size = open.size + int64(len(obj.tail))
	sum, err := open.sum(obj.tail)
	if err != nil {
		return nil, nil, err
	}
	obj.sha256 = hex.EncodeToString(sum)
	return obj, counts, nil
}

// recordsWith is how many records o (nil: none) and m (nil: none) hold.
func (o *openObject) recordsWith(m *member) int {
	n := 0
	if o != nil {
		n = o.records
	}
	if m != nil {
		n += m.records
	}
	return n
}

// uploadObject uploads obj, reading a staged object's bytes from open's
// file.
func (s *Sink) uploadObject(ctx context.Context, st sinks.State, ik []byte, in *intent, obj *object, open *openObject) (bool, error) {
	if !open.staged() {
		return s.upload(ctx, st, ik, in, bodyOf(obj, nil, 0))
	}
	f, head, err := s.staging.open(open.path, open.size)
	if err == nil {
		defer f.Close()
		err = checkStaged(bodyOf(obj, head, open.size), obj.sha256)
	}
	if err != nil {
		// Staging lost or damaged the file (it is not fsynced, and anyone
		// can delete it): the records are in the WAL, and the object's
		// bytes a function of them.
		s.log.Warn("a staged object's file is missing or damaged; rebuilding the object from the WAL", "key", in.Key, "error", err)
		rebuilt, err := s.rebuild(st, in)
		if err == nil {
			s.m.stagingRebuilt.Inc()
		}
		if errors.Is(err, sinks.ErrCarryLost) {
			// Some of its records are gone from the WAL too (a damaged
			// entry, or drop_oldest while it was sent):
			// the object can be built neither from its file nor from the
			// WAL. An earlier attempt's upload may have landed with its
			// answer lost: then S3 holds it, every record with it.
			landed, herr := s.landed(ctx, in)
			if herr != nil {
				return false, herr
			}
			if landed {
				s.log.Warn("a staged object's file is damaged and the WAL no longer holds all of its records, but an earlier attempt's upload of it landed: delivered",
					"key", in.Key, "records", in.Records)
				return true, nil
			}
			// It is given up, and the drainer reads the records left
			// again (their new object may have the same key: the first
			// record's).
			s.m.stagingGivenUp.Inc()
			s.log.Warn("giving up a staged object: its file is damaged and the WAL no longer holds all of its records (a damaged entry, or wal.when_full: drop_oldest); the records left are sent again",
				"key", in.Key, "records", in.Records, "error", err)
			s.forget(in.Partition)
			s.abandonQuietly(ctx, st, in)
			return false, sinks.NewRetryable("staging", err)
		}
		if err != nil {
			return false, sinks.NewRetryable("staging", err)
		}
		return s.upload(ctx, st, ik, in, bodyOf(rebuilt, nil, 0))
	}
	return s.upload(ctx, st, ik, in, bodyOf(obj, head, open.size))
}

// checkStaged reads body and checks it has SHA-256 sum (hex).
func checkStaged(body *io.SectionReader, sum string) error {
	h := sha256.New()
	if _, err := io.Copy(h, body); err != nil {
		return fmt.Errorf("read staged object: %w", err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sum {
		return fmt.Errorf("staged object has SHA-256 %s, not %s", got, sum)
	}
	return nil
}

// rebuild builds in's object again from its records in the WAL, as
// Recover does, and checks it is the one in describes.
func (s *Sink) rebuild(st sinks.State, in *intent) (*object, error) {
	kept, err := st.ReadRange(in.First, in.Last, func(r *sinks.Record) bool {
		return routed(st, s.keys, r) == in.Partition
	})
	if err != nil {
		return nil, fmt.Errorf("read records %d to %d of %q: %w", in.First, in.Last, in.Key, err)
	}
	if len(kept) < in.Records {
		return nil, fmt.Errorf("rebuild %q: the WAL holds %d of its %d records: %w", in.Key, len(kept), in.Records, sinks.ErrCarryLost)
	}
	if len(kept) != in.Records {
		return nil, fmt.Errorf("rebuild %q: the WAL holds %d of its %d records", in.Key, len(kept), in.Records)
	}
	obj, err := s.enc.buildSplit(kept, in.Members)
	if err != nil {
		return nil, fmt.Errorf("rebuild %q: %w", in.Key, err)
	}
	if obj.sha256 != in.SHA256 {
		return nil, fmt.Errorf("rebuild %q: SHA-256 %s, not the intent's %s", in.Key, obj.sha256, in.SHA256)
	}
	return obj, nil
}

// uuidLike is as long as what ${uuid} renders, to measure keys before
// one is drawn.
const uuidLike = "00000000-0000-4000-8000-000000000000"

// begun reports whether an earlier attempt at the batch of records first to
// last finished its object (staging had no room to take it in then): its
// intent is committed and its upload may have landed with its answer lost,
// so the object is finished again, not taken in now that staging has room
// (a larger object would then find the key taken by this one).
func (s *Sink) begun(partition string, first, last uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := s.open[partition]
	return prev != nil && prev.First == first && prev.Last == last
}

// forget drops the begun intent of a partition whose batch is done with.
func (s *Sink) forget(partition string) {
	s.mu.Lock()
	delete(s.open, partition)
	s.mu.Unlock()
}

// intentFor returns the intent for batch b: the one an earlier attempt at
// the same batch began (same records, same ${uuid}), or a new one. A begun
// intent of another batch of the partition is stale: its multipart upload
// is aborted and it is deleted.
func (s *Sink) intentFor(ctx context.Context, st sinks.State, partition string, first, last uint64, records int) *intent {
	s.mu.Lock()
	prev := s.open[partition]
	s.mu.Unlock()
	if prev != nil && prev.First == first && prev.Last == last {
		return prev
	}
	if prev != nil {
		s.abandon(ctx, st, prev)
	}
	in := &intent{Version: intentVersion, Partition: partition, First: first, Last: last, Records: records,
		KeyTemplate: s.cfg.Key, Hostname: s.hostname, KeyRules: keyRulesSanitised, Encoding: s.enc.enc, Match: s.match, Bucket: s.bucket}
	if s.keys.uuid {
		in.UUID = newUUID()
	}
	in.Key = objectKey(partition, first, in.UUID)
	s.mu.Lock()
	s.open[partition] = in
	s.mu.Unlock()
	return in
}

// abandon removes a stale intent (best effort: a left-over one is dealt
// with by Recover at the next start).
func (s *Sink) abandon(ctx context.Context, st sinks.State, in *intent) {
	s.log.Warn("abandoning an upload begun for other records of the partition (the WAL dropped some before delivery, with wal.when_full: drop_oldest, or they were read again and cut otherwise); the object may exist in S3 with records also sent again",
		"key", in.Key, "first_seq", in.First, "last_seq", in.Last)
	s.abandonQuietly(ctx, st, in)
}

// abandonQuietly is abandon without its log line.
func (s *Sink) abandonQuietly(ctx context.Context, st sinks.State, in *intent) {
	if in.UploadID != "" {
		_ = s.abort(ctx, s.bucketOf(in), in.Key, in.UploadID)
	}
	_ = st.Delete(ctx, intentKey(in.Key))
}
