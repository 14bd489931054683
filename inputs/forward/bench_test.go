package forward

import (
	"fmt"
	"math/rand"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/tinylib/msgp/msgp"

	"github.com/logfwd/forwarder/wal"
)

// benchPacked returns a PackedForward message of n records of about 250
// bytes of JSON each, shaped like Kubernetes container logs.
func benchPacked(n int, chunk string) []byte {
	return benchPackedLines(n, chunk, "stdout", func(r *rand.Rand, now time.Time) string {
		return fmt.Sprintf("%s INFO http request method=GET path=/api/v1/items/%d status=200 duration_ms=%d request_id=%016x",
			now.Format(time.RFC3339Nano), r.Intn(100000), r.Intn(900), r.Uint64())
	})
}

// benchPackedLines is a PackedForward message of n container log records
// of stream whose log lines line makes.
func benchPackedLines(n int, chunk, stream string, line func(*rand.Rand, time.Time) string) []byte {
	r := rand.New(rand.NewSource(1))
	var packed []byte
	now := time.Now()
	for i := 0; i < n; i++ {
		rec := msgp.AppendMapHeader(nil, 3)
		rec = msgp.AppendString(rec, "log")
		rec = msgp.AppendString(rec, line(r, now))
		rec = msgp.AppendString(rec, "stream")
		rec = msgp.AppendString(rec, stream)
		rec = msgp.AppendString(rec, "kubernetes")
		rec = msgp.AppendMapHeader(rec, 2)
		rec = msgp.AppendString(rec, "namespace_name")
		rec = msgp.AppendString(rec, "shop")
		rec = msgp.AppendString(rec, "pod_name")
		rec = msgp.AppendString(rec, fmt.Sprintf("web-7d9f8b6c4-%05d", r.Intn(40)))
		packed = append(packed, entry(eventTime(now), rec)...)
	}
	return packedMode("pod.shop.web", packed, false, options(chunk))
}

// BenchmarkForwardAck sends PackedForward messages of 1,000 records of
// about 250 bytes with acks, from 1 and 8 connections, into a WAL that
// fsyncs every commit. A connection waits for each ack before sending on.
func BenchmarkForwardAck(b *testing.B) {
	for _, conns := range []int{1, 8} {
		b.Run(fmt.Sprintf("connections=%d", conns), func(b *testing.B) {
			f := start(b, defaultCfg(), wal.Options{CompactRatio: -1})
			msgs := make([][]byte, conns)
			for i := range msgs {
				msgs[i] = benchPacked(1000, "")
			}
			size := 0
			if recs := 1000; recs > 0 {
				// JSON bytes per message, as stored.
				d := decoder{maxUnpacked: 64 << 20, now: time.Now}
				m, _ := d.decode(benchPacked(1000, "x"))
				for _, r := range m.records {
					size += len(r.Body)
				}
			}
			b.SetBytes(int64(size))
			b.ResetTimer()
			var wg sync.WaitGroup
			per := (b.N + conns - 1) / conns
			for c := 0; c < conns; c++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					nc, err := net.Dial("tcp", f.addr())
					if err != nil {
						b.Error(err)
						return
					}
					defer nc.Close()
					base := msgs[c][:len(msgs[c])-1] // without the empty option map
					for i := 0; i < per; i++ {
						msg := append(base[:len(base):len(base)], options(fmt.Sprintf("c%d-%d", c, i))...)
						msg[0] = 0x93 // three elements: tag, entries, option
						if _, err := nc.Write(msg); err != nil {
							b.Error(err)
							return
						}
						if _, err := readAckErr(nc); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(per*conns*1000)/b.Elapsed().Seconds(), "records/s")
		})
	}
}

// BenchmarkTranscode decodes PackedForward messages of 1,000 records into
// their JSON bodies, in process, without a WAL or a connection: the
// msgpack-to-JSON transcoder and the decoder around it. "plain" are the
// records of BenchmarkForwardAck (ASCII, nothing to escape); "escapes" the
// same with quotes, a tab, a newline, non-ASCII text and one invalid byte
// in every log line.
func BenchmarkTranscode(b *testing.B) {
	for _, c := range []struct {
		name string
		msg  []byte
	}{
		{"plain", benchPacked(1000, "x")},
		{"escapes", benchPackedEscapes(1000, "x")},
	} {
		b.Run(c.name, func(b *testing.B) {
			d := decoder{maxUnpacked: 64 << 20, now: time.Now}
			m, err := d.decode(c.msg)
			if err != nil {
				b.Fatal(err)
			}
			size := 0
			for _, r := range m.records {
				size += len(r.Body)
			}
			m.release()
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				m, err := d.decode(c.msg)
				if err != nil {
					b.Fatal(err)
				}
				m.release()
			}
			b.ReportMetric(float64(1000)*float64(b.N)/b.Elapsed().Seconds(), "records/s")
		})
	}
}

// benchPackedEscapes is benchPacked with log lines that need escaping.
func benchPackedEscapes(n int, chunk string) []byte {
	return benchPackedLines(n, chunk, "stderr", func(r *rand.Rand, now time.Time) string {
		return fmt.Sprintf("%s\tWARN \"request\" method=GET path=/api/v1/élément/%d status=200 durée_ms=%d\xff request_id=%016x\n",
			now.Format(time.RFC3339Nano), r.Intn(100000), r.Intn(900), r.Uint64())
	})
}

// BenchmarkDigest names a decoded PackedForward message of 1,000 records
// for its chunk id (message.digest): what a chunk id adds to a message's
// decoding (BenchmarkTranscode).
func BenchmarkDigest(b *testing.B) {
	d := decoder{maxUnpacked: 64 << 20, now: time.Now}
	m, err := d.decode(benchPacked(1000, "x"))
	if err != nil {
		b.Fatal(err)
	}
	defer m.release()
	b.SetBytes(int64(len(m.buf)))
	b.ReportAllocs()
	for b.Loop() {
		m.digest()
	}
	b.ReportMetric(float64(1000)*float64(b.N)/b.Elapsed().Seconds(), "records/s")
}
