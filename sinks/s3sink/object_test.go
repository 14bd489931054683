package s3sink

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"io"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/internal/racedetect"
	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// manyRecs are n records of about size bytes each, varied enough to
// compress like logs.
func manyRecs(n, size int) []sinks.Record {
	recs := make([]wal.Record, n)
	at := time.Date(2025, 6, 15, 15, 0, 0, 0, time.UTC)
	for i := range recs {
		msg := fmt.Sprintf("GET /api/v1/items/%d?page=%d user=%d status=%d", i*7919%100000, i%13, i*31%977, 200+i%5)
		recs[i] = rec(fmt.Sprintf("app.%d", i%3), fmt.Sprintf("r%d", i), at.Add(time.Duration(i)*time.Millisecond), max(0, size-len(msg)-40))
		recs[i].Body = bytes.Replace(recs[i].Body, []byte(`"msg":"`), []byte(`"msg":"`+msg+` `), 1)
	}
	return sinkRecs(recs...)
}

func TestObjectRoundTrips(t *testing.T) {
	racedetect.Heavy(t)
	recs := manyRecs(5000, 250)
	for _, enc := range []encoding{
		{Compression: config.CompressionGzip, Level: 1, TimeKey: "@timestamp"},
		{Compression: config.CompressionGzip, Level: 9, TimeKey: "@timestamp", TagKey: "tag"},
		{Compression: config.CompressionGzip, Level: 1, TimeKey: "@timestamp", OneStream: true},
		{Compression: config.CompressionGzip, Level: 9, TimeKey: "@timestamp", OneStream: true},
		{Compression: config.CompressionZstd, Level: 1, TimeKey: "@timestamp"},
		{Compression: config.CompressionZstd, Level: 4},
		{Compression: config.CompressionNone, TimeKey: "t"},
	} {
		t.Run(fmt.Sprintf("%s-%d-%v", enc.Compression, enc.Level, enc.OneStream), func(t *testing.T) {
			e, err := newEncoder(enc)
			if err != nil {
				t.Fatal(err)
			}
			obj, err := e.build(recs)
			if err != nil {
				t.Fatal(err)
			}
			var want bytes.Buffer
			size := 0
			for i := range recs {
				want.Write(e.liner.appendLine(nil, &recs[i], new(timestamps)))
				want.WriteByte('\n')
				size += e.size(&recs[i])
			}
			got := decompress(t, e.contentEncoding(), obj.body)
			if !bytes.Equal(got, want.Bytes()) {
				t.Fatalf("object decompresses to %d bytes, want %d", len(got), want.Len())
			}
			if obj.lines != int64(want.Len()) || size != want.Len() || obj.linesCRC32 != crc32.Checksum(want.Bytes(), castagnoli) {
				t.Errorf("lines %d, sizes %d, crc %08x; want %d bytes", obj.lines, size, obj.linesCRC32, want.Len())
			}
			t.Logf("%d records, %d bytes of lines, %d stored (%.1fx)", len(recs), obj.lines, len(obj.body), float64(obj.lines)/float64(len(obj.body)))

			// The bytes are a function of the records: again, at once from
			// several goroutines, with pooled compressors reused.
			var wg sync.WaitGroup
			for range 4 {
				wg.Go(func() {
					again, err := e.build(recs)
					if err != nil || again.sha256 != obj.sha256 || !bytes.Equal(again.body, obj.body) {
						t.Errorf("a second build differs (%v)", err)
					}
				})
			}
			wg.Wait()
			// A fresh encoder too.
			e2, _ := newEncoder(enc)
			if again, _ := e2.build(recs); !bytes.Equal(again.body, obj.body) {
				t.Error("a fresh encoder builds other bytes")
			}
		})
	}
}

func TestGzipHeaderIsFixed(t *testing.T) {
	e, _ := newEncoder(encoding{Compression: config.CompressionGzip, Level: 1})
	obj, err := e.build(manyRecs(10, 100))
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(obj.body))
	if err != nil {
		t.Fatal(err)
	}
	if !zr.ModTime.IsZero() || zr.Name != "" || zr.Comment != "" || zr.Extra != nil || zr.OS != 255 {
		t.Errorf("gzip header %+v, want no name, no time, OS 255", zr.Header)
	}
	// The member's header bytes: magic, deflate, no flags, MTIME 0, XFL, OS.
	if h := obj.body[:10]; !bytes.Equal(h[:8], []byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0}) || h[9] != 255 {
		t.Errorf("header bytes % x", h)
	}
}

func TestEmptyBodiesAndOddRecords(t *testing.T) {
	e, _ := newEncoder(encoding{Compression: config.CompressionNone, TimeKey: "@timestamp"})
	recs := []sinks.Record{{Seq: 1, Body: []byte(`{}`)}, {Seq: 2, Body: []byte(`"just a string"`)}, {Seq: 3, Body: []byte(strings.Repeat("y", chunkSize+10))}}
	obj, err := e.build(recs)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(obj.body), "\n"), "\n")
	if len(lines) != 3 || lines[0] != `{"@timestamp":"1970-01-01T00:00:00.000000000Z"}` || lines[1] != `"just a string"` || len(lines[2]) != chunkSize+10 {
		t.Errorf("lines %.80q", lines)
	}
}

// TestScratchOutlivesCollections: a member compressed after another was
// released is compressed into that one's buffer, even after garbage
// collections (near the memory limit they come every few members).
func TestScratchOutlivesCollections(t *testing.T) {
	e, err := newEncoder(encoding{Compression: config.CompressionGzip, Level: 1, TimeKey: "@timestamp"})
	if err != nil {
		t.Fatal(err)
	}
	recs := manyRecs(5000, 200)
	m, err := e.compressScratch(recs, chain{})
	if err != nil {
		t.Fatal(err)
	}
	first := m.scratch
	m.release()
	runtime.GC()
	runtime.GC()
	runtime.GC()
	m, err = e.compressScratch(recs, chain{})
	if err != nil {
		t.Fatal(err)
	}
	if m.scratch != first {
		t.Fatal("a member after three collections was compressed into a new buffer")
	}
	m.release()
}

// A gzip object built of several pieces is one gzip stream (one header,
// the pieces, one trailer): a reader that stops after the first gzip member
// (Java's GZIPInputStream over a network stream, Python's zlib) reads it
// whole. An intent made before (OneStream false) rebuilds its object as
// it was: gzip members one after the other.
func TestGzipObjectIsOneStream(t *testing.T) {
	recs := manyRecs(3000, 200)
	one, err := newEncoder(encoding{Compression: config.CompressionGzip, Level: 1, OneStream: true})
	if err != nil {
		t.Fatal(err)
	}
	members, err := newEncoder(encoding{Compression: config.CompressionGzip, Level: 1})
	if err != nil {
		t.Fatal(err)
	}
	whole := func(e *encoder, counts []int) (firstMemberLines, allLines int, o *object) {
		o, err := e.buildSplit(recs, counts)
		if err != nil {
			t.Fatal(err)
		}
		zr, err := gzip.NewReader(bytes.NewReader(o.body))
		if err != nil {
			t.Fatal(err)
		}
		zr.Multistream(false)
		first, err := io.ReadAll(zr)
		if err != nil {
			t.Fatal(err)
		}
		all := decompress(t, "gzip", o.body)
		return bytes.Count(first, []byte("\n")), bytes.Count(all, []byte("\n")), o
	}
	for _, counts := range [][]int{nil, {1000, 2000}, {1000, 1000, 1000}} {
		first, all, o := whole(one, counts)
		if first != len(recs) || all != len(recs) {
			t.Errorf("one stream of %v: the first member holds %d lines, the object %d; want %d", counts, first, all, len(recs))
		}
		if pieces, err := gzipPieces(o.body); err != nil || pieces != max(len(counts), 1) {
			t.Errorf("one stream of %v: %d pieces (%v)", counts, pieces, err)
		}
		if o.size != int64(len(o.body)) || o.lines == 0 {
			t.Errorf("one stream of %v: size %d of %d bytes, %d bytes of lines", counts, o.size, len(o.body), o.lines)
		}
	}
	first, all, old := whole(members, []int{1000, 2000})
	if first != 1000 || all != len(recs) {
		t.Errorf("members: the first holds %d lines, the object %d; want 1000 and %d", first, all, len(recs))
	}
	_, _, now := whole(one, []int{1000, 2000})
	if old.sha256 == now.sha256 || old.lines != now.lines || old.linesCRC32 != now.linesCRC32 {
		t.Errorf("the two formats: same bytes %v, lines %d and %d", old.sha256 == now.sha256, old.lines, now.lines)
	}
}
