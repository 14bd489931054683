package s3emu

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// rawRequest sends an unsigned request (the emulator checks no signature)
// and returns the status and body of the answer.
func rawRequest(t *testing.T, method, url string, header http.Header, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, string(b)
}

// multipart begins an upload of key with the parts given and returns its
// id and the parts to complete it with.
func multipart(t *testing.T, cl *s3.Client, key string, parts ...[]byte) (*string, []types.CompletedPart) {
	t.Helper()
	ctx := context.Background()
	cr, err := cl.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("logs"), Key: aws.String(key)})
	if err != nil {
		t.Fatalf("CreateMultipartUpload %s: %v", key, err)
	}
	var done []types.CompletedPart
	for i, p := range parts {
		out, err := cl.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String("logs"), Key: aws.String(key), UploadId: cr.UploadId,
			PartNumber: aws.Int32(int32(i + 1)), Body: bytes.NewReader(p)})
		if err != nil {
			t.Fatalf("UploadPart %d of %s: %v", i+1, key, err)
		}
		done = append(done, types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(int32(i + 1))})
	}
	return cr.UploadId, done
}

func complete(cl *s3.Client, key string, id *string, parts []types.CompletedPart, ifNoneMatch *string) error {
	_, err := cl.CompleteMultipartUpload(context.Background(), &s3.CompleteMultipartUploadInput{Bucket: aws.String("logs"), Key: aws.String(key),
		UploadId: id, MultipartUpload: &types.CompletedMultipartUpload{Parts: parts}, IfNoneMatch: ifNoneMatch})
	return err
}

// The answers AWS documents for If-None-Match on a write: "*" writes only a
// key that does not exist, else 412 PreconditionFailed naming the
// condition; any other value is 501 NotImplemented naming the header.
// Both for PutObject and CompleteMultipartUpload, in memory and on disk.
func TestIfNoneMatch(t *testing.T) {
	for _, store := range []string{"memory", "disk"} {
		t.Run(store, func(t *testing.T) {
			opts := Options{}
			if store == "disk" {
				opts.Dir = t.TempDir()
			}
			srv, cl := start(t, opts)
			mustBucket(t, srv, "logs")
			ctx := context.Background()
			put := func(key, body string, ifNoneMatch *string) error {
				_, err := cl.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("logs"), Key: aws.String(key),
					Body: strings.NewReader(body), IfNoneMatch: ifNoneMatch})
				return err
			}
			stored := func(key, want string) {
				t.Helper()
				got, err := srv.Get("logs", key)
				if err != nil || string(got) != want {
					t.Errorf("%s holds %d bytes %.40q (%v), want %d bytes %.40q", key, len(got), got, err, len(want), want)
				}
			}

			if err := put("k", "first", aws.String("*")); err != nil {
				t.Fatalf("PutObject If-None-Match * of a new key: %v", err)
			}
			err := put("k", "second", aws.String("*"))
			if code(err) != "PreconditionFailed" || status(err) != http.StatusPreconditionFailed {
				t.Errorf("PutObject If-None-Match * of an existing key: %v, want 412 PreconditionFailed", err)
			}
			stored("k", "first")

			// The body AWS answers, read without the SDK.
			st, body := rawRequest(t, http.MethodPut, baseURL(srv)+"/logs/k", http.Header{"If-None-Match": {"*"}}, []byte("third"))
			if st != http.StatusPreconditionFailed || !strings.Contains(body, "<Code>PreconditionFailed</Code>") ||
				!strings.Contains(body, "<Message>At least one of the pre-conditions you specified did not hold</Message>") ||
				!strings.Contains(body, "<Condition>If-None-Match</Condition>") {
				t.Errorf("412 answer: %d %s", st, body)
			}
			stored("k", "first")

			// Other values are not implemented, on a new key as on an
			// existing one, and store nothing.
			for _, key := range []string{"k", "new"} {
				err := put(key, "etag", aws.String(`"9a0364b9e99bb480dd25e1f0284c8555"`))
				if code(err) != "NotImplemented" || status(err) != http.StatusNotImplemented {
					t.Errorf("PutObject If-None-Match <etag> of %s: %v, want 501 NotImplemented", key, err)
				}
			}
			st, body = rawRequest(t, http.MethodPut, baseURL(srv)+"/logs/new", http.Header{"If-None-Match": {"true"}}, []byte("x"))
			if st != http.StatusNotImplemented || !strings.Contains(body, "<Header>If-None-Match</Header>") ||
				!strings.Contains(body, "<Message>A header you provided implies functionality that is not implemented</Message>") {
				t.Errorf("501 answer: %d %s", st, body)
			}
			if _, err := srv.Get("logs", "new"); err == nil {
				t.Error("a refused PutObject stored the object")
			}
			stored("k", "first")

			// Without the header a PUT overwrites, as it always did.
			if err := put("k", "plain", nil); err != nil {
				t.Fatal(err)
			}
			stored("k", "plain")

			// CompleteMultipartUpload: refused on a key that exists, and
			// the upload stays open (it can be aborted); a free key
			// completes.
			part := bytes.Repeat([]byte("p"), 5<<20)
			id, parts := multipart(t, cl, "k", part, []byte("end"))
			err = complete(cl, "k", id, parts, aws.String("*"))
			if code(err) != "PreconditionFailed" || status(err) != http.StatusPreconditionFailed {
				t.Errorf("CompleteMultipartUpload If-None-Match * of an existing key: %v, want 412 PreconditionFailed", err)
			}
			stored("k", "plain")
			if err := complete(cl, "k", id, parts, aws.String("etag")); code(err) != "NotImplemented" {
				t.Errorf("CompleteMultipartUpload If-None-Match <etag>: %v, want 501 NotImplemented", err)
			}
			ups, err := cl.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String("logs")})
			if err != nil {
				t.Errorf("list uploads: %v", err)
			} else if len(ups.Uploads) != 1 {
				t.Errorf("%d uploads after the refusals, want the one still open", len(ups.Uploads))
			}
			if _, err := cl.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: aws.String("logs"), Key: aws.String("k"), UploadId: id}); err != nil {
				t.Errorf("abort the refused upload: %v", err)
			}
			id, parts = multipart(t, cl, "mp", part, []byte("end"))
			if err := complete(cl, "mp", id, parts, aws.String("*")); err != nil {
				t.Fatalf("CompleteMultipartUpload If-None-Match * of a new key: %v", err)
			}
			stored("mp", string(part)+"end")
			// An upload that does not exist is NoSuchUpload, whatever the key holds.
			if err := complete(cl, "mp", id, parts, aws.String("*")); code(err) != "NoSuchUpload" {
				t.Errorf("completing a completed upload: %v, want NoSuchUpload", err)
			}
			// So is a missing bucket NoSuchBucket.
			_, err = cl.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("nobucket"), Key: aws.String("k"), Body: strings.NewReader("x"), IfNoneMatch: aws.String("*")})
			if code(err) != "NoSuchBucket" {
				t.Errorf("PutObject If-None-Match * into a missing bucket: %v, want NoSuchBucket", err)
			}
		})
	}
}

// Conditional writes of one key racing each other: exactly one wins, and
// the key holds its bytes.
func TestIfNoneMatchRace(t *testing.T) {
	srv, cl := start(t, Options{})
	mustBucket(t, srv, "logs")
	ctx := context.Background()
	const writers = 8
	part := bytes.Repeat([]byte("m"), 5<<20)
	id, parts := multipart(t, cl, "race", part, []byte("multipart"))
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		won     []string
		refused int
	)
	for i := range writers + 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			body := fmt.Sprintf("writer %d", i)
			if i == writers {
				body = string(part) + "multipart"
				err = complete(cl, "race", id, parts, aws.String("*"))
			} else {
				_, err = cl.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("logs"), Key: aws.String("race"),
					Body: strings.NewReader(body), IfNoneMatch: aws.String("*")})
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				won = append(won, body)
			case code(err) == "PreconditionFailed":
				refused++
			default:
				t.Errorf("writer %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if len(won) != 1 || refused != writers {
		t.Fatalf("%d writes won, %d refused; want 1 and %d", len(won), refused, writers)
	}
	if got, err := srv.Get("logs", "race"); err != nil || string(got) != won[0] {
		t.Errorf("the key holds %.20q (%v), not the winner's %.20q", got, err, won[0])
	}
}

// baseURL is where srv serves.
func baseURL(srv *Server) string {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	return "http://" + srv.ln.Addr().String()
}
