package jsonscan

import "testing"

func TestMember(t *testing.T) {
	body := []byte(` {"a" : "x\"y", "b":{"c":[1,"}",{"d":2}]}, "e\u0301":3, "n":null} `)
	tests := []struct {
		key, want string
		ok        bool
	}{
		{"a", `"x\"y"`, true},
		{"b", `{"c":[1,"}",{"d":2}]}`, true},
		{"é", "", false}, // an escaped key is compared unescaped: "e\u0301" is e + combining accent
		{"e\u0301", "3", true},
		{"n", "null", true},
		{"zz", "", false},
	}
	for _, tt := range tests {
		v, ok := Member(body, tt.key)
		if ok != tt.ok || string(v) != tt.want {
			t.Errorf("Member(%q) = %q, %v; want %q, %v", tt.key, v, ok, tt.want, tt.ok)
		}
	}
	for _, bad := range []string{``, `[1]`, `{"a"`, `{"a":`, `{"a":"`, `"s"`} {
		if v, ok := Member([]byte(bad), "a"); ok {
			t.Errorf("Member(%q) = %q, true", bad, v)
		}
	}
}
