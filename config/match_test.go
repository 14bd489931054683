package config

import "testing"

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
