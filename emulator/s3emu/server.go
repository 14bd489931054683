package s3emu

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

// Options configures a Server. The zero value is an in-memory server.
type Options struct {
	// Dir, when set, keeps buckets and objects in Dir/s3.db, so that they
	// survive a restart (the dev mode). Multipart uploads in progress are
	// kept in memory and do not.
	Dir string

	// Seed seeds the generator behind the failure rate; 0 picks one from
	// the time of day.
	Seed uint64

	// Initial values of the test switches (see SetFailures and SetDenyAll).
	FailureRate float64
	DenyAll     bool

	// Logger receives gofakes3's internal errors. Nil: discarded.
	Logger *slog.Logger
}

// ObjectInfo is what the server stored for one object, as the request that
// wrote it (PutObject or CreateMultipartUpload) said.
type ObjectInfo struct {
	Key             string
	Size            int64
	ETag            string // quoted, as S3 answers it
	LastModified    time.Time
	ContentType     string
	ContentEncoding string
	StorageClass    string            // x-amz-storage-class; "" when not sent
	SSE             string            // x-amz-server-side-encryption
	SSEKMSKeyID     string            // x-amz-server-side-encryption-aws-kms-key-id
	ACL             string            // x-amz-acl
	Tagging         string            // x-amz-tagging, URL-encoded as sent
	ChecksumSHA256  string            // x-amz-checksum-sha256, base64, as sent and verified
	Metadata        map[string]string // x-amz-meta-*, keys lower-cased without the prefix
}

// Server is a local S3 service: gofakes3 behind a handler that adds the
// test switches, checksum verification and request counts.
type Server struct {
	backend gofakes3.Backend
	disk    *diskBackend // nil in memory
	s3      http.Handler

	failBits  atomic.Uint64 // math.Float64bits of the failure rate
	conflicts atomic.Int64  // SetConflicts: conditional writes left to answer 409
	deny      atomic.Bool
	noList    atomic.Bool // SetNoListBucket
	deniedMu  sync.Mutex
	denied    map[string]bool // SetDenyBucket
	rngMu     sync.Mutex
	rng       *rand.Rand

	callsMu sync.Mutex
	calls   map[string]int

	keys keyLocks // writes of one key, one at a time (see serveWrite)

	mu  sync.Mutex
	srv *http.Server
	ln  net.Listener
	wg  sync.WaitGroup
}

// New returns a Server; Start serves it. With Options.Dir it opens (or
// creates) the store in that directory and holds its lock until Close.
func New(opts Options) (*Server, error) {
	s := &Server{calls: map[string]int{}}
	if opts.Dir != "" {
		d, err := openDisk(filepath.Join(opts.Dir, "s3.db"))
		if err != nil {
			return nil, err
		}
		s.disk, s.backend = d, d
	} else {
		s.backend = s3mem.New()
	}
	seed := opts.Seed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	s.rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	s.SetFailures(opts.FailureRate)
	s.SetDenyAll(opts.DenyAll)
	fakeOpts := []gofakes3.Option{gofakes3.WithIntegrityCheck(true)}
	if opts.Logger != nil {
		fakeOpts = append(fakeOpts, gofakes3.WithLogger(slogLogger{opts.Logger}))
	}
	s.s3 = gofakes3.New(s.backend, fakeOpts...).Server()
	return s, nil
}

// Start serves on addr ("127.0.0.1:0" for any free port) and returns the
// base URL to give the SDK as its endpoint, with path-style addressing.
func (s *Server) Start(addr string) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("listen on %s: %w", addr, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		ln.Close()
		return "", errors.New("s3emu: already started")
	}
	s.ln = ln
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = s.srv.Serve(ln)
	}()
	return "http://" + ln.Addr().String(), nil
}

// Close stops serving, dropping open connections, and closes the store.
func (s *Server) Close() error {
	s.mu.Lock()
	srv := s.srv
	s.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
		s.wg.Wait()
	}
	if s.disk != nil {
		return s.disk.close()
	}
	return nil
}

// SetFailures makes that fraction of requests (0 to 1), drawn at random,
// fail with 503 SlowDown without doing anything.
func (s *Server) SetFailures(rate float64) {
	s.failBits.Store(floatBits(min(max(rate, 0), 1)))
}

// SetConflicts makes the next n conditional writes (PutObject or
// CompleteMultipartUpload with If-None-Match) answer 409
// ConditionalRequestConflict, as S3 does while another conditional write
// of the key is in progress; the upload a refused completion names is
// aborted, since S3 asks the client to begin the upload again.
func (s *Server) SetConflicts(n int) { s.conflicts.Store(int64(n)) }

// SetDenyAll makes every request fail with 403 AccessDenied while on.
func (s *Server) SetDenyAll(on bool) { s.deny.Store(on) }

// SetDenyBucket makes every request about bucket fail with 403
// AccessDenied while on, as an IAM policy that does not name the bucket.
func (s *Server) SetDenyBucket(bucket string, on bool) {
	s.deniedMu.Lock()
	defer s.deniedMu.Unlock()
	if s.denied == nil {
		s.denied = map[string]bool{}
	}
	s.denied[bucket] = on
}

func (s *Server) bucketDenied(r *http.Request) bool {
	bucket, _ := bucketKey(r)
	s.deniedMu.Lock()
	defer s.deniedMu.Unlock()
	return s.denied[bucket]
}

// SetNoListBucket answers as S3 answers credentials without
// s3:ListBucket on the bucket while on: a GetObject or HeadObject of a key
// that does not exist fails with 403 AccessDenied, not 404 NoSuchKey.
func (s *Server) SetNoListBucket(on bool) { s.noList.Store(on) }

// CreateBucket creates a bucket; one that exists already is left as it is.
func (s *Server) CreateBucket(name string) error {
	ok, err := s.backend.BucketExists(name)
	if err != nil {
		return fmt.Errorf("look up bucket %q: %w", name, err)
	}
	if ok {
		return nil
	}
	if err := gofakes3.ValidateBucketName(name); err != nil {
		return fmt.Errorf("create bucket %q: %w", name, err)
	}
	if err := s.backend.CreateBucket(name); err != nil {
		return fmt.Errorf("create bucket %q: %w", name, err)
	}
	return nil
}

// Buckets lists the buckets by name.
func (s *Server) Buckets() ([]string, error) {
	bs, err := s.backend.ListBuckets()
	if err != nil {
		return nil, err
	}
	names := make([]string, len(bs))
	for i, b := range bs {
		names[i] = b.Name
	}
	sort.Strings(names)
	return names, nil
}

// Objects lists a bucket's objects in key order, with what their upload
// said about them.
func (s *Server) Objects(bucket string) ([]ObjectInfo, error) {
	var out []ObjectInfo
	page := gofakes3.ListBucketPage{MaxKeys: 1000}
	for {
		list, err := s.backend.ListBucket(bucket, nil, page)
		if err != nil {
			return nil, fmt.Errorf("list bucket %q: %w", bucket, err)
		}
		for _, c := range list.Contents {
			obj, err := s.backend.HeadObject(bucket, c.Key)
			if err != nil {
				if gofakes3.HasErrorCode(err, gofakes3.ErrNoSuchKey) {
					continue // deleted since the listing
				}
				return nil, fmt.Errorf("head %q: %w", c.Key, err)
			}
			obj.Contents.Close()
			out = append(out, objectInfo(c.Key, obj.Size, c.ETag, c.LastModified.Time, obj.Metadata))
		}
		if !list.IsTruncated || len(list.Contents) == 0 && list.NextMarker == "" {
			break
		}
		page.Marker, page.HasMarker = list.NextMarker, true
		if page.Marker == "" {
			page.Marker = list.Contents[len(list.Contents)-1].Key
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

func objectInfo(key string, size int64, etag string, mod time.Time, meta map[string]string) ObjectInfo {
	info := ObjectInfo{Key: key, Size: size, ETag: etag, LastModified: mod.UTC()}
	for k, v := range meta {
		switch lk := strings.ToLower(k); {
		case lk == "content-type":
			info.ContentType = v
		case lk == "content-encoding":
			info.ContentEncoding = v
		case lk == "x-amz-storage-class":
			info.StorageClass = v
		case lk == "x-amz-server-side-encryption":
			info.SSE = v
		case lk == "x-amz-server-side-encryption-aws-kms-key-id":
			info.SSEKMSKeyID = v
		case lk == "x-amz-acl":
			info.ACL = v
		case lk == "x-amz-tagging":
			info.Tagging = v
		case lk == "x-amz-checksum-sha256":
			info.ChecksumSHA256 = v
		case strings.HasPrefix(lk, "x-amz-meta-"):
			if info.Metadata == nil {
				info.Metadata = map[string]string{}
			}
			info.Metadata[lk[len("x-amz-meta-"):]] = v
		}
	}
	return info
}

// Get returns an object's bytes as stored.
func (s *Server) Get(bucket, key string) ([]byte, error) {
	obj, err := s.backend.GetObject(bucket, key, nil)
	if err != nil {
		return nil, fmt.Errorf("get %s/%s: %w", bucket, key, err)
	}
	defer obj.Contents.Close()
	return io.ReadAll(obj.Contents)
}

// Calls returns the number of requests per operation (PutObject,
// UploadPart, CreateMultipartUpload, ...), whatever their outcome.
func (s *Server) Calls() map[string]int {
	s.callsMu.Lock()
	defer s.callsMu.Unlock()
	out := make(map[string]int, len(s.calls))
	for k, v := range s.calls {
		out[k] = v
	}
	return out
}

// ServeHTTP answers one S3 request, through the test switches first.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	op := operation(r)
	s.callsMu.Lock()
	s.calls[op]++
	s.callsMu.Unlock()

	switch {
	case s.deny.Load(), s.bucketDenied(r):
		discardBody(r)
		writeError(w, r, http.StatusForbidden, "AccessDenied", "Access Denied")
		return
	case s.fail():
		discardBody(r)
		writeError(w, r, http.StatusServiceUnavailable, "SlowDown", "Please reduce your request rate.")
		return
	}
	if (op == "GetObject" || op == "HeadObject") && s.noList.Load() {
		if bucket, key := bucketKey(r); s.bucketExists(bucket) && !s.exists(bucket, key) {
			discardBody(r)
			writeError(w, r, http.StatusForbidden, "AccessDenied", "Access Denied")
			return
		}
	}
	if op == "UploadPart" {
		if n, err := strconv.Atoi(r.URL.Query().Get("partNumber")); err != nil || n < 1 || n > 10000 {
			discardBody(r)
			writeError(w, r, http.StatusBadRequest, "InvalidArgument", "Part number must be an integer between 1 and 10000, inclusive")
			return
		}
	}
	switch op {
	case "PutObject", "CompleteMultipartUpload", "CopyObject":
		s.serveWrite(w, r, op)
		return
	case "ListMultipartUploads":
		s.serveListUploads(w, r)
		return
	}
	if r.Method == http.MethodPut {
		if ok := verifyChecksum(w, r); !ok {
			return
		}
	}
	if (r.Method == http.MethodGet || r.Method == http.MethodHead) && !strings.EqualFold(r.Header.Get("X-Amz-Checksum-Mode"), "ENABLED") {
		// S3 answers an object's checksums only to x-amz-checksum-mode:
		// ENABLED.
		nc := &noChecksums{ResponseWriter: w}
		s.s3.ServeHTTP(nc, r)
		if !nc.wrote { // a HEAD's answer, written once the handler returns
			nc.strip()
		}
		return
	}
	s.s3.ServeHTTP(w, r)
}

// noChecksums leaves the x-amz-checksum-* headers out of an answer.
type noChecksums struct {
	http.ResponseWriter
	wrote bool
}

func (n *noChecksums) WriteHeader(status int) {
	if !n.wrote {
		n.wrote = true
		n.strip()
	}
	n.ResponseWriter.WriteHeader(status)
}

func (n *noChecksums) strip() {
	h := n.Header()
	for k := range h {
		if strings.HasPrefix(strings.ToLower(k), "x-amz-checksum-") {
			delete(h, k)
		}
	}
}

func (n *noChecksums) Write(b []byte) (int, error) {
	if !n.wrote {
		n.WriteHeader(http.StatusOK)
	}
	return n.ResponseWriter.Write(b)
}

func (s *Server) fail() bool {
	rate := bitsFloat(s.failBits.Load())
	if rate <= 0 {
		return false
	}
	s.rngMu.Lock()
	defer s.rngMu.Unlock()
	return s.rng.Float64() < rate
}

// discardBody reads what is left of a refused request's body (up to a
// bound), so that the client reads the answer instead of a reset while it
// is still writing.
func discardBody(r *http.Request) {
	_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, 64<<20))
}

// element is an XML element of an error answer besides Code and Message:
// Condition of a 412, Header of a 501.
type element struct{ name, text string }

// writeError answers an S3 REST error.
func writeError(w http.ResponseWriter, r *http.Request, status int, code, msg string, extra ...element) {
	w.Header().Set("Content-Type", "application/xml")
	w.Header().Set("x-amz-request-id", "emulator")
	w.WriteHeader(status)
	if r.Method == http.MethodHead {
		return
	}
	var b bytes.Buffer
	b.WriteString(`<?xml version="1.0" encoding="UTF-8"?>` + "\n<Error><Code>")
	xmlEscape(&b, code)
	b.WriteString("</Code><Message>")
	xmlEscape(&b, msg)
	b.WriteString("</Message>")
	for _, e := range extra {
		b.WriteString("<" + e.name + ">")
		xmlEscape(&b, e.text)
		b.WriteString("</" + e.name + ">")
	}
	b.WriteString("<Resource>")
	xmlEscape(&b, r.URL.Path)
	b.WriteString("</Resource><RequestId>emulator</RequestId></Error>")
	_, _ = w.Write(b.Bytes())
}

func xmlEscape(b *bytes.Buffer, s string) {
	for _, c := range s {
		switch c {
		case '<':
			b.WriteString("&lt;")
		case '>':
			b.WriteString("&gt;")
		case '&':
			b.WriteString("&amp;")
		case '"':
			b.WriteString("&quot;")
		default:
			b.WriteRune(c)
		}
	}
}

// operation names the S3 operation of a path-style request.
func operation(r *http.Request) string {
	q := r.URL.Query()
	path := strings.TrimPrefix(r.URL.Path, "/")
	bucketOnly := !strings.Contains(path, "/")
	has := func(k string) bool { _, ok := q[k]; return ok }
	switch r.Method {
	case http.MethodPut:
		switch {
		case path == "":
			return "Unknown"
		case bucketOnly && has("versioning"):
			return "PutBucketVersioning"
		case bucketOnly:
			return "CreateBucket"
		case has("uploadId") && r.Header.Get("X-Amz-Copy-Source") != "":
			return "UploadPartCopy"
		case has("uploadId"):
			return "UploadPart"
		case r.Header.Get("X-Amz-Copy-Source") != "":
			return "CopyObject"
		case has("tagging"):
			return "PutObjectTagging"
		}
		return "PutObject"
	case http.MethodPost:
		switch {
		case has("uploads"):
			return "CreateMultipartUpload"
		case has("uploadId"):
			return "CompleteMultipartUpload"
		case has("delete"):
			return "DeleteObjects"
		}
		return "Post"
	case http.MethodDelete:
		switch {
		case has("uploadId"):
			return "AbortMultipartUpload"
		case bucketOnly:
			return "DeleteBucket"
		}
		return "DeleteObject"
	case http.MethodHead:
		if bucketOnly {
			return "HeadBucket"
		}
		return "HeadObject"
	case http.MethodGet:
		switch {
		case path == "":
			return "ListBuckets"
		case bucketOnly && has("uploads"):
			return "ListMultipartUploads"
		case bucketOnly && has("versions"):
			return "ListObjectVersions"
		case bucketOnly && has("location"):
			return "GetBucketLocation"
		case bucketOnly:
			return "ListObjects"
		case has("uploadId"):
			return "ListParts"
		}
		return "GetObject"
	}
	return "Unknown"
}

type slogLogger struct{ l *slog.Logger }

func (s slogLogger) Print(level gofakes3.LogLevel, v ...any) {
	if level == gofakes3.LogErr {
		s.l.Error("s3 emulator", "detail", fmt.Sprint(v...))
	}
}

// serveListUploads answers ListMultipartUploads as S3 does for a bucket
// without uploads in progress: an empty list (the library below answers
// 404 NoSuchUpload when none was ever begun in the bucket).
func (s *Server) serveListUploads(w http.ResponseWriter, r *http.Request) {
	rec := httptest.NewRecorder()
	s.s3.ServeHTTP(rec, r)
	bucket, _ := bucketKey(r)
	if rec.Code == http.StatusNotFound && strings.Contains(rec.Body.String(), "NoSuchUpload") && s.bucketExists(bucket) {
		var b bytes.Buffer
		b.WriteString(`<?xml version="1.0" encoding="UTF-8"?>` + "\n" + `<ListMultipartUploadsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Bucket>`)
		xmlEscape(&b, bucket)
		b.WriteString("</Bucket><KeyMarker></KeyMarker><UploadIdMarker></UploadIdMarker><Prefix>")
		xmlEscape(&b, r.URL.Query().Get("prefix"))
		b.WriteString("</Prefix><MaxUploads>1000</MaxUploads><IsTruncated>false</IsTruncated></ListMultipartUploadsResult>")
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(b.Bytes())
		return
	}
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(rec.Body.Bytes())
}
