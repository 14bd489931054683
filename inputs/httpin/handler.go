package httpin

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/logfwd/forwarder/inputs"
	"github.com/logfwd/forwarder/wal"
)

// Reasons a request is refused, the reason label of
// forwarder_input_rejected_total{input="http"}.
const (
	reasonMalformed      = "malformed"            // not JSON, not objects, broken gzip, an Idempotency-Key too long
	reasonKeyReused      = "idempotency_conflict" // an Idempotency-Key already used for another request
	reasonBadTag         = "bad_tag"              // missing, too long, or with control characters
	reasonTooLarge       = "too_large"            // over max_body_bytes, raw or decompressed, or over wal.max_bytes
	reasonUnauth         = "unauthorized"         // missing or wrong bearer token
	reasonEncoding       = "unsupported_encoding" // a Content-Encoding other than gzip, zstd, deflate
	reasonOTLP           = "otlp"                 // an OpenTelemetry (OTLP) export, which the input does not take
	reasonWALFull        = "wal_full"             // no room in the WAL in time, or no space on disk
	reasonWALError       = "wal_error"            // the WAL failed or is closed
	reasonStoreTimeout   = "store_timeout"        // the WAL, not full, did not take the records in time (a slow disk)
	reasonReadError      = "read_error"           // the body could not be read (the connection broke, bad chunked encoding)
	reasonReadTimeout    = "read_timeout"         // the body did not arrive within the request's time (408: sent again)
	reasonShutdown       = "shutting_down"        // the server is stopping
	reasonCanceled       = "canceled"             // the client went away before its records were stored
	reasonBadMethod      = "bad_method"           // not POST
	reasonNotFound       = "not_found"            // not /v1/logs
	reasonProtocol       = "unsupported_protocol" // HTTP/2 without TLS (h2c)
	reasonTLSHandshake   = "tls_handshake"        // the TLS handshake failed
	reasonHeaderTimeout  = "header_timeout"       // no request head within read_header_timeout
	reasonBadHead        = "bad_request_head"     // net/http refused the request head itself (400, 431, 501, 417)
	reasonTooManyRecords = "too_many_records"     // over max_records_per_request
	reasonOverBudget     = "over_memory_budget"   // more than the inputs' memory budget holds for one request
	reasonNoRoom         = "memory_full"          // no room in the inputs' memory budget in time
	maxIdempotencyKey    = inputs.MaxClientChunkID
)

// authHook, when set (by tests), runs as a request's handler is about to
// mark its connection authenticated.
var authHook func()

func (s *Server) handleLogs(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		s.reject(w, r, http.StatusMethodNotAllowed, reasonBadMethod, fmt.Sprintf("method %s not allowed: POST records to /v1/logs/{tag}", r.Method))
		return
	}
	if s.auth != nil && !s.auth.allows(r) {
		// The connection is closed after the answer: a client without the
		// token keeps no connection open.
		w.Header().Set("WWW-Authenticate", "Bearer")
		w.Header().Set("Connection", "close")
		s.reject(w, r, http.StatusUnauthorized, reasonUnauth, "missing or wrong bearer token")
		return
	}
	if authHook != nil {
		authHook()
	}
	if !authenticated(r) {
		// Evicted (counted then): storing the records would only store
		// them twice, the client sending them again after no answer. The
		// connection is dropped without one: a handler that returned
		// would be answered 200, which the client takes for stored.
		panic(http.ErrAbortHandler)
	}
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct == "application/x-protobuf" || ct == "application/protobuf" {
		s.reject(w, r, http.StatusUnsupportedMediaType, reasonOTLP, otlpRefused)
		return
	}
	tag := r.PathValue("tag")
	if tag == "" {
		tag = r.URL.Query().Get("tag")
	}
	if msg := checkTag(tag); msg != "" {
		s.reject(w, r, http.StatusBadRequest, reasonBadTag, msg)
		return
	}
	enc, err := contentEncoding(r.Header)
	if err != nil {
		s.reject(w, r, http.StatusUnsupportedMediaType, reasonEncoding, err.Error())
		return
	}
	key := r.Header.Get("Idempotency-Key")
	if len(key) > maxIdempotencyKey {
		s.reject(w, r, http.StatusBadRequest, reasonMalformed, fmt.Sprintf("Idempotency-Key longer than %d bytes", maxIdempotencyKey))
		return
	}
	// One tag per request: routed or not, all its records are.
	routed := s.p.Routed == nil || s.p.Routed(tag)
	if routed && s.p.WAL.Full() {
		s.walFull(w, r)
		return
	}
	// Everything the request holds of the inputs' budget is given back
	// once it is answered; the body as soon as it is parsed.
	hold := s.p.Budget.Hold(input)
	defer hold.ReleaseAll()
	deadline := newBodyDeadline(w, time.Now(), s.bodyIdle, s.bodyMax, s.bodyRate)
	body, err := readBody(r.Context(), w, r, enc, int64(s.cfg.MaxBodyBytes), hold, deadline, s.memoryWait)
	if err == nil {
		// Read whole: the deadline has nothing more to bound. (A body not
		// read whole keeps it: net/http reads what is left of it after
		// the answer, which must not wait without end.)
		deadline.done()
	}
	if err != nil {
		var be *bodyError
		isBody := errors.As(err, &be)
		switch {
		case isBody && s.cutOff.Load() && (be.reason == reasonReadError || be.reason == reasonReadTimeout):
			// The stop's grace ended while the body arrived: its
			// connection was closed under it, no fault of the client's.
			s.shuttingDown(w, r)
		case isBody:
			if be.status == http.StatusServiceUnavailable {
				w.Header().Set("Retry-After", "1")
			}
			s.reject(w, r, be.status, be.reason, be.Error())
		case s.budgetRefused(w, r, err):
		default:
			s.reject(w, r, http.StatusBadRequest, reasonReadError, err.Error())
		}
		return
	}
	if bytes.HasPrefix(bytes.TrimLeft(body, " \t\r\n"), []byte(`{"resourceLogs"`)) {
		// OTLP in JSON would be stored as one record, the whole export.
		releaseBuf(hold, body)
		s.reject(w, r, http.StatusUnsupportedMediaType, reasonOTLP, otlpRefused)
		return
	}
	var id wal.AppendOptions
	if key != "" {
		id = wal.AppendOptions{ChunkID: inputs.HTTPChunkID(key), ChunkDigest: requestDigest(tag, body)}
	}
	var out []byte
	pctx, cancelParse := context.WithTimeout(r.Context(), s.memoryWait)
	defer cancelParse()
	recs, stats, err := parseInto(&out, body, tag, s.cfg.TimeField, time.Now(),
		limits{maxRecords: s.cfg.MaxRecordsPerRequest, hold: hold, ctx: pctx})
	releaseBuf(hold, body)
	defer func() { // after the store: the records point into out
		releaseBuf(hold, out)
		releaseRecords(hold, recs)
	}()
	if err != nil {
		var bad *badRequest
		switch {
		case errors.As(err, &bad):
			s.reject(w, r, cmp.Or(bad.status, http.StatusBadRequest), bad.reason, bad.msg)
		case s.budgetRefused(w, r, err):
		default:
			s.reject(w, r, http.StatusBadRequest, reasonMalformed, err.Error())
		}
		return
	}
	s.store(w, r, routed, id, recs, stats)
}

// budgetRefused answers a request the inputs' memory budget could not
// hold, and reports whether err was that: 413 for a request larger than the
// budget ever holds for one, 503 with Retry-After when there was no room in
// time.
func (s *Server) budgetRefused(w http.ResponseWriter, r *http.Request, err error) bool {
	switch {
	case errors.Is(err, inputs.ErrOverBudget):
		s.rejectErr(w, r, http.StatusRequestEntityTooLarge, reasonOverBudget,
			"request needs more memory than the forwarder gives one request (its memory_limit): nothing was stored; send fewer or smaller records per request", err)
	case errors.Is(err, inputs.ErrNoRoom) && s.baseCtx.Err() != nil:
		s.shuttingDown(w, r) // the stop's grace ended while it waited
	case errors.Is(err, inputs.ErrNoRoom) && r.Context().Err() != nil:
		s.reject(w, r, http.StatusServiceUnavailable, reasonCanceled, "request canceled")
	case errors.Is(err, inputs.ErrNoRoom):
		w.Header().Set("Retry-After", "1")
		s.rejectErr(w, r, http.StatusServiceUnavailable, reasonNoRoom,
			"the forwarder's inputs are holding all the memory they may (memory_limit): nothing was stored; retry later", err)
	default:
		return false
	}
	return true
}

// requestDigest is what an Idempotency-Key stands for: the request's tag
// and body (decompressed). The same key with another tag or body is
// refused (422), not taken for the first request.
func requestDigest(tag string, body []byte) []byte {
	h := sha256.New()
	h.Write([]byte(tag))
	h.Write([]byte{0}) // a tag holds no control character: the two never run together
	h.Write(body)
	return h.Sum(nil)
}

// store hands the records to the pipeline and answers 200 only once it
// returned: the records are durable (or were stored before, or are
// unrouted).
func (s *Server) store(w http.ResponseWriter, r *http.Request, routed bool, id wal.AppendOptions, recs []wal.Record, stats parseStats) {
	n, unrouted := len(recs), 0
	if !routed {
		unrouted = n
	}
	if routed && n > 0 && s.p.WAL.Full() {
		s.walFull(w, r)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.storeTimeout)
	res, err := s.p.Store(ctx, input, recs, id)
	cancel()
	if err != nil {
		s.storeFailed(w, r, err)
		return
	}
	if stats.invalidUTF8 > 0 && unrouted == 0 && !res.Duplicate {
		s.p.Metrics.InvalidUTF8.WithLabelValues(input).Add(float64(stats.invalidUTF8))
	}
	if stats.nonFinite > 0 && unrouted == 0 && !res.Duplicate {
		if k, ok := s.rejects.Allow("non_finite", time.Now()); ok {
			s.log.Info("numbers written nan, inf, NaN or Infinity (not JSON; Fluent Bit writes them so) stored as null, as the forward input stores NaN and infinities",
				"remote", r.RemoteAddr, "path", r.URL.Path, "values", stats.nonFinite, "same_reason_not_logged_in_last_minute", k)
		}
	}
	if stats.badTime > 0 && unrouted == 0 && !res.Duplicate {
		s.p.Metrics.BadTime.WithLabelValues(input).Add(float64(stats.badTime))
		s.noteBadTime(r, stats)
	}
	if res.Duplicate {
		w.Header().Set("X-Duplicate", "true")
	}
	b := append(make([]byte, 0, 48), `{"stored":`...)
	b = strconv.AppendInt(b, int64(n), 10)
	if unrouted > 0 {
		b = append(b, `,"unrouted":`...)
		b = strconv.AppendInt(b, int64(unrouted), 10)
	}
	b = append(b, "}\n"...)
	writeJSON(w, http.StatusOK, b)
}

// noteBadTime warns, at most once a minute, of records stored with the
// time of arrival because their time field was no time.
func (s *Server) noteBadTime(r *http.Request, stats parseStats) {
	now := time.Now()
	s.badTimeMu.Lock()
	s.badTimeRecords += stats.badTime
	if now.Before(s.badTimeNext) {
		s.badTimeMu.Unlock()
		return
	}
	n := s.badTimeRecords
	s.badTimeRecords, s.badTimeNext = 0, now.Add(time.Minute)
	s.badTimeMu.Unlock()
	s.log.Warn("records whose time field is not a time the input reads were stored with the time of arrival (the field is kept in the record as sent); counted in forwarder_input_bad_time_records_total",
		"field", s.cfg.TimeField, "records", n, "interval", time.Minute, "example", stats.badTimeWhy, "remote", r.RemoteAddr, "path", r.URL.Path)
}

// otlpRefused is the answer to an OpenTelemetry (OTLP/HTTP) export.
const otlpRefused = "OTLP (OpenTelemetry) exports are not taken here: send NDJSON or JSON records to /v1/logs/{tag}, or use the Collector's Fluent forward exporter"

// storeFailed answers a failed append; nothing of the request was
// acknowledged, and the client may send it again (with the same
// Idempotency-Key, a part that was stored after all is not stored twice).
func (s *Server) storeFailed(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, wal.ErrFull) && r.Context().Err() == nil:
		s.walFull(w, r)
	case errors.Is(err, context.DeadlineExceeded) && r.Context().Err() == nil:
		// Not for want of room: the writer did not take them in time (it
		// answers with the outcome once it has: nothing was stored).
		w.Header().Set("Retry-After", "1")
		s.reject(w, r, http.StatusServiceUnavailable, reasonStoreTimeout,
			"the records were not stored in time (the WAL's disk is slow): nothing was stored; retry later")
	case errors.Is(err, wal.ErrNoSpace):
		w.Header().Set("Retry-After", "1")
		s.reject(w, r, http.StatusServiceUnavailable, reasonWALFull, "no space left on the WAL's disk: retry later")
	case errors.Is(err, wal.ErrChunkConflict):
		s.reject(w, r, http.StatusUnprocessableEntity, reasonKeyReused,
			"Idempotency-Key already used within the dedup window for a request with another tag or body; nothing was stored: send a new request with a new key")
	case errors.Is(err, wal.ErrTooLarge):
		s.reject(w, r, http.StatusRequestEntityTooLarge, reasonTooLarge, "request larger than the WAL can ever hold (wal.max_bytes): send fewer records")
	case errors.Is(err, wal.ErrClosed), s.baseCtx.Err() != nil:
		s.shuttingDown(w, r)
	case r.Context().Err() != nil:
		// Nobody reads this answer; it is for the count and the log.
		s.reject(w, r, http.StatusServiceUnavailable, reasonCanceled, "request canceled")
	default:
		// 503, not 500: nothing was stored, and log clients retry a 503
		// (Fluentd's out_http retries no 500 by default); the service
		// stops, and the retry goes to another replica or to its restart.
		w.Header().Set("Retry-After", "1")
		s.rejectErr(w, r, http.StatusServiceUnavailable, reasonWALError, "the WAL failed to store the records", err)
	}
}

func (s *Server) walFull(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Retry-After", "1")
	if s.p.WAL.DiskFull() {
		s.reject(w, r, http.StatusServiceUnavailable, reasonWALFull, "no space left on the WAL's disk (below wal.min_free_bytes): retry later")
		return
	}
	s.reject(w, r, http.StatusServiceUnavailable, reasonWALFull, "the WAL is full: retry later")
}

func (s *Server) shuttingDown(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Retry-After", "1")
	s.reject(w, r, http.StatusServiceUnavailable, reasonShutdown, "shutting down: retry later")
}

func (s *Server) handleNotFound(w http.ResponseWriter, r *http.Request) {
	if r.Method == "PRI" && r.URL.Path == "*" {
		// HTTP/2 with prior knowledge on a port without TLS (h2c), which
		// the input does not speak: HTTP/2 needs TLS here.
		w.Header().Set("Connection", "close")
		s.reject(w, r, http.StatusHTTPVersionNotSupported, reasonProtocol, "HTTP/2 without TLS (h2c) is not served: use HTTP/1.1, or HTTP/2 over TLS (tls.cert_file)")
		return
	}
	s.reject(w, r, http.StatusNotFound, reasonNotFound, "not found: POST records to /v1/logs/{tag}")
}

// checkTag returns why tag cannot be a routing tag, or "": the inputs'
// one rule (inputs.CheckTag), with where to put a missing one.
func checkTag(tag string) string {
	if tag == "" {
		return "missing tag: POST to /v1/logs/{tag} or /v1/logs?tag=..."
	}
	return inputs.CheckTag(tag)
}

// reject answers a refused request with status and msg, and counts it.
// Each refusal is logged at debug level; one a minute of each reason is a
// warning (as the forward input's), so that what clients are refused, and
// why, shows without flooding the log.
func (s *Server) reject(w http.ResponseWriter, r *http.Request, status int, reason, msg string) {
	s.rejectErr(w, r, status, reason, msg, nil)
}

func (s *Server) rejectErr(w http.ResponseWriter, r *http.Request, status int, reason, msg string, err error) {
	s.p.Metrics.Rejected.WithLabelValues(input, reason).Inc()
	args := []any{"remote", r.RemoteAddr, "path", r.URL.Path, "reason", reason, "status", status, "detail", msg}
	// Behind a proxy or a load balancer the remote address is its own:
	// what the client says of itself helps find it.
	if ua := r.Header.Get("User-Agent"); ua != "" {
		args = append(args, "user_agent", clipHeader(ua))
	}
	if xff := r.Header.Get("X-Forwarded-For"); xff != "" {
		args = append(args, "forwarded_for", clipHeader(xff))
	}
	if err != nil {
		args = append(args, "error", err)
	}
	if n, ok := s.rejects.Allow(reason, time.Now()); ok {
		s.log.Warn("http request refused", append(args, "same_reason_not_logged_in_last_minute", n)...)
	} else {
		s.log.Debug("http request refused", args...)
	}
	b, _ := json.Marshal(struct {
		Error string `json:"error"`
	}{msg})
	writeJSON(w, status, append(b, '\n'))
}

// clipHeader is a header's value for a log line: valid UTF-8, at most
// maxLoggedHeader bytes (a client's header can be long).
func clipHeader(v string) string {
	if len(v) > maxLoggedHeader {
		n := maxLoggedHeader
		for n > 0 && !utf8.RuneStart(v[n]) {
			n-- // not within a character
		}
		v = v[:n] + "..."
	}
	return strings.ToValidUTF8(v, "\uFFFD")
}

// maxLoggedHeader bounds a header's value in a log line.
const maxLoggedHeader = 200

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
