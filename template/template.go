// Package template renders the names and keys of sinks from records:
// CloudWatch log group and stream names, S3 object keys.
//
//	${tag}                 the record's tag
//	${tag[N]}              part N (0-based) of the tag split on "."
//	${record.a.b}          field a.b of the record (a string as is, anything else as its JSON)
//	${record.a.b|default}  the same, or default when the field is missing or empty
//	${hostname}            this machine's host name
//	${seq}                 (S3 keys) the object's first sequence number, 20 digits
//	${uuid}                (S3 keys) a random UUID: gives up exactly-once keys
//	%Y %m %d %H %M %S      the record's event time, UTC
//	$$                     a literal $  (and %% a literal %)
//
// A missing field without a default, or a tag part that does not exist,
// renders the caller's fallback and is reported (Missing), so that it can
// be counted.
//
// A value a record puts in a key or a name never changes its path: a "/"
// inside a tag, a field, a default or the fallback renders as "_", and a
// path segment ("/"-separated) that a value leaves empty, "." or ".."
// renders with "_" in place of each missing part or dot (logs/${tag}/x with
// the tag ".." renders logs/__/x). Either is reported (Sanitised), so that
// it can be counted. The template's own text is rendered as written.
//
// A caller bound to a length (CloudWatch's 512 bytes, S3's 1,024) renders
// with AppendFoundWithin: values too long are shortened, with a hash of
// each, rather than the template's own text cut (reported Shortened).
package template

import (
	"bytes"
	"fmt"
	"hash/fnv"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Options say what a template may use.
type Options struct {
	AllowSeq bool   // ${seq} and ${uuid} (S3 keys)
	Hostname string // what ${hostname} renders
	// Unsanitised renders values as they are, "/", "." and ".." included,
	// as renderings did before values were sanitised. Only for rendering
	// again a key that was rendered then (an S3 upload interrupted across
	// an upgrade); never for a new key or name.
	Unsanitised bool
}

// Notes say what a rendering did besides substituting values.
type Notes uint8

const (
	// Missing: a field or tag part was missing, and the fallback was
	// rendered in its place.
	Missing Notes = 1 << iota
	// Sanitised: a value held a "/", or left a path segment empty, "." or
	// "..", and was rendered with "_" instead (see the package comment).
	Sanitised
	// Shortened: a value was longer than AppendFoundWithin's bound and was
	// rendered shortened (see AppendFoundWithin).
	Shortened
)

// Data is what a template renders from.
type Data struct {
	Tag  string
	Body []byte // the record's JSON object
	Time time.Time
	Seq  uint64
	// SeqText, when set, is rendered for ${seq} instead of Seq; UUID is
	// rendered for ${uuid}.
	SeqText string
	UUID    string
}

type kind int

const (
	literal kind = iota
	tagAll
	tagPart
	field
	seq
	uuid
	timeFmt
)

type part struct {
	kind  kind
	text  string   // literal text; the default of a field
	hasDf bool     // field has a |default
	path  []string // field path
	n     int      // tag part index
	verb  byte     // strftime verb
}

// Template is a parsed template, safe for concurrent use.
type Template struct {
	src         string
	parts       []part
	finest      time.Duration
	seq         bool
	uuid        bool
	hostname    bool
	static      bool
	unsanitised bool
}

// Parse parses s. Errors name the position and what is wrong.
func Parse(s string, opts Options) (*Template, error) {
	t := &Template{src: s, static: true, unsanitised: opts.Unsanitised}
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			t.parts = append(t.parts, part{kind: literal, text: lit.String()})
			lit.Reset()
		}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '$' && i+1 < len(s) && s[i+1] == '$':
			lit.WriteByte('$')
			i++
		case c == '$' && i+1 < len(s) && s[i+1] == '{':
			end := strings.IndexByte(s[i:], '}')
			if end < 0 {
				return nil, fmt.Errorf("unclosed ${ at column %d", i+1)
			}
			expr := s[i+2 : i+end]
			if strings.Contains(expr, "${") {
				return nil, fmt.Errorf("unclosed ${ at column %d", i+1)
			}
			if t := strings.TrimSpace(expr); t != expr && t != "" {
				// ${record.pod_name } would look for a field named with
				// the space, and always render the fallback.
				return nil, fmt.Errorf("${%s} at column %d: white space inside the braces: write ${%s}", expr, i+1, t)
			}
			p, err := parseExpr(expr, opts)
			if err != nil {
				return nil, fmt.Errorf("${%s} at column %d: %w", expr, i+1, err)
			}
			flush()
			t.parts = append(t.parts, p)
			switch p.kind {
			case seq:
				t.seq = true
			case uuid:
				t.uuid = true
			}
			if p.kind == field || p.kind == seq || p.kind == uuid || p.kind == tagAll || p.kind == tagPart {
				t.static = false
			}
			if p.kind == literal { // ${hostname}
				t.hostname = true
				lit.WriteString(p.text)
				t.parts = t.parts[:len(t.parts)-1]
			}
			i += end
		case c == '$':
			return nil, fmt.Errorf("a lone $ at column %d: write $$ for a literal $", i+1)
		case c == '%' && i+1 == len(s):
			return nil, fmt.Errorf("a lone %% at column %d: write %%%% for a literal %%", i+1)
		case c == '%' && i+1 < len(s):
			v := s[i+1]
			unit, ok := strftimeUnits[v]
			if v == '%' {
				lit.WriteByte('%')
				i++
				continue
			}
			if !ok {
				return nil, fmt.Errorf("%%%c at column %d: only %%Y %%m %%d %%H %%M %%S are supported", v, i+1)
			}
			flush()
			t.parts = append(t.parts, part{kind: timeFmt, verb: v})
			if t.finest == 0 || unit < t.finest {
				t.finest = unit
			}
			t.static = false
			i++
		case c == '{' && i+1 < len(s) && s[i+1] == '{' && (i == 0 || s[i-1] != '$') && strings.Contains(s[i+2:], "}}"):
			// {{ .Tag }}, {{ kubernetes.pod_name }}: another tool's
			// placeholders, which as text would name everything the same.
			inner := strings.TrimSpace(s[i+2 : i+2+strings.Index(s[i+2:], "}}")])
			return nil, fmt.Errorf("{{%s}} at column %d: placeholders are written ${...}%s", s[i+2:i+2+strings.Index(s[i+2:], "}}")], i+1, suggestPlaceholder(inner))
		case c == '{' && (i == 0 || s[i-1] != '$') && missingDollar(s[i+1:]) != "": // $${tag} is the text ${tag}
			// {tag} meant ${tag}: taken as text, it would name every
			// object or stream the same.
			name := missingDollar(s[i+1:])
			return nil, fmt.Errorf("{%s at column %d: a placeholder is written ${%s", name, i+1, name)
		default:
			lit.WriteByte(c)
		}
	}
	flush()
	return t, nil
}

// suggestPlaceholder names the placeholder another tool's expr (the inside
// of {{ }}) likely meant, as ": such as ${...}", or says what they are.
func suggestPlaceholder(expr string) string {
	e := strings.TrimPrefix(strings.TrimPrefix(expr, "."), "record.")
	switch {
	case strings.EqualFold(e, "tag"):
		return ": ${tag}"
	case strings.EqualFold(e, "hostname") || strings.EqualFold(e, "host"):
		return ": ${hostname}"
	case e != "" && strings.IndexFunc(e, func(r rune) bool { return r == ' ' || r == '(' || r == '|' || r == '"' }) < 0:
		return ": for a field of the record, ${record." + e + "}"
	}
	return " (${tag}, ${tag[N]}, ${record.FIELD}, ${hostname}, ${seq}, ${uuid})"
}

// missingDollar returns the placeholder s begins with (up to and with its
// closing brace), as after a { that has no $ before it, or "".
func missingDollar(s string) string {
	end := strings.IndexByte(s, '}')
	if end < 0 {
		return ""
	}
	expr := s[:end]
	switch {
	case expr == "tag", expr == "hostname", expr == "seq", expr == "uuid",
		strings.HasPrefix(expr, "tag[") && strings.HasSuffix(expr, "]"),
		strings.HasPrefix(expr, "record.") && len(expr) > len("record."):
		return s[:end+1]
	}
	return ""
}

var strftimeUnits = map[byte]time.Duration{
	'Y': 365 * 24 * time.Hour, 'm': 28 * 24 * time.Hour, 'd': 24 * time.Hour,
	'H': time.Hour, 'M': time.Minute, 'S': time.Second,
}

func parseExpr(expr string, opts Options) (part, error) {
	switch {
	case expr == "tag":
		return part{kind: tagAll}, nil
	case strings.HasPrefix(expr, "tag[") && strings.HasSuffix(expr, "]"):
		n, err := strconv.Atoi(expr[4 : len(expr)-1])
		if err != nil || n < 0 {
			return part{}, fmt.Errorf("tag part must be a number from 0")
		}
		return part{kind: tagPart, n: n}, nil
	case expr == "hostname":
		return part{kind: literal, text: opts.Hostname}, nil
	case expr == "seq" || expr == "uuid":
		if !opts.AllowSeq {
			return part{}, fmt.Errorf("only S3 keys may use ${%s}", expr)
		}
		if expr == "seq" {
			return part{kind: seq}, nil
		}
		return part{kind: uuid}, nil
	case strings.HasPrefix(expr, "record."):
		p := part{kind: field}
		path := expr[len("record."):]
		if i := strings.IndexByte(path, '|'); i >= 0 {
			p.text, p.hasDf, path = path[i+1:], true, path[:i]
		}
		p.path = strings.Split(path, ".")
		for _, k := range p.path {
			if k == "" {
				return part{}, fmt.Errorf("empty field name in %q", path)
			}
		}
		return p, nil
	case strings.HasPrefix(expr, "env."):
		return part{}, fmt.Errorf("${env.NAME} is expanded when the configuration is loaded; here it is not set")
	}
	if envName.MatchString(expr) {
		return part{}, fmt.Errorf("unknown placeholder: for the environment variable %s write ${env.%s}; placeholders are tag, tag[N], record.FIELD, hostname, seq, uuid", expr, expr)
	}
	if name, ok := strings.CutPrefix(expr, "env:"); ok && envName.MatchString(name) {
		// Vector's and Fluent Bit's way to write it.
		return part{}, fmt.Errorf("unknown placeholder: for the environment variable %s write ${env.%s}; placeholders are tag, tag[N], record.FIELD, hostname, seq, uuid", name, name)
	}
	return part{}, fmt.Errorf("unknown placeholder: use tag, tag[N], record.FIELD, hostname, seq, uuid")
}

// envName is what an environment variable's name looks like: what
// ${NAME} most likely meant as ${env.NAME}.
var envName = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*$`)

// String is the template's source.
func (t *Template) String() string { return t.src }

// Literal is the template's own text, without its placeholders and time
// verbs: what it renders whatever the record.
func (t *Template) Literal() string {
	var b strings.Builder
	for _, p := range t.parts {
		if p.kind == literal {
			b.WriteString(p.text)
		}
	}
	return b.String()
}

// Values is how many values t renders: the tag, tag parts and fields
// (each may be shortened by AppendFoundWithin, to MinValueBound at least).
func (t *Template) Values() int {
	n := 0
	for _, p := range t.parts {
		if p.kind == tagAll || p.kind == tagPart || p.kind == field {
			n++
		}
	}
	return n
}

// MayFallBack reports whether a rendering of t may hold the caller's
// fallback: t has a field without a default, or a tag part.
func (t *Template) MayFallBack() bool {
	for _, p := range t.parts {
		if p.kind == field && !p.hasDf || p.kind == tagPart {
			return true
		}
	}
	return false
}

// UsesSeq, UsesUUID and UsesHostname report whether the template has
// ${seq}, ${uuid} or ${hostname} ($${hostname} is a literal).
func (t *Template) UsesSeq() bool      { return t.seq }
func (t *Template) UsesUUID() bool     { return t.uuid }
func (t *Template) UsesHostname() bool { return t.hostname }

// Static reports whether every record renders the same text.
func (t *Template) Static() bool { return t.static }

// Finest is the smallest strftime unit the template uses (time.Hour for
// %H), or 0 when it uses none: a time bucket closes after it.
func (t *Template) Finest() time.Duration { return t.finest }

// Render renders d. Its notes say whether a fallback was rendered for a
// missing field or tag part, and whether a value was sanitised.
func (t *Template) Render(d *Data, fallback string) (string, Notes) {
	b, notes := t.Append(make([]byte, 0, len(t.src)+32), d, fallback)
	return string(b), notes
}

// span is where a substituted value was rendered: dst[start:end].
type span struct{ start, end int }

// Append renders d to dst.
func (t *Template) Append(dst []byte, d *Data, fallback string) ([]byte, Notes) {
	return t.AppendFound(dst, d, nil, fallback)
}

// AppendFound is Append taking the values of the fields that a Finder of t
// found in d.Body from fs (nil: none).
func (t *Template) AppendFound(dst []byte, d *Data, fs *Fields, fallback string) ([]byte, Notes) {
	return t.appendFound(dst, d, fs, fallback, 0)
}

// MinValueBound is the least a value is shortened to: its first 7 bytes,
// "~" and 8 hex digits.
const MinValueBound = 16

// AppendFoundWithin renders as AppendFound, and when the rendering (as
// measure makes of it: the caller's own rules may change its length) is
// longer than limit, renders it again with its longest values shortened,
// so that the template's own text (a ${hostname}, a ${seq}) is kept
// whole. A value over its bound keeps its first bytes (not cutting a
// UTF-8 sequence), then "~" and the 8 hex digits of the FNV-1a hash (32
// bits) of the whole value: values that differ in the part cut off still
// render differently, and a record renders the same name in every run.
// The bound is the largest that fits, at least MinValueBound bytes; with
// that the rendering may still be over limit (the caller refuses it).
// Shortened is noted when a value was.
func (t *Template) AppendFoundWithin(dst []byte, d *Data, fs *Fields, fallback string, limit int, measure func([]byte) int) ([]byte, Notes) {
	base := len(dst)
	dst, notes := t.appendFound(dst, d, fs, fallback, 0)
	n := measure(dst[base:])
	if n <= limit || t.static {
		return dst, notes
	}
	// The largest bound that fits, by halving: a value longer than the
	// whole rendering is never shortened to more than that.
	lo, hi := MinValueBound, n
	best := -1
	for lo <= hi {
		mid := (lo + hi) / 2
		dst, _ = t.appendFound(dst[:base], d, fs, fallback, mid)
		if measure(dst[base:]) <= limit {
			best, lo = mid, mid+1
		} else {
			hi = mid - 1
		}
	}
	if best < 0 {
		best = MinValueBound
	}
	return t.appendFound(dst[:base], d, fs, fallback, best)
}

// appendFound is AppendFound with values over bound bytes shortened (0:
// none is); see AppendFoundWithin.
func (t *Template) appendFound(dst []byte, d *Data, fs *Fields, fallback string, bound int) ([]byte, Notes) {
	var notes Notes
	base := len(dst)
	// Values that are empty or all dots: with the text around them they may
	// make a segment "", "." or "..", which is looked at once rendered.
	var oddBuf [4]span
	odd := oddBuf[:0]
	var clock dateClock // the event time's fields, worked out at the first % verb
	for i := range t.parts {
		p := &t.parts[i]
		start := len(dst)
		switch p.kind {
		case literal:
			dst = append(dst, p.text...)
			continue
		case tagAll:
			dst = append(dst, d.Tag...)
		case tagPart:
			if s, ok := tagN(d.Tag, p.n); ok {
				dst = append(dst, s...)
			} else {
				dst, notes = append(dst, fallback...), notes|Missing
			}
		case field:
			v, ok, found := fs.get(p.path)
			if !found {
				v, ok = lookupScalar(d.Body, p.path)
			}
			switch {
			case ok && len(v) > 0:
				dst = append(dst, v...)
			case p.hasDf:
				dst = append(dst, p.text...)
			default:
				dst, notes = append(dst, fallback...), notes|Missing
			}
		case seq:
			if d.SeqText != "" {
				dst = append(dst, d.SeqText...)
			} else {
				dst = appendSeq(dst, d.Seq)
			}
			continue
		case uuid:
			dst = append(dst, d.UUID...)
			continue
		case timeFmt:
			if !clock.ok {
				clock = newDateClock(d.Time)
			}
			dst = clock.append(dst, p.verb)
			continue
		}
		// A value: the tag, a tag part, a field, a default, the fallback.
		if t.unsanitised {
			continue
		}
		if bound > 0 && len(dst)-start > bound {
			dst, notes = shorten(dst, start, bound), notes|Shortened
		}
		v := dst[start:]
		if bytes.IndexByte(v, '/') >= 0 {
			for j, c := range v {
				if c == '/' {
					v[j] = '_'
				}
			}
			notes |= Sanitised
		}
		if len(bytes.Trim(v, ".")) == 0 {
			odd = append(odd, span{start, len(dst)})
		}
	}
	if len(odd) > 0 {
		var fixed bool
		if dst, fixed = fixSegments(dst, base, odd); fixed {
			notes |= Sanitised
		}
	}
	return dst, notes
}

// shorten cuts the value dst[start:] to bound bytes: its first bytes, not
// cutting a UTF-8 sequence, "~" and the hex FNV-1a hash of the whole value.
func shorten(dst []byte, start, bound int) []byte {
	h := fnv.New32a()
	h.Write(dst[start:])
	sum := h.Sum32()
	keep := start + bound - 9
	for keep > start && !utf8.RuneStart(dst[keep]) {
		keep--
	}
	dst = append(dst[:keep], '~')
	const digits = "0123456789abcdef"
	for i := 28; i >= 0; i -= 4 {
		dst = append(dst, digits[sum>>uint(i)&0xf])
	}
	return dst
}

// fixSegments renders "_" for each dot, or one "_" for nothing, in each
// segment of dst[base:] that holds a value of odd and is "", "." or "..".
// A value holds no "/" by now, so it lies within one segment.
func fixSegments(dst []byte, base int, odd []span) ([]byte, bool) {
	rendered := dst[base:]
	touched := make([]int, 0, len(odd)) // segment numbers, from 0
	for _, v := range odd {
		touched = append(touched, bytes.Count(rendered[:v.start-base], []byte("/")))
	}
	out := make([]byte, base, len(dst)+len(odd))
	copy(out, dst[:base])
	fixed := false
	for i, seg := range bytes.Split(rendered, []byte("/")) {
		if i > 0 {
			out = append(out, '/')
		}
		if slices.Contains(touched, i) {
			switch string(seg) {
			case "", ".":
				out, fixed = append(out, '_'), true
				continue
			case "..":
				out, fixed = append(out, "__"...), true
				continue
			}
		}
		out = append(out, seg...)
	}
	return out, fixed
}

func tagN(tag string, n int) (string, bool) {
	for i := 0; ; i++ {
		j := strings.IndexByte(tag, '.')
		if i == n {
			if j >= 0 {
				tag = tag[:j]
			}
			return tag, tag != ""
		}
		if j < 0 {
			return "", false
		}
		tag = tag[j+1:]
	}
}

// appendSeq appends seq as 20 zero-padded digits, so keys sort by it.
func appendSeq(dst []byte, seq uint64) []byte {
	var b [20]byte
	for i := len(b) - 1; i >= 0; i-- {
		b[i] = byte('0' + seq%10)
		seq /= 10
	}
	return append(dst, b[:]...)
}

// dateClock is a time's UTC date and clock, worked out once for all the
// strftime verbs of a rendering.
type dateClock struct {
	year, month, day, hour, minute, second int
	ok                                     bool
}

func newDateClock(t time.Time) dateClock {
	t = t.UTC()
	y, m, d := t.Date()
	h, mi, s := t.Clock()
	return dateClock{y, int(m), d, h, mi, s, true}
}

func (c *dateClock) append(dst []byte, verb byte) []byte {
	two := func(n int) []byte { return append(dst, byte('0'+n/10), byte('0'+n%10)) }
	switch verb {
	case 'Y':
		return strconv.AppendInt(dst, int64(c.year), 10)
	case 'm':
		return two(c.month)
	case 'd':
		return two(c.day)
	case 'H':
		return two(c.hour)
	case 'M':
		return two(c.minute)
	case 'S':
		return two(c.second)
	}
	return dst
}
