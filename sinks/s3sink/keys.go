package s3sink

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/maphash"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/template"
)

const (
	// A partition is the object key rendered with these markers in place
	// of ${seq} and ${uuid}. They hold control bytes, which a rendered key
	// never keeps (see keyRenderer.partition), so they cannot be confused
	// with anything a record puts in its key.
	seqMarker  = "\x00seq\x00"
	uuidMarker = "\x00uuid\x00"
	// The same lengths, different in every byte: a second rendering with
	// them tells the markers from control bytes of a record's fields.
	altSeqMarker  = "\x01SEQ\x01"
	altUUIDMarker = "\x01UUID\x01"

	// fallback is rendered for a missing field or tag part.
	fallback = "unknown"

	// maxKeyLen is S3's limit on a key, in bytes of UTF-8.
	maxKeyLen = 1024

	// tooLong starts the partition of records whose key would be over
	// maxKeyLen (their key can only be longer than their partition): a
	// short name, so that the drainer's keys stay small, for a batch that
	// Send refuses.
	tooLong = "\x00too-long\x00"
)

// Key rules, kept in each intent so that an interrupted upload is finished
// under the key it was given: keyRulesVerbatim rendered values as they were
// ("/", "." and ".." included); keyRulesSanitised renders them so that they
// never change the key's path (see package template).
const (
	keyRulesVerbatim  = 0
	keyRulesSanitised = 1
)

// keyRenderer renders the partitions and object keys of one key template.
// Safe for concurrent use.
type keyRenderer struct {
	tmpl           *template.Template
	uuid           bool
	markerControls int // control bytes the markers put in every rendering
	cleanLiterals  bool
	// limit is the longest partition whose object keys fit S3's maxKeyLen:
	// ${seq} and ${uuid} render longer than their markers.
	limit int

	// A template without record fields, whose finest time unit is at most
	// a day, renders the same partition for every record of one tag and
	// one time bucket: those are remembered rather than rendered again.
	bucket time.Duration // > 0: partitions are cached by tag and bucket
	mu     sync.Mutex
	cache  map[partitionKey]cachedPartition
	// recent holds, by a hash of the tag, the partitions of the buckets
	// last looked up for two tags of that hash: read without the lock and
	// without dividing the time, it answers most lookups (a tag's records
	// mostly fall in the bucket of its record before) before the map is
	// asked.
	recent [recentSets][2]atomic.Pointer[recentPartition]
	seed   maphash.Seed
}

// recentSets is the number of sets of keyRenderer.recent, a power of two.
const recentSets = 2048

// recentPartition is the partition of the records of tag whose times are
// in [lo, hi): one bucket, or the part of it int64 holds.
type recentPartition struct {
	tag    string
	lo, hi int64
	cachedPartition
}

type partitionKey struct {
	tag    string
	bucket int64
}

type cachedPartition struct {
	partition string
	notes     template.Notes
}

// maxCachedPartitions bounds the cache; it starts afresh when full.
const maxCachedPartitions = 4096

// newKeyRenderer parses key for rendering with rules (keyRulesSanitised
// for every new key).
func newKeyRenderer(key, hostname string, rules int) (*keyRenderer, error) {
	t, err := template.Parse(key, template.Options{AllowSeq: true, Hostname: hostname, Unsanitised: rules == keyRulesVerbatim})
	if err != nil {
		return nil, fmt.Errorf("key %q: %w", key, err)
	}
	if !t.UsesSeq() && !t.UsesUUID() {
		return nil, fmt.Errorf("key %q must contain ${seq} or ${uuid}", key)
	}
	k := &keyRenderer{tmpl: t, uuid: t.UsesUUID()}
	probe, _ := t.Append(nil, &template.Data{SeqText: seqMarker, UUID: uuidMarker}, fallback)
	alt, _ := t.Append(nil, &template.Data{SeqText: altSeqMarker, UUID: altUUIDMarker}, fallback)
	for i := range probe {
		if probe[i] != alt[i] && isControl(probe[i]) {
			k.markerControls++
		}
	}
	k.cleanLiterals = countControls(probe) == k.markerControls
	k.limit = maxKeyLen - (len(objectKey(string(probe), 0, uuidLike)) - len(probe))
	// "${record." anywhere (even after $$) conservatively means fields.
	if !strings.Contains(key, "${record.") && t.Finest() <= 24*time.Hour {
		k.bucket = t.Finest()
		if k.bucket == 0 {
			k.bucket = math.MaxInt64 // no time in the key: one bucket
		}
		k.cache = map[partitionKey]cachedPartition{}
		k.seed = maphash.MakeSeed()
	}
	return k, nil
}

func isControl(c byte) bool { return c < 0x20 || c == 0x7f }

func countControls(b []byte) int {
	n := 0
	for _, c := range b {
		if isControl(c) {
			n++
		}
	}
	return n
}

// partition renders r's partition: its object key with markers for ${seq}
// and ${uuid}. Control characters that a field, the tag or the template
// puts in the key become "_", and values never change its path (package
// template). The notes report a fallback rendered for a missing field or
// tag part, and a value sanitised.
func (k *keyRenderer) partition(r *sinks.Record) (string, template.Notes) {
	if k.bucket == 0 {
		return k.render(r)
	}
	set := &k.recent[maphash.String(k.seed, r.Tag)&(recentSets-1)]
	for i := range set {
		if e := set[i].Load(); e != nil && e.tag == r.Tag && r.Time >= e.lo && r.Time < e.hi {
			return e.partition, e.notes
		}
	}
	size := int64(k.bucket)
	b := r.Time / size
	if r.Time < 0 && r.Time%size != 0 {
		b-- // floor, for times before 1970
	}
	pk := partitionKey{r.Tag, b}
	k.mu.Lock()
	c, ok := k.cache[pk]
	k.mu.Unlock()
	if !ok {
		c.partition, c.notes = k.render(r)
		k.mu.Lock()
		if len(k.cache) >= maxCachedPartitions {
			clear(k.cache)
		}
		k.cache[pk] = c
		k.mu.Unlock()
	}
	// The newest goes first; the other stays unless it is of the same tag
	// (another bucket of it). Concurrent lookups may lose one another's
	// entries: each entry answers only for its own tag and times.
	lo, hi := bucketSpan(b, size)
	if e := set[0].Load(); e != nil && e.tag != r.Tag {
		set[1].Store(e)
	}
	set[0].Store(&recentPartition{tag: r.Tag, lo: lo, hi: hi, cachedPartition: c})
	return c.partition, c.notes
}

// bucketSpan is the times [lo, hi) of bucket b of size times, cut to
// int64: b*size can be below math.MinInt64 (no time is), and (b+1)*size
// above math.MaxInt64 (hi is then math.MaxInt64, and a time of
// math.MaxInt64 is looked up in the map).
func bucketSpan(b, size int64) (lo, hi int64) {
	lo, hi = math.MinInt64, math.MaxInt64
	if p := b * size; p/size == b {
		lo = p
	}
	if p := (b + 1) * size; b+1 > b && p/size == b+1 {
		hi = p
	}
	return lo, hi
}

// render renders r's partition. Values that would make its object keys
// longer than S3 takes are shortened (template.AppendFoundWithin: the
// template's own text, ${hostname} and ${seq} among it, is kept whole);
// a key still too long (the template's text alone) goes to the tooLong
// partition, which Send refuses.
func (k *keyRenderer) render(r *sinks.Record) (string, template.Notes) {
	d := template.Data{Tag: r.Tag, Body: r.Body, Time: time.Unix(0, r.Time), SeqText: seqMarker, UUID: uuidMarker}
	b, notes := k.tmpl.AppendFoundWithin(make([]byte, 0, 128), &d, nil, fallback, k.limit, byteLen)
	if !k.cleanLiterals || countControls(b) != k.markerControls {
		// The markers are as long as the alternates: the values are
		// shortened alike.
		d.SeqText, d.UUID = altSeqMarker, altUUIDMarker
		alt, _ := k.tmpl.AppendFoundWithin(make([]byte, 0, len(b)), &d, nil, fallback, k.limit, byteLen)
		for i := range b {
			if b[i] == alt[i] && isControl(b[i]) {
				b[i] = '_'
				notes |= template.Sanitised
			}
		}
	}
	if len(b) > k.limit {
		sum := sha256.Sum256(b)
		return tooLong + hex.EncodeToString(sum[:]), notes
	}
	return string(b), notes
}

func byteLen(b []byte) int { return len(b) }

// objectKey is the key of the object of partition that starts at first:
// ${seq} as first in 20 zero-padded digits, ${uuid} as id.
func objectKey(partition string, first uint64, id string) string {
	key := strings.ReplaceAll(partition, seqMarker, fmt.Sprintf("%020d", first))
	if id != "" {
		key = strings.ReplaceAll(key, uuidMarker, id)
	}
	return key
}

// newUUID returns a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:36], b[10:16])
	return string(s[:])
}
