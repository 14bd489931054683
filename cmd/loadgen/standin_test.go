package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs"
	cwtypes "github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// The stand-in answers the calls the sinks make, as the SDK's clients
// make them, and counts what arrived.
func TestStandinAnswersTheSinksCalls(t *testing.T) {
	srv := httptest.NewServer(&standin{})
	defer srv.Close()
	ctx := context.Background()
	creds := credentials.NewStaticCredentialsProvider("k", "s", "")
	s3c := s3.New(s3.Options{Region: "us-east-1", Credentials: creds, BaseEndpoint: aws.String(srv.URL), UsePathStyle: true})
	if _, err := s3c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("bucket"), Key: aws.String("a/b.json.gz"), Body: bytes.NewReader([]byte("hello"))}); err != nil {
		t.Fatalf("PutObject: %v", err)
	}
	up, err := s3c.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("bucket"), Key: aws.String("big")})
	if err != nil || aws.ToString(up.UploadId) == "" {
		t.Fatalf("CreateMultipartUpload: %v %+v", err, up)
	}
	part, err := s3c.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String("bucket"), Key: aws.String("big"), UploadId: up.UploadId, PartNumber: aws.Int32(1), Body: bytes.NewReader(make([]byte, 1000))})
	if err != nil {
		t.Fatalf("UploadPart: %v", err)
	}
	if _, err := s3c.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: aws.String("bucket"), Key: aws.String("big"), UploadId: up.UploadId,
		MultipartUpload: &s3types.CompletedMultipartUpload{Parts: []s3types.CompletedPart{{ETag: part.ETag, PartNumber: aws.Int32(1)}}}}); err != nil {
		t.Fatalf("CompleteMultipartUpload: %v", err)
	}
	if l, err := s3c.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String("bucket")}); err != nil || len(l.Uploads) != 0 {
		t.Fatalf("ListMultipartUploads: %v %+v", err, l)
	}
	var nf *s3types.NotFound
	if _, err := s3c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("bucket"), Key: aws.String("a/b.json.gz")}); !errors.As(err, &nf) {
		t.Fatalf("HeadObject of what it does not keep: %v, want NotFound", err)
	}

	logs := cloudwatchlogs.New(cloudwatchlogs.Options{Region: "us-east-1", Credentials: creds, BaseEndpoint: aws.String(srv.URL)})
	if _, err := logs.CreateLogStream(ctx, &cloudwatchlogs.CreateLogStreamInput{LogGroupName: aws.String("/g"), LogStreamName: aws.String("s")}); err != nil {
		t.Fatalf("CreateLogStream: %v", err)
	}
	events := []cwtypes.InputLogEvent{
		{Message: aws.String(`{"timestamp":"not an event"}`), Timestamp: aws.Int64(1)},
		{Message: aws.String("b"), Timestamp: aws.Int64(2)},
		{Message: aws.String("c"), Timestamp: aws.Int64(3)},
	}
	if _, err := logs.PutLogEvents(ctx, &cloudwatchlogs.PutLogEventsInput{LogGroupName: aws.String("/g"), LogStreamName: aws.String("s"), LogEvents: events}); err != nil {
		t.Fatalf("PutLogEvents: %v", err)
	}

	resp, err := http.Get(srv.URL + "/_standin/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st standinStats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	if st.Objects != 2 || st.Parts != 1 || st.LogCalls != 1 || st.Events != 3 || st.First.IsZero() {
		t.Fatalf("stats %+v, want 2 objects, 1 part, 1 PutLogEvents of 3 events", st)
	}
}

// The earlier gap is the longest pause but the one before the latest
// delivery: a stall in the middle of a catch-up shows there even when the
// tail (the last object waiting out its age) is longer.
func TestStandinGapsSetTheTailApart(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var k kindTimes
	for _, at := range []time.Duration{0, time.Second, 2 * time.Second, 9 * time.Second, 10 * time.Second, 310 * time.Second} {
		k.delivered(t0.Add(at))
	}
	if k.maxGap != 300*time.Second || !k.gapEnd.Equal(t0.Add(310*time.Second)) {
		t.Errorf("longest gap %v ending %v, want 300s ending at 310s", k.maxGap, k.gapEnd.Sub(t0))
	}
	if k.maxEarlier != 7*time.Second || !k.earlierEnd.Equal(t0.Add(9*time.Second)) {
		t.Errorf("longest earlier gap %v ending %v, want 7s ending at 9s", k.maxEarlier, k.earlierEnd.Sub(t0))
	}
	var one kindTimes
	one.delivered(t0)
	one.delivered(t0.Add(time.Minute))
	if one.maxEarlier != 0 || one.maxGap != time.Minute {
		t.Errorf("two deliveries: earlier %v, longest %v; want 0 and 1m", one.maxEarlier, one.maxGap)
	}
}
