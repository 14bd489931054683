package forward

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tinylib/msgp/msgp"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/wal"
)

// sizedMessage is a Message-mode message with a chunk id, exactly n bytes
// long: a record {"log": "xxx..."} padded to size.
func sizedMessage(t testing.TB, n int, chunk string) []byte {
	t.Helper()
	build := func(pad int) []byte {
		b := msgp.AppendArrayHeader(nil, 4)
		b = msgp.AppendString(b, "big")
		b = append(b, eventTime(time.Unix(1764489601, 0))...)
		b = msgp.AppendMapHeader(b, 1)
		b = msgp.AppendString(b, "log")
		b = msgp.AppendString(b, strings.Repeat("x", pad))
		return append(b, options(chunk)...)
	}
	overhead := len(build(1<<16)) - 1<<16       // with a str32 header
	for _, shorter := range []int{0, 2, 3, 4} { // a str32, str16, str8 or fixstr header
		if pad := n - overhead + shorter; pad >= 0 {
			if msg := build(pad); len(msg) == n {
				return msg
			}
		}
	}
	t.Fatalf("no message of exactly %d bytes", n)
	return nil
}

// Messages of any size up to max_message_bytes are read whatever came
// before them on the connection: a message that does not fit behind the
// previous ones in a buffer at its largest is read all the same, both
// when the client waits for each ack and when it sends without waiting.
func TestLargeMessagesInSequence(t *testing.T) {
	tests := []struct {
		name    string
		sizes   []int
		waitAck bool
	}{
		{"waiting for each ack", []int{15 << 20, 1 << 20, 16_000_000}, true},
		{"pipelined", []int{4_128_868, 14_000_000}, false},
		{"pipelined, up to the limit", []int{1 << 20, 16 << 20, 100, 16 << 20}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := defaultCfg()
			cfg.MaxMessageBytes = 16 * config.MiB
			f := start(t, cfg, wal.Options{})
			c := f.dial()
			msgs := make([][]byte, len(tt.sizes))
			for i, n := range tt.sizes {
				msgs[i] = sizedMessage(t, n, fmt.Sprint("chunk-", i))
			}
			sent := make(chan error, 1)
			go func() {
				if tt.waitAck {
					sent <- nil
					return
				}
				for _, m := range msgs {
					if _, err := c.Write(m); err != nil {
						sent <- err
						return
					}
				}
				sent <- nil
			}()
			for i, m := range msgs {
				if tt.waitAck {
					if _, err := c.Write(m); err != nil {
						t.Fatalf("write message %d: %v", i, err)
					}
				}
				c.SetReadDeadline(time.Now().Add(30 * time.Second))
				id, err := readAckErr(c)
				if err != nil {
					t.Fatalf("message %d of %d bytes: no ack: %v\n%s", i, len(m), err, f.logs.String())
				}
				if want := fmt.Sprint("chunk-", i); id != want {
					t.Fatalf("ack %q, want %q", id, want)
				}
			}
			if err := <-sent; err != nil {
				t.Fatalf("write: %v", err)
			}
			recs := f.waitRecords(len(msgs))
			for i, r := range recs {
				// The body is {"log":"xxx..."}: the padding and 10 bytes.
				if r.Tag != "big" || len(r.Body) < tt.sizes[i]-100 || len(r.Body) > tt.sizes[i] {
					t.Errorf("record %d: tag %q, %d bytes of body for a message of %d", i, r.Tag, len(r.Body), tt.sizes[i])
				}
			}
		})
	}
}

// streamConn is a connection whose reads come from a byte stream, in
// pieces of random size. A read into an empty slice is an error: it could
// only ever return nothing.
type streamConn struct {
	net.Conn // nil: only what next uses is implemented
	data     []byte
	rng      *rand.Rand
}

func (s *streamConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, fmt.Errorf("read into an empty slice with %d bytes still to come", len(s.data))
	}
	if len(s.data) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), len(s.data), 1+s.rng.Intn(256<<10))
	copy(p, s.data[:n])
	s.data = s.data[n:]
	return n, nil
}

func (s *streamConn) SetReadDeadline(time.Time) error { return nil }

// frame is a msgpack bin32 value exactly n bytes long (n >= 5).
func frame(n int, fill byte) []byte {
	b := []byte{0xc6}
	b = binary.BigEndian.AppendUint32(b, uint32(n-5))
	return append(b, bytes.Repeat([]byte{fill}, n-5)...)
}

// Any sequence of messages within the limit is read back whole, in order,
// however the stream is cut into reads.
func TestNextReadsEverySequence(t *testing.T) {
	const max = 300 << 10
	sizes := [][]int{
		{max, max, max},
		{max / 2, max / 3, max},
		// A message that does not fit behind the one before it in a buffer
		// at its largest (max + bufSlack): after an ack, and pipelined.
		{max, 100 << 10, max},
		{90 << 10, max},
	}
	rng := rand.New(rand.NewSource(1))
	for range 100 {
		seq := make([]int, 1+rng.Intn(12))
		for i := range seq {
			switch rng.Intn(3) {
			case 0:
				seq[i] = 5 + rng.Intn(100)
			case 1:
				seq[i] = 5 + rng.Intn(max/4)
			default:
				seq[i] = max - rng.Intn(max/4)
			}
		}
		sizes = append(sizes, seq)
	}
	for i, seq := range sizes {
		var stream []byte
		for j, n := range seq {
			stream = append(stream, frame(n, byte('a'+j%26))...)
		}
		c := &conn{s: &Server{cfg: config.Forward{MaxMessageBytes: max}}, nc: &streamConn{data: stream, rng: rand.New(rand.NewSource(int64(i)))}}
		err := func() error {
			at := 0
			for j, n := range seq {
				msg, err := c.next()
				if err != nil {
					return fmt.Errorf("message %d: %v", j, err)
				}
				if !bytes.Equal(msg, stream[at:at+n]) {
					return fmt.Errorf("message %d is %d bytes, want %d", j, len(msg), n)
				}
				at += n
			}
			if _, err := c.next(); err != io.EOF {
				return fmt.Errorf("after the last message: %v, want EOF", err)
			}
			return nil
		}()
		if err != nil {
			t.Errorf("sequence %d %v: %v", i, seq, err)
		}
	}
}

// makeRoom always leaves room to read into, keeps the pending bytes, and
// never grows the buffer past a little more than the largest message.
func TestMakeRoom(t *testing.T) {
	const maxMsg = 1 << 20
	limit := maxMsg + bufSlack
	type state struct{ cap, start, len int }
	var states []state
	for _, cp := range []int{0, 1 << 10, 64 << 10, 500 << 10, limit - minRoom, limit} {
		for _, start := range []int{0, 1, cp / 4, cp / 2, cp - minRoom, cp} {
			for _, l := range []int{start, start + 1, (start + cp) / 2, cp - minRoom - 1, cp - minRoom, cp - 1, cp} {
				if start < 0 || start > l || l > cp || l-start > maxMsg {
					continue
				}
				states = append(states, state{cp, start, l})
			}
		}
	}
	for _, s := range states {
		buf := make([]byte, s.len, s.cap)
		for i := s.start; i < s.len; i++ {
			buf[i] = byte(i)
		}
		pending := string(buf[s.start:])
		c := &conn{buf: buf, start: s.start, reserved: true}
		if err := c.makeRoom(maxMsg, time.Time{}); err != nil {
			t.Fatalf("%+v: %v", s, err)
		}
		if room := cap(c.buf) - len(c.buf); room < minRoom {
			t.Errorf("%+v: %d bytes of room after makeRoom, want at least %d", s, room, minRoom)
		}
		if got := string(c.buf[c.start:]); got != pending {
			t.Errorf("%+v: pending bytes changed", s)
		}
		if cap(c.buf) > max(limit, s.cap) {
			t.Errorf("%+v: grown to %d, above %d", s, cap(c.buf), limit)
		}
	}
}
