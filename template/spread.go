package template

import (
	"fmt"
	"strings"
)

// Named is a template and the configuration key it comes from.
type Named struct {
	Key string // "log_stream", "key"
	T   *Template
}

// Spread says which placeholder of the templates (the tag, a tag part, a
// field) renders the most different values for the records ds: what makes
// a sink's partitions many when one takes a value per record. It names the
// key, the template, the placeholder, how many values it took and two of
// them, e.g.
//
//	log_stream "${record.stream}": ${record.stream} took 64 values in 64 records, e.g. "a1", "b7"
func Spread(ts []Named, ds []Data, fallback string) string {
	type slot struct {
		key, src, ph string
		seen         map[string]struct{}
		eg           []string
	}
	var slots []*slot
	for _, nt := range ts {
		for i := range nt.T.parts {
			p := &nt.T.parts[i]
			if p.kind != tagAll && p.kind != tagPart && p.kind != field {
				continue
			}
			sl := &slot{key: nt.Key, src: nt.T.src, ph: p.placeholder(), seen: map[string]struct{}{}}
			one := &Template{parts: []part{*p}, unsanitised: nt.T.unsanitised}
			for j := range ds {
				v, _ := one.Render(&ds[j], fallback)
				if _, ok := sl.seen[v]; !ok {
					sl.seen[v] = struct{}{}
					if len(sl.eg) < 2 {
						sl.eg = append(sl.eg, v)
					}
				}
			}
			slots = append(slots, sl)
		}
	}
	var best *slot
	for _, sl := range slots {
		if best == nil || len(sl.seen) > len(best.seen) {
			best = sl
		}
	}
	switch {
	case len(ds) == 0:
		return "no record to look at (those that overflowed were all larger than the samples kept)"
	case best == nil:
		return fmt.Sprintf("no template has a tag or field placeholder (%d records looked at): the time in the names (%%S, %%M) may make the partitions", len(ds))
	}
	eg := make([]string, len(best.eg))
	for i, v := range best.eg {
		eg[i] = fmt.Sprintf("%q", v)
	}
	return fmt.Sprintf("%s %q: %s took %d values in %d records, e.g. %s",
		best.key, best.src, best.ph, len(best.seen), len(ds), strings.Join(eg, ", "))
}

// placeholder is how p is written in a template.
func (p *part) placeholder() string {
	switch p.kind {
	case tagAll:
		return "${tag}"
	case tagPart:
		return fmt.Sprintf("${tag[%d]}", p.n)
	case field:
		s := "${record." + strings.Join(p.path, ".")
		if p.hasDf {
			s += "|" + p.text
		}
		return s + "}"
	}
	return ""
}
