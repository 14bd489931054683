package e2e

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	cwl "github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	cwemu "github.com/logfwd/forwarder/emulator/cloudwatchlogs"
	s3emu "github.com/logfwd/forwarder/emulator/s3emu"
)

var staticCreds = aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
	return aws.Credentials{AccessKeyID: "AKIDE2ETEST", SecretAccessKey: "e2e-secret", Source: "e2e"}, nil
})

// startS3 runs the S3 emulator in the test process, with the bucket created,
// until the test ends.
func startS3(t *testing.T, buckets ...string) (*s3emu.Server, string) {
	t.Helper()
	srv, err := s3emu.New(s3emu.Options{})
	if err != nil {
		t.Fatal(err)
	}
	url, err := srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	for _, b := range append([]string{bucket}, buckets...) {
		if err := srv.CreateBucket(b); err != nil {
			t.Fatal(err)
		}
	}
	return srv, url
}

// startCW runs the CloudWatch Logs emulator in the test process until the test ends.
func startCW(t *testing.T) (*cwemu.Server, string) {
	t.Helper()
	srv := cwemu.New(cwemu.Options{})
	url, err := srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv, url
}

func newS3Client(endpoint string) *s3.Client {
	return s3.New(s3.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		UsePathStyle: true,
		Credentials:  staticCreds,
	})
}

func newCWClient(endpoint string) *cwl.Client {
	return cwl.New(cwl.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		Credentials:  staticCreds,
	})
}

// s3Read is what a bucket holds: copies of each record id.
type s3Read struct {
	Counts  map[string]int
	Objects int
	Lines   int
	Bad     []string // lines without an id, objects that do not read
	// Where is the key of the last object holding each id: with a
	// duplicate's example, where the other copy is.
	Where map[string]string
}

// readS3 reads every object of the bucket through the SDK: ListObjectsV2,
// GetObject, gunzip, one JSON object a line.
func readS3(t *testing.T, endpoint, bucket string) s3Read {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cl := newS3Client(endpoint)
	out := s3Read{Counts: map[string]int{}, Where: map[string]string{}}
	p := s3.NewListObjectsV2Paginator(cl, &s3.ListObjectsV2Input{Bucket: aws.String(bucket)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			t.Fatalf("S3 ListObjectsV2 %s: %v", bucket, err)
		}
		for _, o := range page.Contents {
			key := aws.ToString(o.Key)
			res, err := cl.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
			if err != nil {
				t.Fatalf("S3 GetObject %s/%s: %v", bucket, key, err)
			}
			b, err := io.ReadAll(res.Body)
			res.Body.Close()
			if err != nil {
				t.Fatalf("S3 GetObject %s/%s: %v", bucket, key, err)
			}
			out.Objects++
			if len(b) > 2 && b[0] == 0x1f && b[1] == 0x8b {
				zr, err := gzip.NewReader(bytes.NewReader(b))
				if err == nil {
					b, err = io.ReadAll(zr)
				}
				if err != nil {
					out.Bad = append(out.Bad, fmt.Sprintf("%s: gunzip: %v", key, err))
					continue
				}
			}
			sc := bufio.NewScanner(bytes.NewReader(b))
			sc.Buffer(nil, 8<<20)
			for sc.Scan() {
				var v struct {
					ID string `json:"id"`
				}
				if err := json.Unmarshal(sc.Bytes(), &v); err != nil || v.ID == "" {
					out.Bad = append(out.Bad, fmt.Sprintf("%s: line %q (%v)", key, sc.Text(), err))
					continue
				}
				out.Lines++
				out.Counts[v.ID]++
				if prev, ok := out.Where[v.ID]; ok && prev != key {
					out.Where[v.ID] = prev + " and " + key
				} else if !ok {
					out.Where[v.ID] = key
				}
			}
		}
	}
	return out
}

// cwCopy is one copy of a record in CloudWatch Logs: where it is and the
// namespace and pod its body names.
type cwCopy struct {
	Group, Stream, NS, Pod string
}

// cwRead is what CloudWatch Logs holds under the /e2e/ groups: each record
// id's copies.
type cwRead struct {
	Places  map[string][]cwCopy
	Events  int
	Groups  int
	Streams map[string]int // events per group|stream
	Bad     []string
}

// readCW reads every group named /e2e/... through the SDK:
// DescribeLogGroups, DescribeLogStreams, then GetLogEvents from the head of
// each stream until the forward token comes back unchanged.
func readCW(t *testing.T, endpoint string) cwRead {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cl := newCWClient(endpoint)
	out := cwRead{Places: map[string][]cwCopy{}, Streams: map[string]int{}}
	gp := cwl.NewDescribeLogGroupsPaginator(cl, &cwl.DescribeLogGroupsInput{LogGroupNamePrefix: aws.String("/e2e/")})
	for gp.HasMorePages() {
		page, err := gp.NextPage(ctx)
		if err != nil {
			t.Fatalf("CloudWatch DescribeLogGroups: %v", err)
		}
		for _, g := range page.LogGroups {
			out.Groups++
			group := aws.ToString(g.LogGroupName)
			sp := cwl.NewDescribeLogStreamsPaginator(cl, &cwl.DescribeLogStreamsInput{LogGroupName: aws.String(group)})
			for sp.HasMorePages() {
				streams, err := sp.NextPage(ctx)
				if err != nil {
					t.Fatalf("CloudWatch DescribeLogStreams %s: %v", group, err)
				}
				for _, st := range streams.LogStreams {
					readStream(ctx, t, cl, group, aws.ToString(st.LogStreamName), &out)
				}
			}
		}
	}
	return out
}

func readStream(ctx context.Context, t *testing.T, cl *cwl.Client, group, stream string, out *cwRead) {
	t.Helper()
	in := &cwl.GetLogEventsInput{LogGroupName: aws.String(group), LogStreamName: aws.String(stream), StartFromHead: aws.Bool(true)}
	for {
		page, err := cl.GetLogEvents(ctx, in)
		if err != nil {
			t.Fatalf("CloudWatch GetLogEvents %s %s: %v", group, stream, err)
		}
		for _, e := range page.Events {
			var v struct {
				ID  string `json:"id"`
				NS  string `json:"ns"`
				Pod string `json:"pod"`
			}
			msg := aws.ToString(e.Message)
			if err := json.Unmarshal([]byte(msg), &v); err != nil || v.ID == "" {
				out.Bad = append(out.Bad, fmt.Sprintf("%s %s: message %q (%v)", group, stream, msg, err))
				continue
			}
			c := cwCopy{Group: group, Stream: stream, NS: v.NS, Pod: v.Pod}
			out.Events++
			out.Streams[group+"|"+stream]++
			out.Places[v.ID] = append(out.Places[v.ID], c)
		}
		// A page may be empty while events remain: the end is the token
		// coming back unchanged.
		next := aws.ToString(page.NextForwardToken)
		if next == "" || next == aws.ToString(in.NextToken) {
			return
		}
		in.NextToken = aws.String(next)
	}
}

// tally is the account of one scenario.
type tally struct {
	Sent, Acked int

	S3Objects, S3Lines int
	S3Dups             int // copies beyond the first, of any record
	S3Missing          int // acknowledged, not in S3, not dead-lettered by the s3 sink
	S3DeadLettered     int // acknowledged, not in S3, dead-lettered by the s3 sink
	S3Unknown          int // in S3 but never sent

	CWEvents       int
	CWDups         int // copies beyond the first
	CWMissing      int // acknowledged, not in CloudWatch, not dead-lettered
	CWDeadLettered int // acknowledged, dead-lettered by the cloudwatch sink
	CWMisplaced    int // copies in a group or stream the record does not name
	CWUnknown      int

	bad                  []string // lines or events that do not read as a record
	missingS3, missingCW []string // all of them, sorted
	dupS3, misplaced     []string // examples
}

func (tl tally) String() string {
	return fmt.Sprintf("acked %d (sent %d); S3: %d objects, %d lines, dup %d, missing %d, dead-lettered %d, unknown %d; "+
		"CloudWatch: %d events, dup %d, missing %d, dead-lettered %d, misplaced %d, unknown %d",
		tl.Acked, tl.Sent, tl.S3Objects, tl.S3Lines, tl.S3Dups, tl.S3Missing, tl.S3DeadLettered, tl.S3Unknown,
		tl.CWEvents, tl.CWDups, tl.CWMissing, tl.CWDeadLettered, tl.CWMisplaced, tl.CWUnknown)
}

// inPodStream is where the usual configuration puts a record: group
// /e2e/NS, stream POD-HOST (podStream: the forwarder's ${hostname}, so that
// each stream has one writer and calls in doubt are read back).
func inPodStream(id string, c cwCopy) bool {
	return c.Group == "/e2e/"+c.NS && c.Stream == c.Pod+"-"+e2eHost()
}

// podStream is the usual log_stream, a stream per pod and forwarder host.
const podStream = "${record.pod}-${hostname}"

// e2eHost is this machine's host name, which the forwarders render as ${hostname}.
func e2eHost() string {
	h, err := os.Hostname()
	if err != nil {
		panic(err)
	}
	return h
}

// account compares the ledger with what the sinks hold. s3Sink and cwSink
// name the sinks in the dead letters; placed, when set, says whether a copy
// is where its record belongs in CloudWatch.
func account(led map[string]bool, s3r s3Read, cw cwRead, dead map[string]map[string]string, s3Sink, cwSink string, placed func(string, cwCopy) bool) tally {
	var tl tally
	tl.S3Objects, tl.S3Lines, tl.CWEvents = s3r.Objects, s3r.Lines, cw.Events
	tl.bad = append(append(tl.bad, s3r.Bad...), cw.Bad...)
	for id, acked := range led {
		tl.Sent++
		if !acked {
			continue
		}
		tl.Acked++
		switch n := s3r.Counts[id]; {
		case n == 0 && dead[s3Sink][id] != "":
			tl.S3DeadLettered++
		case n == 0:
			tl.S3Missing++
			tl.missingS3 = append(tl.missingS3, id)
		}
		switch n := len(cw.Places[id]); {
		case dead[cwSink][id] != "":
			tl.CWDeadLettered++
		case n == 0:
			tl.CWMissing++
			tl.missingCW = append(tl.missingCW, id)
		}
	}
	for id, n := range s3r.Counts {
		if _, ok := led[id]; !ok {
			tl.S3Unknown++
		}
		if n > 1 {
			tl.S3Dups += n - 1
			tl.dupS3 = appendExample(tl.dupS3, fmt.Sprintf("%s×%d in %s", id, n, s3r.Where[id]))
		}
	}
	for id, places := range cw.Places {
		if _, ok := led[id]; !ok {
			tl.CWUnknown++
		}
		tl.CWDups += len(places) - 1
		if placed != nil {
			for _, c := range places {
				if !placed(id, c) {
					tl.CWMisplaced++
					tl.misplaced = appendExample(tl.misplaced, fmt.Sprintf("%s (ns %s, pod %s) in %s|%s", id, c.NS, c.Pod, c.Group, c.Stream))
				}
			}
		}
	}
	sort.Strings(tl.missingS3)
	sort.Strings(tl.missingCW)
	return tl
}

func appendExample(s []string, v string) []string {
	if len(s) < 5 {
		s = append(s, v)
	}
	return s
}

// check fails the test unless the tally keeps the guarantees: in S3 every
// acknowledged record exactly once, nothing unknown; in CloudWatch every
// acknowledged record at least once in its place, with at most cwDups
// copies beyond the first (0: exactly once); nothing dead-lettered (a
// crash, an outage or a full disk is no reason to give a record up).
func check(t *testing.T, tl tally, cwDups int) {
	t.Helper()
	checkDead(t, tl, cwDups, 0)
}

// checkDead is check with cwDead records dead-lettered by the CloudWatch
// sink (and none by the S3 sink) as the load calls for.
func checkDead(t *testing.T, tl tally, cwDups, cwDead int) {
	t.Helper()
	if tl.S3DeadLettered != 0 {
		t.Errorf("S3: %d acknowledged records dead-lettered, want none", tl.S3DeadLettered)
	}
	if tl.CWDeadLettered != cwDead {
		t.Errorf("CloudWatch: %d acknowledged records dead-lettered, want %d", tl.CWDeadLettered, cwDead)
	}
	if tl.Acked == 0 {
		t.Errorf("no record was acknowledged")
	}
	if len(tl.bad) != 0 {
		t.Errorf("%d objects, lines or events that do not read as a record, e.g. %q", len(tl.bad), tl.bad[:min(3, len(tl.bad))])
	}
	if tl.S3Dups != 0 {
		t.Errorf("S3: %d duplicate copies (exactly once broken), e.g. %v", tl.S3Dups, tl.dupS3)
	}
	if tl.S3Missing != 0 {
		t.Errorf("S3: %d acknowledged records missing and not dead-lettered: %s", tl.S3Missing, ranges(tl.missingS3, 600))
	}
	if tl.S3Unknown != 0 || tl.CWUnknown != 0 {
		t.Errorf("records never sent: %d in S3, %d in CloudWatch", tl.S3Unknown, tl.CWUnknown)
	}
	if tl.CWMissing != 0 {
		t.Errorf("CloudWatch: %d acknowledged records missing and not dead-lettered: %s", tl.CWMissing, ranges(tl.missingCW, 600))
	}
	if tl.CWMisplaced != 0 {
		t.Errorf("CloudWatch: %d copies in the wrong group or stream, e.g. %v", tl.CWMisplaced, tl.misplaced)
	}
	if tl.CWDups > cwDups {
		t.Errorf("CloudWatch: %d duplicate copies, more than the %d allowed", tl.CWDups, cwDups)
	}
}

// ranges writes sorted ids (PREFIX-NUMBER) as runs "a-0000001..a-0000050",
// cut at about limit bytes.
func ranges(ids []string, limit int) string {
	var b strings.Builder
	for i := 0; i < len(ids); {
		j := i + 1
		for j < len(ids) && successive(ids[j-1], ids[j]) {
			j++
		}
		if b.Len() > limit {
			fmt.Fprintf(&b, " ... (%d more)", len(ids)-i)
			break
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(ids[i])
		if j-1 > i {
			b.WriteString(".." + ids[j-1])
		}
		i = j
	}
	return b.String()
}

// successive reports whether b is the id after a: same prefix, number + 1.
func successive(a, b string) bool {
	i, j := strings.LastIndexByte(a, '-'), strings.LastIndexByte(b, '-')
	if i < 0 || j < 0 || a[:i] != b[:j] {
		return false
	}
	x, err1 := strconv.Atoi(a[i+1:])
	y, err2 := strconv.Atoi(b[j+1:])
	return err1 == nil && err2 == nil && y == x+1
}
