package cloudwatch

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs/types"
	"github.com/prometheus/client_golang/prometheus"
)

// TestPutBodyMatchesSDK: the body built for a PutLogEvents call says what
// the SDK's own serializer says for the same input (as JSON values: key
// order and escapes may differ), for messages that need every kind of
// escape, with and without a sequence token, and the SDK signs and sends
// it with its usual headers.
func TestPutBodyMatchesSDK(t *testing.T) {
	var mu sync.Mutex
	var bodies [][]byte
	var targets []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			t.Error(err)
		}
		mu.Lock()
		bodies = append(bodies, b)
		targets = append(targets, r.Header.Get("X-Amz-Target")+" "+r.Header.Get("Content-Type")+" "+
			strings.Fields(r.Header.Get("Authorization") + " -")[0])
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		io.WriteString(w, `{"nextSequenceToken":"7"}`)
	}))
	defer srv.Close()
	client := cloudwatchlogs.NewFromConfig(*staticAWS(), func(o *cloudwatchlogs.Options) { o.BaseEndpoint = aws.String(srv.URL) })
	evs := []event{
		{ts: 1700000000000, msg: []byte(`{"log":"plain"}`)},
		{ts: 1700000000001, msg: []byte("quote \" backslash \\ tab \t newline \n nul \x00 del \x7f")},
		{ts: 1700000000002, msg: []byte("<html> & \u2028 \u2029 é 日本 😀")},
		{ts: -5, msg: []byte("x")},
	}
	for _, token := range []string{"", "49590338271490256608559692538361571095921575989136588898"} {
		in := &cloudwatchlogs.PutLogEventsInput{LogGroupName: aws.String("/eks/a\"b"), LogStreamName: aws.String("pod-1/host")}
		if token != "" {
			in.SequenceToken = aws.String(token)
		}
		for _, e := range evs {
			in.LogEvents = append(in.LogEvents, types.InputLogEvent{Timestamp: aws.Int64(e.ts), Message: aws.String(string(e.msg))})
		}
		if _, err := client.PutLogEvents(context.Background(), in); err != nil {
			t.Fatal(err)
		}
		own := &cloudwatchlogs.PutLogEventsInput{LogGroupName: in.LogGroupName, LogStreamName: in.LogStreamName,
			SequenceToken: in.SequenceToken, LogEvents: []types.InputLogEvent{}}
		body := appendPutBody(nil, "/eks/a\"b", "pod-1/host", token, evs)
		if len(body) > putBodyBytes("/eks/a\"b", "pod-1/host", token, evs)+64 {
			t.Errorf("body of %d bytes; putBodyBytes said %d", len(body), putBodyBytes("/eks/a\"b", "pod-1/host", token, evs))
		}
		res, err := client.PutLogEvents(context.Background(), own, withBody(body, ""))
		if err != nil {
			t.Fatal(err)
		}
		if aws.ToString(res.NextSequenceToken) != "7" {
			t.Errorf("answer not decoded: %+v", res)
		}
	}
	if len(bodies) != 4 {
		t.Fatalf("%d requests, want 4", len(bodies))
	}
	for i := 0; i < 4; i += 2 {
		var sdk, own any
		if err := json.Unmarshal(bodies[i], &sdk); err != nil {
			t.Fatalf("SDK body %s: %v", bodies[i], err)
		}
		if err := json.Unmarshal(bodies[i+1], &own); err != nil {
			t.Fatalf("built body %s: %v", bodies[i+1], err)
		}
		if !reflect.DeepEqual(sdk, own) {
			t.Errorf("bodies differ:\nSDK:   %s\nbuilt: %s", bodies[i], bodies[i+1])
		}
		if targets[i] != targets[i+1] || !strings.HasPrefix(targets[i], "Logs_20140328.PutLogEvents application/x-amz-json-1.1 AWS4-HMAC-SHA256") {
			t.Errorf("headers differ: SDK %q, built %q", targets[i], targets[i+1])
		}
	}
}

// TestAppendMessageRoundTrip: every message, of every byte value below
// 0x80 and of valid UTF-8 beyond, reads back from the JSON appendMessage
// writes as the message itself.
func TestAppendMessageRoundTrip(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	runes := []rune{'é', '日', '😀', '\u2028', 0x7f, 0xfffd}
	for i := range 2000 {
		var b strings.Builder
		for range r.Intn(40) {
			if r.Intn(4) == 0 {
				b.WriteRune(runes[r.Intn(len(runes))])
			} else {
				b.WriteByte(byte(r.Intn(0x80)))
			}
		}
		msg := b.String()
		if i < 0x80 {
			msg = string(rune(i)) // each byte below 0x80 alone
		}
		out := appendMessage([]byte("x"), []byte(msg))
		var got string
		if err := json.Unmarshal(out[1:], &got); err != nil || got != msg || out[0] != 'x' {
			t.Fatalf("message %q: wrote %q, read back %q (%v)", msg, out, got, err)
		}
		// With room for every byte escaped and a word more, words are
		// stored whole (control characters aside): the same bytes.
		roomy := appendMessage(append(make([]byte, 0, 2*len(msg)+9), 'x'), []byte(msg))
		small := appendMessageRuns([]byte("x"), []byte(msg))
		if !bytes.Equal(roomy, small) || !bytes.Equal(out, small) {
			t.Fatalf("message %q: wrote %q with room, %q without", msg, roomy, small)
		}
	}
}

// TestPutSignedOverItsBody: a call's signature holds for the bytes sent,
// whether the signer took the body's hash from newPutBody (without a
// token, then with the token the last answer gave) or hashed the body
// itself (a token the service asked for while the call was made), as a
// service that checks SigV4 sees it: the server signs each request again
// from its own reading of the body and compares. A wrong hash handed to
// the signer fails here (and at AWS, with InvalidSignatureException).
func TestPutSignedOverItsBody(t *testing.T) {
	creds := aws.Credentials{AccessKeyID: "AKIDTEST", SecretAccessKey: "secret"}
	var mu sync.Mutex
	var bad, tokens []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err == nil {
			err = checkSignature(r, body, creds)
		}
		var in struct {
			SequenceToken string `json:"sequenceToken"`
		}
		json.Unmarshal(body, &in)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			bad = append(bad, err.Error())
		}
		tokens = append(tokens, in.SequenceToken)
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		if len(tokens) == 3 { // the third call's token is stale: the service wants "8"
			w.Header().Set("X-Amzn-ErrorType", "InvalidSequenceTokenException")
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"__type":"InvalidSequenceTokenException","expectedSequenceToken":"8","message":"stale"}`)
			return
		}
		io.WriteString(w, `{"nextSequenceToken":"7"}`)
	}))
	defer srv.Close()
	s := newBodySink(t, srv.URL)
	evs := []event{{ts: 1700000000000, msg: []byte(`{"log":"a \"quoted\" line"}`)}, {ts: 1700000000001, msg: []byte("second\n")}}
	for range 3 {
		tok, _ := s.tokens.get("/eks/a\x00pod-1")
		if _, err := s.put(context.Background(), "/eks/a", "pod-1", evs, newPutBody("/eks/a", "pod-1", tok, evs)); err != nil {
			t.Fatal(err)
		}
	}
	if want := []string{"", "7", "7", "8"}; !reflect.DeepEqual(tokens, want) {
		t.Fatalf("calls' sequence tokens: %q, want %q", tokens, want)
	}
	for _, b := range bad {
		t.Error(b)
	}
}

// newBodySink is a sink against url with the test credentials.
func newBodySink(t *testing.T, url string) *Sink {
	t.Helper()
	s, err := New(context.Background(), "cw", baseCfg(url), Options{Hostname: "test", AWS: staticAWS(), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// checkSignature signs r again, over body and the headers r says it
// signed, at the time it says, and compares the signatures.
func checkSignature(r *http.Request, body []byte, creds aws.Credentials) error {
	auth := r.Header.Get("Authorization")
	var signed, sig string
	for _, f := range strings.Split(strings.TrimPrefix(auth, "AWS4-HMAC-SHA256 "), ", ") {
		if v, ok := strings.CutPrefix(f, "SignedHeaders="); ok {
			signed = v
		}
		if v, ok := strings.CutPrefix(f, "Signature="); ok {
			sig = v
		}
	}
	at, err := time.Parse("20060102T150405Z", r.Header.Get("X-Amz-Date"))
	if err != nil || signed == "" || sig == "" {
		return fmt.Errorf("request not signed as SigV4: Authorization %q, X-Amz-Date %q", auth, r.Header.Get("X-Amz-Date"))
	}
	again, err := http.NewRequest(r.Method, "http://"+r.Host+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return err
	}
	for _, h := range strings.Split(signed, ";") {
		if h != "host" && h != "content-length" {
			again.Header[http.CanonicalHeaderKey(h)] = r.Header.Values(h)
		}
	}
	sum := sha256.Sum256(body)
	if err := v4.NewSigner().SignHTTP(context.Background(), creds, again, hex.EncodeToString(sum[:]), "logs", "us-east-1", at); err != nil {
		return err
	}
	if want := again.Header.Get("Authorization"); want != auth {
		return fmt.Errorf("signature does not hold for the body sent:\n got  %s\n want %s", auth, want)
	}
	return nil
}

// TestPutBodyDigestIsStable: a version 2 intent's digest is the SHA-256
// of the call's body, and Recover rebuilds the body to compare: a body
// built otherwise (escapes, member order, names) would leave the calls
// an older build left in doubt unresolved after an upgrade, and sent
// again. A change of the body's bytes needs a new intent version, which
// reads version 2 intents as they were written.
func TestPutBodyDigestIsStable(t *testing.T) {
	evs := []event{
		{ts: 1700000000000, msg: []byte(`{"log":"plain","kubernetes":{"pod_name":"a"}}`)},
		{ts: 1700000000001, msg: []byte("quote \" backslash \\ tab \t newline \n nul \x00 del \x7f")},
		{ts: 1700000000002, msg: []byte("<html> & \u2028 \u2029 é 日本 😀")},
	}
	const want = "cdf108df73cfc74d5b535041936f6406e8a8d0a7a8118c00d2cbae500cc85399"
	if got := newPutBody("/eks/a\"b", "pod-1/host", "", evs).sum; got != want {
		t.Errorf("body digest %s, want %s: the body's bytes changed (see above)", got, want)
	}
}

// appendMessageBytewise is appendMessage as it was before it copied eight
// bytes at a time: a byte at a time with messageEscapes when dst has room
// for every byte escaped, else appendMessageRuns. appendMessage must write
// the same bytes (TestAppendMessageSameBytes, FuzzAppendMessage).
func appendMessageBytewise(dst, msg []byte) []byte {
	if n := len(dst); cap(dst)-n >= 2*len(msg)+2 {
		d := dst[:n+2*len(msg)+2]
		d[n] = '"'
		j := n + 1
		for _, c := range msg {
			switch e := messageEscapes[c]; e {
			case 0:
				d[j] = c
				j++
			case 'u':
				return appendMessageRuns(dst, msg)
			default:
				d[j], d[j+1] = '\\', e
				j += 2
			}
		}
		d[j] = '"'
		return d[:j+1]
	}
	return appendMessageRuns(dst, msg)
}

// checkSameBytes fails t when appendMessage and appendMessageBytewise
// write different bytes for msg after prefix, with room for every byte
// escaped and more, with what appendMessage needs to store words
// (2*len(msg)+8), with less, and with room for msg as it is.
func checkSameBytes(t *testing.T, prefix, msg []byte) {
	t.Helper()
	for _, room := range []int{2*len(msg) + 40, 2*len(msg) + 8, 2*len(msg) + 7, 2*len(msg) + 2, len(msg)} {
		a := appendMessage(append(make([]byte, 0, len(prefix)+room), prefix...), msg)
		b := appendMessageBytewise(append(make([]byte, 0, len(prefix)+room), prefix...), msg)
		if !bytes.Equal(a, b) {
			t.Fatalf("message %q after %d bytes, room %d: wrote %q, byte by byte %q", msg, len(prefix), room, a, b)
		}
	}
}

// TestAppendMessageSameBytes: appendMessage writes the bytes that the
// byte-at-a-time version wrote, for messages of every byte value and of
// lengths around multiples of eight, each escape at each place of a word,
// and bench-like JSON bodies.
func TestAppendMessageSameBytes(t *testing.T) {
	r := rand.New(rand.NewSource(2))
	special := []byte{'"', '\\', '\n', '\r', '\t', 0, 0x1f, 0x20, 0x7f, 0x80, 0xff, 0xa2, 0xdc, 'a'}
	for n := 0; n <= 40; n++ {
		for range 300 {
			msg := make([]byte, n)
			for i := range msg {
				switch r.Intn(3) {
				case 0:
					msg[i] = byte(r.Intn(256))
				case 1:
					msg[i] = special[r.Intn(len(special))]
				default:
					msg[i] = byte(0x20 + r.Intn(0x60))
				}
			}
			checkSameBytes(t, []byte("x"), msg)
			checkSameBytes(t, nil, msg)
		}
		// Every byte escaped: the most a message takes.
		checkSameBytes(t, []byte("x"), bytes.Repeat([]byte{'"'}, n))
		checkSameBytes(t, nil, bytes.Repeat([]byte{'\\'}, n))
		// Each byte value alone at each place of a message of n bytes.
		for c := range 256 {
			for at := range n {
				msg := bytes.Repeat([]byte{'a'}, n)
				msg[at] = byte(c)
				checkSameBytes(t, []byte("{"), msg)
			}
		}
	}
	for _, rec := range benchRecords(200, 10, time.Now()) {
		checkSameBytes(t, []byte(`{"message":`), rec.Body)
	}
}

// FuzzAppendMessage: appendMessage writes what the byte-at-a-time
// version wrote.
func FuzzAppendMessage(f *testing.F) {
	f.Add([]byte(`{"log":"a \"quoted\" line\n","stream":"stdout"}`), 3)
	f.Add([]byte("12345678\x001234567\"\\\\\\\\\\\\\\"), 0)
	f.Add([]byte("\xff\xfe\x7f\x80\u2028 é 日本 😀"), 9)
	f.Fuzz(func(t *testing.T, msg []byte, prefix int) {
		checkSameBytes(t, bytes.Repeat([]byte{'p'}, prefix&15), msg)
	})
}

// TestPutBodyTimestamps: each event's timestamp reads back from the body,
// whether it is the previous event's (copied) or not, in a body that has
// room for it and in one that grows while it is built.
func TestPutBodyTimestamps(t *testing.T) {
	tss := []int64{-3, -3, 0, 0, 0, 7, 1700000000000, 1700000000000, 1700000000001, 1700000000001, 9223372036854775807}
	var evs []event
	for i, ts := range tss {
		evs = append(evs, event{ts: ts, msg: fmt.Appendf(nil, `{"log":"line %d"}`, i)})
	}
	for _, dst := range [][]byte{nil, make([]byte, 0, putBodyBytes("g", "s", "", evs))} {
		b := appendPutBody(dst, "g", "s", "", evs)
		var got struct {
			LogEvents []struct {
				Message   string
				Timestamp int64
			}
		}
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if len(got.LogEvents) != len(evs) {
			t.Fatalf("%d events read back from %s", len(got.LogEvents), b)
		}
		for i, e := range got.LogEvents {
			if e.Timestamp != evs[i].ts || e.Message != string(evs[i].msg) {
				t.Errorf("event %d read back as %+v, want %d %s", i, e, evs[i].ts, evs[i].msg)
			}
		}
	}
}

// TestReleaseEventsClears: a slice of events given back holds on to no
// record's bytes.
func TestReleaseEventsClears(t *testing.T) {
	evs := eventsBuffer(4)
	evs = append(evs, event{ts: 1, msg: []byte("a"), seq: 1}, event{ts: 2, msg: []byte("b"), seq: 2})
	all := evs[:cap(evs)]
	releaseEvents(evs)
	for i, e := range all {
		if e.msg != nil || e.ts != 0 || e.seq != 0 {
			t.Errorf("event %d kept: %+v", i, e)
		}
	}
}

// TestBodyBuffersOutliveCollections: the buffer of a call that returned is
// the next call's, even after garbage collections (near the memory limit
// they come every few calls), and a body a little larger than the last
// one fits in it.
func TestBodyBuffersOutliveCollections(t *testing.T) {
	for { // empty what other tests left
		if _, ok := bodies.Get(); !ok {
			break
		}
	}
	b := bodyBuffer(1 << 20)
	first := unsafe.SliceData(b[:1])
	releaseBody(b)
	runtime.GC()
	runtime.GC()
	runtime.GC()
	b = bodyBuffer(1<<20 + 60<<10)
	if unsafe.SliceData(b[:1]) != first {
		t.Fatal("a body after three collections was made anew, not built in the last call's buffer")
	}
	releaseBody(b)
}
