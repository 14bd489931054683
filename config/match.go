package config

import (
	"maps"
	"strings"
	"sync"
	"sync/atomic"
)

// MatchTag reports whether tag matches any of the globs. Tags and globs are made of parts
// separated by dots. In a glob, "*" matches exactly one part, "**" matches any number of parts
// (none included: "pod.**" matches "pod"), a "*" within a part matches any run of characters
// in that part ("pod.web-*" matches "pod.web-1"), and any other part matches itself.
func MatchTag(globs []string, tag string) bool {
	parts := strings.Split(tag, ".")
	for _, glob := range globs {
		if matchParts(strings.Split(glob, "."), parts) {
			return true
		}
	}
	return false
}

func matchParts(glob, parts []string) bool {
	for len(glob) > 0 {
		if glob[0] == "**" {
			for len(glob) > 0 && glob[0] == "**" {
				glob = glob[1:]
			}
			for i := 0; i <= len(parts); i++ {
				if matchParts(glob, parts[i:]) {
					return true
				}
			}
			return false
		}
		if len(parts) == 0 || !matchPart(glob[0], parts[0]) {
			return false
		}
		glob, parts = glob[1:], parts[1:]
	}
	return len(parts) == 0
}

// matchPart matches one part against a glob part in which "*" stands for any run of characters.
func matchPart(glob, part string) bool {
	literals := strings.Split(glob, "*")
	if len(literals) == 1 {
		return glob == part
	}
	first, last := literals[0], literals[len(literals)-1]
	if !strings.HasPrefix(part, first) {
		return false
	}
	part = part[len(first):]
	for _, lit := range literals[1 : len(literals)-1] {
		i := strings.Index(part, lit)
		if i < 0 {
			return false
		}
		part = part[i+len(lit):]
	}
	return strings.HasSuffix(part, last)
}

// maxCachedTags bounds a TagMatcher's memory: tags are few at a time (one per pod or
// file); when this many are remembered, the cache starts over, so that the tags of pods
// that came later (tags often hold a container's id) are remembered too.
const maxCachedTags = 4096

// TagMatcher answers MatchTag for fixed globs, remembering the answer per tag. It is safe
// for concurrent use; a lookup of a known tag takes no lock and allocates nothing.
type TagMatcher struct {
	globs [][]string
	mu    sync.Mutex // one writer of cache at a time
	cache atomic.Pointer[map[string]bool]
}

// NewTagMatcher returns a TagMatcher for globs.
func NewTagMatcher(globs []string) *TagMatcher {
	m := &TagMatcher{}
	for _, g := range globs {
		m.globs = append(m.globs, strings.Split(g, "."))
	}
	m.cache.Store(&map[string]bool{})
	return m
}

// Match reports whether tag matches one of the globs.
func (m *TagMatcher) Match(tag string) bool {
	if v, ok := (*m.cache.Load())[tag]; ok {
		return v
	}
	parts := strings.Split(tag, ".")
	match := false
	for _, g := range m.globs {
		if matchParts(g, parts) {
			match = true
			break
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	old := *m.cache.Load()
	if len(old) >= maxCachedTags {
		old = nil // full: start over
	}
	next := make(map[string]bool, len(old)+1)
	maps.Copy(next, old)
	next[strings.Clone(tag)] = match
	m.cache.Store(&next)
	return match
}
