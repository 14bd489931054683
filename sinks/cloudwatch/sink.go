package cloudwatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs"
	"github.com/aws/smithy-go/middleware"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/internal/awserr"
	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/template"
)

// logsAPI is what the sink needs of the CloudWatch Logs client.
type logsAPI interface {
	PutLogEvents(context.Context, *cloudwatchlogs.PutLogEventsInput, ...func(*cloudwatchlogs.Options)) (*cloudwatchlogs.PutLogEventsOutput, error)
	CreateLogGroup(context.Context, *cloudwatchlogs.CreateLogGroupInput, ...func(*cloudwatchlogs.Options)) (*cloudwatchlogs.CreateLogGroupOutput, error)
	CreateLogStream(context.Context, *cloudwatchlogs.CreateLogStreamInput, ...func(*cloudwatchlogs.Options)) (*cloudwatchlogs.CreateLogStreamOutput, error)
	PutRetentionPolicy(context.Context, *cloudwatchlogs.PutRetentionPolicyInput, ...func(*cloudwatchlogs.Options)) (*cloudwatchlogs.PutRetentionPolicyOutput, error)
	GetLogEvents(context.Context, *cloudwatchlogs.GetLogEventsInput, ...func(*cloudwatchlogs.Options)) (*cloudwatchlogs.GetLogEventsOutput, error)
}

var _ logsAPI = (*cloudwatchlogs.Client)(nil)

// Options are what the sink needs besides its configuration.
type Options struct {
	Hostname   string
	Logger     *slog.Logger
	Registerer prometheus.Registerer // nil: metrics not registered
	// AWS, when set, replaces the standard credential and region chain
	// (tests point it at a local service with static credentials).
	AWS *aws.Config
	Now func() time.Time
	// SharedStreams: the names do not keep replicas apart (neither log_group
	// nor log_stream holds ${hostname}), so another forwarder may write the
	// same streams. A call in doubt is then sent again, not read back: the
	// other writer's identical events would pass for the call's, and its
	// records would be lost. At least once, rather than exactly once.
	SharedStreams bool
}

// Sink is the CloudWatch Logs sink.
type Sink struct {
	// outcomes are the log groups' last outcomes: taken or refused
	// (AccessDenied), for classifyDenied.
	outcomes groupOutcomes
	// lastTaken is when a PutLogEvents was last taken (Unix nanoseconds),
	// by any stream: see refusedEverywhere.
	lastTaken atomic.Int64
	// traceable: the HTTP client is net/http's, which reports connections
	// (connTrace); connTraced: a call's trace saw one (putTraced).
	traceable  bool
	connTraced atomic.Bool
	// refusedAlone counts the records refused in calls of their own, by
	// any stream, since a PutLogEvents was last taken: a low-rate stream's
	// batches of a few records each add up to refusedToPause across them.
	// refusedBy holds each stream's part of it (under refusedMu).
	refusedAlone atomic.Int64
	refusedBy    map[string]int64
	// refusedBatches counts, by partition, Sends in a row whose batch the
	// service refused whole (a pause each): see refusedBatch.
	refusedMu      sync.Mutex
	refusedBatches map[string]int
	name           string
	hostname       string
	cfg            config.CloudWatch
	api            logsAPI
	log            *slog.Logger
	group          *template.Template
	timed          bool   // group or stream has strftime verbs (see Family)
	overflow       string // the overflow partition, when not timed (see Overflow)
	stream         *template.Template
	fields         *template.Finder // the fields of group and stream, found in one pass
	fallbacks      *template.FallbackLog
	groupsChanged  *template.ChangedLog // names the rules changed (names.go)
	streamsChanged *template.ChangedLog
	messageKey     []string
	now            func() time.Time

	tokens *lru // stream → last nextSequenceToken
	last   *lru // stream → what this process's calls stored at its last millisecond (prior.go)
	known  *lru // groups that exist (streams are not kept: a PutLogEvents says when one is missing)

	intents intents // intents of calls in the sink's state
	reads   *limiter
	creates *creation // pace and throttling of creation calls (create.go)
	// shared: Options.SharedStreams; sharedSaid, the line saying so, once.
	shared     bool
	sharedSaid sync.Once
	// noRead is set once GetLogEvents was refused (AccessDenied): calls in
	// doubt are then sent again, for the rest of the run.
	noRead atomic.Bool
	// unbuilt counts the calls in doubt at start that could not be rebuilt
	// from the WAL (resolve): the first is warned in full, the count is in
	// Recover's summary line.
	unbuilt atomic.Int64
	// noUnmask is set once GetLogEvents with unmask was refused (no
	// logs:Unmask): the streams are then read as stored, masked.
	noUnmask atomic.Bool
	skewed   atomic.Bool // the clock warning was given

	// scratch is where partition renders names, reused record after record;
	// keys holds the keys it made, so that a record of a stream seen
	// recently shares its key instead of allocating one (partitionKey).
	scratchMu sync.Mutex
	scratch   []byte
	keys      *[keySlots]string
	keySeed   maphash.Seed

	m metrics
	// creds are the client's credentials, fetched again when the service
	// answers that they expired (awserr.Refetch).
	creds aws.CredentialsProvider
}

type metrics struct {
	fallback, sanitised, tokenRetries, created, puts, events prometheus.Counter
	splitCalls                                               prometheus.Counter     // calls refused whole, sent again in halves
	indoubt                                                  *prometheus.CounterVec // by result
	creations                                                *prometheus.CounterVec // by kind and outcome
	waiting                                                  prometheus.Gauge       // streams waiting for creation
}

// New builds the sink for sink configuration name/cfg.
func New(ctx context.Context, name string, cfg config.CloudWatch, opts Options) (*Sink, error) {
	s := &Sink{name: name, hostname: opts.Hostname, cfg: cfg, log: opts.Logger, now: opts.Now, shared: opts.SharedStreams,
		tokens: newLRU(100000), known: newLRU(100000), last: newLRU(maxPriorStreams)}
	if cfg.ReadRate <= 0 {
		cfg.ReadRate = 10 // config's default, for a configuration not made by package config
	}
	if cfg.MaxPartitions <= 0 {
		cfg.MaxPartitions = config.DefaultMaxPartitions
	}
	if cfg.CreateRate <= 0 {
		cfg.CreateRate = 10 // as config's defaults
	}
	if cfg.GroupCreateRate <= 0 {
		cfg.GroupCreateRate = 1
	}
	s.cfg, s.reads = cfg, newLimiter(cfg.ReadRate)
	s.creates = newCreation(cfg.CreateRate, cfg.GroupCreateRate)
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	err := s.parseNames()
	if err != nil {
		return nil, err
	}
	s.fallbacks = &template.FallbackLog{Log: s.log.With("sink", name), What: "log group or stream"}
	s.groupsChanged = &template.ChangedLog{Log: s.log.With("sink", name), What: "log group name", T: s.group}
	s.streamsChanged = &template.ChangedLog{Log: s.log.With("sink", name), What: "log stream name", T: s.stream}
	if cfg.MessageKey != "" {
		s.messageKey = strings.Split(cfg.MessageKey, ".")
	}
	var awsCfg aws.Config
	if opts.AWS != nil {
		awsCfg = opts.AWS.Copy()
	} else {
		lo := []func(*awsconfig.LoadOptions) error{awsconfig.WithLogger(awserr.Logger(s.log.With("sink", name)))}
		if cfg.Region != "" {
			lo = append(lo, awsconfig.WithRegion(cfg.Region))
		}
		if awsCfg, err = awsconfig.LoadDefaultConfig(ctx, lo...); err != nil {
			return nil, fmt.Errorf("load AWS configuration: %w", err)
		}
	}
	// The drainer retries with backoff; the SDK's own retries and its
	// client-side retry quota would only hide failures and then refuse calls.
	awsCfg.Retryer = func() aws.Retryer {
		return retry.NewStandard(func(o *retry.StandardOptions) {
			o.MaxAttempts = 1
			o.RateLimiter = ratelimit.None
		})
	}
	// The SDK's client keeps 10 idle connections to a host: with more
	// streams sending at once, each call past those would connect (and
	// shake hands) again. An answer that does not begin within callTimeout
	// fails the call (retried). The SDK's own kind of client is copied with
	// these settings; a client of another kind given in Options.AWS is used
	// as it is.
	// A net/http client reports its requests' connections (connTrace);
	// another kind may not, or not for the request's own context.
	switch c := awsCfg.HTTPClient.(type) {
	case nil, *awshttp.BuildableClient:
		s.traceable = true
	case *http.Client:
		_, s.traceable = c.Transport.(*http.Transport)
		s.traceable = s.traceable || c.Transport == nil // http.DefaultTransport
	}
	if bc, ok := awsCfg.HTTPClient.(*awshttp.BuildableClient); ok || awsCfg.HTTPClient == nil {
		if bc == nil {
			bc = awshttp.NewBuildableClient()
		}
		awsCfg.HTTPClient = bc.WithTransportOptions(func(tr *http.Transport) {
			tr.MaxIdleConnsPerHost = max(tr.MaxIdleConnsPerHost, s.cfg.MaxConcurrentStreams)
			tr.MaxIdleConns = max(tr.MaxIdleConns, s.cfg.MaxConcurrentStreams)
			tr.ResponseHeaderTimeout = callTimeout
		})
	}
	s.creds = awsCfg.Credentials
	s.api = cloudwatchlogs.NewFromConfig(awsCfg, func(o *cloudwatchlogs.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
		o.APIOptions = append(o.APIOptions, func(st *middleware.Stack) error { return st.Deserialize.Add(connTrace{}, middleware.After) })
	})
	label := prometheus.Labels{"sink": name}
	s.m = metrics{
		fallback: counter(opts.Registerer, "forwarder_cloudwatch_name_fallback_total", "Records whose group or stream name lacked a field and rendered the fallback.", label),
		sanitised: counter(opts.Registerer, "forwarder_cloudwatch_name_sanitised_total",
			"Records whose group or stream name was changed: a \"/\" in a tag or field rendered \"_\", an empty, \".\" or \"..\" path segment rendered with \"_\", a character CloudWatch Logs does not allow replaced, or values shortened to fit 512 bytes.", label),
		tokenRetries: counter(opts.Registerer, "forwarder_cloudwatch_sequence_token_retries_total",
			"PutLogEvents sent again with the expectedSequenceToken of an InvalidSequenceTokenException (services that still use tokens).", label),
		created: counter(opts.Registerer, "forwarder_cloudwatch_created_total", "Log groups and streams created.", label),
		splitCalls: counter(opts.Registerer, "forwarder_cloudwatch_split_calls_total",
			"PutLogEvents calls the service refused whole (InvalidParameterException, naming no event) and that were sent again in halves, so that only the events it refuses are dead-lettered.", label),
		puts:   counter(opts.Registerer, "forwarder_cloudwatch_put_log_events_total", "PutLogEvents calls that succeeded.", label),
		events: counter(opts.Registerer, "forwarder_cloudwatch_events_total", "Log events accepted (a split message counts each part).", label),
		indoubt: counterVec(opts.Registerer, "forwarder_cloudwatch_indoubt_calls_total",
			"PutLogEvents calls a crash left in doubt, resolved at start by reading the stream back: delivered (every event found, none sent again), resent (none found), partial (those not found sent again), unresolved (sent again without knowing: GetLogEvents refused, or the WAL no longer holds the call's records).",
			label, "result"),
		creations: counterVec2(opts.Registerer, "forwarder_cloudwatch_creations_total",
			"Creation calls by kind (group: CreateLogGroup, stream: CreateLogStream, retention: PutRetentionPolicy) and outcome (created, exists, throttled: ThrottlingException, waited out and made again, failed).",
			label, "kind", "outcome"),
		waiting: gauge(opts.Registerer, "forwarder_cloudwatch_creations_waiting",
			"Streams waiting for their log group or stream to be created: their turn at create_rate or group_create_rate, or the backoff of a throttled creation call.", label),
	}
	for _, r := range []string{resultDelivered, resultResent, resultPartial, resultUnresolved} {
		s.m.indoubt.WithLabelValues(r)
	}
	for _, k := range []string{kindGroup, kindStream, kindRetention} {
		for _, o := range []string{outcomeCreated, outcomeExists, outcomeThrottled, outcomeFailed} {
			s.m.creations.WithLabelValues(k, o)
		}
	}
	return s, nil
}

func counter(reg prometheus.Registerer, name, help string, labels prometheus.Labels) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
	if reg != nil {
		if err := reg.Register(c); err != nil {
			if are, ok := err.(prometheus.AlreadyRegisteredError); ok {
				return are.ExistingCollector.(prometheus.Counter)
			}
		}
	}
	return c
}

func counterVec(reg prometheus.Registerer, name, help string, labels prometheus.Labels, label string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, []string{label})
	if reg != nil {
		if err := reg.Register(c); err != nil {
			if are, ok := err.(prometheus.AlreadyRegisteredError); ok {
				return are.ExistingCollector.(*prometheus.CounterVec)
			}
		}
	}
	return c
}

// parseNames parses the name templates of s.cfg with s.hostname.
func (s *Sink) parseNames() error {
	var err error
	if s.group, err = template.Parse(s.cfg.LogGroup, template.Options{Hostname: s.hostname}); err != nil {
		return fmt.Errorf("log_group: %w", err)
	}
	if s.stream, err = template.Parse(s.cfg.LogStream, template.Options{Hostname: s.hostname}); err != nil {
		return fmt.Errorf("log_stream: %w", err)
	}
	s.fields = template.NewFinder(s.group, s.stream)
	s.timed = s.group.Finest() != 0 || s.stream.Finest() != 0
	s.overflow = s.Overflow(&sinks.Record{})
	return nil
}

// partitioning is what Partitioning describes: what Fingerprint is made of.
type partitioning struct {
	LogGroup  string `json:"log_group"`
	LogStream string `json:"log_stream"`
	Fallback  string `json:"fallback"`
	Hostname  string `json:"hostname"`
}

var _ sinks.Repartitioner = (*Sink)(nil)

// Partitioning describes how the sink partitions records (see
// sinks.Repartitioner).
func (s *Sink) Partitioning() []byte {
	b, _ := json.Marshal(partitioning{LogGroup: s.cfg.LogGroup, LogStream: s.cfg.LogStream, Fallback: s.cfg.Fallback, Hostname: s.hostname})
	return b
}

// Router routes records as a sink of partitioning desc did.
func (s *Sink) Router(desc []byte, st sinks.State) (func(*sinks.Record) string, error) {
	var p partitioning
	if err := json.Unmarshal(desc, &p); err != nil {
		return nil, fmt.Errorf("read the partitioning of an earlier configuration: %w", err)
	}
	if p.LogGroup == "" || p.LogStream == "" {
		return nil, errors.New("the partitioning of an earlier configuration is not a CloudWatch sink's (a sink of another type had the name)")
	}
	old := &Sink{name: s.name, hostname: p.Hostname, log: s.log,
		cfg: config.CloudWatch{LogGroup: p.LogGroup, LogStream: p.LogStream, Fallback: p.Fallback}}
	if err := old.parseNames(); err != nil {
		return nil, fmt.Errorf("the names of an earlier configuration: %w", err)
	}
	return func(r *sinks.Record) string { return old.routed(st, r) }, nil
}

// Fingerprint names how the sink partitions records: its name templates,
// fallback and host name. Delivered marks are kept only while it is the same.
func (s *Sink) Fingerprint() string {
	return strings.Join([]string{"cloudwatch", s.cfg.LogGroup, s.cfg.LogStream, s.cfg.Fallback, s.hostname}, "\x00")
}

// Limits are CloudWatch's per-call limits and the configured pace.
func (s *Sink) Limits() sinks.Limits {
	return sinks.Limits{
		MaxRecords:    maxEvents,
		MaxBytes:      maxBatchBytes,
		MaxAge:        time.Duration(s.cfg.FlushInterval),
		MaxSpan:       maxSpan,
		Concurrency:   s.cfg.MaxConcurrentStreams,
		MaxPartitions: s.cfg.MaxPartitions,
	}
}

// Partition is the record's log group and stream.
func (s *Sink) Partition(r *sinks.Record) string { return s.partition(r, true) }

// partition is Partition, counting and noting fallbacks and sanitised
// values only when count is set (Recover renders records a second time).
// Both names are rendered into the sink's scratch memory and sanitised
// into the key on the stack; the key is allocated only when it is not the
// one kept in its slot (partitionKey).
func (s *Sink) partition(r *sinks.Record, count bool) string {
	var fields template.Fields
	s.fields.Find(r.Body, &fields)
	d := &template.Data{Tag: r.Tag, Body: r.Body, Time: time.Unix(0, r.Time)}
	var key [256]byte
	s.scratchMu.Lock()
	// Values are shortened, rather than the name cut, when a name is over
	// its 512 bytes: the template's own text (${hostname}) is kept.
	g, n1 := s.group.AppendFoundWithin(s.scratch[:0], d, &fields, s.cfg.Fallback, maxNameLen, groupLen)
	k, c1 := appendGroupName(key[:0], g, s.cfg.Fallback)
	var gChanged []byte // the group as rendered, when the rules changed it and a line is due
	if c1 && count && s.groupsChanged.Due() {
		gChanged = append([]byte(nil), g...)
	}
	k = append(k, 0)
	gEnd := len(k) - 1
	st, n2 := s.stream.AppendFoundWithin(g[:0], d, &fields, s.cfg.Fallback, maxNameLen, streamLen)
	k, c2 := appendStreamName(k, st, s.cfg.Fallback)
	var sChanged []byte
	if c2 && count && s.streamsChanged.Due() {
		sChanged = append([]byte(nil), st...)
	}
	if cap(st) <= 4096 {
		s.scratch = st[:0]
	}
	p := s.partitionKey(k)
	s.scratchMu.Unlock()
	if !count {
		return p
	}
	if c1 || c2 || (n1|n2)&template.Shortened != 0 {
		const how = "characters CloudWatch Logs does not allow are replaced (records whose values differ only there share the name), values too long for its 512 bytes shortened (cut, with a hash of the whole value)"
		if c1 || n1&template.Shortened != 0 {
			if gChanged == nil && n1&template.Shortened != 0 && s.groupsChanged.Due() {
				gChanged = []byte("(values shortened)")
			}
			s.groupsChanged.Note(r.Tag, gChanged, p[:gEnd], how)
		}
		if c2 || n2&template.Shortened != 0 {
			if sChanged == nil && n2&template.Shortened != 0 && s.streamsChanged.Due() {
				sChanged = []byte("(values shortened)")
			}
			s.streamsChanged.Note(r.Tag, sChanged, p[gEnd+1:], how)
		}
		n1 |= template.Sanitised
	}
	if (n1|n2)&template.Missing != 0 {
		s.m.fallback.Inc()
		noted := *d // d itself stays on the stack
		if n1&template.Missing != 0 {
			s.fallbacks.Note(s.group, &noted, s.cfg.Fallback)
		}
		if n2&template.Missing != 0 {
			s.fallbacks.Note(s.stream, &noted, s.cfg.Fallback)
		}
	}
	if (n1|n2)&template.Sanitised != 0 {
		s.m.sanitised.Inc()
	}
	return p
}

// keySlots is how many keys partition keeps: one per slot, the slot's by
// the key's hash, a key replacing the one in its slot. A key is at most
// 1,025 bytes (two names of 512 and the NUL), a few dozen as a rule.
const keySlots = 4096

// partitionKey returns k as a string: the one in its slot of s.keys when it
// is the same, else a new one, which takes the slot. s.scratchMu is held.
func (s *Sink) partitionKey(k []byte) string {
	if s.keys == nil {
		s.keys, s.keySeed = new([keySlots]string), maphash.MakeSeed()
	}
	slot := &s.keys[maphash.Bytes(s.keySeed, k)%keySlots]
	if *slot != string(k) {
		*slot = string(k)
	}
	return *slot
}

func splitPartition(p string) (group, stream string) {
	group, stream, _ = strings.Cut(p, "\x00")
	return group, stream
}

// Size is what a record counts against a call's 1,048,576 bytes.
func (s *Sink) Size(r *sinks.Record) int {
	n := len(s.messageBytes(r))
	if n <= maxMessage {
		return n + eventOverhead
	}
	parts := (n + maxMessage - partPrefixSize - 1) / (maxMessage - partPrefixSize)
	return n + parts*(eventOverhead+partPrefixSize)
}
