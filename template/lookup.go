package template

import "github.com/logfwd/forwarder/internal/jsonscan"

// Lookup returns the value at path in the JSON object body: a string's
// text, or any other value's JSON. It scans without decoding the rest, and
// reports false when body is not an object or the path is missing or null.
func Lookup(body []byte, path []string) ([]byte, bool) {
	v, ok := member(body, path)
	if !ok {
		return nil, false
	}
	return lookupValue(v)
}

// lookupValue is what Lookup returns of the JSON value v it found.
func lookupValue(v []byte) ([]byte, bool) {
	return foundText(jsonscan.TrimSpace(v))
}

// lookupScalar is Lookup for a template's field: an object or an array is
// not a value (scalarText).
func lookupScalar(body []byte, path []string) ([]byte, bool) {
	v, ok := member(body, path)
	if !ok {
		return nil, false
	}
	return scalarText(jsonscan.TrimSpace(v))
}

// member returns the JSON value at path in body, as it stands there.
func member(body []byte, path []string) ([]byte, bool) {
	v := body
	for _, key := range path {
		var ok bool
		if v, ok = jsonscan.Member(v, key); !ok {
			return nil, false
		}
	}
	return v, true
}
