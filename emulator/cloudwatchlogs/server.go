package cloudwatchlogs

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Options configures a Server. The zero value is usable.
type Options struct {
	// Region and AccountID appear in ARNs. Defaults: "us-east-1" and
	// "123456789012".
	Region    string
	AccountID string

	// Now is the clock used for event ages (too old, too new, expired),
	// ingestion times and creation times. Default time.Now. Throttling uses
	// the real monotonic clock whatever Now says.
	Now func() time.Time

	// Seed seeds the generator behind the failure and drop rates; 0 picks a
	// seed from the time of day.
	Seed uint64

	// AWSQuotas gives every operation AWS's default quota for Region
	// (AWSQuota): calls above it are throttled as AWS throttles them. Quotas
	// sets operations' quotas in calls a second, by operation name, over
	// those (0 or less: none). The zero value has no quota, so that a
	// test's bursts of calls are not throttled; tests of quotas and
	// forwarder dev turn them on. SetQuota changes one at any time.
	AWSQuotas bool
	Quotas    map[string]int

	// Initial values of the test switches; each has a setter of the same
	// meaning that can be called at any time.
	ThrottlePerSecond    int           // SetThrottle (0: Quotas decide)
	FailureRate          float64       // SetFailures
	FailureStatus        int           // SetFailures (default 503)
	Latency              time.Duration // SetLatency
	DropRate             float64       // SetDropResponses
	LegacySequenceTokens bool          // SetLegacySequenceTokens
	DenyAll              string        // SetDenyAll
	ReadDelay            time.Duration // SetReadDelay
	SparsePages          int           // SetSparsePages
}

// Event is one stored log event.
type Event struct {
	Timestamp     int64 // milliseconds since the Unix epoch, as sent
	IngestionTime int64 // milliseconds since the Unix epoch, Options.Now at storage
	Message       string
}

// StreamInfo describes one log stream.
type StreamInfo struct {
	Name                string
	CreationTime        int64
	Events              int
	StoredBytes         int64 // UTF-8 bytes of the stored messages
	FirstEventTimestamp int64 // 0 when the stream has no events
	LastEventTimestamp  int64
	LastIngestionTime   int64
}

// GroupInfo describes one log group and its streams (sorted by name).
type GroupInfo struct {
	Name            string
	CreationTime    int64
	RetentionInDays int32 // 0: never expire
	Class           string
	KmsKeyID        string
	Tags            map[string]string
	StoredBytes     int64 // sum over the streams
	Streams         []StreamInfo
}

// Server is an in-memory CloudWatch Logs service speaking awsJson1.1. It is
// an http.Handler; Start serves it on a listener of its own.
type Server struct {
	region, account string
	now             func() time.Time
	eventIDs        atomic.Uint64
	requestIDs      atomic.Uint64

	mu     sync.RWMutex // groups, group fields, group.streams
	groups map[string]*group

	callsMu   sync.Mutex
	calls     map[string]int
	throttled map[string]int // ThrottlingException answers of the quotas

	swMu         sync.Mutex // the switches and the generator
	rng          *rand.Rand
	quotas       map[string]*bucket // by operation
	failRate     float64
	failStatus   int
	latency      time.Duration
	dropRate     float64
	legacyTokens bool
	denyCode     string
	readDelay    time.Duration
	sparsePages  int

	lifeMu    sync.RWMutex // the fields below, and inflight.Add against Close
	started   bool
	closed    bool
	closing   chan struct{} // closed by Close: wakes requests in SetLatency
	inflight  sync.WaitGroup
	srv       *http.Server
	serveDone chan struct{}
	closeOnce sync.Once
}

type group struct {
	name      string
	created   int64
	retention int32
	class     string
	kms       string
	tags      map[string]string
	streams   map[string]*stream
}

type stream struct {
	name    string
	created int64

	mu            sync.Mutex // everything below; held for a whole PutLogEvents
	events        []storedEvent
	bytes         int64
	lastIngestion int64
	puts          uint64   // successful PutLogEvents calls
	prevToken     string   // the token that was current before the last successful put
	lastHash      [32]byte // messages of the last successful put
}

type storedEvent struct {
	Event
	id uint64
}

// New returns a Server with no log groups.
func New(opts Options) *Server {
	s := &Server{
		region:    opts.Region,
		account:   opts.AccountID,
		now:       opts.Now,
		groups:    map[string]*group{},
		calls:     map[string]int{},
		throttled: map[string]int{},
		closing:   make(chan struct{}),
	}
	if s.region == "" {
		s.region = "us-east-1"
	}
	if s.account == "" {
		s.account = "123456789012"
	}
	if s.now == nil {
		s.now = time.Now
	}
	seed := opts.Seed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	s.rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	s.initQuotas(opts)
	s.SetFailures(opts.FailureRate, opts.FailureStatus)
	s.SetLatency(opts.Latency)
	s.SetDropResponses(opts.DropRate)
	s.SetLegacySequenceTokens(opts.LegacySequenceTokens)
	s.SetDenyAll(opts.DenyAll)
	s.SetReadDelay(opts.ReadDelay)
	s.SetSparsePages(opts.SparsePages)
	return s
}

func (s *Server) nowMs() int64 { return s.now().UnixMilli() }

// Start listens on addr (for example "127.0.0.1:0") and serves in the
// background. It returns the base URL, "http://HOST:PORT"; an unspecified
// host (":0", "0.0.0.0:0") is reported as 127.0.0.1.
func (s *Server) Start(addr string) (string, error) {
	s.lifeMu.Lock()
	defer s.lifeMu.Unlock()
	if s.closed {
		return "", errors.New("cloudwatchlogs emulator: Start after Close")
	}
	if s.started {
		return "", errors.New("cloudwatchlogs emulator: already started")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", err
	}
	s.started = true
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 30 * time.Second}
	s.serveDone = make(chan struct{})
	srv, done := s.srv, s.serveDone
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	tcp := ln.Addr().(*net.TCPAddr)
	host := tcp.IP.String()
	if tcp.IP.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, fmt.Sprint(tcp.Port)), nil
}

// Close stops the listener started by Start, closes its connections, wakes
// requests sleeping in SetLatency and waits for every request in progress to
// return. Later requests through ServeHTTP get ServiceUnavailableException.
// Close is idempotent.
func (s *Server) Close() error {
	var err error
	s.closeOnce.Do(func() {
		s.lifeMu.Lock()
		s.closed = true
		close(s.closing)
		srv, done := s.srv, s.serveDone
		s.lifeMu.Unlock()
		if srv != nil {
			err = srv.Close()
			<-done
		}
		s.inflight.Wait()
	})
	return err
}

// SetThrottle limits PutLogEvents to callsPerSecond (a token bucket holding
// one second's worth of calls, refilled continuously); calls above the rate
// get ThrottlingException (400). 0 or less turns throttling off. It is
// SetQuota("PutLogEvents", callsPerSecond).
func (s *Server) SetThrottle(callsPerSecond int) { s.SetQuota("PutLogEvents", callsPerSecond) }

// SetFailures makes that fraction (0..1) of all requests fail before they do
// anything: status 503 answers ServiceUnavailableException, any other 5xx
// status InternalFailure with that status. A status outside 500..599 means 503.
func (s *Server) SetFailures(rate float64, status int) {
	if status < 500 || status > 599 {
		status = http.StatusServiceUnavailable
	}
	s.swMu.Lock()
	defer s.swMu.Unlock()
	s.failRate = clamp01(rate)
	s.failStatus = status
}

// SetLatency delays every request by d before it is looked at.
func (s *Server) SetLatency(d time.Duration) {
	s.swMu.Lock()
	defer s.swMu.Unlock()
	s.latency = max(d, 0)
}

// SetDropResponses makes that fraction (0..1) of PutLogEvents calls do their
// work (store the events) and then close the connection without a response.
func (s *Server) SetDropResponses(rate float64) {
	s.swMu.Lock()
	defer s.swMu.Unlock()
	s.dropRate = clamp01(rate)
}

// SetLegacySequenceTokens turns on the pre-2023 sequence token rules for
// PutLogEvents (see the package documentation).
func (s *Server) SetLegacySequenceTokens(on bool) {
	s.swMu.Lock()
	defer s.swMu.Unlock()
	s.legacyTokens = on
}

// SetDenyAll makes every request fail with the error code given, for example
// "AccessDeniedException" or "UnrecognizedClientException"; "" turns it off.
func (s *Server) SetDenyAll(code string) {
	s.swMu.Lock()
	defer s.swMu.Unlock()
	s.denyCode = code
}

// SetReadDelay makes stored events readable through GetLogEvents and
// FilterLogEvents only once d has passed since their ingestion (by
// Options.Now), as events reach CloudWatch Logs' readers a moment after the
// call that stored them. 0 turns it off. Events and Groups are not delayed.
func (s *Server) SetReadDelay(d time.Duration) {
	s.swMu.Lock()
	defer s.swMu.Unlock()
	s.readDelay = max(d, 0)
}

// SetSparsePages makes forward GetLogEvents pages (startFromHead, or an
// f/ token) short and uneven, as the service's pages may be: while events
// remain, an empty page comes first, then a page of at most n events, and
// so on. A reader that stops at an empty page, instead of when the token
// comes back unchanged, misses events. 0 turns it off.
func (s *Server) SetSparsePages(n int) {
	s.swMu.Lock()
	defer s.swMu.Unlock()
	s.sparsePages = max(n, 0)
}

func (s *Server) readSwitches() (delay time.Duration, sparse int) {
	s.swMu.Lock()
	defer s.swMu.Unlock()
	return s.readDelay, s.sparsePages
}

func clamp01(f float64) float64 {
	switch {
	case f != f || f <= 0: // NaN or negative
		return 0
	case f >= 1:
		return 1
	}
	return f
}

// Calls returns how many requests named op (for example "PutLogEvents") the
// server received, whatever their outcome. Requests without a recognisable
// X-Amz-Target count under "".
func (s *Server) Calls(op string) int {
	s.callsMu.Lock()
	defer s.callsMu.Unlock()
	return s.calls[op]
}

func (s *Server) countCall(op string) {
	s.callsMu.Lock()
	s.calls[op]++
	s.callsMu.Unlock()
}

// Groups describes every log group, sorted by name.
func (s *Server) Groups() []GroupInfo {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]GroupInfo, 0, len(s.groups))
	for _, g := range s.groups {
		gi := GroupInfo{
			Name:            g.name,
			CreationTime:    g.created,
			RetentionInDays: g.retention,
			Class:           g.class,
			KmsKeyID:        g.kms,
			Tags:            map[string]string{},
		}
		for k, v := range g.tags {
			gi.Tags[k] = v
		}
		for _, st := range g.streams {
			si := st.info()
			gi.StoredBytes += si.StoredBytes
			gi.Streams = append(gi.Streams, si)
		}
		sort.Slice(gi.Streams, func(i, j int) bool { return gi.Streams[i].Name < gi.Streams[j].Name })
		out = append(out, gi)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Events returns a copy of a stream's events in the order GetLogEvents reads
// them: by timestamp, and in arrival order for equal timestamps. It returns
// nil when the group or the stream does not exist.
func (s *Server) Events(groupName, streamName string) []Event {
	s.mu.RLock()
	g := s.groups[groupName]
	var st *stream
	if g != nil {
		st = g.streams[streamName]
	}
	s.mu.RUnlock()
	if st == nil {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	out := make([]Event, len(st.events))
	for i, e := range st.events {
		out[i] = e.Event
	}
	return out
}

func (st *stream) info() StreamInfo {
	st.mu.Lock()
	defer st.mu.Unlock()
	si := StreamInfo{
		Name:              st.name,
		CreationTime:      st.created,
		Events:            len(st.events),
		StoredBytes:       st.bytes,
		LastIngestionTime: st.lastIngestion,
	}
	if n := len(st.events); n > 0 {
		si.FirstEventTimestamp = st.events[0].Timestamp
		si.LastEventTimestamp = st.events[n-1].Timestamp
	}
	return si
}

// insert adds a batch sorted by timestamp, keeping the stream sorted by
// timestamp and, for equal timestamps, in arrival order.
func (st *stream) insert(batch []storedEvent) {
	if len(batch) == 0 {
		return
	}
	n := len(st.events)
	if n == 0 || st.events[n-1].Timestamp <= batch[0].Timestamp {
		st.events = append(st.events, batch...)
		return
	}
	k := sort.Search(n, func(i int) bool { return st.events[i].Timestamp > batch[0].Timestamp })
	tail := append([]storedEvent(nil), st.events[k:]...)
	st.events = st.events[:k]
	i, j := 0, 0
	for i < len(tail) && j < len(batch) {
		if batch[j].Timestamp < tail[i].Timestamp {
			st.events = append(st.events, batch[j])
			j++
		} else {
			st.events = append(st.events, tail[i])
			i++
		}
	}
	st.events = append(st.events, tail[i:]...)
	st.events = append(st.events, batch[j:]...)
}

// token is the sequence token a stream expects next; "" before its first put.
func (st *stream) token() string {
	if st.puts == 0 {
		return ""
	}
	return seqToken(st.puts)
}

func seqToken(n uint64) string { return fmt.Sprintf("49%054d", n) }

func (s *Server) groupArn(name string) string {
	return fmt.Sprintf("arn:aws:logs:%s:%s:log-group:%s", s.region, s.account, name)
}

func (s *Server) streamArn(groupName, streamName string) string {
	return s.groupArn(groupName) + ":log-stream:" + streamName
}
