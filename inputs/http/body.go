package httpin

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
)

var errTooLarge = errors.New("body too large")

// contentEncoding reports whether the body is gzip, or an error naming an
// encoding this input does not read.
func contentEncoding(h http.Header) (gzipped bool, err error) {
	values := h.Values("Content-Encoding")
	switch len(values) {
	case 0:
		return false, nil
	case 1:
	default:
		return false, fmt.Errorf("Content-Encoding %q not supported: send identity or gzip", strings.Join(values, ", "))
	}
	switch enc := strings.TrimSpace(values[0]); {
	case enc == "" || strings.EqualFold(enc, "identity"):
		return false, nil
	case strings.EqualFold(enc, "gzip") || strings.EqualFold(enc, "x-gzip"):
		return true, nil
	default:
		return false, fmt.Errorf("Content-Encoding %q not supported: send identity or gzip", clip([]byte(enc)))
	}
}

// bodyError is a body that could not be read whole.
type bodyError struct {
	status int
	reason string
	err    error
}

func (e *bodyError) Error() string { return e.err.Error() }

// readBody reads the request body, decompressed, refusing more than limit
// bytes before and after decompression: a small gzip body that inflates
// past limit is stopped there.
func readBody(w http.ResponseWriter, r *http.Request, gzipped bool, limit int64) ([]byte, error) {
	tooLarge := &bodyError{http.StatusRequestEntityTooLarge, reasonTooLarge,
		fmt.Errorf("body larger than %d bytes", limit)}
	if r.ContentLength > limit {
		return nil, tooLarge
	}
	raw := &errReader{r: http.MaxBytesReader(w, r.Body, limit)}
	if !gzipped {
		b, err := readAll(raw, limit, r.ContentLength)
		return b, classify(err, raw, tooLarge)
	}
	zr, err := gzip.NewReader(raw)
	if err == io.EOF && raw.err == io.EOF {
		return nil, nil // an empty body
	}
	if err != nil {
		return nil, classify(err, raw, tooLarge)
	}
	// gzip.Reader reads concatenated members (multistream) by default.
	b, err := readAll(zr, limit, 0)
	return b, classify(err, raw, tooLarge)
}

// classify names the failure: the raw body over the limit or the
// decompressed one (413), the connection (a read error), or the gzip data.
func classify(err error, raw *errReader, tooLarge *bodyError) error {
	var maxErr *http.MaxBytesError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errTooLarge), errors.As(err, &maxErr), errors.As(raw.err, &maxErr):
		return tooLarge
	case raw.err != nil && raw.err != io.EOF:
		return &bodyError{http.StatusBadRequest, reasonReadError, fmt.Errorf("read body: %w", raw.err)}
	default:
		return &bodyError{http.StatusBadRequest, reasonMalformed, fmt.Errorf("invalid gzip data: %w", err)}
	}
}

// Request bodies and the records parsed from them go through buffers that
// are reused once the request is answered: the WAL copies records into its
// entries before Append returns, and nothing else keeps them.
var bufPool sync.Pool // *[]byte

// maxPooled: larger buffers are left to the garbage collector, so that a
// few big requests do not pin their memory.
const maxPooled = 4 << 20

// getBuf returns an empty buffer with room for n bytes.
func getBuf(n int) []byte {
	if bp, ok := bufPool.Get().(*[]byte); ok {
		if cap(*bp) >= n {
			return (*bp)[:0]
		}
		bufPool.Put(bp)
	}
	return make([]byte, 0, n)
}

func putBuf(b []byte) {
	if cap(b) == 0 || cap(b) > maxPooled {
		return
	}
	b = b[:0]
	bufPool.Put(&b)
}

// readAll reads r to its end, failing with errTooLarge past limit bytes.
// hint is the expected length (-1 or 0: unknown).
func readAll(r io.Reader, limit, hint int64) ([]byte, error) {
	size := int64(64 << 10)
	if hint > 0 {
		size = hint + 1 // room to see the end without growing
	}
	if size > limit+1 {
		size = limit + 1
	}
	b := getBuf(int(size))
	for {
		if len(b) == cap(b) {
			// Grow, never past limit+1: one byte over is enough to know.
			bigger := make([]byte, len(b), min(2*int64(cap(b))+512, limit+1))
			copy(bigger, b)
			putBuf(b)
			b = bigger
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if int64(len(b)) > limit {
			putBuf(b)
			return nil, errTooLarge
		}
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			putBuf(b)
			return nil, err
		}
	}
}

// errReader remembers the last error of the raw body, to tell a broken
// connection from broken gzip data.
type errReader struct {
	r   io.Reader
	err error
}

func (e *errReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil {
		e.err = err
	}
	return n, err
}
