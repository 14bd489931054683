package s3sink

import (
	"bytes"
	"strings"
	"time"

	"github.com/logfwd/forwarder/internal/jsonscan"
	"github.com/logfwd/forwarder/internal/jsonstr"
	"github.com/logfwd/forwarder/sinks"
)

// timestampLen is the length of a timestamp as written: RFC 3339 in UTC with
// nine fractional digits, "2006-01-02T15:04:05.000000000Z". Every time a
// record can carry (int64 nanoseconds: years 1677 to 2262) has four year
// digits, so the length is fixed.
const timestampLen = 30

// liner turns records into JSON lines: the body, with the event time added
// under timeKey and the tag under tagKey when the body has no member of
// that name. The added members come first, right after the body's opening
// brace, in that order; the body's bytes follow unchanged (no re-encoding).
// The tag is escaped by internal/jsonstr, whose rule for invalid UTF-8 (each
// byte as \ufffd) is the one this sink always wrote: forward records stored
// before the inputs refused such tags can have it, and Recover rebuilds the
// lines of an intent byte for byte (internal/jsonstr's doc says more).
type liner struct {
	timePrefix, tagPrefix []byte // `"key":"`, nil when the key is off
	timeKey, tagKey       *memberFinder
}

func newLiner(timeKey, tagKey string) *liner {
	l := &liner{}
	if timeKey != "" {
		l.timeKey = newMemberFinder(timeKey)
		l.timePrefix = append(append(bytes.Clone(l.timeKey.quoted), ':'), '"')
	}
	if tagKey != "" {
		l.tagKey = newMemberFinder(tagKey)
		l.tagPrefix = append(append(bytes.Clone(l.tagKey.quoted), ':'), '"')
	}
	return l
}

// additions reports which members r's line adds, and whether the body
// has members of its own after the opening brace.
func (l *liner) additions(body []byte) (addTime, addTag, rest bool) {
	if len(body) < 2 || body[0] != '{' {
		return false, false, false // not an object: written as it is
	}
	addTime = l.timeKey != nil && !l.timeKey.in(body)
	addTag = l.tagKey != nil && !l.tagKey.in(body)
	i := jsonscan.SkipSpace(body, 1)
	rest = i < len(body) && body[i] != '}'
	return addTime, addTag, rest
}

// lineLen is the length of r's line, without its newline.
func (l *liner) lineLen(r *sinks.Record) int {
	addTime, addTag, rest := l.additions(r.Body)
	n, added := len(r.Body), 0
	if addTime {
		n += len(l.timePrefix) + timestampLen + 1
		added++
	}
	if addTag {
		n += len(l.tagPrefix) + jsonstr.ContentLen(r.Tag) + 1
		added++
	}
	if added > 0 {
		n += added - 1 // commas between the added members
		if rest {
			n++ // and the one before the body's own
		}
	}
	return n
}

// appendLine appends r's line, without its newline. ts formats the time:
// one per goroutine, kept from line to line.
func (l *liner) appendLine(dst []byte, r *sinks.Record, ts *timestamps) []byte {
	addTime, addTag, rest := l.additions(r.Body)
	if !addTime && !addTag {
		return append(dst, r.Body...)
	}
	dst = append(dst, '{')
	if addTime {
		dst = append(dst, l.timePrefix...)
		dst = ts.append(dst, r.Time)
		dst = append(dst, '"')
	}
	if addTag {
		if addTime {
			dst = append(dst, ',')
		}
		dst = append(dst, l.tagPrefix...)
		dst, _ = jsonstr.AppendContent(dst, r.Tag)
		dst = append(dst, '"')
	}
	if rest {
		dst = append(dst, ',')
	}
	return append(dst, r.Body[1:]...)
}

// appendTimestamp appends ns as "2006-01-02T15:04:05.000000000Z".
func appendTimestamp(dst []byte, ns int64) []byte {
	t := time.Unix(0, ns).UTC()
	year, month, day := t.Date()
	hour, minute, sec := t.Clock()
	var b [timestampLen]byte
	put := func(i, v, width int) {
		for j := i + width - 1; j >= i; j-- {
			b[j] = byte('0' + v%10)
			v /= 10
		}
	}
	put(0, year, 4)
	b[4] = '-'
	put(5, int(month), 2)
	b[7] = '-'
	put(8, day, 2)
	b[10] = 'T'
	put(11, hour, 2)
	b[13] = ':'
	put(14, minute, 2)
	b[16] = ':'
	put(17, sec, 2)
	b[19] = '.'
	put(20, t.Nanosecond(), 9)
	b[29] = 'Z'
	return append(dst, b[:]...)
}

// timestamps appends timestamps as appendTimestamp does, remembering the
// date and time of the last second it formatted: the records of an object
// mostly share theirs with the one before, and then only the nine
// fractional digits are new. The zero value is ready to use.
type timestamps struct {
	sec  int64
	head [20]byte // "2006-01-02T15:04:05." of sec
	ok   bool
}

func (c *timestamps) append(dst []byte, ns int64) []byte {
	sec, frac := ns/1e9, ns%1e9
	if frac < 0 {
		sec, frac = sec-1, frac+1e9
	}
	if !c.ok || sec != c.sec {
		var b [timestampLen]byte
		appendTimestamp(b[:0], ns)
		copy(c.head[:], b[:])
		c.sec, c.ok = sec, true
	}
	// The nine digits two at a time, in unsigned 32-bit arithmetic: this
	// runs for every line.
	n := len(dst)
	dst = append(append(dst, c.head[:]...), "000000000Z"...)
	b := dst[n+20 : n+timestampLen]
	f := uint32(frac)
	b[8] = byte('0' + f%10)
	f /= 10
	for i := 6; i >= 0; i -= 2 {
		q := f / 100
		d := (f - q*100) * 2
		b[i], b[i+1] = digitPairs[d], digitPairs[d+1]
		f = q
	}
	return dst
}

// digitPairs holds "00" to "99".
const digitPairs = "0001020304050607080910111213141516171819" +
	"2021222324252627282930313233343536373839" +
	"4041424344454647484950515253545556575859" +
	"6061626364656667686970717273747576777879" +
	"8081828384858687888990919293949596979899"

// memberFinder tells whether a JSON object has a top-level member of a
// given name. Sizing and writing a line ask it for every record, so it
// first tries to rule the member out with fast byte searches.
type memberFinder struct {
	key    string
	quoted []byte // `"key"`
	// plain: the key has no byte that JSON could write with a short escape
	// (", \, /, control characters), so it can only appear in a body as
	// quoted, or with \u escapes.
	plain   bool
	rare    byte // the byte of quoted least likely in JSON text
	rareOff int  // its offset in quoted
}

func newMemberFinder(key string) *memberFinder {
	quoted, _ := jsonstr.Append(nil, key)
	f := &memberFinder{key: key, quoted: quoted, plain: true}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c == '"' || c == '\\' || c == '/' {
			f.plain = false
		}
	}
	best := -1
	for i := 1; i < len(f.quoted)-1; i++ {
		if sc := byteScore(f.quoted[i]); best < 0 || sc < best {
			best, f.rare, f.rareOff = sc, f.quoted[i], i
		}
	}
	return f
}

// letterFrequency orders lower-case letters from the most to the least
// frequent in English (and so in JSON keys and log text).
const letterFrequency = "etaoinshrdlcumwfgypbvkjxqz"

// byteScore guesses how common c is in JSON text: lower is rarer.
func byteScore(c byte) int {
	switch {
	case c >= 'a' && c <= 'z':
		return 10 + len(letterFrequency) - strings.IndexByte(letterFrequency, c)
	case c >= '0' && c <= '9':
		return 20
	case c >= 'A' && c <= 'Z':
		return 8
	case c == '_' || c == '-' || c == '.':
		return 6
	case c == ' ' || c == ':' || c == ',':
		return 50
	}
	return 1
}

// in reports whether body has the member.
func (f *memberFinder) in(body []byte) bool {
	if f.plain && !f.mayContain(body) && !hasUnicodeEscape(body) {
		return false
	}
	return scanMember(body, f.key)
}

// mayContain reports whether `"key"` occurs anywhere in body.
func (f *memberFinder) mayContain(body []byte) bool {
	for i := 0; i < len(body); {
		j := bytes.IndexByte(body[i:], f.rare)
		if j < 0 {
			return false
		}
		if p := i + j - f.rareOff; p >= 0 && p+len(f.quoted) <= len(body) && bytes.Equal(body[p:p+len(f.quoted)], f.quoted) {
			return true
		}
		i += j + 1
	}
	return false
}

// hasUnicodeEscape reports whether a JSON text holds a \u escape.
func hasUnicodeEscape(b []byte) bool {
	for i := 0; i < len(b); {
		j := bytes.IndexByte(b[i:], '\\')
		if j < 0 {
			return false
		}
		i += j + 1
		if i < len(b) && b[i] == 'u' {
			return true
		}
		i++ // the escaped byte, which may be another backslash
	}
	return false
}

// scanMember reports whether the object body has key at its top level.
func scanMember(b []byte, key string) bool {
	_, ok := jsonscan.Member(b, key)
	return ok
}
