package httpin

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/inputs"
	"github.com/logfwd/forwarder/wal"
)

// FuzzParseBody: parsing never panics; on success every record body is one
// compact JSON object in valid UTF-8, and parsing those bodies again (as
// NDJSON) gives the same records; on failure nothing is returned and the
// error is one for the client, with a reason.
func FuzzParseBody(f *testing.F) {
	f.Add([]byte(`{"time":"2024-05-01T12:00:00.5+02:00","log":"x"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		now := time.Unix(1700000000, 0)
		recs, stats, err := parseBody(data, "app", "time", now)
		if err != nil {
			if recs != nil || stats != (parseStats{}) {
				t.Fatalf("error %v with %d records returned", err, len(recs))
			}
			var bad *badRequest
			if !errors.As(err, &bad) || bad.reason == "" || bad.msg == "" {
				t.Fatalf("error %v is not a client error with a reason", err)
			}
			return
		}
		if stats.invalidUTF8 > len(recs) {
			t.Fatalf("%d records replaced, of %d", stats.invalidUTF8, len(recs))
		}
		var joined []byte
		for i, r := range recs {
			if !json.Valid(r.Body) || len(r.Body) == 0 || r.Body[0] != '{' {
				t.Fatalf("record %d: body %q is not a JSON object", i, r.Body)
			}
			if !utf8.Valid(r.Body) {
				t.Fatalf("record %d: body %q is not UTF-8", i, r.Body)
			}
			var compact bytes.Buffer
			if err := json.Compact(&compact, r.Body); err != nil || !bytes.Equal(compact.Bytes(), r.Body) {
				t.Fatalf("record %d: body %q is not compact", i, r.Body)
			}
			if r.Tag != "app" {
				t.Fatalf("record %d: tag %q", i, r.Tag)
			}
			joined = append(append(joined, r.Body...), '\n')
		}
		again, stats2, err := parseBody(joined, "app", "time", now)
		if err != nil {
			t.Fatalf("re-parse of the bodies: %v", err)
		}
		if len(again) != len(recs) {
			t.Fatalf("re-parse gives %d records, first parse %d", len(again), len(recs))
		}
		if stats2.invalidUTF8 != 0 {
			t.Fatalf("re-parse replaced UTF-8 in %d records", stats2.invalidUTF8)
		}
		for i := range recs {
			if !bytes.Equal(again[i].Body, recs[i].Body) || again[i].Time != recs[i].Time {
				t.Fatalf("record %d: re-parse gives %q at %d, first %q at %d", i, again[i].Body, again[i].Time, recs[i].Body, recs[i].Time)
			}
		}
	})
}

// FuzzScanner holds the scanner to encoding/json: it accepts exactly the
// values json.Valid accepts (but for nesting past maxDepth) and compacts
// them to the same bytes as json.Compact.
func FuzzScanner(f *testing.F) {
	for _, s := range []string{
		`{"a":[1,-2.5e+3,true,false,null,"x\u00e9\n"],"b":{}}`, ` [ 1 , 2 ] `, `"\ud800"`, `0`, `-0.0E-0`,
		`01`, `1.`, `.5`, `+1`, `"a` + "\x01" + `"`, `{"a" 1}`, `[1,]`, `{,}`, `tru`, `nul`, "\"\xff\"", `{"a":1}x`, "",
		`[nan,-inf,Infinity]`, `{"a":nanx}`, `-Infinit`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s := scanner{data: data, timeStart: -1}
		s.skipSpace()
		err := s.value(0)
		if err == nil {
			s.skipSpace()
			if s.pos != len(data) {
				err = errors.New("data after the value")
			}
		}
		if errors.Is(err, errTooDeep) {
			return
		}
		if err == nil && s.nonFiniteSeen > 0 {
			// Beyond JSON: nan, inf and the like, written as null (nonFinite).
			var want bytes.Buffer
			if err := json.Compact(&want, s.out); err != nil || !bytes.Equal(s.out, want.Bytes()) {
				t.Fatalf("%q: with %d non-finite numbers, wrote %q: not compact JSON (%v)", data, s.nonFiniteSeen, s.out, err)
			}
			return
		}
		if valid := json.Valid(data); (err == nil) != valid {
			t.Fatalf("%q: scanner says %v, json.Valid %v", data, err, valid)
		}
		if err != nil {
			return
		}
		var want bytes.Buffer
		if err := json.Compact(&want, data); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(s.out, want.Bytes()) {
			t.Fatalf("%q: compacted to %q, json.Compact %q", data, s.out, want.Bytes())
		}
	})
}

// recordingWAL is the WAL, with every record handed to Append kept for
// the fuzz target to look at.
type recordingWAL struct {
	*wal.WAL
	mu   sync.Mutex
	recs []wal.Record
}

func (r *recordingWAL) Append(ctx context.Context, recs []wal.Record, opts wal.AppendOptions) (wal.Result, error) {
	res, err := r.WAL.Append(ctx, recs, opts)
	if err == nil && !res.Duplicate {
		r.mu.Lock()
		for _, rec := range recs {
			r.recs = append(r.recs, wal.Record{Tag: rec.Tag, Body: bytes.Clone(rec.Body)})
		}
		r.mu.Unlock()
	}
	return res, err
}

func (r *recordingWAL) take() []wal.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	recs := r.recs
	r.recs = nil
	return recs
}

// shortReader gives r's bytes, then fails as a connection that broke
// before the Content-Length did.
type shortReader struct{ r io.Reader }

func (s shortReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// FuzzRequest sends arbitrary requests through the HTTP input's handler,
// with a real WAL behind it and a small memory budget and limits: the body
// as sent or gzipped (whole, or cut short), any Content-Encoding, a
// Content-Length that is right, missing, smaller or larger than the body,
// an Idempotency-Key. Whatever comes, the answer is one of the input's,
// in JSON; records are stored only with a 200, as many as it says, each a
// JSON object in valid UTF-8; and every byte reserved from the budget is
// given back once the request is answered.
func FuzzRequest(f *testing.F) {
	f.Add([]byte("{\"a\":1}\n{\"b\":\"x\"}\n"), uint8(0), "", "")
	f.Add([]byte(`[{"time":"2024-05-01T12:00:00Z","m":"\u00e9"},{}]`), uint8(1), "", "key-1")
	f.Add([]byte("{\"m\":\"a\xffb\"}"), uint8(1|2<<4), "", "")
	f.Add(bytes.Repeat([]byte("{}\n"), 60), uint8(3), "", "")
	f.Add(bytes.Repeat([]byte("\n"), 5000), uint8(1|1<<4), "gzip", "")
	f.Add([]byte(`{"a":1}`), uint8(3<<4), "br", "")
	w, err := wal.Open(f.TempDir(), wal.Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { w.Close() })
	app := &recordingWAL{WAL: w}
	budget := inputs.NewBudget(256<<10, nil) // one request: at most 224 KiB
	s := New(config.HTTP{Listen: "127.0.0.1:0", MaxBodyBytes: 64 << 10, TimeField: "time", MaxRecordsPerRequest: 50},
		&inputs.Pipeline{WAL: app, Budget: budget}, nil)
	s.memoryWait = 10 * time.Millisecond
	h := s.routes()
	f.Fuzz(func(t *testing.T, body []byte, ctl uint8, encoding, key string) {
		payload := body
		if ctl&1 != 0 {
			var z bytes.Buffer
			zw := gzip.NewWriter(&z)
			zw.Write(body)
			zw.Close()
			payload = z.Bytes()
			if ctl&2 != 0 && len(payload) > 4 {
				payload = payload[:len(payload)-4] // cut short
			}
		}
		var r io.Reader = bytes.NewReader(payload)
		length := int64(len(payload))
		switch ctl >> 4 & 3 {
		case 1:
			length = -1 // chunked: no length
		case 2:
			length = int64(len(payload) / 2) // a length shorter than the body: the body ends there
			r = io.LimitReader(r, length)
		case 3:
			length = int64(len(payload))*2 + 1 // longer: the body breaks off
			r = shortReader{r}
		}
		req := httptest.NewRequest(http.MethodPost, "/v1/logs/app", r)
		req.ContentLength = length
		if ctl&1 != 0 {
			req.Header.Set("Content-Encoding", "gzip")
		}
		if encoding != "" {
			req.Header.Set("Content-Encoding", encoding)
		}
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		stored := app.take()

		if used := budget.Used(); used != 0 {
			t.Fatalf("answered %d, and %d bytes of the budget are still held", rec.Code, used)
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" || !json.Valid(rec.Body.Bytes()) {
			t.Fatalf("answered %d with %q: %q", rec.Code, ct, rec.Body.Bytes())
		}
		switch rec.Code {
		case 200:
		case 400, 413, 415, 422, 503:
			if len(stored) > 0 {
				t.Fatalf("answered %d %s, and %d records stored", rec.Code, rec.Body.Bytes(), len(stored))
			}
			return
		default:
			t.Fatalf("answered %d %s", rec.Code, rec.Body.Bytes())
		}
		var answer struct{ Stored int }
		if err := json.Unmarshal(rec.Body.Bytes(), &answer); err != nil {
			t.Fatal(err)
		}
		if rec.Header().Get("X-Duplicate") != "true" && answer.Stored != len(stored) || answer.Stored > 50 {
			t.Fatalf("answered %s, %d records stored", rec.Body.Bytes(), len(stored))
		}
		for i, r := range stored {
			if r.Tag != "app" || len(r.Body) == 0 || r.Body[0] != '{' || !json.Valid(r.Body) || !utf8.Valid(r.Body) {
				t.Fatalf("record %d: %q %q is not a JSON object in UTF-8", i, r.Tag, r.Body)
			}
		}
	})
}
