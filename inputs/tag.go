package inputs

import (
	"fmt"
	"unicode"
	"unicode/utf8"
)

// MaxTagBytes is the longest routing tag the inputs take, in bytes.
const MaxTagBytes = 1024

// CheckTag returns why tag cannot be a routing tag, or "" when it can. One
// rule for every input: not empty, at most MaxTagBytes bytes, valid UTF-8,
// no control characters. A tag ends up in S3 keys and CloudWatch names,
// and in every log line about its records: a tag that breaks this rule is
// refused as bad input, never stored.
func CheckTag(tag string) string {
	switch {
	case tag == "":
		return "tag is empty"
	case len(tag) > MaxTagBytes:
		return fmt.Sprintf("tag of %d bytes, at most %d", len(tag), MaxTagBytes)
	case !utf8.ValidString(tag):
		return "tag is not valid UTF-8"
	}
	for _, c := range tag {
		if unicode.IsControl(c) {
			return fmt.Sprintf("tag contains a control character (%U)", c)
		}
	}
	return ""
}
