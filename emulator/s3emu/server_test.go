package s3emu

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

func sha256b64(b []byte) string {
	s := sha256.Sum256(b)
	return base64.StdEncoding.EncodeToString(s[:])
}

func mustBucket(t *testing.T, srv *Server, name string) {
	t.Helper()
	if err := srv.CreateBucket(name); err != nil {
		t.Fatal(err)
	}
}

func getBody(t *testing.T, cl *s3.Client, bucket, key string) (*s3.GetObjectOutput, []byte) {
	t.Helper()
	out, err := cl.GetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	if err != nil {
		t.Fatalf("GetObject %s: %v", key, err)
	}
	defer out.Body.Close()
	b, err := io.ReadAll(out.Body)
	if err != nil {
		t.Fatalf("read %s: %v", key, err)
	}
	return out, b
}

func TestPutObjectKeepsHeaders(t *testing.T) {
	srv, cl := start(t, Options{})
	mustBucket(t, srv, "logs")
	body := []byte("hello\n")
	_, err := cl.PutObject(context.Background(), &s3.PutObjectInput{
		Bucket: aws.String("logs"), Key: aws.String("a/b.json.gz"), Body: bytes.NewReader(body),
		ContentType: aws.String("application/x-ndjson"), ContentEncoding: aws.String("gzip"),
		ChecksumSHA256: aws.String(sha256b64(body)), ServerSideEncryption: types.ServerSideEncryptionAwsKms,
		SSEKMSKeyId: aws.String("alias/logs"), StorageClass: types.StorageClassStandardIa,
		ACL: types.ObjectCannedACLBucketOwnerFullControl, Tagging: aws.String("team=core&env=dev"),
		Metadata: map[string]string{"Source": "test"},
	})
	if err != nil {
		t.Fatalf("PutObject: %v", err)
	}
	objs, err := srv.Objects("logs")
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 1 {
		t.Fatalf("objects = %+v, want one", objs)
	}
	o := objs[0]
	want := ObjectInfo{Key: "a/b.json.gz", Size: int64(len(body)), ContentType: "application/x-ndjson", ContentEncoding: "gzip",
		StorageClass: "STANDARD_IA", SSE: "aws:kms", SSEKMSKeyID: "alias/logs", ACL: "bucket-owner-full-control",
		Tagging: "team=core&env=dev", ChecksumSHA256: sha256b64(body)}
	if o.Key != want.Key || o.Size != want.Size || o.ContentType != want.ContentType || o.ContentEncoding != want.ContentEncoding ||
		o.StorageClass != want.StorageClass || o.SSE != want.SSE || o.SSEKMSKeyID != want.SSEKMSKeyID || o.ACL != want.ACL ||
		o.Tagging != want.Tagging || o.ChecksumSHA256 != want.ChecksumSHA256 || o.Metadata["source"] != "test" {
		t.Errorf("object = %+v\nwant     %+v", o, want)
	}
	got, err := srv.Get("logs", "a/b.json.gz")
	if err != nil || !bytes.Equal(got, body) {
		t.Errorf("Get = %q, %v", got, err)
	}
	out, b := getBody(t, cl, "logs", "a/b.json.gz")
	if !bytes.Equal(b, body) || aws.ToString(out.ContentEncoding) != "gzip" || aws.ToString(out.ContentType) != "application/x-ndjson" {
		t.Errorf("GetObject = %q, encoding %q, type %q", b, aws.ToString(out.ContentEncoding), aws.ToString(out.ContentType))
	}
	if c := srv.Calls(); c["PutObject"] != 1 || c["GetObject"] != 1 {
		t.Errorf("calls = %v", c)
	}
}

// An object's checksum is answered, by HEAD as by GET, only to
// x-amz-checksum-mode: ENABLED, as S3 does.
func TestChecksumsOnlyInChecksumMode(t *testing.T) {
	srv, cl := start(t, Options{})
	mustBucket(t, srv, "logs")
	body := []byte("hello\n")
	if _, err := cl.PutObject(context.Background(), &s3.PutObjectInput{Bucket: aws.String("logs"), Key: aws.String("k"),
		Body: bytes.NewReader(body), ChecksumSHA256: aws.String(sha256b64(body))}); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []types.ChecksumMode{"", types.ChecksumModeEnabled} {
		head, err := cl.HeadObject(context.Background(), &s3.HeadObjectInput{Bucket: aws.String("logs"), Key: aws.String("k"), ChecksumMode: mode})
		if err != nil {
			t.Fatal(err)
		}
		get, err := cl.GetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String("logs"), Key: aws.String("k"), ChecksumMode: mode})
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, get.Body)
		get.Body.Close()
		want := ""
		if mode == types.ChecksumModeEnabled {
			want = sha256b64(body)
		}
		if got := aws.ToString(head.ChecksumSHA256); got != want {
			t.Errorf("HEAD, checksum mode %q: checksum %q, want %q", mode, got, want)
		}
		if got := aws.ToString(get.ChecksumSHA256); got != want {
			t.Errorf("GET, checksum mode %q: checksum %q, want %q", mode, got, want)
		}
	}
}

func TestChecksumMismatchIsBadDigest(t *testing.T) {
	srv, cl := start(t, Options{})
	mustBucket(t, srv, "logs")
	for _, in := range []*s3.PutObjectInput{
		{ChecksumSHA256: aws.String(sha256b64([]byte("other")))},
		{ContentMD5: aws.String("1B2M2Y8AsgTpgAmY7PhCfg==")}, // MD5 of ""
	} {
		in.Bucket, in.Key, in.Body = aws.String("logs"), aws.String("k"), bytes.NewReader([]byte("data"))
		_, err := cl.PutObject(context.Background(), in)
		if code(err) != "BadDigest" || status(err) != http.StatusBadRequest {
			t.Errorf("PutObject with a wrong checksum: %v, want 400 BadDigest", err)
		}
	}
	if objs, _ := srv.Objects("logs"); len(objs) != 0 {
		t.Errorf("stored %+v after a bad digest", objs)
	}
	// The SDK's own default checksum (CRC32) passes.
	if _, err := cl.PutObject(context.Background(), &s3.PutObjectInput{Bucket: aws.String("logs"), Key: aws.String("k"), Body: bytes.NewReader([]byte("data"))}); err != nil {
		t.Errorf("PutObject with the SDK's checksum: %v", err)
	}
}

func TestMultipartUpload(t *testing.T) {
	srv, cl := start(t, Options{})
	mustBucket(t, srv, "logs")
	ctx := context.Background()
	// A bucket with no upload ever begun: an empty list, as S3 answers;
	// a bucket that does not exist: NoSuchBucket.
	lu, err := cl.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String("logs"), Prefix: aws.String("big")})
	if err != nil || len(lu.Uploads) != 0 || aws.ToString(lu.Prefix) != "big" {
		t.Fatalf("ListMultipartUploads of a bucket without uploads = %+v, %v", lu, err)
	}
	if _, err := cl.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String("nope")}); code(err) != "NoSuchBucket" {
		t.Fatalf("ListMultipartUploads of a missing bucket: %v, want NoSuchBucket", err)
	}
	cr, err := cl.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("logs"), Key: aws.String("big"),
		ContentEncoding: aws.String("zstd"), StorageClass: types.StorageClassGlacierIr})
	if err != nil {
		t.Fatalf("CreateMultipartUpload: %v", err)
	}
	part1 := bytes.Repeat([]byte("a"), 5<<20)
	part2 := []byte("tail")
	var parts []types.CompletedPart
	for i, p := range [][]byte{part1, part2} {
		out, err := cl.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String("logs"), Key: aws.String("big"), UploadId: cr.UploadId,
			PartNumber: aws.Int32(int32(i + 1)), Body: bytes.NewReader(p)})
		if err != nil {
			t.Fatalf("UploadPart %d: %v", i+1, err)
		}
		parts = append(parts, types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(int32(i + 1))})
	}
	lu, err = cl.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String("logs")})
	if err != nil || len(lu.Uploads) != 1 || aws.ToString(lu.Uploads[0].Key) != "big" {
		t.Fatalf("ListMultipartUploads = %+v, %v", lu, err)
	}
	if _, err := cl.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: aws.String("logs"), Key: aws.String("big"),
		UploadId: cr.UploadId, MultipartUpload: &types.CompletedMultipartUpload{Parts: parts}}); err != nil {
		t.Fatalf("CompleteMultipartUpload: %v", err)
	}
	got, err := srv.Get("logs", "big")
	if err != nil || !bytes.Equal(got, append(append([]byte(nil), part1...), part2...)) {
		t.Fatalf("object of %d bytes, %v", len(got), err)
	}
	objs, _ := srv.Objects("logs")
	if len(objs) != 1 || objs[0].ContentEncoding != "zstd" || objs[0].StorageClass != "GLACIER_IR" {
		t.Errorf("objects = %+v", objs)
	}

	// An aborted upload leaves nothing.
	cr2, err := cl.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("logs"), Key: aws.String("gone")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: aws.String("logs"), Key: aws.String("gone"), UploadId: cr2.UploadId}); err != nil {
		t.Fatalf("AbortMultipartUpload: %v", err)
	}
	_, err = cl.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: aws.String("logs"), Key: aws.String("gone"), UploadId: cr2.UploadId})
	if code(err) != "NoSuchUpload" {
		t.Errorf("second abort: %v, want NoSuchUpload", err)
	}
	c := srv.Calls()
	if c["CreateMultipartUpload"] != 2 || c["UploadPart"] != 2 || c["CompleteMultipartUpload"] != 1 || c["AbortMultipartUpload"] != 2 || c["ListMultipartUploads"] != 3 {
		t.Errorf("calls = %v", c)
	}
}

func TestSwitches(t *testing.T) {
	srv, cl := start(t, Options{Seed: 1})
	mustBucket(t, srv, "logs")
	ctx := context.Background()
	put := func() error {
		_, err := cl.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("logs"), Key: aws.String("k"), Body: bytes.NewReader(bytes.Repeat([]byte("x"), 1<<20))})
		return err
	}

	srv.SetDenyAll(true)
	if err := put(); code(err) != "AccessDenied" || status(err) != http.StatusForbidden {
		t.Errorf("denied: %v, want 403 AccessDenied", err)
	}
	if _, err := cl.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("logs"), Key: aws.String("k")}); status(err) != http.StatusForbidden {
		t.Errorf("denied HEAD: %v, want 403", err)
	}
	srv.SetDenyAll(false)

	// One bucket denied: the others answer.
	mustBucket(t, srv, "other")
	srv.SetDenyBucket("logs", true)
	if err := put(); code(err) != "AccessDenied" || status(err) != http.StatusForbidden {
		t.Errorf("bucket denied: %v, want 403 AccessDenied", err)
	}
	if _, err := cl.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("other"), Key: aws.String("k"), Body: bytes.NewReader([]byte("x"))}); err != nil {
		t.Errorf("another bucket while one is denied: %v", err)
	}
	srv.SetDenyBucket("logs", false)

	// Without s3:ListBucket, a missing key is 403, an existing one read
	// as ever; a missing bucket is still NoSuchBucket.
	srv.SetNoListBucket(true)
	if _, err := cl.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("logs"), Key: aws.String("missing")}); status(err) != http.StatusForbidden {
		t.Errorf("no ListBucket, HEAD of a missing key: %v, want 403", err)
	}
	if _, err := cl.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("logs"), Key: aws.String("missing")}); code(err) != "AccessDenied" || status(err) != http.StatusForbidden {
		t.Errorf("no ListBucket, GET of a missing key: %v, want 403 AccessDenied", err)
	}
	if err := put(); err != nil {
		t.Fatalf("no ListBucket, put: %v", err)
	}
	if _, err := cl.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("logs"), Key: aws.String("k")}); err != nil {
		t.Errorf("no ListBucket, HEAD of a key that exists: %v", err)
	}
	if _, err := cl.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("nobucket"), Key: aws.String("k")}); code(err) != "NoSuchBucket" {
		t.Errorf("no ListBucket, GET in a missing bucket: %v, want NoSuchBucket", err)
	}
	srv.SetNoListBucket(false)
	if _, err := cl.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("logs"), Key: aws.String("missing")}); status(err) != http.StatusNotFound {
		t.Errorf("HEAD of a missing key: %v, want 404", err)
	}

	srv.SetFailures(1)
	if err := put(); code(err) != "SlowDown" || status(err) != http.StatusServiceUnavailable {
		t.Errorf("failing: %v, want 503 SlowDown", err)
	}
	srv.SetFailures(0.5)
	failed := 0
	for range 200 {
		if err := put(); err != nil {
			if code(err) != "SlowDown" {
				t.Fatalf("unexpected error: %v", err)
			}
			failed++
		}
	}
	if failed < 60 || failed > 140 {
		t.Errorf("%d of 200 failed at rate 0.5", failed)
	}
	srv.SetFailures(0)
	if err := put(); err != nil {
		t.Errorf("after the switches: %v", err)
	}
}

func TestDirSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	keys := []string{"a/1", "a/2", "b/1", "b/2/x", "c"}
	func() {
		srv, cl := start(t, Options{Dir: dir})
		mustBucket(t, srv, "logs")
		mustBucket(t, srv, "logs") // again: no error
		for _, k := range keys {
			if _, err := cl.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("logs"), Key: aws.String(k), Body: bytes.NewReader([]byte("v " + k)),
				ContentEncoding: aws.String("gzip")}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := cl.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String("logs"), Key: aws.String("c")}); err != nil {
			t.Fatal(err)
		}
		if err := srv.Close(); err != nil {
			t.Fatal(err)
		}
	}()

	srv, cl := start(t, Options{Dir: dir})
	if b, _ := srv.Buckets(); fmt.Sprint(b) != "[logs]" {
		t.Errorf("buckets = %v", b)
	}
	objs, err := srv.Objects("logs")
	if err != nil || len(objs) != 4 {
		t.Fatalf("objects = %+v, %v", objs, err)
	}
	for i, o := range objs {
		if o.Key != keys[i] || o.ContentEncoding != "gzip" || o.Size != int64(len("v "+keys[i])) {
			t.Errorf("object %d = %+v", i, o)
		}
	}
	_, b := getBody(t, cl, "logs", "b/2/x")
	if string(b) != "v b/2/x" {
		t.Errorf("body = %q", b)
	}

	// Listing with a delimiter and pages of one key, through the SDK.
	var got []string
	var token *string
	for {
		out, err := cl.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("logs"), Delimiter: aws.String("/"), MaxKeys: aws.Int32(1), ContinuationToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range out.CommonPrefixes {
			got = append(got, aws.ToString(p.Prefix))
		}
		for _, c := range out.Contents {
			got = append(got, aws.ToString(c.Key))
		}
		if !aws.ToBool(out.IsTruncated) {
			break
		}
		token = out.NextContinuationToken
	}
	if fmt.Sprint(got) != "[a/ b/]" {
		t.Errorf("listing = %v, want [a/ b/]", got)
	}
	out, err := cl.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("logs"), Prefix: aws.String("b/")})
	if err != nil || len(out.Contents) != 2 {
		t.Errorf("prefix listing = %+v, %v", out, err)
	}

	// Copy and delete in bulk.
	if _, err := cl.CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String("logs"), Key: aws.String("copy"), CopySource: aws.String("logs/a/1")}); err != nil {
		t.Fatalf("CopyObject: %v", err)
	}
	if got, err := srv.Get("logs", "copy"); err != nil || string(got) != "v a/1" {
		t.Errorf("copy = %q, %v", got, err)
	}
	del, err := cl.DeleteObjects(ctx, &s3.DeleteObjectsInput{Bucket: aws.String("logs"), Delete: &types.Delete{
		Objects: []types.ObjectIdentifier{{Key: aws.String("a/1")}, {Key: aws.String("copy")}}}})
	if err != nil || len(del.Deleted) != 2 {
		t.Fatalf("DeleteObjects = %+v, %v", del, err)
	}
	if objs, _ := srv.Objects("logs"); len(objs) != 3 {
		t.Errorf("%d objects after deleting 2 of 5", len(objs))
	}

	// A second server on the same directory is refused while this one runs.
	if _, err := New(Options{Dir: dir}); err == nil {
		t.Error("a second server opened the same directory")
	}
}

// A part but the last under 5 MiB: CompleteMultipartUpload is refused with
// 400 EntityTooSmall, as S3 refuses it, and no object is made.
func TestCompleteRefusesSmallParts(t *testing.T) {
	srv, cl := start(t, Options{})
	mustBucket(t, srv, "logs")
	ctx := context.Background()
	cr, err := cl.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("logs"), Key: aws.String("small")})
	if err != nil {
		t.Fatal(err)
	}
	var parts []types.CompletedPart
	for i, p := range [][]byte{bytes.Repeat([]byte("a"), 1<<20), []byte("tail")} {
		out, err := cl.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String("logs"), Key: aws.String("small"), UploadId: cr.UploadId,
			PartNumber: aws.Int32(int32(i + 1)), Body: bytes.NewReader(p)})
		if err != nil {
			t.Fatalf("UploadPart %d: %v", i+1, err)
		}
		parts = append(parts, types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(int32(i + 1))})
	}
	_, err = cl.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: aws.String("logs"), Key: aws.String("small"),
		UploadId: cr.UploadId, MultipartUpload: &types.CompletedMultipartUpload{Parts: parts}})
	if code(err) != "EntityTooSmall" || status(err) != http.StatusBadRequest {
		t.Fatalf("complete with a first part of 1 MiB: %v, want 400 EntityTooSmall", err)
	}
	if objs, _ := srv.Objects("logs"); len(objs) != 0 {
		t.Fatalf("objects after the refusal: %+v", objs)
	}
	// One part alone may be small: it is the last.
	if _, err := cl.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: aws.String("logs"), Key: aws.String("small"),
		UploadId: cr.UploadId, MultipartUpload: &types.CompletedMultipartUpload{Parts: parts[1:]}}); err != nil {
		t.Fatalf("complete with the last part alone: %v", err)
	}
}

// A completion's parts must be in ascending order and there must be one
// at least; a part's number is 1 to 10,000: S3's refusals.
func TestPartOrderAndNumbers(t *testing.T) {
	srv, cl := start(t, Options{})
	mustBucket(t, srv, "logs")
	ctx := context.Background()
	cr, err := cl.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("logs"), Key: aws.String("k")})
	if err != nil {
		t.Fatal(err)
	}
	var parts []types.CompletedPart
	for i := range 2 {
		out, err := cl.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String("logs"), Key: aws.String("k"), UploadId: cr.UploadId,
			PartNumber: aws.Int32(int32(i + 1)), Body: bytes.NewReader(bytes.Repeat([]byte("a"), 5<<20))})
		if err != nil {
			t.Fatalf("UploadPart %d: %v", i+1, err)
		}
		parts = append(parts, types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(int32(i + 1))})
	}
	for _, n := range []int32{0, 10001} {
		_, err := cl.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String("logs"), Key: aws.String("k"), UploadId: cr.UploadId,
			PartNumber: aws.Int32(n), Body: bytes.NewReader([]byte("x"))})
		if code(err) != "InvalidArgument" || status(err) != http.StatusBadRequest {
			t.Errorf("UploadPart number %d: %v, want 400 InvalidArgument", n, err)
		}
	}
	complete := func(parts []types.CompletedPart) error {
		_, err := cl.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: aws.String("logs"), Key: aws.String("k"),
			UploadId: cr.UploadId, MultipartUpload: &types.CompletedMultipartUpload{Parts: parts}})
		return err
	}
	if err := complete([]types.CompletedPart{parts[1], parts[0]}); code(err) != "InvalidPartOrder" {
		t.Errorf("parts 2, 1: %v, want InvalidPartOrder", err)
	}
	if err := complete([]types.CompletedPart{parts[0], parts[0]}); code(err) != "InvalidPartOrder" {
		t.Errorf("parts 1, 1: %v, want InvalidPartOrder", err)
	}
	if err := complete([]types.CompletedPart{}); code(err) != "MalformedXML" {
		t.Errorf("no parts: %v, want MalformedXML", err)
	}
	if err := complete(parts); err != nil {
		t.Fatalf("parts 1, 2: %v", err)
	}
}
