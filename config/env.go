package config

import (
	"os"
	"strings"

	"gopkg.in/yaml.v3"
)

// expandEnv replaces ${env.NAME} in every key and value of the tree with the variable's value.
// It works on the parsed scalars rather than on the file's text, so a value cannot change the
// structure of the file, lines stay where they are, and comments are left alone. A scalar with
// a reference that cannot be expanded is reported, left as it is, and returned in the set so
// that the decoder does not report it again.
func expandEnv(c *checker, n *yaml.Node) (unexpanded map[*yaml.Node]bool) {
	unexpanded = map[*yaml.Node]bool{}
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		if n.Kind != yaml.ScalarNode {
			for _, child := range n.Content {
				walk(child)
			}
			return
		}
		value, problems := expandEnvString(n.Value, os.LookupEnv)
		for _, msg := range problems {
			c.add(position{n.Line, n.Column}, "%s", msg)
		}
		if len(problems) > 0 {
			unexpanded[n] = true
			return
		}
		n.Value = value
	}
	walk(n) // an alias is visited where its anchor is, so each scalar is expanded once
	return unexpanded
}

// expandEnvString expands ${env.NAME} in s, once: a value is not expanded again. "$$" is kept as
// it is, for the templates that see it later as a literal "$", so "$${env.NAME}" is not a
// reference. Other ${...} forms are templates and are kept too.
func expandEnvString(s string, lookup func(string) (string, bool)) (string, []string) {
	const open = "${env."
	var (
		b        strings.Builder
		problems []string
	)
	for i := 0; i < len(s); {
		switch {
		case strings.HasPrefix(s[i:], "$$"):
			b.WriteString("$$")
			i += 2
		case strings.HasPrefix(s[i:], open):
			end := strings.IndexByte(s[i:], '}')
			if end < 0 {
				problems = append(problems, "${env. without a closing }")
				b.WriteString(s[i:])
				i = len(s)
				continue
			}
			name := s[i+len(open) : i+end]
			i += end + 1
			if !isEnvName(name) {
				problems = append(problems, "${env."+name+"}: not a valid environment variable name")
				continue
			}
			value, ok := lookup(name)
			if !ok {
				problems = append(problems, "environment variable "+name+" is not set")
			}
			b.WriteString(value)
		default:
			b.WriteByte(s[i])
			i++
		}
	}
	return b.String(), problems
}

// isEnvName reports whether name is a portable environment variable name: letters, digits and
// underscores, not starting with a digit.
func isEnvName(name string) bool {
	if name == "" || ('0' <= name[0] && name[0] <= '9') {
		return false
	}
	for _, r := range name {
		if !(r == '_' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9') {
			return false
		}
	}
	return true
}
