package config

import (
	"reflect"
	"strings"
)

// yamlKeys lists the keys of struct type t, by their yaml tags.
func yamlKeys(t reflect.Type) []string {
	var keys []string
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); name != "" && name != "-" {
			keys = append(keys, name)
		}
	}
	return keys
}

// nearest is the key of keys closest to key, when it is close enough to
// be what was meant (a typo: at most two edits, and fewer than a third of
// the key); "" otherwise.
func nearest(key string, keys []string) string {
	best, bestD := "", 3
	for _, k := range keys {
		if d := editDistance(key, k); d < bestD && d*3 <= max(len(k), 3) {
			best, bestD = k, d
		}
	}
	return best
}

// editDistance is the distance of a and b in edits: a byte inserted,
// deleted or replaced, or two neighbours swapped ("levle" is one from
// "level"; optimal string alignment).
func editDistance(a, b string) int {
	prev2 := make([]int, len(b)+1) // the row before prev
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

// didYouMean is ` (did you mean "k"?)` for the key of keys nearest key, or "".
func didYouMean(key string, keys []string) string {
	if k := nearest(key, keys); k != "" {
		return ` (did you mean "` + k + `"?)`
	}
	return ""
}
