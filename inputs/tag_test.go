package inputs

import (
	"strings"
	"testing"
)

func TestCheckTag(t *testing.T) {
	good := []string{"t", "pod.shop.web", "kube.var.log.containers.web-1_shop_app-0123.log", "日本.ログ", "../../etc/passwd", strings.Repeat("a", MaxTagBytes)}
	for _, tag := range good {
		if msg := CheckTag(tag); msg != "" {
			t.Errorf("CheckTag(%q) = %q, want it taken", tag, msg)
		}
	}
	bad := map[string]string{
		"":                                 "tag is empty",
		strings.Repeat("a", MaxTagBytes+1): "tag of 1025 bytes, at most 1024",
		"t.\xff\xfe_x":                     "not valid UTF-8",
		"a\nb":                             "control character (U+000A)",
		"a\x00b":                           "control character (U+0000)",
		"a\u0085b":                         "control character (U+0085)",
		"tab\there":                        "control character (U+0009)",
		"del\x7f":                          "control character (U+007F)",
		strings.Repeat("\u00e9", MaxTagBytes/2+1): "at most 1024",
	}
	for tag, want := range bad {
		if msg := CheckTag(tag); !strings.Contains(msg, want) {
			t.Errorf("CheckTag(%.40q) = %q, want %q", tag, msg, want)
		}
	}
}
