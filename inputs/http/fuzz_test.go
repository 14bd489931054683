package httpin

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
	"time"
	"unicode/utf8"
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
