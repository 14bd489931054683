package httpin

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/klauspost/compress/zlib"
	"github.com/klauspost/compress/zstd"

	"github.com/logfwd/forwarder/inputs"
)

var errTooLarge = errors.New("body too large")

// The body encodings the input reads (Content-Encoding): none, gzip, zstd,
// and deflate, which HTTP defines as zlib (RFC 1950).
const (
	encIdentity = ""
	encGzip     = "gzip"
	encZstd     = "zstd"
	encDeflate  = "deflate"
)

// contentEncoding returns the body's encoding, or an error naming an
// encoding this input does not read.
func contentEncoding(h http.Header) (string, error) {
	values := h.Values("Content-Encoding")
	switch len(values) {
	case 0:
		return encIdentity, nil
	case 1:
	default:
		return "", fmt.Errorf("Content-Encoding %q not supported: send one of identity, gzip, zstd or deflate", strings.Join(values, ", "))
	}
	switch enc := strings.TrimSpace(values[0]); {
	case enc == "" || strings.EqualFold(enc, "identity"):
		return encIdentity, nil
	case strings.EqualFold(enc, "gzip") || strings.EqualFold(enc, "x-gzip"):
		return encGzip, nil
	case strings.EqualFold(enc, "zstd"):
		return encZstd, nil
	case strings.EqualFold(enc, "deflate"):
		return encDeflate, nil
	default:
		return "", fmt.Errorf("Content-Encoding %q not supported: send one of identity, gzip, zstd or deflate", clip([]byte(enc)))
	}
}

// zstdDecoderBytes is what a zstd decoder holds besides its window (its
// block buffers, with one goroutine and low memory), and zlibReaderBytes
// what a zlib reader holds (its 32 KiB window and tables): held from the
// inputs' budget while a body is decoded, with a zstd frame's window.
const (
	zstdDecoderBytes = 512 << 10
	zlibReaderBytes  = 80 << 10
)

// maxZstdWindow is the largest window a zstd body's frames may ask for
// (zstd's default levels use at most 8 MiB).
const maxZstdWindow = 8 << 20

// zstdDecoders are the input's zstd decoders, reused.
var zstdDecoders sync.Pool // *zstd.Decoder

// bodyError is a body that could not be read whole.
type bodyError struct {
	status int
	reason string
	err    error
}

func (e *bodyError) Error() string { return e.err.Error() }

// readBody reads the request body, decompressed, refusing more than limit
// bytes before and after decompression: a small gzip body that inflates
// past limit is stopped there. The buffer it returns is reserved from hold
// (its capacity), grown as the body arrives, waiting for room for
// memoryWait in all (waitBudget) or until ctx ends: an error that is
// inputs.ErrOverBudget or inputs.ErrNoRoom says so. deadline moves the
// connection's read deadline while the body keeps arriving.
func readBody(ctx context.Context, w http.ResponseWriter, r *http.Request, enc string, limit int64, hold *inputs.Hold, deadline *bodyDeadline, memoryWait time.Duration) ([]byte, error) {
	waits := &waitBudget{left: memoryWait}
	tooLarge := &bodyError{http.StatusRequestEntityTooLarge, reasonTooLarge,
		fmt.Errorf("body larger than %d bytes", limit)}
	if r.ContentLength > limit {
		return nil, tooLarge
	}
	raw := &errReader{r: http.MaxBytesReader(w, r.Body, limit), deadline: deadline}
	switch enc {
	case encZstd:
		return readZstd(ctx, raw, limit, hold, waits, tooLarge)
	case encDeflate:
		if err := waits.grow(ctx, hold, zlibReaderBytes); err != nil {
			return nil, err
		}
		defer hold.Release(zlibReaderBytes)
		zr, err := zlib.NewReader(raw)
		if err == io.EOF && raw.err == io.EOF {
			return nil, nil // an empty body
		}
		if err != nil {
			return nil, classify(err, raw, tooLarge, enc)
		}
		defer zr.Close()
		b, err := readAll(ctx, zr, limit, -1, hold, waits)
		return b, classify(err, raw, tooLarge, enc)
	case encGzip:
		zr, err := inputs.GetGzip(raw)
		if err == io.EOF && raw.err == io.EOF {
			return nil, nil // an empty body
		}
		if err != nil {
			return nil, classify(err, raw, tooLarge, enc)
		}
		defer inputs.PutGzip(zr)
		// gzip.Reader reads concatenated members (multistream) by default.
		b, err := readAll(ctx, zr, limit, -1, hold, waits)
		return b, classify(err, raw, tooLarge, enc)
	}
	b, err := readAll(ctx, raw, limit, r.ContentLength, hold, waits)
	return b, classify(err, raw, tooLarge, enc)
}

// readZstd reads a zstd body (one or more frames). The first frame's
// window, which every frame must keep within, is held from the inputs'
// budget while it decodes, with what the decoder holds besides.
func readZstd(ctx context.Context, raw *errReader, limit int64, hold *inputs.Hold, waits *waitBudget, tooLarge *bodyError) ([]byte, error) {
	br := bufio.NewReaderSize(raw, zstd.HeaderMaxSize)
	head, err := br.Peek(zstd.HeaderMaxSize)
	if len(head) == 0 && err == io.EOF && raw.err == io.EOF {
		return nil, nil // an empty body
	}
	if len(head) < zstd.HeaderMaxSize && err != io.EOF {
		return nil, classify(err, raw, tooLarge, encZstd)
	}
	var h zstd.Header
	if err := h.Decode(head); err != nil {
		return nil, classify(err, raw, tooLarge, encZstd)
	}
	window := h.WindowSize
	if h.SingleSegment { // the frame's content is its window
		window = h.FrameContentSize
	}
	window = max(window, zstd.MinWindowSize)
	if window > maxZstdWindow {
		return nil, classify(fmt.Errorf("a zstd window of %d bytes, at most %d", window, maxZstdWindow), raw, tooLarge, encZstd)
	}
	if err := waits.grow(ctx, hold, int64(window)+zstdDecoderBytes); err != nil {
		return nil, err
	}
	defer hold.Release(int64(window) + zstdDecoderBytes)
	zr, _ := zstdDecoders.Get().(*zstd.Decoder)
	if zr == nil {
		if zr, err = zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true)); err != nil {
			return nil, fmt.Errorf("zstd decoder: %w", err)
		}
	}
	defer func() {
		zr.Reset(nil) // holds nothing of the body
		zstdDecoders.Put(zr)
	}()
	// Both bound a frame's window when streaming (MaxMemory that of a
	// frame of one segment).
	if err := zr.ResetWithOptions(br, zstd.WithDecoderMaxWindow(window), zstd.WithDecoderMaxMemory(window)); err != nil {
		return nil, classify(err, raw, tooLarge, encZstd)
	}
	b, err := readAll(ctx, zr, limit, -1, hold, waits)
	return b, classify(err, raw, tooLarge, encZstd)
}

// classify names the failure: the raw body over the limit or the
// decompressed one (413), no room in the inputs' budget (as it is), the
// connection (a read error), or the compressed data (of encoding enc).
func classify(err error, raw *errReader, tooLarge *bodyError, enc string) error {
	var maxErr *http.MaxBytesError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, inputs.ErrOverBudget), errors.Is(err, inputs.ErrNoRoom):
		return err
	case errors.Is(err, errTooLarge), errors.As(err, &maxErr), errors.As(raw.err, &maxErr):
		return tooLarge
	case raw.err != nil && isTimeout(raw.err):
		// A body slower than the request's time (a slow link): not bad
		// input. 503, not 408: log clients retry a 503 (Fluentd's out_http
		// and Logstash retry no 408 by default, and would drop it).
		return &bodyError{http.StatusServiceUnavailable, reasonReadTimeout, fmt.Errorf("read body: it did not arrive whole in time (%s): %w", raw.deadline.explain(), raw.err)}
	case raw.err != nil && raw.err != io.EOF:
		return &bodyError{http.StatusBadRequest, reasonReadError, fmt.Errorf("read body: %w", raw.err)}
	default:
		return &bodyError{http.StatusBadRequest, reasonMalformed, fmt.Errorf("invalid %s data: %w", enc, err)}
	}
}

// firstRead is the buffer a body is first read into: small, so that a
// client that announces a large body and sends little of it holds little.
const firstRead = 16 << 10

// readAll reads r to its end, failing with errTooLarge past limit bytes,
// into a buffer that doubles as it fills, each size reserved from hold
// before it is allocated. hint (a Content-Length, -1: none) only ever
// makes the first buffer smaller: the buffer grows from bytes that came,
// never from what a client says it will send.
func readAll(ctx context.Context, r io.Reader, limit, hint int64, hold *inputs.Hold, waits *waitBudget) ([]byte, error) {
	first := int64(firstRead)
	if hint >= 0 && hint+1 < first {
		first = hint + 1 // room to see the end without growing
	}
	b, err := reserveBuf(ctx, hold, inputs.BufClass(int(min(first, limit+1))), waits)
	if err != nil {
		return nil, err
	}
	for {
		if len(b) == cap(b) {
			// Double, never past limit+1: one byte over is enough to know.
			size := inputs.BufClass(int(min(2*int64(cap(b)), limit+1)))
			bigger, err := reserveBuf(ctx, hold, size, waits)
			if err != nil {
				releaseBuf(hold, b)
				return nil, err
			}
			bigger = append(bigger, b...)
			releaseBuf(hold, b)
			b = bigger
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if int64(len(b)) > limit {
			releaseBuf(hold, b)
			return nil, errTooLarge
		}
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			releaseBuf(hold, b)
			return nil, err
		}
	}
}

// reserveBuf reserves size bytes from hold, waiting for room within what
// waits has left, then returns an empty buffer of that capacity.
func reserveBuf(ctx context.Context, hold *inputs.Hold, size int, waits *waitBudget) ([]byte, error) {
	if err := waits.grow(ctx, hold, int64(size)); err != nil {
		return nil, err
	}
	return inputs.GetBuf(size), nil
}

// waitBudget is how long a body may wait for room in the inputs' memory
// budget, in all its waits: counted while it waits, not while its bytes
// arrive (a slow link's body grows its buffer long after it began). nil:
// the context alone bounds the waits (the parse's own).
type waitBudget struct{ left time.Duration }

func (w *waitBudget) grow(ctx context.Context, hold *inputs.Hold, n int64) error {
	if w == nil { // ctx alone bounds the wait
		return hold.Grow(ctx, n)
	}
	wctx, cancel := context.WithTimeout(ctx, max(w.left, 0))
	defer cancel()
	start := time.Now()
	err := hold.Grow(wctx, n)
	w.left -= time.Since(start)
	return err
}

// releaseBuf gives b back to its pool and its capacity to hold.
func releaseBuf(hold *inputs.Hold, b []byte) {
	hold.Release(int64(cap(b)))
	inputs.PutBuf(b)
}

// errReader remembers the last error of the raw body, to tell a broken
// connection from broken gzip data, and moves the body's read deadline as
// bytes arrive.
type errReader struct {
	r        io.Reader
	err      error
	deadline *bodyDeadline // nil: the server's ReadTimeout alone
}

func (e *errReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil {
		e.err = err
	}
	if n > 0 {
		e.deadline.progress(n)
	}
	return n, err
}

// bodyDeadline keeps a body that is still arriving from the server's
// ReadTimeout, which counts from the request's start: after reads that
// brought bytes (looked at every quarter of idle, and at each read until
// the deadline first moves and in the last quarter of idle before it),
// when at least minRate bytes a second came since the deadline last
// moved, the connection's read deadline moves to idle from then, never
// past max from the request's start. A slow link's large body gets in,
// also one that resumes at full speed after a pause; a client that stops
// sending, or trickles (holding its connection and memory), does not hold
// them past idle. Once the body is read whole (done), the deadline is cleared:
// net/http's read of the connection in the background, which ends the
// request's context when it fails, must not meet it while the request
// waits for memory or for the WAL.
type bodyDeadline struct {
	rc        *http.ResponseController
	idle, max time.Duration
	minRate   float64 // bytes a second
	end, next time.Time
	at        time.Time // the deadline as this moved it (zero: the server's ReadTimeout)
	since     time.Time // when the deadline last moved (the request's start)
	got       int64     // bytes since
}

// minBodyRate is the least a body must keep arriving at, in bytes a
// second, for its read deadline to move.
const minBodyRate = 1024

func newBodyDeadline(w http.ResponseWriter, start time.Time, idle, max time.Duration, minRate float64) *bodyDeadline {
	return &bodyDeadline{rc: http.NewResponseController(w), idle: idle, max: max, minRate: minRate, end: start.Add(max), since: start}
}

func (d *bodyDeadline) progress(n int) {
	if d == nil {
		return
	}
	d.got += int64(n)
	now := time.Now()
	if now.Before(d.next) && now.Before(d.at.Add(-d.idle/4)) {
		return
	}
	d.next = now.Add(d.idle / 4) // the deadline stays at least three quarters of idle ahead
	if float64(d.got) < d.minRate*now.Sub(d.since).Seconds() {
		return // too slow: the deadline stands
	}
	d.got, d.since = 0, now
	at := now.Add(d.idle)
	if at.After(d.end) {
		at = d.end
	}
	if d.rc.SetReadDeadline(at) == nil { // not supported: the server's ReadTimeout stands
		d.at = at
	}
}

// done clears the read deadline once the body is read.
func (d *bodyDeadline) done() {
	if d != nil {
		_ = d.rc.SetReadDeadline(time.Time{})
	}
}

// explain says what a body that timed out did not meet.
func (d *bodyDeadline) explain() string {
	if d == nil {
		return "the request's read timeout"
	}
	return fmt.Sprintf("%s without %.0f bytes a second, or not whole within %s", d.idle, d.minRate, d.max)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
