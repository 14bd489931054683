package cloudwatch

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/emulator/cloudwatchlogs"
	"github.com/logfwd/forwarder/queue"
	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// benchRecords are n container-log records of about 250 bytes spread over
// streams pods, event times a microsecond apart.
func benchRecords(n, streams int, at time.Time) []wal.Record {
	recs := make([]wal.Record, n)
	for i := range recs {
		pod := fmt.Sprintf("catalog-%d", i%streams)
		body := fmt.Appendf(nil, `{"log":"2026-11-30T09:13:54.930819Z INFO POST /api/v1/items/%d status=200 latency_ms=%d request_id=%016x","stream":"stdout","kubernetes":{"namespace_name":"shop","pod_name":%q},"id":"b-%d"}`,
			i*7919%100000, i%300, uint64(i)*0x9e3779b97f4a7c15, pod, i)
		recs[i] = wal.Record{Time: at.Add(time.Duration(i) * time.Microsecond).UnixNano(), Tag: "pod.shop", Body: body}
	}
	return recs
}

// benchDrain drains the WAL into a fresh emulator with a fresh cursor and
// sink, until the cursor passes last. It returns the PutLogEvents calls made
// and the sends' total duration.
func benchDrain(b *testing.B, w *wal.WAL, name string, last uint64, feed func()) (calls int, sends time.Duration) {
	b.Helper()
	emu := cloudwatchlogs.New(cloudwatchlogs.Options{})
	url, err := emu.Start("127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer emu.Close()
	cfg := baseCfg(url)
	cfg.FlushInterval = config.Duration(200 * time.Millisecond)
	cfg.MaxConcurrentStreams = 64
	sink, err := New(context.Background(), name, cfg, Options{Hostname: "bench", AWS: staticAWS(), Registerer: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	d := queue.New(w, name, sink, queue.Options{Fingerprint: sink.Fingerprint(), Metrics: queue.NewMetrics(reg)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	b.StartTimer()
	go func() { done <- d.Run(ctx) }()
	if feed != nil {
		feed()
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		if pos, _ := w.Cursor(name); pos >= last {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("cursor of %s not at %d after 5 minutes: %+v", name, last, d.Status())
		}
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "forwarder_sink_send_duration_seconds" {
			for _, m := range mf.GetMetric() {
				sends += time.Duration(m.GetHistogram().GetSampleSum() * float64(time.Second))
			}
		}
	}
	return emu.Calls("PutLogEvents"), sends
}

// reportCalls reports PutLogEvents calls per round and the mean time of a
// send (one batch: its commits and calls).
func reportCalls(b *testing.B, calls int, sends time.Duration) {
	b.ReportMetric(float64(calls)/float64(b.N), "calls/op")
	if calls > 0 {
		b.ReportMetric(float64(sends.Microseconds())/1000/float64(calls), "ms/call")
	}
}

// BenchmarkDrainToEmulator drains 200,000 records of about 250 bytes from
// the WAL through the drainer and the sink into the CloudWatch Logs
// emulator (in this process: its CPU counts too), to 1 and 10 streams.
func BenchmarkDrainToEmulator(b *testing.B) {
	const n = 200000
	for _, streams := range []int{1, 10} {
		b.Run(fmt.Sprintf("streams=%d", streams), func(b *testing.B) {
			w, err := wal.Open(b.TempDir(), wal.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer w.Close()
			if _, err := w.RegisterCursor(context.Background(), "pin"); err != nil {
				b.Fatal(err) // keeps every record for every round
			}
			recs := benchRecords(n, streams, time.Now())
			for i := 0; i < n; i += 1000 {
				if _, err := w.Append(context.Background(), recs[i:i+1000], wal.AppendOptions{}); err != nil {
					b.Fatal(err)
				}
			}
			last := w.Stats().NextSeq - 1
			b.SetBytes(int64(n * len(recs[0].Body)))
			b.StopTimer()
			b.ResetTimer()
			calls, sends := 0, time.Duration(0)
			for i := 0; i < b.N; i++ {
				c, s := benchDrain(b, w, fmt.Sprint("round", i), last, nil)
				calls, sends = calls+c, sends+s
			}
			b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "records/s")
			reportCalls(b, calls, sends)
		})
	}
}

// BenchmarkIngestAndDrain appends 100,000 records in appends of 100 from 4
// goroutines while the sink drains them to 10 streams, and ends when the
// last is delivered: a PutLogEvents that waits for a commit first shows
// here as a longer drain.
func BenchmarkIngestAndDrain(b *testing.B) {
	const n, per, writers, streams = 100000, 100, 4, 10
	b.StopTimer()
	calls, sends := 0, time.Duration(0)
	for i := 0; i < b.N; i++ {
		w, err := wal.Open(b.TempDir(), wal.Options{})
		if err != nil {
			b.Fatal(err)
		}
		recs := benchRecords(n, streams, time.Now())
		feed := func() {
			var wg sync.WaitGroup
			for g := range writers {
				wg.Go(func() {
					for j := g * per; j < n; j += writers * per {
						if _, err := w.Append(context.Background(), recs[j:j+per], wal.AppendOptions{}); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
		}
		c, s := benchDrain(b, w, "cw", n, feed)
		calls, sends = calls+c, sends+s
		w.Close()
	}
	b.SetBytes(int64(n * len(benchRecords(1, 1, time.Now())[0].Body)))
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "records/s")
	reportCalls(b, calls, sends)
}

// BenchmarkRecoverStreams times the resolution at start of 64 calls in
// doubt, one per stream, 100 events each, that landed (the emulator
// answers reads after 50 ms, as a distant service would): from the
// drainer's start to its leaving the recovering state, with settle passed
// already, at read_rate 10 (the default) and 100.
func BenchmarkRecoverStreams(b *testing.B) {
	const streams, events = 64, 100
	for _, rate := range []int{10, 100} {
		b.Run(fmt.Sprintf("streams=%d/read_rate=%d", streams, rate), func(b *testing.B) {
			b.StopTimer()
			for range b.N {
				e := newEnv(b, nil)
				p := newProxy(b, e.url, nil)
				cfg := streamCfg(p.url)
				cfg.LogStream = "${tag}"
				cfg.MaxConcurrentStreams = streams
				cfg.ReadRate = rate
				e.restart(cfg)
				var tags []string
				for i := range streams {
					tags = append(tags, fmt.Sprint("s", i))
				}
				e.prime(tags...)
				p.setRule(landPuts)
				now := time.Now()
				var recs []wal.Record
				for i := range streams * events {
					recs = append(recs, wal.Record{Time: now.Add(time.Duration(i/streams) * time.Millisecond).UnixNano(), Tag: tags[i%streams],
						Body: fmt.Appendf(nil, `{"log":"line %d of the call in doubt"}`, i)})
				}
				e.append(recs...)
				e.runUntilHung(p, streams)
				e.emu.SetLatency(50 * time.Millisecond)
				e.restart(cfg)
				d := queue.New(e.w, "cw", e.sink, queue.Options{Metrics: e.qm, Fingerprint: e.sink.Fingerprint()})
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				b.StartTimer()
				go func() { done <- d.Run(ctx) }()
				for d.Status().State != "running" {
					time.Sleep(time.Millisecond)
				}
				b.StopTimer()
				cancel()
				if err := <-done; err != nil {
					b.Fatal(err)
				}
				if n := e.indoubt(resultDelivered); n != streams {
					b.Fatalf("%v calls found delivered, want %d", n, streams)
				}
			}
			b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/resolution")
		})
	}
}

// BenchmarkPartition renders the log group and stream of a record (the
// default templates: two fields of the body and the host name) per op.
func BenchmarkPartition(b *testing.B) {
	s, err := New(context.Background(), "cw", baseCfg("http://127.0.0.1:1"), Options{Hostname: "bench", AWS: staticAWS(), Registerer: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	recs := benchRecords(1000, 10, time.Now())
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		r := &recs[i%len(recs)]
		s.Partition(&sinks.Record{Seq: uint64(i), Time: r.Time, Tag: r.Tag, Body: r.Body})
	}
}

// BenchmarkRequest builds the events of one full call (10,000 records of
// about 250 bytes, or the 1 MiB limit) and its request body, per op: what
// Send does per call before the SDK signs and sends it.
func BenchmarkRequest(b *testing.B) {
	s, err := New(context.Background(), "cw", baseCfg("http://127.0.0.1:1"), Options{Hostname: "bench", AWS: staticAWS(), Registerer: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	wrecs := benchRecords(4000, 1, now)
	recs := make([]sinks.Record, len(wrecs))
	for i, r := range wrecs {
		recs[i] = sinks.Record{Seq: uint64(i + 1), Time: r.Time, Tag: r.Tag, Body: r.Body}
	}
	b.ReportAllocs()
	var body []byte
	for b.Loop() {
		evs, _ := s.events(recs, now, nil)
		for _, c := range calls(evs) {
			body = appendPutBody(body[:0], "/eks/shop", "catalog-0-bench", "", c)
		}
		releaseEvents(evs) // as Send does
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(recs)), "ns/record")
}

// BenchmarkPut makes one PutLogEvents call of 4,000 records of about 250
// bytes per op through the SDK (body, signing, HTTP) to a local server that
// reads the request and answers at once: Send's cost per call but the
// intent's commit. The server's CPU counts too.
func BenchmarkPut(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		io.WriteString(w, `{}`)
	}))
	defer srv.Close()
	s, err := New(context.Background(), "cw", baseCfg(srv.URL), Options{Hostname: "bench", AWS: staticAWS(), Registerer: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	wrecs := benchRecords(4000, 1, now)
	recs := make([]sinks.Record, len(wrecs))
	for i, r := range wrecs {
		recs[i] = sinks.Record{Seq: uint64(i + 1), Time: r.Time, Tag: r.Tag, Body: r.Body}
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		evs, _ := s.events(recs, now, nil)
		for _, c := range calls(evs) {
			tok, _ := s.tokens.get("/eks/shop\x00catalog-0-bench")
			body := newPutBody("/eks/shop", "catalog-0-bench", tok, c)
			_ = newIntent("/eks/shop\x00catalog-0-bench", 1, c, body, 0)
			if _, err := s.put(ctx, "/eks/shop", "catalog-0-bench", c, body); err != nil {
				b.Fatal(err)
			}
		}
		releaseEvents(evs) // as Send does
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(recs)), "ns/record")
}
