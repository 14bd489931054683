package cloudwatch

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math/bits"
	"strconv"

	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/logfwd/forwarder/internal/jsonstr"
	"github.com/logfwd/forwarder/internal/reuse"
)

// appendPutBody appends the awsJson1.1 body of one PutLogEvents call to
// dst: what the SDK's serializer makes of a PutLogEventsInput holding the
// same events, built from the events' messages as they are instead of an
// InputLogEvent (two pointers) per event and a second pass of the SDK's
// own escaper. A message's invalid UTF-8, which events already replaced,
// would be replaced here too. The bytes are what a version 2 intent's
// digest hashes and Recover builds again: changing them needs a new intent
// version (TestPutBodyDigestIsStable).
func appendPutBody(dst []byte, group, stream, token string, evs []event) []byte {
	dst = append(dst, `{"logEvents":[`...)
	// Events come sorted by time, many in the same millisecond: a
	// timestamp that is the last one's is copied from where it was first
	// written, dst[tsFrom:tsTo].
	tsFrom, tsTo := 0, 0
	for i := range evs {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"message":`...)
		dst = appendMessage(dst, evs[i].msg)
		dst = append(dst, `,"timestamp":`...)
		if i > 0 && evs[i].ts == evs[i-1].ts {
			dst = append(dst, dst[tsFrom:tsTo]...)
		} else {
			tsFrom = len(dst)
			dst = strconv.AppendInt(dst, evs[i].ts, 10)
			tsTo = len(dst)
		}
		dst = append(dst, '}')
	}
	dst = append(dst, `],"logGroupName":`...)
	dst, _ = jsonstr.Append(dst, group)
	dst = append(dst, `,"logStreamName":`...)
	dst, _ = jsonstr.Append(dst, stream)
	if token != "" {
		dst = append(dst, `,"sequenceToken":`...)
		dst, _ = jsonstr.Append(dst, token)
	}
	return append(dst, '}')
}

// appendMessage appends msg as a JSON string. A message is valid UTF-8
// (events repairs one that is not), so only `"`, `\` and the control
// characters are escaped, as encoding/json escapes them (internal/jsonstr
// has the same escapes). When dst has room for every byte escaped and a
// word more, msg is read eight bytes at a time: a word is stored whole,
// and for each '"' or '\' in it (quoteMask) a backslash is written in its
// place and the word's rest stored again after it. A message that is a
// JSON document has a quote every few bytes; stores at offsets known from
// the word cost less there than a byte at a time, or a copy per run
// between quotes. A word with a control character goes a byte at a time.
// Without the room (the body's buffer is sized for the body: its last
// messages), or at a control character that is written \u00XX, the runs
// between escapes are copied.
func appendMessage(dst, msg []byte) []byte {
	n := len(dst)
	if cap(dst)-n < 2*len(msg)+8 {
		return appendMessageRuns(dst, msg)
	}
	// At a word at i, j is at most n+1+2*i; its last store, after its
	// last quote (at most its seventh escape), ends before n+2*i+24: within
	// d while i+8 <= len(msg).
	d := dst[:n+2*len(msg)+8]
	d[n] = '"'
	j := n + 1
	i := 0
	for ; i+8 <= len(msg); i += 8 {
		w := binary.LittleEndian.Uint64(msg[i:])
		if ctlMask(w) != 0 {
			var ok bool
			if j, ok = escapeBytes(d, j, msg[i:i+8]); !ok {
				return appendMessageRuns(dst, msg)
			}
			continue
		}
		binary.LittleEndian.PutUint64(d[j:], w)
		for q := quoteMask(w); q != 0; q &= q - 1 {
			k := bits.TrailingZeros64(q) >> 3
			d[j+k] = '\\'
			binary.LittleEndian.PutUint64(d[j+k+1:], w>>(8*k))
			j++
		}
		j += 8
	}
	j, ok := escapeBytes(d, j, msg[i:]) // the last bytes, fewer than eight
	if !ok {
		return appendMessageRuns(dst, msg)
	}
	d[j] = '"'
	return d[:j+1]
}

// escapeBytes writes b into d from j on, a byte at a time, with `"`, `\`,
// newline, carriage return and tab escaped, and returns where it ended. It
// reports false, having written part of b, at a byte that is written
// \u00XX, which appendMessageRuns writes.
func escapeBytes(d []byte, j int, b []byte) (int, bool) {
	for _, c := range b {
		switch e := messageEscapes[c]; e {
		case 0:
			d[j] = c
			j++
		case 'u':
			return j, false
		default:
			d[j], d[j+1] = '\\', e
			j += 2
		}
	}
	return j, true
}

const (
	lowBits  = 0x0101010101010101
	highBits = 0x8080808080808080
	lowSeven = 0x7f7f7f7f7f7f7f7f
)

// ctlMask has the high bit set of each byte of w below 0x20, and
// quoteMask of each '"' and '\\'. They are exact: the low seven bits of a
// byte plus at most 0x7f do not carry into the next byte.
func ctlMask(w uint64) uint64 {
	return ^(w&lowSeven + lowBits*(0x80-0x20) | w) & highBits
}

func quoteMask(w uint64) uint64 {
	return zeroBytes(w^lowBits*'"') | zeroBytes(w^lowBits*'\\')
}

// zeroBytes has the high bit set of each byte of w that is zero.
func zeroBytes(w uint64) uint64 {
	return ^(w&lowSeven + lowSeven | w) & highBits
}

// appendMessageRuns is appendMessage copying the runs between escapes.
func appendMessageRuns(dst, msg []byte) []byte {
	dst = append(dst, '"')
	start := 0
	for i, c := range msg {
		e := messageEscapes[c]
		if e == 0 {
			continue
		}
		dst = append(dst, msg[start:i]...)
		if e == 'u' {
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		} else {
			dst = append(dst, '\\', e)
		}
		start = i + 1
	}
	dst = append(dst, msg[start:]...)
	return append(dst, '"')
}

const hexDigits = "0123456789abcdef"

// messageEscapes is, for each byte, what follows the backslash of its
// escape ('u': \u00XX), or 0 for a byte written as it is.
var messageEscapes = func() (e [256]byte) {
	for c := range 0x20 {
		e[c] = 'u'
	}
	e['\n'], e['\r'], e['\t'], e['"'], e['\\'] = 'n', 'r', 't', '"', '\\'
	return e
}()

// putBodyBytes is how many bytes appendPutBody appends at most for evs
// when no message holds a control character (which takes up to six bytes)
// and the names and token need no escapes: the buffer's size, so that it
// is not grown and copied while the body is built. A message that is a
// JSON document escapes every quote.
func putBodyBytes(group, stream, token string, evs []event) int {
	n := len(`{"logEvents":[],"logGroupName":"","logStreamName":"","sequenceToken":""}`) + len(group) + len(stream) + len(token)
	for i := range evs {
		m := evs[i].msg
		n += len(`{"message":"","timestamp":},`) + 20 + len(m) + bytes.Count(m, quote) + bytes.Count(m, backslash)
	}
	return n
}

var quote, backslash = []byte{'"'}, []byte{'\\'}

// bodies holds the buffers of calls that returned, for the bodies of the
// next calls: a call's body is about a mebibyte, and allocating (and
// clearing) one per call showed in the CPU per record. Two are kept for
// good, the rest pooled (see package reuse): near the memory limit a pool
// alone is emptied every few calls. A buffer is reused only once its call
// returned: the SDK's HTTP handler closes the request's body before it
// returns, and smithy-go wraps that body so that nothing, not even the
// HTTP transport's writer, reads it after the close.
var bodies = reuse.Buffers[*[]byte]{Keep: 2}

// maxPooledBody is the largest buffer bodies keeps: a call's body, with
// room for escapes.
const maxPooledBody = 2 << 20

// bodyBuffer returns an empty buffer with room for n bytes. A new one has
// an eighth more, so that the next calls' bodies, which vary in size a
// little, fit in it too.
func bodyBuffer(n int) []byte {
	if bp, ok := bodies.Get(); ok && cap(*bp) >= n {
		return (*bp)[:0]
	}
	return make([]byte, 0, max(n, min(n+n/8, maxPooledBody)))
}

// releaseBody gives the buffer of a call that returned to bodies.
func releaseBody(b []byte) {
	if c := cap(b); c > 0 && c <= maxPooledBody {
		b = b[:0]
		bodies.Put(&b)
	}
}

// A putBody is the body of one PutLogEvents call with the sequence token
// known when it was built, and its SHA-256 (hex): the payload hash SigV4
// signs, and the digest its intent stores (version 2, with the token), so
// that a call's bytes are hashed once. Only a token a service hands over
// while the call is made (InvalidSequenceTokenException) makes a body of
// its own, which the SDK hashes.
type putBody struct {
	b     []byte
	token string
	sum   string
}

// newPutBody builds the body of a call of evs with token ("": none), in a
// buffer of bodies (releaseBody gives it back once the call returned).
func newPutBody(group, stream, token string, evs []event) putBody {
	b := appendPutBody(bodyBuffer(putBodyBytes(group, stream, token, evs)), group, stream, token, evs)
	return putBody{b: b, token: token, sum: bodySum(b)}
}

// bodySum is the hex SHA-256 of a body.
func bodySum(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// bodyID names the serialize step that puts the prebuilt body in place.
const bodyID = "forwarder.PutLogEventsBody"

// withBody makes one PutLogEvents call send body instead of the body the
// SDK serializes from its input (which then carries the names and token but
// no events): the SDK still resolves the endpoint, signs, sends and decodes
// the answer and the errors as for any call. With sum (the body's hex
// SHA-256) the signer takes it as the payload hash instead of hashing the
// body again; without, it hashes the body.
func withBody(body []byte, sum string) func(*cloudwatchlogs.Options) {
	return func(o *cloudwatchlogs.Options) {
		o.APIOptions = append(o.APIOptions, func(st *middleware.Stack) error {
			return st.Serialize.Insert(&prebuiltBody{b: body, sum: sum}, "OperationSerializer", middleware.After)
		})
	}
}

// prebuiltBody replaces the serialized body of a request and, with sum,
// hands the signer its hash. The hash is set here, inside the call: the SDK
// clears such values from the context a call starts with.
type prebuiltBody struct {
	b   []byte
	sum string
}

func (*prebuiltBody) ID() string { return bodyID }

func (p *prebuiltBody) HandleSerialize(ctx context.Context, in middleware.SerializeInput, next middleware.SerializeHandler) (
	middleware.SerializeOutput, middleware.Metadata, error,
) {
	req, ok := in.Request.(*smithyhttp.Request)
	if !ok {
		return middleware.SerializeOutput{}, middleware.Metadata{}, fmt.Errorf("set PutLogEvents body: unexpected transport type %T", in.Request)
	}
	sreq, err := req.SetStream(bytes.NewReader(p.b))
	if err != nil {
		return middleware.SerializeOutput{}, middleware.Metadata{}, fmt.Errorf("set PutLogEvents body: %w", err)
	}
	*req = *sreq
	if p.sum != "" {
		ctx = v4.SetPayloadHash(ctx, p.sum)
	}
	return next.HandleSerialize(ctx, in)
}
