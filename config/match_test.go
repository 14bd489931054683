package config

import (
	"fmt"
	"sync"
	"testing"
)

func TestMatchTag(t *testing.T) {
	for _, c := range []struct {
		glob, tag string
		want      bool
	}{
		{"**", "a", true},
		{"**", "a.b.c", true},
		{"**", "", true},
		{"*", "a", true},
		{"*", "a.b", false},
		{"a", "a", true},
		{"a", "b", false},
		{"a", "a.b", false},
		{"a.b", "a.b", true},
		{"a.*", "a.b", true},
		{"a.*", "a", false},
		{"a.*", "a.b.c", false},
		{"*.b", "a.b", true},
		{"a.*.c", "a.x.c", true},
		{"a.*.c", "a.c", false},
		{"pod.**", "pod", true},
		{"pod.**", "pod.web", true},
		{"pod.**", "pod.web.1", true},
		{"pod.**", "pods.web", false},
		{"pod.**", "node.pod", false},
		{"**.error", "error", true},
		{"**.error", "app.web.error", true},
		{"**.error", "app.error.web", false},
		{"a.**.z", "a.z", true},
		{"a.**.z", "a.b.c.z", true},
		{"a.**.z", "a.b.c", false},
		{"a.**.**.z", "a.b.z", true},
		{"pod.web-*", "pod.web-1", true},
		{"pod.web-*", "pod.web-", true},
		{"pod.web-*", "pod.api-1", false},
		{"pod.web-*", "pod.web-1.x", false},
		{"pod.*-canary", "pod.web-canary", true},
		{"pod.*-canary", "pod.web-canary-2", false},
		{"pod.w*b*c", "pod.wxbyc", true},
		{"pod.w*b*c", "pod.wbc", true},
		{"pod.w*b*c", "pod.wxc", false},
		{"pod.ab*ba", "pod.aba", false},
	} {
		if got := MatchTag([]string{c.glob}, c.tag); got != c.want {
			t.Errorf("MatchTag(%q, %q) = %v, want %v", c.glob, c.tag, got, c.want)
		}
		m := NewTagMatcher([]string{c.glob})
		for range 2 { // worked out, then remembered
			if got := m.Match(c.tag); got != c.want {
				t.Errorf("TagMatcher(%q).Match(%q) = %v, want %v", c.glob, c.tag, got, c.want)
			}
		}
	}
}

func TestMatchTagAnyGlob(t *testing.T) {
	globs := []string{"pod.**", "node.*.kubelet"}
	for tag, want := range map[string]bool{
		"pod.web":            true,
		"node.n1.kubelet":    true,
		"node.n1.containerd": false,
		"app":                false,
	} {
		if got := MatchTag(globs, tag); got != want {
			t.Errorf("MatchTag(%q, %q) = %v, want %v", globs, tag, got, want)
		}
	}
	if MatchTag(nil, "pod.web") {
		t.Error("no globs matched a tag")
	}
}

// Many goroutines, more tags than are remembered: every answer is right.
func TestTagMatcherConcurrentAndBounded(t *testing.T) {
	m := NewTagMatcher([]string{"pod.**", "node.*.kubelet"})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range maxCachedTags + 1000 {
				tag := fmt.Sprintf("pod.p%d", (i*7+g)%(maxCachedTags+500))
				if !m.Match(tag) {
					t.Errorf("Match(%q) = false", tag)
					return
				}
				if tag := fmt.Sprintf("node.n%d.containerd", i); m.Match(tag) {
					t.Errorf("Match(%q) = true", tag)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := len(*m.cache.Load()); n > maxCachedTags || n == 0 {
		t.Errorf("%d tags remembered, want at most the bound %d", n, maxCachedTags)
	}
	// Tags that come after the bound was reached are remembered too: the
	// cache starts over rather than staying with the first tags for good.
	for i := range maxCachedTags {
		m.Match(fmt.Sprintf("pod.later%d", i))
	}
	if _, ok := (*m.cache.Load())["pod.later4095"]; !ok {
		t.Error("a tag seen after the cache filled is not remembered")
	}
	if allocs := testing.AllocsPerRun(100, func() { m.Match("pod.p1") }); allocs != 0 {
		t.Errorf("a remembered tag costs %v allocations", allocs)
	}
}
