package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const standinUsage = `Usage: loadgen standin -listen 127.0.0.1:4599

Answer the S3 and CloudWatch Logs requests of the forwarder's sinks at once, as a
destination that accepts everything and keeps nothing would: PutObject, multipart
uploads and PutLogEvents succeed, log groups and streams are created. Requests with
an X-Amz-Target header are CloudWatch Logs; the others are S3 with path-style
addressing (path_style: true). GET /_standin/stats answers what arrived, as JSON:
requests, events (PutLogEvents), objects and bytes (S3), the first and last
delivery, and the longest time between two PutLogEvents and between two objects. Point both sinks' endpoint
at it to measure the forwarder without an emulator's own cost.
`

// standin is the stand-in destination's counters.
type standin struct {
	logCalls, events, objects, parts, bodyBytes atomic.Uint64
	uploads                                     atomic.Uint64 // multipart upload ids handed out
	mu                                          sync.Mutex
	first, last                                 time.Time // of the first and last accepted delivery
	kinds                                       [2]kindTimes
}

// kindTimes follow the deliveries of one kind: PutLogEvents or objects.
type kindTimes struct {
	last   time.Time
	maxGap time.Duration // longest time between two deliveries of the kind
	gapEnd time.Time     // when it ended
	// lastGap is the time before the latest delivery; maxEarlier the
	// longest gap before that one: a pause that was not the tail (the last,
	// partial object waiting out its age).
	lastGap, maxEarlier time.Duration
	earlierEnd          time.Time
	lastAt              time.Time // when the latest gap ended
}

const (
	kindLogs = iota
	kindObjects
)

func cmdStandin(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	f := flag.NewFlagSet("loadgen standin", flag.ContinueOnError)
	f.SetOutput(stderr)
	f.Usage = func() { fmt.Fprint(stderr, standinUsage); f.PrintDefaults() }
	addr := f.String("listen", "127.0.0.1:4599", "address to listen on")
	if err := f.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintf(stderr, "loadgen standin: %v\n", err)
		return 1
	}
	s := &standin{}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	fmt.Fprintf(stdout, "standin listening on %s\n", ln.Addr())
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintf(stderr, "loadgen standin: %v\n", err)
		return 1
	}
	return 0
}

// standinStats is what GET /_standin/stats answers.
type standinStats struct {
	LogCalls  uint64    `json:"put_log_events"`
	Events    uint64    `json:"events"`
	Objects   uint64    `json:"objects"`
	Parts     uint64    `json:"parts"`
	BodyBytes uint64    `json:"body_bytes"`
	First     time.Time `json:"first,omitzero"`
	Last      time.Time `json:"last,omitzero"`
	// The longest time between two PutLogEvents and between two objects.
	MaxGapLogsMs    float64   `json:"max_gap_logs_ms"`
	MaxGapObjectsMs float64   `json:"max_gap_objects_ms"`
	GapLogsEnd      time.Time `json:"gap_logs_end,omitzero"`
	GapObjectsEnd   time.Time `json:"gap_objects_end,omitzero"`
	// The same but for the gap before the latest delivery of the kind: the
	// longest pause that was not the tail.
	MaxEarlierGapLogsMs    float64   `json:"max_earlier_gap_logs_ms"`
	MaxEarlierGapObjectsMs float64   `json:"max_earlier_gap_objects_ms"`
	EarlierGapLogsEnd      time.Time `json:"earlier_gap_logs_end,omitzero"`
	EarlierGapObjectsEnd   time.Time `json:"earlier_gap_objects_end,omitzero"`
}

func (s *standin) stats() standinStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return standinStats{LogCalls: s.logCalls.Load(), Events: s.events.Load(), Objects: s.objects.Load(),
		Parts: s.parts.Load(), BodyBytes: s.bodyBytes.Load(), First: s.first, Last: s.last,
		MaxGapLogsMs:    float64(s.kinds[kindLogs].maxGap) / float64(time.Millisecond),
		MaxGapObjectsMs: float64(s.kinds[kindObjects].maxGap) / float64(time.Millisecond),
		GapLogsEnd:      s.kinds[kindLogs].gapEnd, GapObjectsEnd: s.kinds[kindObjects].gapEnd,
		MaxEarlierGapLogsMs:    float64(s.kinds[kindLogs].maxEarlier) / float64(time.Millisecond),
		MaxEarlierGapObjectsMs: float64(s.kinds[kindObjects].maxEarlier) / float64(time.Millisecond),
		EarlierGapLogsEnd:      s.kinds[kindLogs].earlierEnd, EarlierGapObjectsEnd: s.kinds[kindObjects].earlierEnd}
}

func (s *standin) delivered(kind int) {
	now := time.Now()
	s.mu.Lock()
	if s.first.IsZero() {
		s.first = now
	}
	s.last = now
	s.kinds[kind].delivered(now)
	s.mu.Unlock()
}

// delivered notes a delivery of the kind at now.
func (k *kindTimes) delivered(now time.Time) {
	if k.last.IsZero() {
		k.last = now
		return
	}
	gap := now.Sub(k.last)
	if gap > k.maxGap {
		k.maxGap, k.gapEnd = gap, now
	}
	if k.lastGap > k.maxEarlier {
		k.maxEarlier, k.earlierEnd = k.lastGap, k.lastAt
	}
	k.lastGap, k.lastAt, k.last = gap, now, now
}

var eventKey = []byte(`"timestamp"`)

func (s *standin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/_standin/stats" {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(s.stats())
		return
	}
	// Bodies are read into reused buffers (CloudWatch Logs, whose events
	// are counted) or discarded as they arrive (S3): the stand-in's own CPU
	// shares the machine with the forwarder it measures.
	if target := r.Header.Get("X-Amz-Target"); target != "" {
		buf := standinBodies.Get().(*bytes.Buffer)
		defer standinBodies.Put(buf)
		buf.Reset()
		if r.ContentLength > 0 {
			buf.Grow(int(r.ContentLength) + bytes.MinRead) // ReadFrom wants MinRead free to see EOF
		}
		n, err := buf.ReadFrom(r.Body)
		s.bodyBytes.Add(uint64(n))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.logs(w, target, buf.Bytes())
		return
	}
	n, err := io.Copy(io.Discard, r.Body)
	s.bodyBytes.Add(uint64(n))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.s3(w, r)
}

// standinBodies are buffers for the bodies of CloudWatch Logs calls.
var standinBodies = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// logs answers a CloudWatch Logs call (awsJson1.1).
func (s *standin) logs(w http.ResponseWriter, target string, body []byte) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	op := target[strings.LastIndexByte(target, '.')+1:]
	switch op {
	case "PutLogEvents":
		s.logCalls.Add(1)
		s.events.Add(uint64(bytes.Count(body, eventKey)))
		s.delivered(kindLogs)
		io.WriteString(w, `{"nextSequenceToken":"1"}`)
	case "GetLogEvents":
		io.WriteString(w, `{"events":[],"nextForwardToken":"f/0","nextBackwardToken":"b/0"}`)
	default: // CreateLogGroup, CreateLogStream, PutRetentionPolicy, TagResource...
		io.WriteString(w, `{}`)
	}
}

// s3 answers an S3 call, path-style.
func (s *standin) s3(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	_, hasUploads := q["uploads"]
	uploadID := q.Get("uploadId")
	switch {
	case r.Method == http.MethodPut && uploadID != "":
		s.parts.Add(1)
		w.Header().Set("ETag", `"part"`)
	case r.Method == http.MethodPut:
		s.objects.Add(1)
		s.delivered(kindObjects)
		w.Header().Set("ETag", `"object"`)
	case r.Method == http.MethodPost && hasUploads:
		id := s.uploads.Add(1)
		w.Header().Set("Content-Type", "application/xml")
		fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><InitiateMultipartUploadResult><Bucket>b</Bucket><Key>k</Key><UploadId>u%d</UploadId></InitiateMultipartUploadResult>`, id)
	case r.Method == http.MethodPost && uploadID != "":
		s.objects.Add(1)
		s.delivered(kindObjects)
		w.Header().Set("Content-Type", "application/xml")
		io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><CompleteMultipartUploadResult><Bucket>b</Bucket><Key>k</Key><ETag>"object"</ETag></CompleteMultipartUploadResult>`)
	case r.Method == http.MethodDelete:
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodGet && hasUploads:
		w.Header().Set("Content-Type", "application/xml")
		io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><ListMultipartUploadsResult><Bucket>b</Bucket><IsTruncated>false</IsTruncated></ListMultipartUploadsResult>`)
	default: // GET or HEAD of an object: it keeps nothing
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(http.StatusNotFound)
		if r.Method != http.MethodHead {
			io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>NoSuchKey</Code><Message>The specified key does not exist.</Message></Error>`)
		}
	}
}
