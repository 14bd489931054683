//go:build unix

package s3emu

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/logfwd/forwarder/internal/mototest"
)

// TestIfNoneMatchLikeMoto runs the same conditional writes against the
// emulator and moto_server, which implements If-None-Match: * on
// PutObject and CompleteMultipartUpload too, and wants the same answers.
// (moto ignores other values of the header, which AWS answers with 501
// NotImplemented: TestIfNoneMatch checks those against AWS's documented
// answer.)
func TestIfNoneMatchLikeMoto(t *testing.T) {
	srv, emu := start(t, Options{})
	mustBucket(t, srv, "logs")
	moto := newClient(t, mototest.Start(t))
	if _, err := moto.CreateBucket(context.Background(), &s3.CreateBucketInput{Bucket: aws.String("logs")}); err != nil {
		t.Fatalf("create bucket in moto: %v", err)
	}
	run := func(cl *s3.Client) []string {
		ctx := context.Background()
		var answers []string
		note := func(step string, err error) {
			answers = append(answers, fmt.Sprintf("%s: %d %s", step, status(err), code(err)))
		}
		put := func(key, body string, ifNoneMatch *string) error {
			_, err := cl.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("logs"), Key: aws.String(key),
				Body: strings.NewReader(body), IfNoneMatch: ifNoneMatch})
			return err
		}
		note("put * new", put("k", "first", aws.String("*")))
		note("put * existing", put("k", "second", aws.String("*")))
		got, err := getObject(cl, "k")
		answers = append(answers, fmt.Sprintf("k holds %q (%v)", got, err))
		note("put plain existing", put("k", "plain", nil))

		part := bytes.Repeat([]byte("p"), 5<<20)
		id, parts := multipart(t, cl, "k", part, []byte("end"))
		note("complete * existing", complete(cl, "k", id, parts, aws.String("*")))
		_, err = cl.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: aws.String("logs"), Key: aws.String("k"), UploadId: id})
		note("abort refused upload", err)
		got, err = getObject(cl, "k")
		answers = append(answers, fmt.Sprintf("k holds %q (%v)", got, err))
		id, parts = multipart(t, cl, "mp", part, []byte("end"))
		note("complete * new", complete(cl, "mp", id, parts, aws.String("*")))
		note("put * after complete", put("mp", "x", aws.String("*")))
		return answers
	}
	want, got := run(moto), run(emu)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("emulator:\n%s\nmoto_server:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	t.Logf("both:\n%s", strings.Join(got, "\n"))
}

func getObject(cl *s3.Client, key string) (string, error) {
	out, err := cl.GetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String("logs"), Key: aws.String(key)})
	if err != nil {
		return "", err
	}
	defer out.Body.Close()
	var b bytes.Buffer
	_, err = b.ReadFrom(out.Body)
	return b.String(), err
}
