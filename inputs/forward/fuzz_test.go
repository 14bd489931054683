package forward

import (
	"encoding/json"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/tinylib/msgp/msgp"

	"github.com/logfwd/forwarder/inputs"
)

// FuzzDecode feeds arbitrary bytes to the framer and the decoder: they
// never panic, what they accept is valid JSON in valid UTF-8, and what
// they reserve from the budget is given back, accepted or not.
func FuzzDecode(f *testing.F) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 5, time.UTC)
	e := entry(eventTime(t0), record("log", "x", "n", 1.5))
	f.Add(messageMode("a", eventTime(t0), record("log", "hello"), options("c")))
	f.Add(forwardMode("a", [][]byte{e, e}, options("c", "size", 2)))
	f.Add(packedMode("a", append(e, e...), false, nil))
	f.Add(packedMode("a", gz(e, e), false, options("c", "compressed", "gzip")))
	f.Add(messageMode("a", msgp.AppendFloat64(nil, 1.25), []byte("\x82\xa1k\xc4\x02\x00\xff\x01\xc3"), nil))
	f.Add([]byte{0x93, 0xa1, 'a', 0xc1})
	f.Add([]byte{0x92, 0xa1, 'a', 0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Add(messageMode("a", eventTime(t0), []byte("\x81\xa1k\xa2\xff\xfe"), nil))
	f.Fuzz(func(t *testing.T, data []byte) {
		var fr framer
		n, err := fr.next(data)
		if err != nil || n == 0 {
			return
		}
		hold := inputs.NewBudget(64<<20, nil).Hold("forward")
		d := decoder{maxUnpacked: 1 << 20, maxRecords: 1000, now: time.Now, hold: hold}
		m, err := d.decode(data[:n])
		if err != nil {
			if _, ok := err.(*badMessage); !ok {
				t.Fatalf("decode returned %T, want *badMessage", err)
			}
			if hold.Held() != 0 {
				t.Fatalf("a refused message holds %d bytes of the budget", hold.Held())
			}
			return
		}
		defer func() {
			m.release()
			if hold.Held() != 0 {
				t.Fatalf("a released message holds %d bytes of the budget", hold.Held())
			}
		}()
		for _, r := range m.records {
			if !json.Valid(r.Body) || !utf8.Valid(r.Body) {
				t.Fatalf("record body %q is not valid JSON in UTF-8", r.Body)
			}
			if r.Body[0] != '{' {
				t.Fatalf("record body %q is not an object", r.Body)
			}
		}
	})
}
