package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tinylib/msgp/msgp"

	"github.com/logfwd/forwarder/internal/testseed"
)

// record is one log record a client sends: a unique id, the namespace and
// pod that name its CloudWatch group and stream, a line of text and, when
// set, an event time.
type record struct {
	ID, NS, Pod, Log string
	Time             time.Time // zero: the forward client sends now; HTTP sends no time field
}

// json is the record as the HTTP client sends it, one compact object.
func (r record) json() []byte {
	b := make([]byte, 0, 64+len(r.Log))
	b = append(b, `{"id":`...)
	b = strconv.AppendQuote(b, r.ID)
	b = append(b, `,"ns":`...)
	b = strconv.AppendQuote(b, r.NS)
	b = append(b, `,"pod":`...)
	b = strconv.AppendQuote(b, r.Pod)
	b = append(b, `,"log":`...)
	b = strconv.AppendQuote(b, r.Log)
	if !r.Time.IsZero() {
		b = append(b, `,"time":`...)
		b = strconv.AppendQuote(b, r.Time.UTC().Format(time.RFC3339Nano))
	}
	return append(b, '}')
}

// appendEntry appends the record as a forward entry [EventTime, map].
func (r record) appendEntry(b []byte) []byte {
	t := r.Time
	if t.IsZero() {
		t = time.Now()
	}
	b = msgp.AppendArrayHeader(b, 2)
	// EventTime: fixext 8 of type 0, seconds and nanoseconds big-endian.
	sec, nsec := uint32(t.Unix()), uint32(t.Nanosecond())
	b = append(b, 0xd7, 0x00,
		byte(sec>>24), byte(sec>>16), byte(sec>>8), byte(sec),
		byte(nsec>>24), byte(nsec>>16), byte(nsec>>8), byte(nsec))
	b = msgp.AppendMapHeader(b, 4)
	for _, kv := range [][2]string{{"id", r.ID}, {"ns", r.NS}, {"pod", r.Pod}, {"log", r.Log}} {
		b = msgp.AppendString(b, kv[0])
		b = msgp.AppendString(b, kv[1])
	}
	return b
}

// ledger is what the clients sent and what was acknowledged to them.
type ledger struct {
	mu    sync.Mutex
	state map[string]uint8 // id → sent or acked
	acked int
}

const (
	stateSent  = 1
	stateAcked = 2
)

func newLedger() *ledger { return &ledger{state: map[string]uint8{}} }

func (l *ledger) sent(recs []record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range recs {
		if l.state[r.ID] == 0 {
			l.state[r.ID] = stateSent
		}
	}
}

func (l *ledger) ack(recs []record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range recs {
		if l.state[r.ID] != stateAcked {
			l.state[r.ID] = stateAcked
			l.acked++
		}
	}
}

// counts returns how many records were sent and how many acknowledged.
func (l *ledger) counts() (sent, acked int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.state), l.acked
}

// snapshot copies the ledger: id → acknowledged.
func (l *ledger) snapshot() map[string]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := make(map[string]bool, len(l.state))
	for id, s := range l.state {
		m[id] = s == stateAcked
	}
	return m
}

// clientOpts shapes what a client sends.
type clientOpts struct {
	Prefix     string        // of record ids, chunk ids and Idempotency-Keys
	NSs, Pods  []string      // a batch is of one namespace (one tag); pods rotate
	Batch      int           // records per forward chunk or HTTP POST
	Pause      time.Duration // between batches
	Batches    int           // 0: until stopped
	AckTimeout time.Duration // forward: no ack after this and the chunk is sent again
	GiveUp     time.Duration // after stop, how long the batch in flight is still retried
	// Sticky, with several forward addresses, is how long a batch that was
	// not acknowledged is sent again to the same address before the client
	// moves to the next: a replica that was killed comes back and knows the
	// chunk; one that stopped for good had not stored it.
	Sticky   time.Duration
	LogBytes int // when set, each line ends with about this many random hex digits
}

func (o *clientOpts) setDefaults() {
	if len(o.NSs) == 0 {
		o.NSs = []string{"shop", "pay", "auth"}
	}
	if len(o.Pods) == 0 {
		o.Pods = []string{"web-0", "web-1", "api-0", "worker-0"}
	}
	if o.Batch == 0 {
		o.Batch = 50
	}
	if o.AckTimeout == 0 {
		o.AckTimeout = 60 * time.Second
	}
	if o.GiveUp == 0 {
		o.GiveUp = 60 * time.Second
	}
}

var words = strings.Fields(`GET POST PUT /api/v1/orders /api/v1/users /healthz status=200 status=404
status=500 latency_ms user_id request_id cache miss hit upstream timeout retry payment accepted
declined session opened closed shard replica leader follower`)

// gen makes records with unique ids.
type gen struct {
	opts clientOpts
	rng  *rand.Rand
	n    int
	b    int
}

func newGen(opts clientOpts, seed uint64) *gen {
	return &gen{opts: opts, rng: rand.New(rand.NewPCG(seed, seed*31+7))}
}

// batch returns the next batch: its tag and records.
func (g *gen) batch() (string, []record) {
	ns := g.opts.NSs[g.b%len(g.opts.NSs)]
	g.b++
	recs := make([]record, g.opts.Batch)
	for i := range recs {
		var line strings.Builder
		for j := 0; j < 8+g.rng.IntN(8); j++ {
			line.WriteString(words[g.rng.IntN(len(words))])
			line.WriteByte(' ')
		}
		fmt.Fprintf(&line, "%x", g.rng.Uint64())
		for k := 0; k < g.opts.LogBytes/16; k++ {
			fmt.Fprintf(&line, "%016x", g.rng.Uint64())
		}
		recs[i] = record{
			ID:  fmt.Sprintf("%s-%07d", g.opts.Prefix, g.n),
			NS:  ns,
			Pod: g.opts.Pods[g.n%len(g.opts.Pods)],
			Log: line.String(),
		}
		g.n++
	}
	return "pod." + ns, recs
}

// clientStats is what one client saw.
type clientStats struct {
	Batches    int            // batches acknowledged
	Records    int            // records acknowledged
	Attempts   int            // sends, first ones included
	Reconnects int            // forward: connections made after the first
	Failovers  int            // forward: moves to the next address
	Abandoned  int            // batches not acknowledged by the end
	MaxAckWait time.Duration  // first send of a batch → its acknowledgement
	Status     map[int]int    // HTTP: answers by status
	NoRetryAft int            // HTTP: 503 answers without Retry-After
	LastBody   map[int]string // HTTP: the last answer's body, by status
	Errors     []string       // answers no client should get
}

func (s *clientStats) add(o clientStats) {
	s.Batches += o.Batches
	s.Records += o.Records
	s.Attempts += o.Attempts
	s.Reconnects += o.Reconnects
	s.Failovers += o.Failovers
	s.Abandoned += o.Abandoned
	s.MaxAckWait = max(s.MaxAckWait, o.MaxAckWait)
	for k, v := range o.Status {
		if s.Status == nil {
			s.Status = map[int]int{}
		}
		s.Status[k] += v
	}
	s.NoRetryAft += o.NoRetryAft
	for k, v := range o.LastBody {
		if s.LastBody == nil {
			s.LastBody = map[int]string{}
		}
		s.LastBody[k] = v
	}
	s.Errors = append(s.Errors, o.Errors...)
}

// client is a forward or an HTTP client: it sends batch after batch and
// sends a batch again, identical (same chunk id or Idempotency-Key), until
// it is acknowledged.
type client struct {
	opts clientOpts
	led  *ledger
	gen  *gen
	send func(tag, key string, recs []record, payload []byte) bool // true: acknowledged
	pack func(tag, key string, recs []record) []byte
	stop <-chan struct{}

	mu      sync.Mutex
	stats   clientStats
	waiting time.Time // first send of the batch in flight; zero between batches
	close   func()
}

// pending is how long the batch in flight has waited for its
// acknowledgement (0 between batches).
func (c *client) pending() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.waiting.IsZero() {
		return 0
	}
	return time.Since(c.waiting)
}

func (c *client) statsCopy() clientStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.Status = map[int]int{}
	for k, v := range c.stats.Status {
		s.Status[k] = v
	}
	s.Errors = append([]string(nil), c.stats.Errors...)
	s.LastBody = map[int]string{}
	for k, v := range c.stats.LastBody {
		s.LastBody[k] = v
	}
	return s
}

func (c *client) update(f func(*clientStats)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f(&c.stats)
}

func (c *client) stopped() bool {
	select {
	case <-c.stop:
		return true
	default:
		return false
	}
}

// sleep waits d, or less if the client is stopped.
func (c *client) sleep(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-c.stop:
	}
}

func (c *client) run() {
	defer func() {
		if c.close != nil {
			c.close()
		}
	}()
	for b := 0; c.opts.Batches == 0 || b < c.opts.Batches; b++ {
		if c.stopped() {
			return
		}
		tag, recs := c.gen.batch()
		key := fmt.Sprintf("%s-b%06d", c.opts.Prefix, b)
		payload := c.pack(tag, key, recs)
		c.led.sent(recs)
		first := time.Now()
		c.update(func(*clientStats) { c.waiting = first })
		var stoppedAt time.Time
		for {
			c.update(func(s *clientStats) { s.Attempts++ })
			if c.send(tag, key, recs, payload) {
				c.led.ack(recs)
				wait := time.Since(first)
				c.update(func(s *clientStats) {
					s.Batches++
					s.Records += len(recs)
					s.MaxAckWait = max(s.MaxAckWait, wait)
					c.waiting = time.Time{}
				})
				break
			}
			if c.stopped() {
				if stoppedAt.IsZero() {
					stoppedAt = time.Now()
				}
				if time.Since(stoppedAt) > c.opts.GiveUp {
					c.update(func(s *clientStats) { s.Abandoned++ })
					return
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		if c.opts.Pause > 0 {
			c.sleep(c.opts.Pause)
		}
	}
}

// newForwardClient sends PackedForward messages with a chunk id to the
// first of addrs and counts a chunk acknowledged only once {"ack": id} came
// back. With more addresses it fails over, as Fluent Bit's upstreams do: a
// chunk not acknowledged for opts.Sticky goes to the next address.
func newForwardClient(addrs []string, led *ledger, opts clientOpts, seed uint64, stop <-chan struct{}) *client {
	c := &client{opts: opts, led: led, gen: newGen(opts, seed), stop: stop}
	var conn net.Conn
	var rd *msgp.Reader
	dials, cur := 0, 0
	var failingSince time.Time // when the chunk in flight was first not acknowledged here
	drop := func() {
		if conn != nil {
			conn.Close()
			conn, rd = nil, nil
		}
	}
	c.close = drop
	c.pack = func(tag, key string, recs []record) []byte {
		var entries []byte
		for _, r := range recs {
			entries = r.appendEntry(entries)
		}
		b := msgp.AppendArrayHeader(nil, 3)
		b = msgp.AppendString(b, tag)
		b = msgp.AppendBytes(b, entries)
		b = msgp.AppendMapHeader(b, 2)
		b = msgp.AppendString(b, "size")
		b = msgp.AppendInt(b, len(recs))
		b = msgp.AppendString(b, "chunk")
		return msgp.AppendString(b, key)
	}
	try := func(key string, payload []byte) bool {
		if conn == nil {
			nc, err := net.DialTimeout("tcp", addrs[cur], time.Second)
			if err != nil {
				return false
			}
			dials++
			if dials > 1 {
				c.update(func(s *clientStats) { s.Reconnects++ })
			}
			conn, rd = nc, msgp.NewReader(nc)
		}
		conn.SetWriteDeadline(time.Now().Add(c.opts.AckTimeout))
		if _, err := conn.Write(payload); err != nil {
			drop()
			return false
		}
		conn.SetReadDeadline(time.Now().Add(c.opts.AckTimeout))
		got, err := readAck(rd)
		if err != nil {
			drop()
			return false
		}
		if got != key {
			c.update(func(s *clientStats) {
				s.Errors = append(s.Errors, fmt.Sprintf("forward: ack %q for chunk %q", got, key))
			})
			drop()
			return false
		}
		return true
	}
	c.send = func(tag, key string, recs []record, payload []byte) bool {
		if try(key, payload) {
			failingSince = time.Time{}
			return true
		}
		now := time.Now()
		if failingSince.IsZero() {
			failingSince = now
		}
		if len(addrs) > 1 && now.Sub(failingSince) > opts.Sticky {
			drop()
			cur, failingSince = (cur+1)%len(addrs), now
			c.update(func(s *clientStats) { s.Failovers++ })
		}
		return false
	}
	return c
}

// readAck reads one {"ack": id} answer.
func readAck(rd *msgp.Reader) (string, error) {
	n, err := rd.ReadMapHeader()
	if err != nil {
		return "", err
	}
	var id string
	for range n {
		k, err := rd.ReadString()
		if err != nil {
			return "", err
		}
		if k != "ack" {
			if err := rd.Skip(); err != nil {
				return "", err
			}
			continue
		}
		if id, err = rd.ReadString(); err != nil {
			return "", err
		}
	}
	return id, nil
}

// newHTTPClient POSTs NDJSON batches with an Idempotency-Key to addr and
// counts a batch acknowledged only on 200. A 503 is retried after its
// Retry-After.
func newHTTPClient(addr string, led *ledger, opts clientOpts, seed uint64, stop <-chan struct{}) *client {
	c := &client{opts: opts, led: led, gen: newGen(opts, seed), stop: stop}
	tr := &http.Transport{MaxIdleConnsPerHost: 2}
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	c.close = tr.CloseIdleConnections
	c.pack = func(tag, key string, recs []record) []byte {
		var b bytes.Buffer
		for _, r := range recs {
			b.Write(r.json())
			b.WriteByte('\n')
		}
		return b.Bytes()
	}
	c.send = func(tag, key string, recs []record, payload []byte) bool {
		code, retryAfter, body, err := postNDJSON(hc, addr, tag, key, payload)
		if err != nil {
			return false
		}
		c.update(func(s *clientStats) {
			if s.Status == nil {
				s.Status, s.LastBody = map[int]int{}, map[int]string{}
			}
			s.Status[code]++
			s.LastBody[code] = strings.TrimSpace(body)
		})
		switch code {
		case http.StatusOK:
			return true
		case http.StatusServiceUnavailable:
			wait := time.Second
			if secs, err := strconv.Atoi(retryAfter); err == nil {
				wait = time.Duration(secs) * time.Second
			} else {
				c.update(func(s *clientStats) { s.NoRetryAft++ })
			}
			c.sleep(min(wait, 2*time.Second))
			return false
		default:
			c.update(func(s *clientStats) {
				if len(s.Errors) < 10 {
					s.Errors = append(s.Errors, fmt.Sprintf("http: %d %s", code, strings.TrimSpace(body)))
				}
			})
			c.sleep(time.Second)
			return false
		}
	}
	return c
}

// postNDJSON POSTs payload to /v1/logs/{tag} and returns the status, the
// Retry-After header and the answer's body.
func postNDJSON(hc *http.Client, addr, tag, key string, payload []byte) (int, string, string, error) {
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/logs/"+tag, bytes.NewReader(payload))
	if err != nil {
		return 0, "", "", err
	}
	req.Header.Set("Content-Type", "application/x-ndjson")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	res, err := hc.Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 4096))
	if err != nil {
		return 0, "", "", err
	}
	return res.StatusCode, res.Header.Get("Retry-After"), string(b), nil
}

// load is a set of clients sending at once.
type load struct {
	stopCh  chan struct{}
	wg      sync.WaitGroup
	fwd     []*client
	http    []*client
	stopped bool
}

// startLoad starts nFwd forward clients and nHTTP HTTP clients against
// cfg's inputs; their ids start with opts.Prefix and "f" or "h" and a number.
// Their records' sizes and fields come from a seed the test's log shows.
func startLoad(t testing.TB, cfg fwdConfig, led *ledger, nFwd, nHTTP int, opts clientOpts) *load {
	opts.setDefaults()
	l := &load{stopCh: make(chan struct{})}
	seed := uint64(testseed.Seed(t, "E2E_LOAD_SEED", "the clients' records"))
	for i := range nFwd {
		o := opts
		o.Prefix = fmt.Sprintf("%sf%d", opts.Prefix, i)
		l.fwd = append(l.fwd, newForwardClient([]string{cfg.Forward}, led, o, seed+uint64(i), l.stopCh))
	}
	for i := range nHTTP {
		o := opts
		o.Prefix = fmt.Sprintf("%sh%d", opts.Prefix, i)
		l.http = append(l.http, newHTTPClient(cfg.HTTP, led, o, seed+100+uint64(i), l.stopCh))
	}
	for _, c := range append(append([]*client(nil), l.fwd...), l.http...) {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			c.run()
		}()
	}
	return l
}

// halt stops the clients: no new batch; the one in flight is still sent
// until acknowledged or GiveUp passes.
func (l *load) halt() {
	if !l.stopped {
		close(l.stopCh)
		l.stopped = true
	}
	l.wg.Wait()
}

// wait waits for clients with a fixed number of batches to finish.
func (l *load) wait() { l.wg.Wait() }

// stats sums what the forward and the HTTP clients saw.
func (l *load) stats() (fwd, http clientStats) {
	for _, c := range l.fwd {
		fwd.add(c.statsCopy())
	}
	for _, c := range l.http {
		http.add(c.statsCopy())
	}
	return fwd, http
}

// String is a one-line summary of a client kind's statistics.
func (s clientStats) String() string {
	out := fmt.Sprintf("%d records in %d batches acked (%d sends, %d abandoned, longest ack wait %v",
		s.Records, s.Batches, s.Attempts, s.Abandoned, s.MaxAckWait.Round(time.Millisecond))
	if s.Reconnects > 0 {
		out += fmt.Sprintf(", %d reconnects", s.Reconnects)
	}
	if len(s.Status) > 0 {
		st, _ := json.Marshal(s.Status)
		out += fmt.Sprintf(", statuses %s", st)
	}
	if s.NoRetryAft > 0 {
		out += fmt.Sprintf(", %d 503s without Retry-After", s.NoRetryAft)
	}
	return out + ")"
}
