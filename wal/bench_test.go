package wal

import (
	"context"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// benchBodies returns n bodies of exactly size bytes shaped like container
// logs collected by Fluent Bit: a JSON object with a timestamped log line
// from one of a few message templates with variable ids, numbers and paths,
// and Kubernetes metadata for a few dozen pods. Compression ratios depend on
// this shape; the stored-bytes/record metric reports the one measured.
func benchBodies(n, size int) [][]byte {
	r := rand.New(rand.NewSource(42))
	paths := []string{"/api/v1/items", "/api/v1/orders", "/api/v2/users", "/healthz", "/login", "/static/app.js", "/api/v1/cart"}
	methods := []string{"GET", "GET", "GET", "POST", "PUT", "DELETE"}
	templates := []func() string{
		func() string {
			return fmt.Sprintf("INFO http request method=%s path=%s/%d status=%d duration_ms=%d bytes=%d request_id=%016x",
				methods[r.Intn(len(methods))], paths[r.Intn(len(paths))], r.Intn(50000), []int{200, 200, 200, 201, 204, 304, 404, 500}[r.Intn(8)], r.Intn(900), r.Intn(90000), r.Uint64())
		},
		func() string {
			return fmt.Sprintf("WARN slow query table=%s rows=%d elapsed=%dms user_id=%d", []string{"orders", "items", "users", "sessions"}[r.Intn(4)], r.Intn(5000), 200+r.Intn(3000), r.Intn(1000000))
		},
		func() string {
			return fmt.Sprintf("ERROR upstream %s failed: connection reset by peer attempt=%d trace_id=%016x%016x", []string{"payments", "inventory", "search"}[r.Intn(3)], 1+r.Intn(3), r.Uint64(), r.Uint64())
		},
		func() string {
			return fmt.Sprintf("DEBUG cache %s key=%s:%d ttl=%ds", []string{"hit", "miss"}[r.Intn(2)], []string{"user", "cart", "price"}[r.Intn(3)], r.Intn(100000), 60*r.Intn(60))
		},
		func() string {
			return fmt.Sprintf("INFO job %s completed in %d.%03ds processed=%d queue=%s", []string{"reindex", "email", "export", "cleanup"}[r.Intn(4)], r.Intn(30), r.Intn(1000), r.Intn(20000), []string{"default", "low", "high"}[r.Intn(3)])
		},
	}
	agents := []string{"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0 Safari/537.36",
		"curl/8.5.0", "okhttp/4.12.0", "Go-http-client/1.1", "Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 Mobile/15E148"}
	t := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	out := make([][]byte, n)
	for i := range out {
		t = t.Add(time.Duration(r.Intn(2000)) * time.Microsecond)
		pod := r.Intn(40)
		msg := t.Format("2006-01-02T15:04:05.000000Z ") + templates[r.Intn(len(templates))]() +
			fmt.Sprintf(" client_ip=10.%d.%d.%d user_agent=%q", r.Intn(4), r.Intn(256), r.Intn(256), agents[r.Intn(len(agents))])
		meta := fmt.Sprintf(`","stream":"stdout","kubernetes":{"namespace_name":"shop-%d","pod_name":"web-7d9f8b6c4-%05d","container_name":"app"}}`, pod%4, pod)
		// Fit the message to size (it is always longer than the room left).
		room := size - len(`{"log":"`) - len(meta)
		msg = strings.ReplaceAll(msg, `"`, `'`)
		if len(msg) < room {
			msg += strings.Repeat(" ", room-len(msg))
		}
		out[i] = []byte(`{"log":"` + msg[:room] + meta)
	}
	return out
}

func benchRecords(bodies [][]byte) []Record {
	recs := make([]Record, len(bodies))
	now := time.Now().UnixNano()
	for i := range recs {
		recs[i] = Record{Time: now + int64(i), Tag: "pod.prod.web", Body: bodies[i]}
	}
	return recs
}

func reportRate(b *testing.B, records int) {
	b.ReportMetric(float64(records)/b.Elapsed().Seconds(), "records/s")
}

// BenchmarkAppend appends 250-byte records in batches of one size from one
// goroutine; every Append is fsynced before it returns.
func BenchmarkAppend(b *testing.B) {
	for _, batch := range []int{1, 100, 1000, 10000} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			w := openT(b, b.TempDir(), Options{CompactRatio: -1})
			defer w.Close()
			recs := benchRecords(benchBodies(batch, 250))
			b.SetBytes(int64(batch * 250))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := w.Append(context.Background(), recs, AppendOptions{}); err != nil {
					b.Fatal(err)
				}
			}
			reportRate(b, b.N*batch)
			b.StopTimer()
			st := w.Stats()
			b.ReportMetric(float64(st.Bytes)/float64(st.Records), "stored-bytes/record")
		})
	}
}

// BenchmarkAppendConcurrent appends batches of 100 250-byte records from
// many goroutines at once; group commit shares transactions and fsyncs.
func BenchmarkAppendConcurrent(b *testing.B) {
	for _, g := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("goroutines=%d", g), func(b *testing.B) {
			w := openT(b, b.TempDir(), Options{CompactRatio: -1})
			defer w.Close()
			recs := benchRecords(benchBodies(100, 250))
			b.SetBytes(100 * 250)
			b.ReportAllocs()
			b.ResetTimer()
			var wg sync.WaitGroup
			per := (b.N + g - 1) / g
			for j := 0; j < g; j++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < per; i++ {
						if _, err := w.Append(context.Background(), recs, AppendOptions{}); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			reportRate(b, per*g*100)
			b.StopTimer()
			b.ReportMetric(float64(per*g)/float64(w.Stats().Commits), "appends/commit")
		})
	}
}

// readBenchWAL is a WAL of the read benchmarks: 200,000 records of 250
// bytes, written in 1,000-record appends.
func readBenchWAL(b *testing.B) *WAL {
	w := openT(b, b.TempDir(), Options{CompactRatio: -1})
	recs := benchRecords(benchBodies(1000, 250))
	for i := 0; i < 200; i++ {
		if _, err := w.Append(context.Background(), recs, AppendOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	return w
}

// BenchmarkRead reads back 250-byte records written in 1,000-record appends.
func BenchmarkRead(b *testing.B) {
	w := readBenchWAL(b)
	defer w.Close()
	b.SetBytes(200000 * 250)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rd := w.NewReader(1)
		n := 0
		for n < 200000 {
			got, err := rd.Next(context.Background(), 10000, 0)
			if err != nil {
				b.Fatal(err)
			}
			n += len(got)
		}
	}
	reportRate(b, b.N*200000)
}

// BenchmarkAppendAfterDrain appends batches of 1,000 records of 250 bytes,
// 8 goroutines at once, to a WAL whose earlier records (drained=N) every
// cursor has passed and retention deleted: most of the file's pages are
// free, as after a backlog drained, and every commit writes bbolt's
// freelist. cpu-us/record is the process's CPU time per record appended.
func BenchmarkAppendAfterDrain(b *testing.B) {
	for _, drained := range []int{1_000_000, 4_000_000} {
		b.Run(fmt.Sprintf("drained=%d", drained), func(b *testing.B) {
			w := openT(b, b.TempDir(), Options{CompactRatio: -1})
			defer w.Close()
			recs := benchRecords(benchBodies(1000, 250))
			ctx := context.Background()
			if _, err := w.RegisterCursor(ctx, "sink"); err != nil {
				b.Fatal(err)
			}
			var last uint64
			for range drained / 1000 {
				res, err := w.Append(ctx, recs, AppendOptions{})
				if err != nil {
					b.Fatal(err)
				}
				last = res.Last
			}
			var cb Batch
			cb.SetCursor("sink", last)
			if err := w.Commit(ctx, &cb); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(1000 * 250)
			b.ReportAllocs()
			cpu0 := cpuTime()
			b.ResetTimer()
			var wg sync.WaitGroup
			var next atomic.Int64
			for range 8 {
				wg.Go(func() {
					for next.Add(1) <= int64(b.N) {
						if _, err := w.Append(ctx, recs, AppendOptions{}); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			reportRate(b, b.N*1000)
			b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/1e3/float64(b.N*1000), "cpu-us/record")
		})
	}
}

// BenchmarkReadIntoNew reads back 250-byte records written in 1,000-record
// appends, 10,000 records or 4 MiB a read as a drainer reads, each read into
// a ReadBuffer of its own: what a reader does when the buffers it gave back
// were collected.
func BenchmarkReadIntoNew(b *testing.B) {
	w := readBenchWAL(b)
	defer w.Close()
	b.SetBytes(200000 * 250)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rd := w.NewReader(1)
		n := 0
		for n < 200000 {
			got, err := rd.NextInto(context.Background(), 10000, 4<<20, new(ReadBuffer))
			if err != nil {
				b.Fatal(err)
			}
			n += len(got)
		}
	}
	reportRate(b, b.N*200000)
}

// BenchmarkReadTwoReaders reads back 250-byte records written in
// 1,000-record appends with two readers, as the two sinks' drainers read
// the WAL: each reads 10,000 records or 4 MiB at a time into a ReadBuffer
// of its own that it reads into again, the second reading what the first
// just read. An op is both readers reading all 200,000 records.
func BenchmarkReadTwoReaders(b *testing.B) {
	w := readBenchWAL(b)
	defer w.Close()
	var bufs [2]ReadBuffer
	b.SetBytes(2 * 200000 * 250)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rds := [2]*Reader{w.NewReader(1), w.NewReader(1)}
		for rds[1].Position() <= 200000 {
			for j, rd := range rds {
				got, err := rd.NextInto(context.Background(), 10000, 4<<20, &bufs[j])
				if err != nil {
					b.Fatal(err)
				}
				if len(got) == 0 || got[len(got)-1].Seq != rd.Position()-1 {
					b.Fatalf("reader %d: read %d records", j, len(got))
				}
			}
		}
	}
	reportRate(b, 2*b.N*200000)
}

// BenchmarkReadHead is what a sink that keeps up with appends reads: after
// each append of 1,000 records of 250 bytes, two readers (the two sinks)
// read them into ReadBuffers of their own. "memory" reads them from the
// entries the WAL keeps (recent), "file" from bbolt (the entries are
// dropped from memory after each append). Only the reads are timed.
func BenchmarkReadHead(b *testing.B) {
	for _, from := range []string{"memory", "file"} {
		b.Run(from, func(b *testing.B) {
			w := openT(b, b.TempDir(), Options{CompactRatio: -1})
			defer w.Close()
			recs := benchRecords(benchBodies(1000, 250))
			rds := [2]*Reader{w.NewReader(1), w.NewReader(1)}
			var bufs [2]ReadBuffer
			b.SetBytes(2 * 1000 * 250)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				if _, err := w.Append(context.Background(), recs, AppendOptions{}); err != nil {
					b.Fatal(err)
				}
				if from == "file" {
					forgetRecent(w)
				}
				b.StartTimer()
				for j, rd := range rds {
					got, err := rd.ReadInto(10000, 4<<20, &bufs[j])
					if err != nil || len(got) != 1000 {
						b.Fatalf("reader %d: %d records, %v", j, len(got), err)
					}
				}
			}
			b.StopTimer()
			reportRate(b, 2*b.N*1000)
			if st := w.Stats(); from == "memory" && st.FileReads > 0 || from == "file" && st.MemoryReads > 0 {
				b.Fatalf("%s: %d reads from memory, %d from the file", from, st.MemoryReads, st.FileReads)
			}
		})
	}
}
