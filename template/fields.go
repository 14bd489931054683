package template

import "github.com/logfwd/forwarder/internal/jsonscan"

// maxFound is how many fields a Finder looks up in its one pass; the
// fields of templates beyond it are looked up one by one, as without one.
const maxFound = 8

// A Finder looks up the fields that a set of templates renders in one pass
// over a record's body, instead of one pass per field: a sink rendering a
// log group and a stream from two fields of the same object (${record.kubernetes.namespace_name},
// ${record.kubernetes.pod_name}) scans the body once. What a template
// renders from the values found is what it renders from Lookup's. Safe
// for concurrent use.
type Finder struct {
	paths [][]string // the templates' own path slices: a part finds its value by identity
	// lens has, for each depth, bit min(len(key), 63) set for the key of
	// every path at that depth: a key without a backslash of no such
	// length is none of them.
	lens []uint64
}

// NewFinder returns a Finder of the fields of ts.
func NewFinder(ts ...*Template) *Finder {
	f := &Finder{}
	for _, t := range ts {
		for i := range t.parts {
			p := &t.parts[i]
			if p.kind == field && len(p.path) > 0 && len(f.paths) < maxFound {
				f.paths = append(f.paths, p.path)
				for d, k := range p.path {
					if d == len(f.lens) {
						f.lens = append(f.lens, 0)
					}
					f.lens[d] |= 1 << min(len(k), 63)
				}
			}
		}
	}
	return f
}

// Fields are the values a Finder found in one body, for Template.AppendFound.
type Fields struct {
	finder *Finder
	vals   [maxFound]foundValue
}

type foundValue struct {
	v  []byte
	ok bool
}

// Find looks up f's fields in body into out.
func (f *Finder) Find(body []byte, out *Fields) {
	out.finder = f
	out.vals = [maxFound]foundValue{}
	var pend [maxFound]int8
	for i := range f.paths {
		pend[i] = int8(i)
	}
	f.scan(body, 0, pend, len(f.paths), out)
	for i := range f.paths {
		if fv := &out.vals[i]; fv.ok {
			fv.v, fv.ok = scalarText(fv.v)
		}
	}
}

// scalarText is foundText of a value a name may hold: an object or an
// array is not one (its JSON in a key or a stream name is a mistake of the
// template's field, rendered as the fallback, noted Missing).
func scalarText(v []byte) ([]byte, bool) {
	if len(v) > 0 && (v[0] == '{' || v[0] == '[') {
		return nil, false
	}
	return foundText(v)
}

// foundText is lookupValue of a value with no space around it, as scan
// finds them: scan skips space before a value, and a value that
// jsonscan.SkipValue skips ends at a quote, a bracket, or before a space.
func foundText(v []byte) ([]byte, bool) {
	switch {
	case len(v) == 0 || string(v) == "null":
		return nil, false
	case v[0] == '"':
		return jsonscan.Unquote(v)
	}
	return v, true
}

// scan looks up, in the object obj, member path[depth] of each field of
// idx[:n] (an array, not a slice, so that the recursion allocates
// nothing): the first member of that name, and the fields whose path goes on
// in its value, as Lookup does one field at a time. It stops where
// jsonscan.Member would: at the end of the object, or at what is not JSON.
func (f *Finder) scan(obj []byte, depth int, idx [maxFound]int8, n int, out *Fields) {
	i := jsonscan.SkipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return
	}
	i++
	left := n
	for left > 0 {
		i = jsonscan.SkipSpace(obj, i)
		if i >= len(obj) || obj[i] != '"' {
			return // the end ('}'), or not an object
		}
		var leaf, sub [maxFound]int8
		var nl, ns int
		if i, leaf, sub, nl, ns = f.member(obj, i, depth, &idx, n); i < 0 {
			return
		}
		left -= nl + ns
		var vEnd int
		if ns > 0 && i < len(obj) && obj[i] == '{' {
			vEnd = f.scanObject(obj, i, depth+1, sub, ns, out)
		} else {
			vEnd = jsonscan.SkipValue(obj, i) // a path going on in what is not an object ends here
		}
		if vEnd < 0 {
			return
		}
		for _, x := range leaf[:nl] {
			out.vals[x] = foundValue{obj[i:vEnd], true}
		}
		i = jsonscan.SkipSpace(obj, vEnd)
		if i < len(obj) && obj[i] == ',' {
			i++
		}
	}
}

// member reads the member of obj whose key opens at obj[i] up to its
// value: it returns where the value starts, or -1 when what is there is
// not a member, and the fields of idx[:n] the key names (match). Keys of a
// length no field's member at depth has are not compared.
func (f *Finder) member(obj []byte, i, depth int, idx *[maxFound]int8, n int) (v int, leaf, sub [maxFound]int8, nl, ns int) {
	kEnd, escaped := jsonscan.SkipKey(obj, i)
	if kEnd < 0 {
		return -1, leaf, sub, 0, 0
	}
	k := obj[i:kEnd]
	v = jsonscan.SkipSpace(obj, kEnd)
	if v >= len(obj) || obj[v] != ':' {
		return -1, leaf, sub, 0, 0
	}
	v = jsonscan.SkipSpace(obj, v+1)
	if escaped || f.lens[depth]&(1<<min(len(k)-2, 63)) != 0 {
		leaf, sub, nl, ns = f.match(k, escaped, depth, idx, n)
	}
	return v, leaf, sub, nl, ns
}

// match takes the fields of idx[:n] whose member path[depth] is the key k
// (quoted; escaped when it holds a backslash) out of idx: those whose path
// ends there into leaf[:nl], those whose path goes on into sub[:ns].
func (f *Finder) match(k []byte, escaped bool, depth int, idx *[maxFound]int8, n int) (leaf, sub [maxFound]int8, nl, ns int) {
	raw := k[1 : len(k)-1]
	for j, x := range idx[:n] {
		if x < 0 {
			continue
		}
		key := f.paths[x][depth]
		if escaped && !jsonscan.KeyEquals(k, key) || !escaped && string(raw) != key {
			continue
		}
		idx[j] = -1
		if len(f.paths[x]) == depth+1 {
			leaf[nl] = x
			nl++
		} else {
			sub[ns] = x
			ns++
		}
	}
	return leaf, sub, nl, ns
}

// scanObject is scan of the object obj[i:end] that opens at obj[i] ('{'),
// end being jsonscan.SkipValue(obj, i), which it returns; the fields of
// idx[:n] are left not found when it is -1. It goes over the object once:
// its members as scan does, then, once every field is found, the rest as
// SkipValue does. SkipValue counts brackets outside strings, and so finds
// the same end through the members read as scan reads them, but for a
// value that is neither a string, an object nor an array (a number, true,
// false, null) and holds a bracket or a quote, or what is not an object:
// then the object is skipped with SkipValue and scanned again within its
// end.
func (f *Finder) scanObject(obj []byte, i, depth int, idx [maxFound]int8, n int, out *Fields) int {
	start, all := i, idx
	i++
	left := n
	for {
		i = jsonscan.SkipSpace(obj, i)
		if i >= len(obj) {
			break
		}
		if obj[i] == '}' {
			return i + 1
		}
		if obj[i] != '"' {
			break
		}
		if left == 0 {
			if end := jsonscan.SkipNested(obj, i, 1); end >= 0 {
				return end
			}
			break
		}
		var leaf, sub [maxFound]int8
		var nl, ns int
		if i, leaf, sub, nl, ns = f.member(obj, i, depth, &idx, n); i < 0 {
			break
		}
		left -= nl + ns
		var vEnd int
		if ns > 0 && i < len(obj) && obj[i] == '{' {
			vEnd = f.scanObject(obj, i, depth+1, sub, ns, out)
		} else {
			vEnd = jsonscan.SkipValue(obj, i)
		}
		if vEnd < 0 || !countsAsSkipped(obj[i:vEnd]) {
			break
		}
		for _, x := range leaf[:nl] {
			out.vals[x] = foundValue{obj[i:vEnd], true}
		}
		i = jsonscan.SkipSpace(obj, vEnd)
		if i < len(obj) && obj[i] == ',' {
			i++
		}
	}
	for _, x := range all[:n] { // the fields found within the object, at any depth
		out.vals[x] = foundValue{}
	}
	end := jsonscan.SkipValue(obj, start)
	if end >= 0 {
		f.scan(obj[start:end], depth, all, n, out)
	}
	return end
}

// countsAsSkipped reports whether SkipValue, skipping an object or array
// that holds the value v, steps over v as it is: v is a string, an object
// or an array, or else holds no bracket or quote that SkipValue would
// count.
func countsAsSkipped(v []byte) bool {
	if len(v) == 0 || v[0] == '"' || v[0] == '{' || v[0] == '[' {
		return true
	}
	for _, c := range v {
		if c == '"' || c == '{' || c == '[' {
			return false
		}
	}
	return true
}

// get returns the value found for path, and whether path is one of the
// Finder's.
func (fs *Fields) get(path []string) (v []byte, ok, known bool) {
	if fs == nil || fs.finder == nil || len(path) == 0 {
		return nil, false, false
	}
	for i, p := range fs.finder.paths {
		if len(p) == len(path) && &p[0] == &path[0] {
			return fs.vals[i].v, fs.vals[i].ok, true
		}
	}
	return nil, false, false
}
