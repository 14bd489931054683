package config

// Config is the whole configuration file. Load and Parse return it with every default
// applied and every value validated.
type Config struct {
	DataDir         string   `yaml:"data_dir"`         // holds the WAL
	Log             Log      `yaml:"log"`              // the process's own log
	ShutdownTimeout Duration `yaml:"shutdown_timeout"` // time to drain in-flight sends before exiting
	// DrainOnShutdown makes a stop (SIGTERM) deliver everything in the WAL, until every
	// sink's lag is 0 or ShutdownTimeout ends, instead of only the batches in flight: for
	// a replica that is scaled in and may not come back.
	DrainOnShutdown bool `yaml:"drain_on_shutdown"`
	// MemoryLimit is the process's memory target: the Go runtime's soft limit, and the
	// source of each sink's share for records held in memory (see SinkBuffers) and of the
	// inputs' budget (see InputMemory).
	MemoryLimit Size   `yaml:"memory_limit"`
	WAL         WAL    `yaml:"wal"`
	Inputs      Inputs `yaml:"inputs"`
	Admin       Admin  `yaml:"admin"`
	Sinks       []Sink `yaml:"sinks"`

	file string              // the name problems are reported against
	pos  map[string]position // where each key was found in the file, by path
}

// Line is the line of the file that the key at path ("inputs.forward.tls") came from,
// or the nearest enclosing key's that did; 0 when none did (or c was not loaded from a
// file). Problems found outside the config package are placed by it.
func (c *Config) Line(path string) int {
	for p := path; ; p = parentPath(p) {
		if pos, ok := c.pos[p]; ok {
			return pos.line
		}
		if p == "" {
			return 0
		}
	}
}

// Log configures the process's own log lines.
type Log struct {
	Level  string `yaml:"level"`  // LevelDebug, LevelInfo, LevelWarn or LevelError
	Format string `yaml:"format"` // FormatText or FormatJSON
}

// WAL configures the write-ahead log that makes records durable before they are acknowledged.
type WAL struct {
	// MaxBytes bounds the live records as stored; above it, WhenFull decides.
	MaxBytes Size `yaml:"max_bytes"`
	// WhenFull is WhenFullBlock (push back on the inputs) or WhenFullDropOldest.
	WhenFull string `yaml:"when_full"`
	// Sync is SyncAlways (fsync before every acknowledgement) or SyncInterval.
	Sync string `yaml:"sync"`
	// DedupWindow is how long forward chunk ids and HTTP idempotency keys are remembered.
	DedupWindow Duration `yaml:"dedup_window"`
	// MinFreeBytes is the room kept on the WAL's disk for cursor and sink state commits:
	// appends wait (the inputs push back) while storing them would leave less free, on
	// the file system or in free pages inside the WAL file.
	MinFreeBytes Size `yaml:"min_free_bytes"`
	// DropCursors names cursors of removed sinks that run drops at start, so that they no
	// longer keep their records in the WAL; a name with no cursor is passed over.
	DropCursors []string `yaml:"drop_cursors"`
}

// Inputs holds the inputs that are enabled; a nil input is disabled.
type Inputs struct {
	Forward *Forward `yaml:"forward"`
	HTTP    *HTTP    `yaml:"http"`
}

// Forward configures the Fluent forward protocol input (TCP, optionally TLS).
type Forward struct {
	Listen          string `yaml:"listen"`            // host:port
	SharedKey       string `yaml:"shared_key"`        // non-empty: clients must pass the HELO/PING/PONG handshake
	Users           []User `yaml:"users"`             // checked in the handshake; needs SharedKey
	TLS             TLS    `yaml:"tls"`               // server TLS, and client certificates with ClientCAFile
	MaxMessageBytes Size   `yaml:"max_message_bytes"` // largest forward message accepted
	MaxConnections  int    `yaml:"max_connections"`   // concurrent client connections
	// HandshakeTimeout bounds a connection's handshake, from its accept: the TLS handshake
	// (with tls) and HELO/PING/PONG (with shared_key).
	HandshakeTimeout Duration `yaml:"handshake_timeout"`
	// MaxRecordsPerMessage bounds the records of one message (entries of Forward and
	// PackedForward messages, once decompressed): a message with more is bad input.
	MaxRecordsPerMessage int `yaml:"max_records_per_message"`
	// SelfHostname is the name the handshake's PONG gives (Fluentd's <security>
	// self_hostname); empty: the host name. Fluentd's out_forward and @fluent-org/logger
	// refuse a PONG that names their own host.
	SelfHostname string `yaml:"self_hostname"`
}

// User is a username and password for the forward handshake.
type User struct {
	Username string `yaml:"username"`
	Password string `yaml:"password"`
}

// TLS is the forward input's TLS: a certificate and key, and optionally a CA that client
// certificates must chain to. All empty: plain TCP.
type TLS struct {
	CertFile     string `yaml:"cert_file"`
	KeyFile      string `yaml:"key_file"`
	ClientCAFile string `yaml:"client_ca_file"`
}

// Enabled reports whether TLS is configured.
func (t TLS) Enabled() bool { return t.CertFile != "" }

// HTTP configures the HTTP input (NDJSON or JSON bodies).
type HTTP struct {
	Listen            string   `yaml:"listen"`              // host:port
	Token             string   `yaml:"token"`               // bearer token clients must send; empty: no auth
	TLS               HTTPTLS  `yaml:"tls"`                 // server TLS
	MaxBodyBytes      Size     `yaml:"max_body_bytes"`      // largest request body accepted
	TimeField         string   `yaml:"time_field"`          // field holding the event time; empty: the receive time
	MaxConnections    int      `yaml:"max_connections"`     // concurrent client connections
	ReadHeaderTimeout Duration `yaml:"read_header_timeout"` // for a request's headers, from its first byte or the connection's start
	// MaxRecordsPerRequest bounds the records of one request (lines or array elements,
	// once decompressed): a request with more is answered 413 and stores nothing.
	MaxRecordsPerRequest int `yaml:"max_records_per_request"`
}

// HTTPTLS is the HTTP input's TLS: a certificate and key. Both empty: plain HTTP.
type HTTPTLS struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// Enabled reports whether TLS is configured.
func (t HTTPTLS) Enabled() bool { return t.CertFile != "" }

// Admin configures the admin HTTP server (/metrics, /healthz, /readyz, /status).
type Admin struct {
	Listen string `yaml:"listen"` // host:port
	// Pprof serves Go's runtime profiles (CPU, heap, goroutines, ...)
	// under /debug/pprof/ on the admin listener. Off by default.
	Pprof bool `yaml:"pprof"`
}

// Sink is one destination. Its type's settings are written inline in the sink's mapping,
// next to name, type and match; exactly one of S3 and CloudWatch is set, as Type says.
type Sink struct {
	Name  string   `yaml:"name"`  // unique; letters, digits, "_" and "-"
	Type  string   `yaml:"type"`  // SinkS3 or SinkCloudWatch
	Match []string `yaml:"match"` // tag globs, see MatchTag; a single string in the file is a list of one

	Line int `yaml:"-"` // line of the sink in the file, for later messages; 0 when not from a file

	S3         *S3         `yaml:"-"` // set when Type is SinkS3
	CloudWatch *CloudWatch `yaml:"-"` // set when Type is SinkCloudWatch
}

// S3 configures a sink that writes JSON-lines objects to Amazon S3 or a compatible service.
type S3 struct {
	Bucket    string `yaml:"bucket"`
	Region    string `yaml:"region"`     // empty: the AWS SDK's default
	Endpoint  string `yaml:"endpoint"`   // a local or S3-compatible service
	PathStyle bool   `yaml:"path_style"` // path-style addressing, for local services
	Key       string `yaml:"key"`        // object key template; contains ${seq} or ${uuid}
	// KeyEnv are the values of the environment variables key referred to
	// (${env.POD_NAME}): one that holds the host name keeps each replica's keys apart
	// as ${hostname} does.
	KeyEnv             []string          `yaml:"-"`
	Compression        string            `yaml:"compression"`         // CompressionGzip, CompressionZstd or CompressionNone
	CompressionLevel   int               `yaml:"compression_level"`   // gzip 1-9; zstd 1-4 (fastest to best)
	MaxObjectBytes     Size              `yaml:"max_object_bytes"`    // uncompressed bytes per object
	MaxObjectAge       Duration          `yaml:"max_object_age"`      // an open object is closed this long after its first record
	MaxOpenObjects     int               `yaml:"max_open_objects"`    // objects being filled at once (one per partition)
	MaxPartitions      int               `yaml:"max_partitions"`      // partitions (rendered key prefixes) admitted; beyond: the overflow key
	MultipartThreshold Size              `yaml:"multipart_threshold"` // objects this large are uploaded in parts
	StagingMaxBytes    Size              `yaml:"staging_max_bytes"`   // disk for open objects' members; 0: memory (see StagingDefault)
	TimeKey            string            `yaml:"time_key"`            // field the event time is added under; empty: none
	TagKey             string            `yaml:"tag_key"`             // field the tag is added under; empty: none
	SSE                string            `yaml:"sse"`                 // "", SSEAES256 or SSEKMS
	KMSKeyID           string            `yaml:"kms_key_id"`          // with SSEKMS; empty: the bucket's default key
	StorageClass       string            `yaml:"storage_class"`       // empty: the bucket's default
	ACL                string            `yaml:"acl"`                 // canned ACL; empty: none
	Tags               map[string]string `yaml:"tags"`                // object tags
}

// CloudWatch configures a sink that sends events to Amazon CloudWatch Logs.
type CloudWatch struct {
	Region    string `yaml:"region"`     // empty: the AWS SDK's default
	Endpoint  string `yaml:"endpoint"`   // a local or compatible service
	LogGroup  string `yaml:"log_group"`  // template
	LogStream string `yaml:"log_stream"` // template
	// NamesEnv are the values of the environment variables log_group and log_stream
	// referred to (${env.POD_NAME}): one that holds the host name names each replica's
	// streams as ${hostname} does.
	NamesEnv             []string          `yaml:"-"`
	Fallback             string            `yaml:"fallback"`               // rendered for a missing field without a default
	CreateGroup          bool              `yaml:"create_group"`           // create missing log groups
	CreateStream         bool              `yaml:"create_stream"`          // create missing log streams
	RetentionDays        int               `yaml:"retention_days"`         // set on groups it creates; 0: don't set
	LogGroupClass        string            `yaml:"log_group_class"`        // LogGroupClassStandard or LogGroupClassInfrequentAccess
	KMSKeyID             string            `yaml:"kms_key_id"`             // for groups it creates
	Tags                 map[string]string `yaml:"tags"`                   // for groups it creates
	MessageKey           string            `yaml:"message_key"`            // ship this field's value instead of the whole body
	FlushInterval        Duration          `yaml:"flush_interval"`         // longest wait before a partial batch is sent
	MaxConcurrentStreams int               `yaml:"max_concurrent_streams"` // streams with a request in flight at once
	MaxPartitions        int               `yaml:"max_partitions"`         // group and stream pairs admitted; beyond: the overflow stream
	// Settle is how old a PutLogEvents call a crash left in doubt must be
	// before the stream is read back to see whether it landed.
	Settle   Duration `yaml:"settle"`
	ReadRate int      `yaml:"read_rate"` // GetLogEvents calls a second while resolving calls in doubt
	// CreateRate is how many log streams the sink creates a second, for all
	// its streams: CreateLogStream has an account-wide quota (README).
	CreateRate int `yaml:"create_rate"`
	// GroupCreateRate is how many log groups it creates a second (each a
	// CreateLogGroup and, with retention_days, a PutRetentionPolicy).
	GroupCreateRate int `yaml:"group_create_rate"`
}

// Values of the keys that take one of a fixed set.
const (
	LevelDebug = "debug" // log.level
	LevelInfo  = "info"
	LevelWarn  = "warn"
	LevelError = "error"

	FormatText = "text" // log.format
	FormatJSON = "json"

	WhenFullBlock      = "block"       // wal.when_full: push back on the inputs
	WhenFullDropOldest = "drop_oldest" // wal.when_full: drop the oldest records, counted per sink

	SyncAlways   = "always"   // wal.sync: fsync before every acknowledgement
	SyncInterval = "interval" // wal.sync: fsync every second; acknowledged records can be lost in a crash

	SinkS3         = "s3" // sink type
	SinkCloudWatch = "cloudwatch"

	CompressionGzip = "gzip" // s3 compression
	CompressionZstd = "zstd"
	CompressionNone = "none"

	SSEAES256 = "AES256"  // s3 sse
	SSEKMS    = "aws:kms" // s3 sse

	LogGroupClassStandard         = "STANDARD" // cloudwatch log_group_class
	LogGroupClassInfrequentAccess = "INFREQUENT_ACCESS"
)
