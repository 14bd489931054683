package forward

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tinylib/msgp/msgp"

	"github.com/logfwd/forwarder/inputs"
	"github.com/logfwd/forwarder/wal"
)

// conn is one client connection: it reads one message at a time, stores
// it, acks it, and only then reads the next. While the WAL is full the
// store waits, nothing is read, and the client feels TCP backpressure.
type conn struct {
	s      *Server
	nc     net.Conn
	remote string
	dec    decoder
	ctx    context.Context // ends when the server stops: reading and decoding stop (waits for room too)
	hold   *inputs.Hold    // what the connection holds of the inputs' budget

	buf      []byte // bytes read; the pending ones start at start
	start    int
	consumed int // length of the message last returned by next
	fr       framer
	read     int64 // bytes read from the connection, for error positions
	// raw counts the bytes read from the socket, under TLS too: a
	// connection that sent none before it closed was a port check.
	raw *countingConn
	// readErr is what a read that also returned bytes ended with (a TLS
	// connection returns a last message and the client's close together):
	// the messages in those bytes are taken first, then it ends the
	// connection as it would have.
	readErr error
	// own is where a connection with nothing pending reads: a small buffer
	// of its own, so that idle connections hold nothing of the budget. A
	// message that does not fit moves to a buffer reserved from it
	// (reserved is then true), which goes back once nothing is pending.
	own      [ownBuf]byte
	reserved bool
	msgBy    time.Time // when the message being read must be whole: also the end of a wait for room

	slot *inputs.Slot
	// handshakeBy is when the handshake (TLS, HELO/PING/PONG) must be over;
	// zero once it is, or when there is none.
	handshakeBy time.Time

	mu         sync.Mutex
	busy       bool // between a message's first byte and its ack
	gone       bool // the server is stopping
	ended      bool // the server reads no more from it (see endReads)
	discarding bool // close reads what the client still sends, until closeLinger
}

func (s *Server) newConn(nc net.Conn, slot *inputs.Slot) *conn {
	if s.tune != nil {
		s.tune(nc)
	}
	raw := &countingConn{Conn: nc}
	nc = raw
	if s.tls != nil {
		nc = tls.Server(nc, s.tls)
	}
	max := int(s.cfg.MaxMessageBytes)
	hold := s.p.Budget.Hold("forward")
	c := &conn{s: s, nc: nc, raw: raw, remote: nc.RemoteAddr().String(), slot: slot, hold: hold,
		dec: decoder{maxUnpacked: 4 * max, maxRecords: s.cfg.MaxRecordsPerMessage, now: time.Now, hold: hold}}
	c.buf = c.own[:0]
	// Evicted while idle, it stops as at a stop of the server: what is in
	// its socket is read for shutdownLinger (a message begun is finished,
	// stored and acknowledged), then it closes without a reset.
	slot.OnIdleEviction(c.stopReading)
	if s.tls != nil || s.cfg.SharedKey != "" {
		c.handshakeBy = time.Now().Add(time.Duration(s.cfg.HandshakeTimeout))
	} else {
		slot.Ready() // nothing to wait for: a connection like any other
	}
	return c
}

// shutdownLinger is how long a connection of a stopping server waits for
// the next message: what its client wrote before the listener closed may
// still be in the socket, and is read, stored and acknowledged, not
// dropped; then the connection closes.
var shutdownLinger = 250 * time.Millisecond // a variable for tests

// fluentBitEmptyChunk is the chunk id Fluent Bit's forward output sends
// with every message in Message mode (a Tag built from the records, with
// Require_ack_response): the first 16 bytes, in hex, of the SHA-512 of no
// bytes, where it means to hash each record. An id every message shares
// names none of them: those messages are acknowledged and stored without
// deduplication (README, the forward input).
const fluentBitEmptyChunk = "cf83e1357eefb8bdf1542850d66d8007"

// stopReading is the server stopping: an idle connection reads only what
// arrives within shutdownLinger, one in the middle of a message finishes
// it (within the server's drain time).
func (c *conn) stopReading() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gone = true
	if !c.busy {
		c.nc.SetReadDeadline(time.Now().Add(shutdownLinger))
	}
}

// endReads is the server's time for reading at a stop running out: the
// read in progress ends, and no other begins.
// A connection being closed keeps its closing discard (see close), which
// its own deadline bounds: cut short, the close would reset the connection.
func (c *conn) endReads() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ended = true
	if !c.discarding {
		c.nc.SetReadDeadline(time.Now())
	}
}

// readUntil sets the deadline of the next read, unless reading has ended.
// Once the server stops, a connection between messages reads for
// shutdownLinger at most, whenever stopReading came.
func (c *conn) readUntil(t time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return false
	}
	if linger := time.Now().Add(shutdownLinger); c.gone && !c.busy && (t.IsZero() || t.After(linger)) {
		t = linger
	}
	c.nc.SetReadDeadline(t)
	return true
}

func (c *conn) readsEnded() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ended
}

// close ends the connection. A stopping server first half-closes it and
// reads on for a moment what the client still sends: closing a socket with
// unread bytes in it resets the connection, and a reset can destroy acks
// on their way to the client, which would then send those chunks again.
func (c *conn) close() {
	if c.closing() {
		if cw, ok := c.nc.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
			c.mu.Lock()
			c.discarding = true
			c.nc.SetReadDeadline(time.Now().Add(closeLinger))
			c.mu.Unlock()
			io.Copy(io.Discard, c.nc)
		}
	}
	c.nc.Close()
}

func (c *conn) setBusy(b bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.busy = b
}

// closing reports whether the server is closing the connection.
func (c *conn) closing() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gone
}

// serve reads, decodes and stores messages until the connection ends.
// ctx ends reading and decoding (the server is stopping), storeCtx a store
// (a while later, so that messages being stored are acknowledged).
func (c *conn) serve(ctx, storeCtx context.Context) {
	c.s.track(c, true)
	defer c.s.track(c, false)
	defer c.close()
	defer c.hold.ReleaseAll()
	defer c.dropBuf()
	// Waits for memory and decoding go on while the server stops, until it
	// gives up on stores too: a message that has arrived is finished.
	c.ctx = storeCtx
	log := c.s.log.With("remote", c.remote)
	if !c.handshakeBy.IsZero() {
		if err := c.handshake(); err != nil {
			c.handshakeFailed(err)
			return
		}
	}
	for {
		msg, err := c.next()
		if err != nil {
			var bm *badMessage
			switch {
			case c.slot.Evicted():
				if n, ok := c.s.rejects.Allow("evicted_idle", time.Now()); ok {
					c.s.log.Warn("closed an idle connection to make room for a new one: max_connections is reached; raise it if these are real clients (each client node keeps connections to every replica)",
						"remote", c.remote, "max_connections", c.s.cfg.MaxConnections, "same_reason_not_logged_in_last_minute", n)
				}
				c.s.p.Metrics.Rejected.WithLabelValues("forward", "evicted").Inc() // once said
			case errors.As(err, &bm):
				c.reject(bm.reason, bm)
			case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed):
				log.Debug("connection closed")
			default:
				log.Debug("connection ended", "error", err)
			}
			return
		}
		dctx, cancel := context.WithDeadline(storeCtx, c.msgBy)
		c.dec.ctx = dctx
		m, err := c.dec.decode(msg)
		cancel()
		c.dec.ctx = nil
		if err != nil {
			var bm *badMessage
			if errors.As(err, &bm) {
				c.reject(bm.reason, bm)
			} else {
				log.Debug("connection ended", "error", err)
			}
			return
		}
		// The records are decoded: the message's bytes are no longer needed.
		c.drop()
		var id wal.AppendOptions
		if m.chunk != "" && m.chunk != fluentBitEmptyChunk {
			id.ChunkID, id.ChunkDigest = inputs.ForwardChunkID(m.chunk), m.digest()
		}
		res, err := c.s.p.Store(storeCtx, "forward", m.records, id)
		if errors.Is(err, wal.ErrChunkConflict) {
			// The client reused a chunk id for another message: stored
			// without deduplication rather than acknowledged and dropped.
			c.s.p.Metrics.ChunkReused.WithLabelValues("forward").Inc()
			if n, ok := c.s.rejects.Allow("chunk_reused", time.Now()); ok {
				log.Warn("a chunk id stored within dedup_window for another message came again: the client reuses chunk ids; stored without deduplication (a re-sent message with a reused id may be stored twice)",
					"tag", m.tag, "chunk", m.chunk, "records", len(m.records), "same_reason_not_logged_in_last_minute", n)
			}
			res, err = c.s.p.Store(storeCtx, "forward", m.records, wal.AppendOptions{})
		}
		if err == nil && m.invalid > 0 && res.First != 0 && !res.Duplicate {
			// Counted as HTTP counts them: records stored, not those of an
			// unrouted tag or of a re-sent chunk stored before.
			c.s.p.Metrics.InvalidUTF8.WithLabelValues("forward").Add(float64(m.invalid))
		}
		if err == nil && m.nils > 0 {
			// Skipped as Fluentd's in_forward skips them: counted, and
			// said once a minute, since the client sent nothing to store.
			c.s.p.Metrics.NilRecords.WithLabelValues("forward").Add(float64(m.nils))
			if n, ok := c.s.rejects.Allow("nil_record", time.Now()); ok {
				log.Warn("entries with a nil record skipped (nothing to store): the client sends [time, nil]", "tag", m.tag, "nil_records", m.nils, "same_reason_not_logged_in_last_minute", n)
			}
		}
		if err == nil && m.notMaps > 0 {
			// Skipped, counted and said: a record is a map of fields.
			c.s.p.Metrics.NotMaps.WithLabelValues("forward").Add(float64(m.notMaps))
			if n, ok := c.s.rejects.Allow("not_map", time.Now()); ok {
				log.Warn("entries whose record is not a map skipped (not stored): the client sends [time, value] with a value that is no map of fields; the rest of its message is stored",
					"tag", m.tag, "records_skipped", m.notMaps, "first_type", m.notMap, "same_reason_not_logged_in_last_minute", n)
			}
		}
		tag, records := m.tag, len(m.records)
		m.release() // stored or not, the WAL holds no reference to the records
		if err != nil {
			// Not acknowledged: the client sends the chunk again.
			reason := "wal_error"
			switch {
			case errors.Is(err, wal.ErrNoSpace):
				reason = "no_space"
			case errors.Is(err, wal.ErrTooLarge):
				// Sent again, it is refused again: the client must cut it.
				reason = "too_large"
				if n, ok := c.s.rejects.Allow(reason+"_wal", time.Now()); ok {
					log.Warn("message larger than the WAL can ever hold (wal.max_bytes), not stored, not acknowledged: the client must send smaller chunks, or raise wal.max_bytes", "tag", tag, "records", records,
						"error", err, "same_reason_not_logged_in_last_minute", n)
				}
				c.s.p.Metrics.Rejected.WithLabelValues("forward", reason).Inc() // once said
				return
			case storeCtx.Err() != nil:
				reason = "shutting_down" // the stop's time to store ran out
			}
			if n, ok := c.s.rejects.Allow(reason, time.Now()); ok {
				log.Warn("message not stored, not acknowledged; the client will send it again", "tag", tag, "records", records,
					"error", err, "same_reason_not_logged_in_last_minute", n)
			}
			c.s.p.Metrics.Rejected.WithLabelValues("forward", reason).Inc() // once said
			return
		}
		if m.acked {
			if err := c.write(ack(m.chunk)); err != nil {
				log.Debug("ack not delivered; a re-sent chunk is acknowledged without being stored twice", "error", err)
				return
			}
		}
		c.setBusy(false) // a stopping server reads on what its client had sent
	}
}

// reject closes the connection over bad input, with a count and, at most
// once a minute per reason, a log line (which says how many more it stood for).
func (c *conn) reject(reason string, err error) {
	// Counted once said: what reads the count finds the line written.
	defer c.s.p.Metrics.Rejected.WithLabelValues("forward", reason).Inc()
	if n, ok := c.s.rejects.Allow(reason, time.Now()); ok {
		msg := "closing connection: bad input; nothing of the message was stored"
		switch reason {
		case reasonNoRoom:
			msg = "closing connection: no room in the inputs' memory budget (from memory_limit) for the message: it waited until its time was up, or all of the budget was held by connections waiting for more; nothing of it was stored or acknowledged, the client will send it again"
		case reasonOverBudget:
			msg = "closing connection: the message needs more memory than the inputs' budget gives one message: raise memory_limit or lower max_message_bytes; nothing of it was stored"
		}
		c.s.log.Warn(msg, "remote", c.remote, "reason", reason,
			"error", err, "message_at_byte", c.read-int64(len(c.buf)-c.start), "same_reason_not_logged_in_last_minute", n)
	}
}

func ack(chunk string) []byte {
	b := msgp.AppendMapHeader(nil, 1)
	b = msgp.AppendString(b, "ack")
	return msgp.AppendString(b, chunk)
}

func (c *conn) write(b []byte) error {
	c.nc.SetWriteDeadline(c.within(time.Now().Add(writeTimeout)))
	_, err := c.nc.Write(b)
	return err
}

// within is deadline (zero: none), or the handshake's deadline when that
// is sooner.
func (c *conn) within(deadline time.Time) time.Time {
	if !c.handshakeBy.IsZero() && (deadline.IsZero() || c.handshakeBy.Before(deadline)) {
		return c.handshakeBy
	}
	return deadline
}

// errEvicted is a handshake cut short because a newer connection needed
// its slot (inputs.Slots); errEvictedIdle, an idle connection's wait.
var (
	errEvicted     = errors.New("closed in the handshake: max_connections reached and a new connection took its slot")
	errEvictedIdle = errors.New("closed while idle: max_connections reached and a new connection took its slot")
)

// countingConn counts the bytes read from a connection.
type countingConn struct {
	net.Conn
	n atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// CloseWrite half-closes the connection, as the connection it wraps does.
func (c *countingConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// closedByPeer reports an error of a connection its peer closed: at the
// end of what it sent, or reset (it closed with bytes of ours unread), or
// before a write of ours.
func closedByPeer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// tlsError is a failed TLS handshake.
type tlsError struct{ err error }

func (e *tlsError) Error() string { return "TLS handshake: " + e.err.Error() }
func (e *tlsError) Unwrap() error { return e.err }

// handshake runs the TLS handshake (with tls) and HELO/PING/PONG (with
// shared_key), all within handshake_timeout of the accept, the PING within
// maxHandshakeBytes. Until it is over, the connection's slot may be taken
// by a newer connection (inputs.Slots).
func (c *conn) handshake() error {
	c.nc.SetDeadline(c.handshakeBy)
	if tc, ok := c.nc.(*tls.Conn); ok {
		if err := tc.Handshake(); err != nil {
			return &tlsError{err}
		}
	}
	if c.s.cfg.SharedKey != "" {
		h, err := newHandshake(c.s.cfg, c.s.hostname)
		if err != nil {
			return err
		}
		if err := c.write(h.helo()); err != nil {
			return err
		}
		msg, err := c.next()
		if err != nil {
			return err
		}
		pong, refused := h.ping(msg)
		if err := c.write(pong); err != nil {
			return err
		}
		c.setBusy(false)
		if refused != nil {
			return refused
		}
		if h.clientHost == c.s.hostname {
			// Accepted here, but Fluentd's out_forward and @fluent-org/logger
			// refuse a PONG that names their own host, and close quietly.
			if n, ok := c.s.rejects.Allow("same_hostname", time.Now()); ok {
				c.s.log.Warn("the client's PING names the same host as this input's PONG: Fluentd's out_forward and @fluent-org/logger refuse such a PONG and close the connection (a sidecar in the same pod shares the host name); set inputs.forward.self_hostname to another name",
					"remote", c.remote, "hostname", h.clientHost, "same_reason_not_logged_in_last_minute", n)
			}
		}
	}
	c.handshakeBy = time.Time{}
	c.nc.SetDeadline(time.Time{})
	if !c.slot.Ready() {
		return errEvicted
	}
	return nil
}

// handshakeFailed counts and logs a handshake that did not finish. A
// connection closed before it sent anything (a port check, a load
// balancer's probe) and one closed at shutdown are logged at debug only.
func (c *conn) handshakeFailed(err error) {
	var bm *badMessage
	switch {
	case c.slot.Evicted():
		if n, ok := c.s.rejects.Allow("evicted", time.Now()); ok {
			c.s.log.Warn("closed a connection still in its handshake to make room for a new one: max_connections is reached; raise it if these are real clients",
				"remote", c.remote, "max_connections", c.s.cfg.MaxConnections, "same_reason_not_logged_in_last_minute", n)
		}
		c.s.p.Metrics.Rejected.WithLabelValues("forward", "evicted").Inc() // once said, as reject
	case c.closing() && (errors.Is(err, net.ErrClosed) || errors.Is(err, errClosing)):
		c.s.log.Debug("connection closed in its handshake: the server is stopping", "remote", c.remote)
	case closedByPeer(err) && (c.raw.n.Load() == 0 || c.read == 0 && !errors.As(err, new(*tlsError))):
		// Closed, or reset (the HELO unread), before it sent a byte, or
		// a TLS probe's: after its TLS handshake, before a byte in it.
		c.s.log.Debug("connection closed before its handshake began", "remote", c.remote, "error", err)
	case isTimeout(err) || errors.As(err, &bm) && bm.reason == "timeout":
		c.reject("handshake_timeout", fmt.Errorf("handshake not over within handshake_timeout (%s): %w", time.Duration(c.s.cfg.HandshakeTimeout), err))
	case errors.As(err, new(*tlsError)):
		c.reject("tls_handshake", err)
	case errors.Is(err, errNotPing):
		c.reject("malformed", err) // not a client with wrong credentials
	default:
		c.reject("handshake", err)
	}
}

// next returns the next whole message, read within the size limit and
// the timeouts (in the handshake, within its own). The returned bytes are
// valid until the next call, or drop.
func (c *conn) next() ([]byte, error) {
	max, limit := int(c.s.cfg.MaxMessageBytes), "max_message_bytes"
	if !c.handshakeBy.IsZero() {
		max, limit = maxHandshakeBytes, "the handshake's limit"
	}
	c.drop()
	// Between messages a connection waits with no deadline but the
	// handshake's: a client that writes without waiting for acks would
	// lose the first message it writes into a connection closed under it
	// after a quiet spell. A dead peer is found by TCP keepalive; an idle
	// connection gives its slot to a new one when max_connections are open
	// (inputs.Slots).
	deadline := c.within(time.Time{})
	if c.closing() {
		deadline = time.Now().Add(shutdownLinger) // what is still in the socket, then no more
	}
	if c.handshakeBy.IsZero() {
		// Given way while idle (inputs.Slots), a connection finishes the one
		// message its socket held or its client wrote within shutdownLinger,
		// and no other: a client that streams on is not served above
		// max_connections.
		if c.slot.Evicted() {
			return nil, errEvictedIdle
		}
		if c.start == len(c.buf) {
			c.slot.Idle(true)
		}
	}
	started := false
	empty := 0 // reads in a row that returned nothing and no error
	for {
		if pending := c.buf[c.start:]; len(pending) > 0 {
			if !started {
				// A message has begun: it must arrive whole within messageTimeout.
				started = true
				c.slot.Idle(false)
				deadline = c.within(time.Now().Add(messageTimeout))
				c.msgBy = deadline
				c.setBusy(true) // a stopping server lets it finish

			}
			n, err := c.fr.next(pending)
			switch {
			case err != nil:
				return nil, &badMessage{reason: "malformed", offset: -1, err: err}
			case n > max:
				return nil, &badMessage{reason: "too_large", offset: -1, err: errSize(n, max, limit)}
			case n > 0:
				c.consumed = n
				return pending[:n], nil
			case len(pending) > max:
				return nil, &badMessage{reason: "too_large", offset: -1, err: errSize(len(pending), max, limit)}
			}
		}
		n, err := 0, c.readErr
		if err == nil {
			if err := c.makeRoom(max, deadline); err != nil {
				return nil, err
			}
			if !c.readUntil(deadline) {
				return nil, errClosing // the server stops reading, in a message or not
			}
			n, err = c.nc.Read(c.buf[len(c.buf):cap(c.buf)])
			c.buf = c.buf[:len(c.buf)+n]
			c.read += int64(n)
			if err != nil && n > 0 {
				if !isTimeout(err) { // a timeout passes: the next read sees its own
					c.readErr = err // the whole messages of these bytes first
				}
				continue
			}
		}
		if err != nil {
			if len(c.buf) == c.start && isTimeout(err) && c.closing() || isTimeout(err) && c.readsEnded() {
				return nil, errClosing // nothing more came before the server stops, or it stopped reading
			}
			if len(c.buf) > c.start && !errors.Is(err, net.ErrClosed) { // the client's end (EOF, a reset) or its time
				return nil, &badMessage{reason: reasonFor(err), offset: -1, err: errIncomplete(len(c.buf)-c.start, err)}
			}
			return nil, err
		}
		if n > 0 {
			empty = 0
		} else if empty++; empty >= maxEmptyReads {
			return nil, io.ErrNoProgress
		}
	}
}

// Buffer sizes. A connection's buffer grows as messages need it, up to
// the largest message and bufSlack more, so that the start of the next
// message can arrive behind a message at the limit.
const (
	ownBuf   = 4 << 10  // a connection's own buffer, for small messages
	minRoom  = 16 << 10 // the least room a read into a reserved buffer is given
	bufSlack = 64 << 10
	// maxEmptyReads ends a connection whose reads return neither bytes nor
	// an error (a net.Conn should never do that), as bufio does.
	maxEmptyReads = 100
)

// drop forgets the message last returned by next. Once nothing is
// pending, the connection reads into its own small buffer again and gives
// a reserved one back: an idle connection holds nothing of the budget.
func (c *conn) drop() {
	c.start += c.consumed
	c.consumed = 0
	if c.start < len(c.buf) {
		return
	}
	c.start = 0
	if c.reserved {
		c.dropBuf()
	}
	c.buf = c.own[:0]
}

// dropBuf gives a reserved buffer back, to its pool and to the budget.
func (c *conn) dropBuf() {
	if c.reserved {
		c.hold.Release(int64(cap(c.buf)))
		inputs.PutBuf(c.buf)
		c.buf, c.reserved = c.own[:0], false
	}
}

// makeRoom makes room after the pending bytes: some in the connection's
// own buffer, at least minRoom in a reserved one. It moves the pending
// bytes to the front when the consumed ones take half the buffer; when
// that leaves too little room, it grows the buffer (reserved from the
// budget first, which may wait until deadline), up to the largest message
// and bufSlack more, or, once the buffer is that large, moves the pending
// bytes to the front anyway. The pending bytes are never more than the
// largest message (next refuses more), so there is always room, whatever
// the messages before them were.
func (c *conn) makeRoom(largest int, deadline time.Time) error {
	if c.start > 0 && c.start >= cap(c.buf)/2 {
		c.compact()
	}
	want := minRoom
	if !c.reserved {
		want = 1
	}
	if cap(c.buf)-len(c.buf) >= want {
		return nil
	}
	pending := len(c.buf) - c.start
	size := inputs.BufClass(max(2*cap(c.buf), pending+minRoom))
	if size > largest+bufSlack {
		size = max(largest+bufSlack, pending+minRoom)
	}
	if size <= cap(c.buf) {
		c.compact() // cap(c.buf) >= pending+minRoom: room enough at the front
		return nil
	}
	if err := c.reserve(size, deadline); err != nil {
		return err
	}
	grown := append(inputs.GetBuf(size), c.buf[c.start:]...)
	c.dropBuf()
	c.buf, c.start, c.reserved = grown, 0, true
	return nil
}

// reserve takes n bytes from the budget for the connection, waiting for
// room until deadline (TCP backpressure meanwhile: nothing is read).
func (c *conn) reserve(n int, deadline time.Time) error {
	if c.hold == nil {
		return nil
	}
	ctx := c.ctx
	if ctx == nil {
		ctx = context.Background()
	}
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	err := c.hold.Grow(ctx, int64(n))
	switch {
	case err == nil:
		return nil
	case errors.Is(err, inputs.ErrOverBudget):
		return &badMessage{reason: reasonOverBudget, offset: -1, err: fmt.Errorf("message of at least %d bytes: %w", len(c.buf)-c.start, err)}
	case errors.Is(err, context.Canceled):
		return err // the server is stopping
	default:
		return &badMessage{reason: reasonNoRoom, offset: -1, err: fmt.Errorf("message incomplete after %d bytes: %w", len(c.buf)-c.start, err)}
	}
}

// compact moves the pending bytes to the front of the buffer.
func (c *conn) compact() {
	c.buf = c.buf[:copy(c.buf, c.buf[c.start:])]
	c.start = 0
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func reasonFor(err error) string {
	if isTimeout(err) {
		return "timeout"
	}
	return "truncated"
}
