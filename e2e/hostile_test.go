package e2e

import (
	"bytes"
	"compress/gzip"
	"crypto/sha512"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tinylib/msgp/msgp"
)

// TestHostileClientsRSS runs the hostile clients of the inputs' tests
// (inputs/forward and inputs/httpin TestHostileClients) against the real
// binary with the default memory_limit (128 MiB), one forwarder per probe,
// and measures its anonymous memory (RssAnon) meanwhile; a well-behaved
// client must be acknowledged during each. It is what BENCHMARKS.md
// reports, and is long and memory-hungry on a forwarder without the
// inputs' budget: E2E_HOSTILE=1 runs it.
func TestHostileClientsRSS(t *testing.T) {
	if os.Getenv("E2E_HOSTILE") == "" {
		t.Skip("E2E_HOSTILE=1 runs the hostile clients against the real binary (BENCHMARKS.md)")
	}
	const big = 16 << 20
	unfinished := fwdMessage("big", strings.Repeat("x", big-64), "")[:big-64]
	bodies := bytes.Repeat([]byte("{}\n"), 5_000_000)
	probes := []struct {
		name  string
		conns int
		input string // forward: the message after the handshake; ping: in place of the PING; http
		data  []byte
		head  string // http: the request's headers
		whole bool   // the forwarder answers it (or closes the connection): wait for that
	}{
		{"forward: unfinished 16 MB messages", 20, "forward", unfinished, "", false},
		{"forward: unfinished 16 MB messages", 60, "forward", unfinished, "", false},
		{"forward: a 16 MB PING", 30, "ping", hugePing(), "", true},
		{"forward: a 58 KB gzip message of 20M records", 1, "forward", forwardBomb(), "", true},
		{"http: unfinished 15 MB bodies", 40, "http", bodies[:len(bodies)-1], httpHead(len(bodies), ""), false},
		{"http: Content-Length 16 MiB, 5 bytes sent", 40, "http", []byte(`{"a":`), httpHead(16<<20, ""), false},
		{"http: a 16 KB gzip body of 5.5M records", 1, "http", httpBomb(), httpHead(len(httpBomb()), "Content-Encoding: gzip\r\n"), true},
	}
	for _, p := range probes {
		t.Run(fmt.Sprintf("%s x%d", p.name, p.conns), func(t *testing.T) {
			e := newEnv(t, nil)
			cfg := e.f.cfg
			yaml := strings.Replace(cfg.yaml(), fmt.Sprintf("forward: {listen: %q}", cfg.Forward),
				fmt.Sprintf("forward: {listen: %q, shared_key: k}", cfg.Forward), 1)
			if err := os.WriteFile(e.f.cfgPath, []byte(yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			e.f.start()
			peak := watchRssAnon(t, e.f.pid())
			before, _ := rssAnon(e.f.pid())
			addr := cfg.HTTP
			if p.input != "http" {
				addr = cfg.Forward
			}
			var wg sync.WaitGroup
			var conns []net.Conn
			for range p.conns {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				conns = append(conns, c)
				wg.Go(func() {
					c.SetDeadline(time.Now().Add(90 * time.Second))
					switch p.input {
					case "forward":
						if err := handshake(c, msgp.NewReader(c)); err != nil {
							return
						}
					case "ping":
						if _, err := readHELO(msgp.NewReader(c)); err != nil {
							return
						}
					default:
						c.Write([]byte(p.head))
					}
					c.Write(p.data)
					if p.whole {
						c.Read(make([]byte, 4096)) // until an answer, or the close
					}
				})
			}
			time.Sleep(3 * time.Second) // the forwarder takes what it will of them
			start := time.Now()
			if err := goodForwardClient(cfg.Forward); err != nil {
				t.Errorf("a well-behaved forward client during the probe: %v", err)
			}
			resp, err := http.Post("http://"+cfg.HTTP+"/v1/logs/good", "application/x-ndjson", strings.NewReader(`{"good":1}`))
			if err != nil || resp.StatusCode != 200 {
				t.Errorf("a well-behaved HTTP client during the probe: %v %v", err, resp)
			} else {
				resp.Body.Close()
			}
			served := time.Since(start)
			if p.whole {
				wg.Wait() // the forwarder is done with them
			}
			time.Sleep(500 * time.Millisecond)
			t.Logf("%d bytes a connection; peak RssAnon %.0f MiB (%.0f MiB at the start); well-behaved clients served in %v",
				len(p.head)+len(p.data), float64(peak())/(1<<20), float64(before)/(1<<20), served.Round(time.Millisecond))
			for _, c := range conns {
				c.Close()
			}
			wg.Wait()
			// memory_limit, and room for what the runtime's soft limit
			// does not hold back at once: goroutines, garbage not yet collected.
			if got := peak(); got > 160<<20 {
				t.Errorf("peak RssAnon %d bytes, more than 160 MiB", got)
			}
			e.f.stop()
		})
	}
}

// fwdMessage is a forward Message-mode message [tag, time, {"log": log}, option?].
func fwdMessage(tag, log, chunk string) []byte {
	n := uint32(3)
	if chunk != "" {
		n = 4
	}
	b := msgp.AppendArrayHeader(nil, n)
	b = msgp.AppendString(b, tag)
	b = msgp.AppendInt64(b, time.Now().Unix())
	b = msgp.AppendMapHeader(b, 1)
	b = msgp.AppendString(b, "log")
	b = msgp.AppendString(b, log)
	if chunk != "" {
		b = msgp.AppendMapHeader(b, 1)
		b = msgp.AppendString(b, "chunk")
		b = msgp.AppendString(b, chunk)
	}
	return b
}

// hugePing is a PING whose hostname claims 16 MiB, and brings all of it.
func hugePing() []byte {
	p := msgp.AppendArrayHeader(nil, 6)
	p = msgp.AppendString(p, "PING")
	p = append(p, 0xdb)
	p = binary.BigEndian.AppendUint32(p, 16<<20)
	return append(p, bytes.Repeat([]byte{'h'}, 16<<20)...)
}

// forwardBomb is a CompressedPackedForward message whose entries, [1, {}]
// each, take 60 MB once decompressed: 20 gzip members of 1M entries.
func forwardBomb() []byte {
	var z bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&z, gzip.BestCompression)
	zw.Write(bytes.Repeat([]byte{0x92, 0x01, 0x80}, 1_000_000))
	zw.Close()
	b := msgp.AppendArrayHeader(nil, 3)
	b = msgp.AppendString(b, "bomb")
	b = msgp.AppendBytes(b, bytes.Repeat(z.Bytes(), 20))
	b = msgp.AppendMapHeader(b, 2)
	b = msgp.AppendString(b, "compressed")
	b = msgp.AppendString(b, "gzip")
	b = msgp.AppendString(b, "chunk")
	return msgp.AppendString(b, "bomb")
}

var httpBombOnce = sync.OnceValue(func() []byte {
	var z bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&z, gzip.BestCompression)
	zw.Write(bytes.Repeat([]byte("{}\n"), 100_000))
	zw.Close()
	return bytes.Repeat(z.Bytes(), 55) // 5.5M lines
})

func httpBomb() []byte { return httpBombOnce() }

func httpHead(length int, extra string) string {
	return fmt.Sprintf("POST /v1/logs/hostile HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n", length, extra)
}

// readHELO reads the server's HELO and returns its nonce.
func readHELO(r *msgp.Reader) ([]byte, error) {
	if n, err := r.ReadArrayHeader(); err != nil || n != 2 {
		return nil, fmt.Errorf("HELO: %v (%d elements)", err, n)
	}
	r.ReadString()
	var nonce []byte
	n, err := r.ReadMapHeader()
	for range n {
		if k, _ := r.ReadString(); k == "nonce" {
			nonce, err = r.ReadBytes(nil)
		} else {
			err = r.Skip()
		}
	}
	return nonce, err
}

// handshake passes the forward handshake on c (shared_key k), reading
// with r.
func handshake(c net.Conn, r *msgp.Reader) error {
	nonce, err := readHELO(r)
	if err != nil {
		return err
	}
	h := sha512.Sum512([]byte("salt" + "good" + string(nonce) + "k"))
	p := msgp.AppendArrayHeader(nil, 6)
	for _, s := range []string{"PING", "good", "salt", hex.EncodeToString(h[:]), "", ""} {
		p = msgp.AppendString(p, s)
	}
	c.Write(p)
	if n, err := r.ReadArrayHeader(); err != nil || n != 5 {
		return fmt.Errorf("PONG: %v", err)
	}
	r.ReadString()
	if ok, _ := r.ReadBool(); !ok {
		return fmt.Errorf("handshake refused")
	}
	r.Skip()
	r.Skip()
	return r.Skip()
}

// goodForwardClient passes the handshake, sends one message with a chunk
// and waits for its ack.
func goodForwardClient(addr string) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	r := msgp.NewReader(c)
	if err := handshake(c, r); err != nil {
		return err
	}
	c.Write(fwdMessage("good", "hello", "g1"))
	if _, err := r.ReadMapHeader(); err != nil {
		return fmt.Errorf("ack: %w", err)
	}
	r.ReadString()
	if id, err := r.ReadString(); err != nil || id != "g1" {
		return fmt.Errorf("ack %q: %v", id, err)
	}
	return nil
}
