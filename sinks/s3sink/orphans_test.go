package s3sink

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/logfwd/forwarder/config"
	s3emu "github.com/logfwd/forwarder/emulator/s3emu"
	"github.com/logfwd/forwarder/sinks"
)

// Multipart uploads left open by failures on the wire: each is aborted
// before the object is stored again, so that none costs storage until the
// bucket's lifecycle rule.

// frontedEmu starts an S3 emulator holding the test bucket, behind the
// handler front makes of it (nil: the emulator itself), and returns it and
// the front's URL.
func frontedEmu(t *testing.T, front func(emu *s3emu.Server) http.Handler) (*s3emu.Server, string) {
	t.Helper()
	emu, err := s3emu.New(s3emu.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { emu.Close() })
	if err := emu.CreateBucket(bucket); err != nil {
		t.Fatal(err)
	}
	var h http.Handler = emu
	if front != nil {
		h = front(emu)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return emu, srv.URL
}

// multipartBatch is a sink on url uploading objects over 5 MiB in parts,
// and a final batch of 80,000 records (about 6 MiB) for it.
func multipartBatch(t *testing.T, url string) (*Sink, *sinks.Batch) {
	t.Helper()
	cfg := testConfig(url)
	cfg.Compression = config.CompressionNone
	cfg.MultipartThreshold = 5 * config.MiB
	cfg.MaxObjectBytes = 32 * config.MiB
	s := newTestSink(t, cfg)
	recs := batchRecs("a", 80000)
	return s, &sinks.Batch{Partition: s.Partition(&recs[0]), Records: recs, State: newMemState(recs), Final: true}
}

// storedOnce fails the test unless the bucket holds one object and no
// upload is left open.
func storedOnce(t *testing.T, emu *s3emu.Server, url string) {
	t.Helper()
	if objs, _ := emu.Objects(bucket); len(objs) != 1 {
		t.Fatalf("objects %+v, want one", objs)
	}
	if up, err := newReader(t, url).ListMultipartUploads(t.Context(), &s3.ListMultipartUploadsInput{Bucket: aws.String(bucket)}); err != nil || len(up.Uploads) != 0 {
		t.Errorf("uploads left open after the object was stored: %d, %v", len(up.Uploads), err)
	}
}

// The answer to CreateMultipartUpload is lost on the wire (S3 created the
// upload; the connection drops before the answer): the SDK's error has no
// status, which is no answer, not a refusal.
func TestLostCreateAnswerOnTheWireAborted(t *testing.T) {
	var lost atomic.Bool
	emu, url := frontedEmu(t, func(emu *s3emu.Server) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, isCreate := r.URL.Query()["uploads"]
			if r.Method == http.MethodPost && isCreate && lost.CompareAndSwap(false, true) {
				emu.ServeHTTP(httptest.NewRecorder(), r) // S3 creates the upload
				conn, _, err := w.(http.Hijacker).Hijack()
				if err == nil {
					conn.Close() // and its answer is lost
				}
				return
			}
			emu.ServeHTTP(w, r)
		})
	})
	s, b := multipartBatch(t, url)
	if _, err := s.Send(t.Context(), b); err == nil || !lost.Load() {
		t.Fatalf("first send: %v (lost %v)", err, lost.Load())
	}
	if _, err := s.Send(t.Context(), b); err != nil {
		t.Fatalf("send again: %v", err)
	}
	storedOnce(t, emu, url)
}

// A part fails (500) and the aborts of the upload fail for a moment (503):
// the upload whose id the next attempt replaces is looked for among the
// key's open uploads and aborted.
func TestFailedAbortLookedForAgain(t *testing.T) {
	var mu sync.Mutex
	partFails, abortFails := 1, 2
	emu, url := frontedEmu(t, func(emu *s3emu.Server) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			q := r.URL.Query()
			mu.Lock()
			var fail int
			switch {
			case r.Method == http.MethodPut && q.Get("partNumber") != "" && partFails > 0:
				partFails--
				fail = http.StatusInternalServerError
			case r.Method == http.MethodDelete && q.Get("uploadId") != "" && abortFails > 0:
				abortFails--
				fail = http.StatusServiceUnavailable
			}
			mu.Unlock()
			if fail != 0 {
				w.WriteHeader(fail)
				return
			}
			emu.ServeHTTP(w, r)
		})
	})
	s, b := multipartBatch(t, url)
	if _, err := s.Send(t.Context(), b); err == nil {
		t.Fatal("first send succeeded")
	}
	if _, err := s.Send(t.Context(), b); err != nil {
		t.Fatalf("send again: %v", err)
	}
	storedOnce(t, emu, url)
}

// A 409 ConditionalRequestConflict (another conditional write of the key
// in progress) is retried: a PutObject is made again, a multipart upload
// begun again (S3 asks it; the emulator aborts the upload whose completion
// it refused). The object is stored once and no upload is left open.
func TestConditionalConflictRetried(t *testing.T) {
	for _, multipart := range []bool{false, true} {
		t.Run(map[bool]string{false: "PutObject", true: "multipart"}[multipart], func(t *testing.T) {
			emu, url := frontedEmu(t, nil)
			var (
				s *Sink
				b *sinks.Batch
			)
			if multipart {
				s, b = multipartBatch(t, url)
			} else {
				recs := batchRecs("a", 100)
				s = newTestSink(t, testConfig(url))
				b = &sinks.Batch{Partition: s.Partition(&recs[0]), Records: recs, State: newMemState(recs), Final: true}
			}
			emu.SetConflicts(1)
			_, err := s.Send(t.Context(), b)
			if e := sinks.Classify(err); err == nil || e.Class != sinks.Retryable || e.Reason != "ConditionalRequestConflict" {
				t.Fatalf("first send: %v (%v %s), want a retryable ConditionalRequestConflict", err, e.Class, e.Reason)
			}
			if _, err := s.Send(t.Context(), b); err != nil {
				t.Fatalf("send again: %v", err)
			}
			storedOnce(t, emu, url)
		})
	}
}
