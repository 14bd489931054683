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

// The answer to CreateMultipartUpload is lost on the wire (S3 created the
// upload; the connection drops before the answer): the SDK's error has no
// status, which is no answer, not a refusal.
func TestLostCreateAnswerOnTheWireAborted(t *testing.T) {
	emu, err := s3emu.New(s3emu.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer emu.Close()
	if err := emu.CreateBucket(bucket); err != nil {
		t.Fatal(err)
	}
	var lost atomic.Bool
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	}))
	defer front.Close()

	cfg := testConfig(front.URL)
	cfg.Compression = config.CompressionNone
	cfg.MultipartThreshold = 5 * config.MiB
	cfg.MaxObjectBytes = 32 * config.MiB
	s := newTestSink(t, cfg)
	recs := batchRecs("a", 80000)
	st := newMemState(recs)
	b := &sinks.Batch{Partition: s.Partition(&recs[0]), Records: recs, State: st, Final: true}
	_, err = s.Send(t.Context(), b)
	if err == nil || !lost.Load() {
		t.Fatalf("first send: %v (lost %v)", err, lost.Load())
	}
	t.Logf("first send: %v (class %v reason %s)", err, sinks.Classify(err).Class, sinks.Classify(err).Reason)
	if _, err := s.Send(t.Context(), b); err != nil {
		t.Fatalf("send again: %v", err)
	}
	if objs, _ := emu.Objects(bucket); len(objs) != 1 {
		t.Fatalf("objects %+v, want one", objs)
	}
	if up, err := newReader(t, front.URL).ListMultipartUploads(t.Context(), &s3.ListMultipartUploadsInput{Bucket: aws.String(bucket)}); err != nil || len(up.Uploads) != 0 {
		t.Errorf("uploads left open after the object was stored: %d, %v", len(up.Uploads), err)
	}
}

// A part fails (500) and the aborts of the upload fail for a moment (503):
// the upload whose id the next attempt replaces is looked for among the
// key's open uploads and aborted.
func TestFailedAbortLookedForAgain(t *testing.T) {
	emu, err := s3emu.New(s3emu.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer emu.Close()
	if err := emu.CreateBucket(bucket); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	partFails, abortFails := 1, 2
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	}))
	defer front.Close()

	cfg := testConfig(front.URL)
	cfg.Compression = config.CompressionNone
	cfg.MultipartThreshold = 5 * config.MiB
	cfg.MaxObjectBytes = 32 * config.MiB
	s := newTestSink(t, cfg)
	recs := batchRecs("a", 80000)
	st := newMemState(recs)
	b := &sinks.Batch{Partition: s.Partition(&recs[0]), Records: recs, State: st, Final: true}
	if _, err = s.Send(t.Context(), b); err == nil {
		t.Fatal("first send succeeded")
	}
	if _, err := s.Send(t.Context(), b); err != nil {
		t.Fatalf("send again: %v", err)
	}
	if objs, _ := emu.Objects(bucket); len(objs) != 1 {
		t.Fatalf("objects %+v, want one", objs)
	}
	if up, err := newReader(t, front.URL).ListMultipartUploads(t.Context(), &s3.ListMultipartUploadsInput{Bucket: aws.String(bucket)}); err != nil || len(up.Uploads) != 0 {
		t.Errorf("uploads left open after the object was stored and its intent done with: %d, %v", len(up.Uploads), err)
	}
}

// A 409 ConditionalRequestConflict (another conditional write of the key
// in progress) is retried: a PutObject is made again, a multipart upload
// begun again (S3 asks it; the emulator aborts the upload whose completion
// it refused). The object is stored once and no upload is left open.
func TestConditionalConflictRetried(t *testing.T) {
	for _, multipart := range []bool{false, true} {
		t.Run(map[bool]string{false: "PutObject", true: "multipart"}[multipart], func(t *testing.T) {
			emu, err := s3emu.New(s3emu.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer emu.Close()
			if err := emu.CreateBucket(bucket); err != nil {
				t.Fatal(err)
			}
			front := httptest.NewServer(emu)
			defer front.Close()
			cfg := testConfig(front.URL)
			recs := batchRecs("a", 100)
			if multipart {
				cfg.Compression = config.CompressionNone
				cfg.MultipartThreshold = 5 * config.MiB
				cfg.MaxObjectBytes = 32 * config.MiB
				recs = batchRecs("a", 80000)
			}
			s := newTestSink(t, cfg)
			st := newMemState(recs)
			b := &sinks.Batch{Partition: s.Partition(&recs[0]), Records: recs, State: st, Final: true}
			emu.SetConflicts(1)
			_, err = s.Send(t.Context(), b)
			if e := sinks.Classify(err); err == nil || e.Class != sinks.Retryable || e.Reason != "ConditionalRequestConflict" {
				t.Fatalf("first send: %v (%v %s), want a retryable ConditionalRequestConflict", err, e.Class, e.Reason)
			}
			if _, err := s.Send(t.Context(), b); err != nil {
				t.Fatalf("send again: %v", err)
			}
			if objs, _ := emu.Objects(bucket); len(objs) != 1 {
				t.Fatalf("objects %+v, want one", objs)
			}
			if up, err := newReader(t, front.URL).ListMultipartUploads(t.Context(), &s3.ListMultipartUploadsInput{Bucket: aws.String(bucket)}); err != nil || len(up.Uploads) != 0 {
				t.Errorf("uploads left open: %d, %v", len(up.Uploads), err)
			}
		})
	}
}
