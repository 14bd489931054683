package s3emu

import (
	"bytes"
	"encoding/xml"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
)

// S3's answers to If-None-Match on a write (PutObject, CompleteMultipartUpload):
// "*" writes only a key that does not exist; any other value is not
// implemented.
const (
	preconditionMessage    = "At least one of the pre-conditions you specified did not hold"
	notImplementedMessage  = "A header you provided implies functionality that is not implemented"
	notImplementedAddition = "We don't accept the provided value of If-None-Match header for this API"
)

// serveWrite answers a request that writes an object (PutObject,
// CompleteMultipartUpload, CopyObject). Writes of one key are serialised,
// so that If-None-Match: * is decided and the object written atomically
// with respect to every other write of the key; gofakes3 itself checks the
// header on PutObject only, and answers with its own message.
func (s *Server) serveWrite(w http.ResponseWriter, r *http.Request, op string) {
	ifNoneMatch := r.Header.Get("If-None-Match")
	conditional := ifNoneMatch != "" && (op == "PutObject" || op == "CompleteMultipartUpload")
	if conditional && ifNoneMatch != "*" {
		discardBody(r)
		writeError(w, r, http.StatusNotImplemented, "NotImplemented", notImplementedMessage,
			element{"Header", "If-None-Match"}, element{"additionalMessage", notImplementedAddition})
		return
	}
	bucket, key := bucketKey(r)
	unlock := s.keys.lock(bucket + "/" + key)
	defer unlock()
	if r.Method == http.MethodPut && !verifyChecksum(w, r) {
		return
	}
	if conditional && s.conflicts.Add(-1) >= 0 {
		discardBody(r)
		if op == "CompleteMultipartUpload" {
			s.abortUpload(r)
		}
		writeError(w, r, http.StatusConflict, "ConditionalRequestConflict", conflictMessage)
		return
	}
	// S3 answers what the request would get without the condition when
	// that is an error (no such bucket, no such upload) rather than 412:
	// gofakes3 answers those.
	if conditional && (op != "CompleteMultipartUpload" || s.uploadExists(r)) && s.exists(bucket, key) {
		discardBody(r)
		writeError(w, r, http.StatusPreconditionFailed, "PreconditionFailed", preconditionMessage,
			element{"Condition", "If-None-Match"})
		return
	}
	if op == "CompleteMultipartUpload" && !s.partsLargeEnough(w, r) {
		return
	}
	s.s3.ServeHTTP(w, r)
}

// minPartSize is the least a multipart upload's part may hold, but its
// last: S3 refuses the completion of an upload with a smaller one.
const minPartSize = 5 << 20

// partsLargeEnough answers 400 EntityTooSmall, as S3 does, to a
// CompleteMultipartUpload that names a part other than its last of less
// than minPartSize (MalformedXML to one that names none, InvalidPartOrder
// to parts not in ascending order), and reports false; the part sizes come from gofakes3
// (ListParts), which does not check them. The request's body is read and
// put back for gofakes3.
func (s *Server) partsLargeEnough(w http.ResponseWriter, r *http.Request) bool {
	body, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(body), r.Body), r.Body} // whole again for gofakes3
	if err != nil {
		return true // gofakes3 answers the broken request
	}
	var req struct {
		Parts []struct {
			PartNumber int `xml:"PartNumber"`
		} `xml:"Part"`
	}
	if xml.Unmarshal(body, &req) != nil {
		return true // gofakes3 answers the malformed request
	}
	if len(req.Parts) == 0 {
		writeError(w, r, http.StatusBadRequest, "MalformedXML", "The XML you provided was not well-formed or did not validate against our published schema")
		return false
	}
	for i := 1; i < len(req.Parts); i++ {
		if req.Parts[i].PartNumber <= req.Parts[i-1].PartNumber {
			writeError(w, r, http.StatusBadRequest, "InvalidPartOrder", "The list of parts was not in ascending order. Parts must be ordered by part number.")
			return false
		}
	}
	if len(req.Parts) < 2 {
		return true
	}
	rec := s.listParts(r, 10000)
	var list struct {
		Parts []struct {
			PartNumber int   `xml:"PartNumber"`
			Size       int64 `xml:"Size"`
		} `xml:"Part"`
	}
	if rec == nil || rec.Code != http.StatusOK || xml.Unmarshal(rec.Body.Bytes(), &list) != nil {
		return true // no such upload: gofakes3 says so
	}
	size := map[int]int64{}
	for _, p := range list.Parts {
		size[p.PartNumber] = p.Size
	}
	for _, p := range req.Parts[:len(req.Parts)-1] {
		if n, ok := size[p.PartNumber]; ok && n < minPartSize {
			writeError(w, r, http.StatusBadRequest, "EntityTooSmall", "Your proposed upload is smaller than the minimum allowed object size.")
			return false
		}
	}
	return true
}

// bucketKey splits a path-style request's path into bucket and key.
func bucketKey(r *http.Request) (bucket, key string) {
	bucket, key, _ = strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	return bucket, key
}

// exists reports whether bucket holds key. An error other than a missing
// key (a missing bucket) reports false: gofakes3 then answers the error.
func (s *Server) exists(bucket, key string) bool {
	obj, err := s.backend.HeadObject(bucket, key)
	if err != nil {
		return false
	}
	if obj.Contents != nil {
		obj.Contents.Close()
	}
	return true
}

// bucketExists reports whether the bucket exists (false on an error).
func (s *Server) bucketExists(bucket string) bool {
	ok, err := s.backend.BucketExists(bucket)
	return err == nil && ok
}

// uploadExists reports whether the multipart upload a
// CompleteMultipartUpload names is in progress, by asking gofakes3 for its
// parts (ListParts), which holds the uploads.
func (s *Server) uploadExists(r *http.Request) bool {
	rec := s.listParts(r, 1)
	return rec != nil && rec.Code == http.StatusOK
}

// conflictMessage is S3's message of a 409 ConditionalRequestConflict.
const conflictMessage = "A conflicting conditional operation is currently in progress against this resource. Please try again."

// abortUpload aborts the upload request r names, in gofakes3.
func (s *Server) abortUpload(r *http.Request) {
	u := *r.URL
	u.RawQuery = url.Values{"uploadId": {r.URL.Query().Get("uploadId")}}.Encode()
	probe, err := http.NewRequestWithContext(r.Context(), http.MethodDelete, u.String(), nil)
	if err != nil {
		return
	}
	probe.Host = r.Host
	s.s3.ServeHTTP(httptest.NewRecorder(), probe)
}

// listParts is gofakes3's answer to a ListParts, of at most max parts, of
// the upload request r names (nil if the request cannot be made).
func (s *Server) listParts(r *http.Request, max int) *httptest.ResponseRecorder {
	u := *r.URL
	u.RawQuery = url.Values{"uploadId": {r.URL.Query().Get("uploadId")}, "max-parts": {strconv.Itoa(max)}}.Encode()
	probe, err := http.NewRequestWithContext(r.Context(), http.MethodGet, u.String(), nil)
	if err != nil {
		return nil
	}
	probe.Host = r.Host
	rec := httptest.NewRecorder()
	s.s3.ServeHTTP(rec, probe)
	return rec
}

// keyLocks holds a lock per key being written, and none for the others.
type keyLocks struct {
	mu sync.Mutex
	m  map[string]*keyLock
}

type keyLock struct {
	mu    sync.Mutex
	users int // holders and waiters
}

// lock takes key's lock and returns what releases it.
func (k *keyLocks) lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*keyLock{}
	}
	l := k.m[key]
	if l == nil {
		l = &keyLock{}
		k.m[key] = l
	}
	l.users++
	k.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		k.mu.Lock()
		if l.users--; l.users == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
}
