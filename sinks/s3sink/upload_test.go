package s3sink

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	s3emu "github.com/logfwd/forwarder/emulator/s3emu"
	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// TestPutObjectSignsTheObjectsHash: over plain HTTP the SDK signs the
// payload hash, which the sink hands it from the intent rather than
// letting it hash the body again; the hash it sends must be the body's.
func TestPutObjectSignsTheObjectsHash(t *testing.T) {
	emu, err := s3emu.New(s3emu.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer emu.Close()
	if err := emu.CreateBucket(bucket); err != nil {
		t.Fatal(err)
	}
	type put struct {
		signed string
		body   []byte
	}
	var mu sync.Mutex
	var puts []put
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			mu.Lock()
			puts = append(puts, put{r.Header.Get("X-Amz-Content-Sha256"), body})
			mu.Unlock()
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		emu.ServeHTTP(w, r)
	}))
	defer front.Close()

	s := newTestSink(t, testConfig(front.URL))
	var recs []wal.Record
	for i := range 100 {
		recs = append(recs, rec("app", string(rune('a'+i%26))+"x", time.Unix(1750000000, int64(i)), 100))
	}
	batch := sinkRecs(recs...)
	st := newMemState(batch)
	out, err := s.Send(context.Background(), &sinks.Batch{Partition: s.Partition(&batch[0]), Records: batch, State: st, Final: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.DeleteState) != 1 {
		t.Fatalf("outcome %+v", out)
	}
	mu.Lock()
	if len(puts) != 1 {
		t.Fatalf("%d PUTs, want 1", len(puts))
	}
	sum := sha256.Sum256(puts[0].body)
	if puts[0].signed != hex.EncodeToString(sum[:]) {
		t.Errorf("x-amz-content-sha256 %q, want the body's %x", puts[0].signed, sum)
	}
	objs := mustObjects(t, emu)
	if len(objs) != 1 || objs[0].Size != int64(len(puts[0].body)) {
		t.Errorf("objects %+v", objs)
	}
	mu.Unlock()

	// The SDK takes the hash it is given and does not compute its own:
	// this one is not the body's (the emulator does not check it).
	other := sha256.Sum256([]byte("not the body"))
	if _, err := s.api.PutObject(context.Background(), &s3.PutObjectInput{
		Bucket: aws.String(bucket), Key: aws.String("given-hash"), Body: bytes.NewReader([]byte("body")),
	}, withPayloadHash(hex.EncodeToString(other[:]))); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(puts) != 2 || puts[1].signed != hex.EncodeToString(other[:]) {
		t.Errorf("x-amz-content-sha256 of the second PUT %q, want the given %x", puts[len(puts)-1].signed, other)
	}
}

// An object's bytes read from a staged file and its last member held in
// memory read as one: whole, by ReadAt across the boundary, and by Seek.
func TestBodyOfStagedAndTail(t *testing.T) {
	for _, c := range []struct{ head, tail string }{
		{"", "tail only"}, {"head only", ""}, {"0123456789", "abcdefghij"}, {"x", "yz"},
	} {
		obj := &object{tail: []byte(c.tail)}
		body := bodyOf(obj, strings.NewReader(c.head+"never read past the head"), int64(len(c.head)))
		if err := iotest.TestReader(body, []byte(c.head+c.tail)); err != nil {
			t.Errorf("head %q, tail %q: %v", c.head, c.tail, err)
		}
	}
	// A file shorter than its object is an error, not a short object.
	body := bodyOf(&object{tail: []byte("tail")}, strings.NewReader("short"), 10)
	if _, err := io.ReadAll(body); err == nil {
		t.Error("a staged file shorter than the object read without an error")
	}
}

// An object held in memory as its members reads as their bytes one after
// the other: whole, by ReadAt across the boundaries, and by Seek.
func TestBodyOfParts(t *testing.T) {
	for _, parts := range [][]string{{"one"}, {"0123456789", "abcdefghij"}, {"x", "", "yz", "", ""}, {"", "a"}} {
		obj := &object{}
		for _, p := range parts {
			obj.parts = append(obj.parts, []byte(p))
			obj.size += int64(len(p))
		}
		if err := iotest.TestReader(bodyOf(obj, nil, 0), []byte(strings.Join(parts, ""))); err != nil {
			t.Errorf("parts %q: %v", parts, err)
		}
	}
}

// A send cancelled by the stop aborts its upload for a moment only, not
// the 10 s an abort otherwise gets: an endpoint that does not answer must
// not hold the stop past its deadline.
func TestAbortAfterStopIsShort(t *testing.T) {
	release := make(chan struct{})
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer front.Close()
	s := newTestSink(t, testConfig(front.URL))

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	if err := s.abort(ctx, s.bucket, "k", "upload-1"); err == nil {
		t.Fatal("an abort that got no answer reported success")
	}
	if took := time.Since(start); took > 2*abortAfterStop {
		t.Errorf("abort after the stop took %s, want about %s", took, abortAfterStop)
	}

	// Before the stop, the abort waits longer than that: here until the
	// endpoint answers.
	done := make(chan error, 1)
	go func() { done <- s.abort(context.Background(), s.bucket, "k", "upload-1") }()
	select {
	case err := <-done:
		t.Fatalf("abort during the run gave up before the endpoint answered: %v", err)
	case <-time.After(3 * abortAfterStop):
	}
	close(release)
	if err := <-done; err != nil {
		t.Errorf("abort answered 204: %v", err)
	}
}
