//go:build unix

package s3sink

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/klauspost/compress/gzip"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/queue"
	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// logRecords are n access-log-like records of about 250 bytes: repeated
// structure, varying numbers, a random request id (so they compress like
// real logs, not like padding).
func logRecords(n, partitions int) []wal.Record {
	rng := rand.New(rand.NewPCG(1, 2))
	methods := []string{"GET", "GET", "GET", "POST", "PUT", "DELETE"}
	paths := []string{"/api/v1/orders", "/api/v1/users", "/healthz", "/api/v2/search", "/static/app.js"}
	agents := []string{"Mozilla/5.0 (X11; Linux x86_64)", "curl/8.5.0", "Go-http-client/1.1", "okhttp/4.12.0"}
	at := time.Date(2025, 6, 15, 15, 0, 0, 0, time.UTC)
	recs := make([]wal.Record, n)
	for i := range recs {
		body := fmt.Appendf(nil, `{"level":"info","msg":"request served","method":%q,"path":"%s/%d","status":%d,"bytes":%d,"duration_ms":%.3f,"remote":"10.%d.%d.%d","request_id":"%016x%016x","user_agent":%q}`,
			methods[rng.IntN(len(methods))], paths[rng.IntN(len(paths))], rng.IntN(100000), []int{200, 200, 200, 201, 204, 304, 404, 500}[rng.IntN(8)],
			rng.IntN(50000), rng.Float64()*200, rng.IntN(256), rng.IntN(256), rng.IntN(256), rng.Uint64(), rng.Uint64(), agents[rng.IntN(len(agents))])
		recs[i] = wal.Record{Time: at.Add(time.Duration(i) * time.Microsecond).UnixNano(), Tag: fmt.Sprintf("app.%d", i%partitions), Body: body}
	}
	return recs
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkBuildObject: JSON lines and gzip level 1 of 250-byte records,
// one object at a time on one core (and zstd level 1 for comparison).
// MB/s counts the lines before compression (the input).
func BenchmarkBuildObject(b *testing.B) {
	for _, c := range []struct {
		codec string
		size  int
	}{{config.CompressionGzip, 4 << 20}, {config.CompressionGzip, 64 << 20}, {config.CompressionZstd, 64 << 20}} {
		size := c.size
		b.Run(fmt.Sprintf("%s-1/%dMiB", c.codec, size>>20), func(b *testing.B) {
			e, err := newEncoder(encoding{Compression: c.codec, Level: 1, TimeKey: "@timestamp"})
			if err != nil {
				b.Fatal(err)
			}
			all := sinkRecs(logRecords(size/300+1000, 1)...)
			n, lines := 0, 0
			for n < len(all) && lines+e.size(&all[n]) <= size {
				lines += e.size(&all[n])
				n++
			}
			recs := all[:n]
			b.SetBytes(int64(lines))
			b.ReportAllocs()
			var stored int
			b.ResetTimer()
			for range b.N {
				obj, err := e.build(recs)
				if err != nil {
					b.Fatal(err)
				}
				stored = len(obj.body)
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "records/s")
			b.ReportMetric(float64(lines)/float64(stored), "ratio")
		})
	}
}

// BenchmarkGzipAlone: the compressor alone (klauspost gzip level 1) on the
// lines of 4 MiB of the same records, built beforehand and written in one
// call into a reused buffer: the floor under BuildObject and DrainToS3.
// MB/s counts the lines.
func BenchmarkGzipAlone(b *testing.B) {
	e, err := newEncoder(encoding{Compression: config.CompressionGzip, Level: 1, TimeKey: "@timestamp"})
	if err != nil {
		b.Fatal(err)
	}
	recs := sinkRecs(logRecords(4<<20/300+1000, 1)...)
	var lines []byte
	var ts timestamps
	for i := 0; i < len(recs) && len(lines)+e.size(&recs[i]) <= 4<<20; i++ {
		lines = e.liner.appendLine(lines, &recs[i], &ts)
		lines = append(lines, '\n')
	}
	gw, err := gzip.NewWriterLevel(io.Discard, 1)
	if err != nil {
		b.Fatal(err)
	}
	var out bytes.Buffer
	b.SetBytes(int64(len(lines)))
	b.ReportAllocs()
	for b.Loop() {
		out.Reset()
		gw.Reset(&out)
		if _, err := gw.Write(lines); err != nil {
			b.Fatal(err)
		}
		if err := gw.Close(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(lines))/float64(out.Len()), "ratio")
}

// BenchmarkDrainToS3 drains records already in a WAL through the real
// drainer and sink into an emulator: reading and decoding the WAL,
// partitioning, sizing, building, compressing and uploading. The emulator
// runs in a child process (see emuProcess), so that its work is not
// counted here.
//
// MB/s and records/s count record bodies over the wall-clock time from the
// drainer's start until its cursor passed the last record. MB/cpu-s divides
// the same bytes by the CPU time (user + system, getrusage RUSAGE_SELF)
// this process spent over that time: drainer, sink, SDK and Go runtime, and
// not the emulator; lines-MB/cpu-s the JSON lines written (bodies plus the
// time and tag members: the compressor's input) over the same time. objects
// is the number of objects of the last round.
func BenchmarkDrainToS3(b *testing.B) {
	const records = 200_000 // about 50 MB of bodies
	for _, partitions := range []int{1, 50} {
		b.Run(fmt.Sprintf("partitions=%d", partitions), func(b *testing.B) {
			recs, input, cfg := benchInput(records, partitions)
			cfg.MaxObjectAge = config.Duration(50 * time.Millisecond)
			b.SetBytes(int64(input))
			var cpu time.Duration
			var objects, lines int
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				emu := startEmuProcess(b)
				cfg.Endpoint = emu.URL
				w := openWAL(b, b.TempDir())
				for off := 0; off < len(recs); off += 10000 {
					appendRecs(b, w, recs[off:min(off+10000, len(recs))])
				}
				last := w.Stats().NextSeq - 1
				s, err := New(context.Background(), fmt.Sprintf("bench%d", i), cfg, Options{Hostname: "bench", AWS: &aws.Config{Credentials: testCreds}})
				if err != nil {
					b.Fatal(err)
				}
				if lines == 0 {
					for _, r := range sinkRecs(recs...) {
						lines += s.Size(&r)
					}
				}
				ctx, cancel := context.WithCancel(context.Background())
				d := queue.New(w, "archive", s, queue.Options{})
				done := make(chan error, 1)
				runtime.GC() // the WAL's filling is not the drain's garbage
				c0 := cpuTime()
				b.StartTimer()
				go func() { done <- d.Run(ctx) }()
				waitCursor(b, w, "archive", last, 5*time.Minute)
				b.StopTimer()
				cpu += cpuTime() - c0
				cancel()
				if err := <-done; err != nil {
					b.Fatal(err)
				}
				s.Close()
				w.Close()
				objects = stopCounting(b, emu, records)
				b.StartTimer()
			}
			reportDrain(b, input, records, cpu, objects)
			b.ReportMetric(float64(lines)*float64(b.N)/cpu.Seconds()/1e6, "lines-MB/cpu-s")
		})
	}
}

// BenchmarkPartition: an S3 partition per record, for a key the sink
// caches by tag and hour and for one with a record field, which it renders
// for every record.
func BenchmarkPartition(b *testing.B) {
	recs := sinkRecs(logRecords(10000, 50)...)
	for _, c := range []struct{ name, key string }{
		{"cached", "logs/${tag}/%Y/%m/%d/%H/${hostname}-${seq}.json.gz"},
		{"field", "logs/${tag}/${record.method}/%Y/%m/%d/%H/${hostname}-${seq}.json.gz"},
	} {
		key := c.key
		b.Run(c.name, func(b *testing.B) {
			s, err := New(context.Background(), "bench", testConfig("http://127.0.0.1:1"), Options{Hostname: "bench", AWS: &aws.Config{Credentials: testCreds}})
			if err != nil {
				b.Fatal(err)
			}
			if s.keys, err = newKeyRenderer(key, "bench", keyRulesSanitised); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if p := s.Partition(&recs[i%len(recs)]); len(p) == 0 {
					b.Fatal("empty partition")
				}
				i++
			}
		})
	}
}

// BenchmarkSinkSend measures the sink alone on records already in memory:
// the sink gives each a partition and a size (Partition, Size), then the
// records are grouped per partition into objects of up to max_object_bytes
// and those into batches of up to the sink's Limits.MaxBytes (the
// drainer's work, not timed, not counted) and sent one batch at a time
// through Send, each carrying the object built so far and the last one
// final: building the lines, compressing each batch, joining the members,
// checksumming, committing the intent to an in-memory state and uploading
// through the SDK to an emulator in a child process. MB/cpu-s divides record bodies by this
// process's CPU time over the two timed phases, lines-MB/cpu-s the JSON
// lines written (bodies plus the time and tag members: the compressor's
// input), as in BenchmarkDrainToS3, which adds the WAL reads and the
// drainer to this.
func BenchmarkSinkSend(b *testing.B) {
	const records = 200_000
	for _, partitions := range []int{1, 50} {
		b.Run(fmt.Sprintf("partitions=%d", partitions), func(b *testing.B) {
			walRecs, input, cfg := benchInput(records, partitions)
			recs := sinkRecs(walRecs...)
			b.SetBytes(int64(input))
			keys := make([]string, len(recs))
			sizes := make([]int, len(recs))
			var cpu time.Duration
			var objects, lines int
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				emu := startEmuProcess(b)
				cfg.Endpoint = emu.URL
				s, err := New(context.Background(), fmt.Sprintf("bench%d", i), cfg, Options{Hostname: "bench", AWS: &aws.Config{Credentials: testCreds}})
				if err != nil {
					b.Fatal(err)
				}
				st := newMemState(recs)
				lim := s.Limits()
				runtime.GC()
				c0 := cpuTime()
				b.StartTimer()
				for j := range recs {
					keys[j] = s.Partition(&recs[j])
					sizes[j] = s.Size(&recs[j])
				}
				b.StopTimer()
				cpu += cpuTime() - c0
				type open struct {
					recs []sinks.Record
					size int
				}
				parts := map[string]*open{}
				var batches []sinks.Batch
				lines = 0
				// members appends o's records as batches of an object.
				members := func(key string, o *open) {
					start, size := 0, 0
					for k := range o.recs {
						if k > start && (size+s.Size(&o.recs[k]) > lim.MaxBytes || k-start >= lim.MaxRecords) {
							batches = append(batches, sinks.Batch{Partition: key, Records: o.recs[start:k], State: st})
							start, size = k, 0
						}
						size += s.Size(&o.recs[k])
					}
					batches = append(batches, sinks.Batch{Partition: key, Records: o.recs[start:], State: st, Final: true})
				}
				for j := range recs {
					o := parts[keys[j]]
					if o == nil {
						o = &open{}
						parts[keys[j]] = o
					}
					if len(o.recs) > 0 && o.size+sizes[j] > s.maxBytes {
						members(keys[j], o)
						o.recs, o.size = nil, 0
					}
					o.recs = append(o.recs, recs[j])
					o.size += sizes[j]
					lines += sizes[j]
				}
				for key, o := range parts {
					if len(o.recs) > 0 {
						members(key, o)
					}
				}
				runtime.GC()
				c0 = cpuTime()
				b.StartTimer()
				carries := map[string]sinks.Carry{}
				for j := range batches {
					batches[j].Carry = carries[batches[j].Partition]
					out, err := s.Send(context.Background(), &batches[j])
					if err != nil {
						b.Fatal(err)
					}
					carries[batches[j].Partition] = out.Carry
					for _, k := range out.DeleteState {
						_ = st.Delete(context.Background(), k)
					}
				}
				b.StopTimer()
				cpu += cpuTime() - c0
				s.Close()
				objects = stopCounting(b, emu, records)
				b.StartTimer()
			}
			reportDrain(b, input, records, cpu, objects)
			b.ReportMetric(float64(lines)*float64(b.N)/cpu.Seconds()/1e6, "lines-MB/cpu-s")
		})
	}
}

// benchInput is what the drain benchmarks send: records of partitions tags,
// the bytes of their bodies, and a sink configuration of 4 MiB objects keyed
// by tag and hour.
func benchInput(records, partitions int) ([]wal.Record, int, config.S3) {
	recs := logRecords(records, partitions)
	input := 0
	for _, r := range recs {
		input += len(r.Body)
	}
	cfg := testConfig("")
	cfg.Key = "bench/${tag}/%Y/%m/%d/%H/${hostname}-${seq}.json.gz"
	cfg.MaxObjectBytes = 4 * config.MiB
	return recs, input, cfg
}

// stopCounting stops the emulator process and fails unless its objects hold
// exactly records lines; it returns the number of objects.
func stopCounting(b *testing.B, emu *emuProcess, records int) int {
	objects, lines := emu.stop(b)
	if lines != records {
		b.Fatalf("the objects hold %d lines, want %d", lines, records)
	}
	return objects
}

// reportDrain reports MB/cpu-s of input bytes over the CPU time spent,
// records/s over the benchmark's time, and the objects of the last round.
func reportDrain(b *testing.B, input, records int, cpu time.Duration, objects int) {
	b.ReportMetric(float64(input)*float64(b.N)/cpu.Seconds()/1e6, "MB/cpu-s")
	b.ReportMetric(float64(records)*float64(b.N)/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(float64(objects), "objects")
}

// BenchmarkObjectSizes measures how large the objects are that a sink
// finishes in a steady flow within the default memory share of an S3 sink
// (32 MiB beside one CloudWatch sink), with the default max_object_bytes
// (64 MiB) and an age that never ends one: a backlog of 1,000,000 records
// (286 MB of lines) drains until half of them are delivered; the objects
// finished by then were ended by size or by memory. MB/object is their
// mean size in lines (uncompressed).
func BenchmarkObjectSizes(b *testing.B) {
	const records = 1_000_000
	for _, partitions := range []int{1, 50} {
		b.Run(fmt.Sprintf("partitions=%d", partitions), func(b *testing.B) {
			recs, _, cfg := benchInput(records, partitions)
			cfg.MaxObjectBytes = 64 * config.MiB
			cfg.MaxObjectAge = config.Duration(time.Hour)
			var perObject float64
			for i := range b.N {
				emu := startEmuProcess(b)
				cfg.Endpoint = emu.URL
				w := openWAL(b, b.TempDir())
				for off := 0; off < len(recs); off += 10000 {
					appendRecs(b, w, recs[off:min(off+10000, len(recs))])
				}
				s, err := New(context.Background(), fmt.Sprintf("sizes%d", i), cfg, Options{Hostname: "bench", AWS: &aws.Config{Credentials: testCreds}})
				if err != nil {
					b.Fatal(err)
				}
				lines := 0
				for _, r := range sinkRecs(recs...) {
					lines += s.Size(&r)
				}
				ctx, cancel := context.WithCancel(context.Background())
				d := queue.New(w, "archive", s, queue.Options{MaxBufferedBytes: 32 << 20})
				done := make(chan error, 1)
				go func() { done <- d.Run(ctx) }()
				deadline := time.Now().Add(5 * time.Minute)
				for d.Status().Delivered < records/2 {
					if time.Now().After(deadline) {
						b.Fatalf("%d records delivered after 5 minutes", d.Status().Delivered)
					}
					time.Sleep(5 * time.Millisecond)
				}
				cancel()
				if err := <-done; err != nil {
					b.Fatal(err)
				}
				delivered := d.Status().Delivered
				s.Close()
				w.Close()
				objects, stored := emu.stop(b)
				if uint64(stored) != delivered || objects == 0 {
					b.Fatalf("%d objects of %d lines, %d records delivered", objects, stored, delivered)
				}
				perObject = float64(lines) * float64(stored) / float64(records) / float64(objects) / 1e6
			}
			b.ReportMetric(perObject, "MB/object")
		})
	}
}

// BenchmarkLines sizes and writes the JSON lines of 4 MiB of 250-byte
// records with time_key and tag_key set, without compressing them: the
// line builder alone, with the tag escaped into every line. MB/s counts
// the lines.
func BenchmarkLines(b *testing.B) {
	e, err := newEncoder(encoding{Compression: config.CompressionNone, TimeKey: "@timestamp", TagKey: "tag"})
	if err != nil {
		b.Fatal(err)
	}
	recs := sinkRecs(logRecords(4<<20/300, 50)...)
	for i := range recs {
		recs[i].Tag = fmt.Sprintf("pod.shop.web-7d9f8b6c4-%05d", i%50)
	}
	size := 0
	for i := range recs {
		size += e.size(&recs[i])
	}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	lines := make([]byte, 0, size)
	for b.Loop() {
		var ts timestamps
		lines = lines[:0]
		n := 0
		for i := range recs {
			n += e.size(&recs[i])
			lines = e.liner.appendLine(lines, &recs[i], &ts)
			lines = append(lines, '\n')
		}
		if n != len(lines) {
			b.Fatalf("sized %d bytes, wrote %d", n, len(lines))
		}
	}
	b.ReportMetric(float64(len(recs))*float64(b.N)/b.Elapsed().Seconds(), "records/s")
}

// BenchmarkSendObject sends one object of 4 MiB of lines (about 14,000
// 250-byte records of one partition) per op through Send, as the drainer
// would: batches of Limits.MaxBytes, each carrying the object built so far,
// the last final, then PutObject through the real SDK to an emulator in a
// child process (not counted). Held in memory or staged. Each op's records
// get new sequence numbers, so that every object has a key of its own.
// ns/record is the time per record of an op, cpu-ns/record the CPU time
// (user + system, getrusage RUSAGE_SELF: not the emulator's) per record.
func BenchmarkSendObject(b *testing.B) {
	for _, staged := range []bool{false, true} {
		b.Run(fmt.Sprintf("staged=%v", staged), func(b *testing.B) {
			emu := startEmuProcess(b)
			cfg := testConfig(emu.URL)
			cfg.Key = "bench/${tag}/%Y/%m/%d/%H/${hostname}-${seq}.json.gz"
			cfg.MaxObjectBytes = 4 * config.MiB
			opts := Options{Hostname: "bench", AWS: &aws.Config{Credentials: testCreds}}
			if staged {
				cfg.StagingMaxBytes = 64 * config.MiB
				opts.StagingDir = b.TempDir()
			}
			s, err := New(context.Background(), "bench", cfg, opts)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			all := sinkRecs(logRecords(4<<20/250, 1)...)
			lim := s.Limits()
			n, lines := 0, 0
			for n < len(all) && lines+s.Size(&all[n]) <= s.maxBytes {
				lines += s.Size(&all[n])
				n++
			}
			recs := all[:n]
			partition := s.Partition(&recs[0])
			var bounds []int // where each batch ends
			for k, size := 0, 0; k < len(recs); k++ {
				if size+s.Size(&recs[k]) > lim.MaxBytes {
					bounds = append(bounds, k)
					size = 0
				}
				size += s.Size(&recs[k])
			}
			bounds = append(bounds, len(recs))
			st := newMemState(nil)
			b.SetBytes(int64(lines))
			b.ReportAllocs()
			ops := 0
			c0 := cpuTime()
			for b.Loop() {
				for k := range recs {
					recs[k].Seq = uint64(ops*len(recs) + k + 1)
				}
				ops++
				var carry sinks.Carry
				start := 0
				for j, end := range bounds {
					batch := sinks.Batch{Partition: partition, Records: recs[start:end], State: st, Carry: carry, Final: j == len(bounds)-1}
					out, err := s.Send(context.Background(), &batch)
					if err != nil {
						b.Fatal(err)
					}
					carry, start = out.Carry, end
					for _, k := range out.DeleteState {
						_ = st.Delete(context.Background(), k)
					}
				}
				if carry != nil {
					b.Fatal("the final batch left a carry")
				}
			}
			cpu := cpuTime() - c0
			b.ReportMetric(float64(len(recs)), "records/op")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(ops*len(recs)), "ns/record")
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(ops*len(recs)), "cpu-ns/record")
			s.Close()
			if objects, stored := emu.stop(b); objects != ops || stored != ops*len(recs) {
				b.Fatalf("%d objects of %d lines, want %d of %d", objects, stored, ops, ops*len(recs))
			}
		})
	}
}
