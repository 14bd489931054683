package config

import (
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/logfwd/forwarder/template"
)

var sinkName = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// retentionDays are the values CloudWatch Logs accepts for a log group's retention.
var retentionDays = []int{1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653}

func validateSinks(top section, sinks []Sink) {
	first := map[string]int{} // name -> line of the first sink with it
	for i := range sinks {
		sink := &sinks[i]
		path := fmt.Sprintf("sinks[%d]", i)
		sink.validate(section{top.c, sinkScope(path, sink.Name, sink.Type)})
		if sink.Name == "" {
			continue
		}
		if line, ok := first[sink.Name]; ok {
			top.c.at(path+".name", "duplicate sink name %q (first at line %d)", sink.Name, line)
			continue
		}
		first[sink.Name] = sink.Line
	}
}

func (sink *Sink) validate(s section) {
	switch {
	case sink.Name == "":
		s.required("name", sink.Name)
	case !sinkName.MatchString(sink.Name):
		s.invalid("name", "%q may hold only letters, digits, _ and -", sink.Name)
	}
	if sink.Type == "" {
		s.at("type", "%stype is required (%s or %s)", s.label, SinkS3, SinkCloudWatch)
	} else {
		s.oneOf("type", sink.Type, SinkS3, SinkCloudWatch)
	}
	if len(sink.Match) == 0 {
		s.invalid("match", "needs at least one tag glob")
	}
	for _, glob := range sink.Match {
		if msg := checkGlob(glob); msg != "" {
			s.invalid("match", "%s", msg)
		}
	}
	switch {
	case sink.Type == SinkS3 && sink.S3 != nil:
		sink.S3.validate(s)
	case sink.Type == SinkCloudWatch && sink.CloudWatch != nil:
		sink.CloudWatch.validate(s)
	case sink.Type == SinkS3 || sink.Type == SinkCloudWatch:
		s.invalid("type", "is %s, but the sink has no %s settings", sink.Type, sink.Type)
	}
}

// checkGlob describes what is wrong with a tag glob, or returns "".
func checkGlob(glob string) string {
	if glob == "" {
		return "a tag glob must not be empty"
	}
	if strings.ContainsAny(glob, "{}, \t") {
		// Fluentd's {a,b} and space-separated patterns: here they would
		// match no tag, as text.
		return fmt.Sprintf("tag glob %q: braces, commas and spaces are not glob syntax here (Fluentd's {a,b} or \"a b\"); give each glob as an item of a match list", glob)
	}
	for part := range strings.SplitSeq(glob, ".") {
		switch {
		case part == "":
			return fmt.Sprintf("tag glob %q has an empty part", glob)
		case part != "**" && strings.Contains(part, "**"):
			return fmt.Sprintf("tag glob %q: ** must be a whole part", glob)
		}
	}
	return ""
}

// BucketNameProblem says what breaks Amazon S3's rules for new general purpose bucket
// names in name (3 to 63 characters, checked by Validate), or "". Not an error of its own:
// buckets made in us-east-1 before the rules, and other services, may have such names.
func BucketNameProblem(name string) string {
	for _, r := range name {
		if !('a' <= r && r <= 'z' || '0' <= r && r <= '9' || r == '.' || r == '-') {
			return fmt.Sprintf("has %q: only lowercase letters, digits, dots and hyphens are allowed", r)
		}
	}
	alnum := func(b byte) bool { return 'a' <= b && b <= 'z' || '0' <= b && b <= '9' }
	switch {
	case !alnum(name[0]) || !alnum(name[len(name)-1]):
		return "must begin and end with a letter or a digit"
	case strings.Contains(name, ".."):
		return "must not have two dots in a row"
	case net.ParseIP(name) != nil:
		return "must not be an IP address"
	case strings.HasPrefix(name, "xn--") || strings.HasPrefix(name, "sthree-"):
		return "must not begin with xn-- or sthree-"
	case strings.HasSuffix(name, "--ol-s3"):
		return "must not end with --ol-s3 (an Object Lambda access point's alias, which takes no uploads)"
	}
	return ""
}

// awsRegion is the form of an AWS region's name: lowercase words and a
// number (us-east-1, us-gov-west-1, eusc-de-east-1), with the SDK's fips-
// and -fips forms, or a global pseudo-region (aws-global).
var awsRegion = regexp.MustCompile(`^(fips-)?[a-z]+(-[a-z]+)+-[0-9]+(-fips)?$|^aws(-[a-z]+)*-global$`)

// availabilityZone is an availability zone's name: a region and a letter.
var availabilityZone = regexp.MustCompile(`^([a-z]+(-[a-z]+)+-[0-9]+)[a-z]$`)

// RegionProblem says why region is not an AWS region's name, or "". The SDK
// would take such a name and build an endpoint host that does not resolve,
// so the sink would retry, unreachable, for ever. With an endpoint of its
// own (an S3-compatible service, an emulator), in the sink or in the AWS
// environment or shared config, a sink's region may be any name: the
// service checks it where it resolves the sink's AWS configuration.
func RegionProblem(region string) string {
	if awsRegion.MatchString(region) {
		return ""
	}
	if m := availabilityZone.FindStringSubmatch(region); m != nil {
		return fmt.Sprintf("%q is an availability zone: its region is %s", region, m[1])
	}
	return fmt.Sprintf("%q is not an AWS region's name (such as us-east-1 or eu-west-3)", region)
}

// knownRegions are the AWS regions this build knows the names of (those
// of the AWS SDK's endpoint partitions when it was built).
var knownRegions = []string{
	"af-south-1", "ap-east-1", "ap-east-2", "ap-northeast-1", "ap-northeast-2", "ap-northeast-3",
	"ap-south-1", "ap-south-2", "ap-southeast-1", "ap-southeast-2", "ap-southeast-3", "ap-southeast-4",
	"ap-southeast-5", "ap-southeast-6", "ap-southeast-7", "ca-central-1", "ca-west-1", "cn-north-1",
	"cn-northwest-1", "eu-central-1", "eu-central-2", "eu-isoe-west-1", "eu-north-1", "eu-south-1",
	"eu-south-2", "eu-west-1", "eu-west-2", "eu-west-3", "eusc-de-east-1", "il-central-1", "me-central-1",
	"me-south-1", "me-west-1", "mx-central-1", "sa-east-1", "sa-west-1", "us-east-1", "us-east-2",
	"us-gov-east-1", "us-gov-west-1", "us-iso-east-1", "us-iso-west-1", "us-isob-east-1", "us-isob-west-1",
	"us-isof-east-1", "us-isof-south-1", "us-west-1", "us-west-2",
}

// UnknownRegion says, for a region of AWS's form (RegionProblem is "") that
// this build does not know, that it may be misspelt, and the known one it
// is nearest to; "" for a known region. Not an error: AWS adds regions
// after a build.
func UnknownRegion(region string) string {
	r := strings.TrimSuffix(strings.TrimPrefix(region, "fips-"), "-fips")
	if slices.Contains(knownRegions, r) || strings.HasSuffix(r, "-global") {
		return ""
	}
	return fmt.Sprintf("%q is not a region this build knows%s: a misspelt one builds an endpoint that does not resolve, and the sink retries, unreachable, for ever (a region newer than this build works)",
		region, didYouMean(r, knownRegions))
}

func (s3 *S3) validate(s section) {
	switch n := len(s3.Bucket); {
	case n == 0:
		s.required("bucket", s3.Bucket)
	case strings.HasPrefix(strings.ToLower(s3.Bucket), "s3://"):
		s.invalid("bucket", "%q is a URL: give the bucket's name, without s3:// (prefixes go in key)", s3.Bucket)
	case strings.HasPrefix(s3.Bucket, "arn:"):
		s.invalid("bucket", "%q is an ARN: give the bucket's name (what follows arn:aws:s3:::)", s3.Bucket)
	case n < 3 || n > 63:
		s.invalid("bucket", "%q must be 3 to 63 characters long", s3.Bucket)
	case strings.Contains(s3.Bucket, "/"):
		s.invalid("bucket", "%q must not contain /: put prefixes in key", s3.Bucket)
	case strings.IndexFunc(s3.Bucket, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		// No S3 service takes one (an environment variable read with its
		// line's end, say): the sink would pause at its first upload.
		s.invalid("bucket", "%q must not contain white space or control characters", s3.Bucket)
	}
	if t, err := template.Parse(s3.Key, template.Options{AllowSeq: true, Hostname: hostname()}); err != nil {
		s.invalid("key", "%q: %v", s3.Key, err)
	} else if !t.UsesSeq() && !t.UsesUUID() {
		s.invalid("key", "%q must contain ${seq} or ${uuid}", s3.Key)
	} else if msg := keyText(s3.Key, t); msg != "" {
		s.invalid("key", "%q: %s", s3.Key, msg)
	}
	s.endpoint("endpoint", s3.Endpoint)
	s.oneOf("acl", s3.ACL, cannedACLs...)
	s.oneOf("compression", s3.Compression, CompressionGzip, CompressionZstd, CompressionNone)
	switch s3.Compression {
	case CompressionGzip:
		s.between("compression_level", s3.CompressionLevel, 1, 9)
	case CompressionZstd:
		s.between("compression_level", s3.CompressionLevel, 1, 4)
	}
	atLeast(s, "max_object_bytes", s3.MaxObjectBytes, 1)
	s.positive("max_object_age", s3.MaxObjectAge)
	atLeast(s, "max_open_objects", s3.MaxOpenObjects, 1)
	s.between("max_partitions", s3.MaxPartitions, 1, MaxPartitionsLimit)
	atLeast(s, "multipart_threshold", s3.MultipartThreshold, 5*MiB)
	if s3.MultipartThreshold > MaxPutObject {
		// An object below the threshold goes out in one PutObject.
		s.invalid("multipart_threshold", "must be at most %v (the largest object one PutObject takes), not %v", MaxPutObject, s3.MultipartThreshold)
	}
	if s3.TagKey != "" && s3.TagKey == s3.TimeKey {
		// Each line would hold the name twice; readers keep the last (the
		// tag: the time lost), and some refuse the line.
		s.invalid("tag_key", "%q is time_key too: give each its own name", s3.TagKey)
	}
	s.oneOf("sse", s3.SSE, "", SSEAES256, SSEKMS)
	if s3.KMSKeyID != "" && s3.SSE != SSEKMS {
		s.invalid("kms_key_id", "needs sse: %s", SSEKMS)
	}
}

// MaxPutObject is the largest object S3 takes in one PutObject.
const MaxPutObject = 5 * GiB

// cannedACLs are the values S3 takes for an object's canned ACL ("": none).
var cannedACLs = []string{"", "private", "public-read", "public-read-write", "authenticated-read",
	"aws-exec-read", "bucket-owner-read", "bucket-owner-full-control"}

// keyText describes what is wrong with an S3 key template's own text, or returns "": a
// leading /, an empty or . or .. segment (values of placeholders are cleaned of these when
// rendered, the template's text is not), or more than S3's 1,024 bytes with its values at
// the least they are shortened to (the template's text is not shortened).
func keyText(key string, t *template.Template) string {
	switch {
	case strings.HasPrefix(key, "/"):
		return "must not begin with /: S3 would keep an empty first segment"
	case leastLen(t) > 1024:
		return fmt.Sprintf("renders at least %d bytes (%s); S3 keys are at most 1024", leastLen(t), leastWhat(t))
	}
	for seg := range strings.SplitSeq(key, "/") {
		switch seg {
		case "":
			return "has an empty segment (//)"
		case ".", "..":
			return fmt.Sprintf("has a %q segment, which tools reading the bucket as paths resolve away", seg)
		}
	}
	return ""
}

// hostname stands for what ${hostname} renders when lengths are checked: a name as long
// as a host's or pod's may be (63 bytes), so that a file passes or fails alike on every
// machine, the one it is checked on and the one it runs on.
func hostname() string { return strings.Repeat("h", 63) }

// leastLen is the fewest bytes t renders: its text, ${seq} as 20 digits, ${uuid} as 36,
// the date and time, the host name, and each value at the least a value too long for
// the name or key is shortened to (template.MinValueBound).
func leastLen(t *template.Template) int {
	least, _ := t.Render(&template.Data{Body: []byte("{}"), Time: time.Unix(0, 0), SeqText: strings.Repeat("0", 20), UUID: strings.Repeat("0", 36)}, "")
	return len(least) + template.MinValueBound*t.Values()
}

// leastWhat says what leastLen counts in t.
func leastWhat(t *template.Template) string {
	parts := []string{"its text"}
	if t.UsesSeq() {
		parts = append(parts, "${seq} as 20 digits")
	}
	if t.UsesUUID() {
		parts = append(parts, "${uuid} as 36")
	}
	if t.Finest() > 0 {
		parts = append(parts, "the date and time")
	}
	if t.UsesHostname() {
		parts = append(parts, "the host name at 63 bytes")
	}
	switch n := t.Values(); n {
	case 0:
	case 1:
		parts = append(parts, fmt.Sprintf("its value at the %d bytes a long one is shortened to", template.MinValueBound))
	default:
		parts = append(parts, fmt.Sprintf("each of its %d values at the %d bytes a long one is shortened to", n, template.MinValueBound))
	}
	return strings.Join(parts, ", ")
}

// nameText describes what in a log group's or stream's own text CloudWatch does not take
// (the sink would rewrite it, out of the operator's sight), or returns "". Values of
// placeholders are sanitised when rendered; the template's text is the operator's. t is
// the template (nil: lit is a name, the fallback).
func nameText(key, src, lit string, t *template.Template) string {
	var bad []string
	for _, r := range lit {
		ok := r != ':' && r != '*' && r >= ' ' && r != 0x7f
		if key == "log_group" {
			ok = r == '.' || r == '-' || r == '_' || r == '/' || r == '#' ||
				'A' <= r && r <= 'Z' || 'a' <= r && r <= 'z' || '0' <= r && r <= '9'
		}
		if q := strconv.QuoteRune(r); !ok && !slices.Contains(bad, q) {
			bad = append(bad, q)
		}
	}
	switch {
	case len(bad) > 0 && key == "log_group":
		return fmt.Sprintf("has %s, which log group names cannot hold (letters, digits and . - _ / #)", strings.Join(bad, ", "))
	case len(bad) > 0:
		return fmt.Sprintf("has %s, which log stream names cannot hold (no : or *)", strings.Join(bad, ", "))
	case key == "log_group" && strings.HasPrefix(src, "aws/"):
		return "begins with aws/, which AWS keeps for its own log groups"
	case t == nil && len(lit) > maxNameBytes:
		return fmt.Sprintf("has %d bytes, over the %d a name may hold", len(lit), maxNameBytes)
	case t != nil && leastLen(t) > maxNameBytes:
		return fmt.Sprintf("renders at least %d bytes (%s), over the %d a name may hold: names would be cut there, and what the template renders after the cut (${hostname}) lost", leastLen(t), leastWhat(t), maxNameBytes)
	}
	return ""
}

// maxNameBytes is the longest log group or stream name CloudWatch Logs takes.
const maxNameBytes = 512

func (cw *CloudWatch) validate(s section) {
	s.endpoint("endpoint", cw.Endpoint)
	s.required("log_group", cw.LogGroup)
	s.required("log_stream", cw.LogStream)
	fallsBack := map[string]bool{} // the names whose template may render the fallback
	for key, v := range map[string]string{"log_group": cw.LogGroup, "log_stream": cw.LogStream} {
		t, err := template.Parse(v, template.Options{Hostname: hostname()})
		switch {
		case v != "" && err != nil:
			s.invalid(key, "%q: %v", v, err)
		case err == nil:
			if msg := nameText(key, v, t.Literal(), t); msg != "" {
				s.invalid(key, "%q: %s", v, msg)
			}
			fallsBack[key] = t.MayFallBack()
		}
	}
	if s.required("fallback", cw.Fallback); cw.Fallback != "" {
		// It stands in a name for a missing value: it must be one.
		for _, key := range []string{"log_group", "log_stream"} {
			if msg := nameText(key, "", cw.Fallback, nil); msg != "" && fallsBack[key] {
				s.invalid("fallback", "%q stands in a %s for a missing value, and %s", cw.Fallback, strings.ReplaceAll(key, "_", " ")+" name", msg)
				break
			}
		}
	}
	if cw.RetentionDays != 0 && !slices.Contains(retentionDays, cw.RetentionDays) {
		s.invalid("retention_days", "%d is not 0 (don't set) or one of %s", cw.RetentionDays, joinInts(retentionDays))
	}
	s.oneOf("log_group_class", cw.LogGroupClass, LogGroupClassStandard, LogGroupClassInfrequentAccess)
	s.positive("flush_interval", cw.FlushInterval)
	s.between("max_concurrent_streams", cw.MaxConcurrentStreams, 1, 10000)
	if cw.Settle > Duration(time.Hour) {
		s.invalid("settle", "must be at most 1h, not %s (every start with calls in doubt waits that long)", cw.Settle)
	}
	s.between("read_rate", cw.ReadRate, 1, 1000)
	s.between("max_partitions", cw.MaxPartitions, 1, MaxPartitionsLimit)
	s.between("create_rate", cw.CreateRate, 1, 1000)
	s.between("group_create_rate", cw.GroupCreateRate, 1, 1000)
}

// MaxPartitionsLimit is the largest max_partitions: each admitted partition costs
// memory and a key in the WAL's sink state.
const MaxPartitionsLimit = 1_000_000

func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ", ")
}
