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
//
// A value that referred to variables and came out empty is noted in c.emptyEnv, by its key's
// place, for the settings that must not be empty by accident (section.notEmptyEnv).
func expandEnv(c *checker, n *yaml.Node) (unexpanded map[*yaml.Node]bool) {
	unexpanded = map[*yaml.Node]bool{}
	// Where a node is: the top level, the list under sinks, a sink of it,
	// or anywhere else. A template is a sink's own key, log_group or
	// log_stream, not a key of that name elsewhere (a tag named key).
	const (
		atTop = iota
		atSinks
		atSink
		elsewhere
	)
	var walk func(n *yaml.Node, at int, template bool)
	walk = func(n *yaml.Node, at int, template bool) {
		if n.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				walk(k, elsewhere, false)
				before := v.Value
				child := elsewhere
				if at == atTop && k.Value == "sinks" {
					child = atSinks
				}
				walk(v, child, at == atSink && templateKeys[k.Value])
				if v.Kind == yaml.ScalarNode && v.Value == "" && before != "" && !unexpanded[v] {
					if c.emptyEnv == nil {
						c.emptyEnv = map[position]string{}
					}
					c.emptyEnv[position{k.Line, k.Column}] = before // by its key, where c.pos has it
				}
			}
			return
		}
		if n.Kind != yaml.ScalarNode {
			child := elsewhere
			if at == atSinks {
				child = atSink
			}
			for _, c := range n.Content {
				walk(c, child, template)
			}
			return
		}
		// The templates report ${NAME} themselves, with their placeholders.
		value, problems := expandEnvString(n.Value, os.LookupEnv, !template)
		for _, msg := range problems {
			c.add(position{n.Line, n.Column}, "%s", msg)
		}
		if len(problems) > 0 {
			unexpanded[n] = true
			return
		}
		if template {
			if refs := envRefValues(n.Value, os.LookupEnv); len(refs) > 0 {
				if c.envTemplates == nil {
					c.envTemplates = map[*yaml.Node][]string{}
				}
				c.envTemplates[n] = refs
			}
		}
		n.Value = value
	}
	at := atTop
	if n.Kind == yaml.DocumentNode {
		at = elsewhere // not expected: parseYAML gives the document's content
	}
	walk(n, at, false) // an alias is visited where its anchor is, so each scalar is expanded once
	return unexpanded
}

// envRefValues returns the values of the variables s refers to with ${env.NAME} (not
// $${env.NAME}, which is text).
func envRefValues(s string, lookup func(string) (string, bool)) []string {
	var out []string
	for i := 0; i < len(s); i++ {
		switch {
		case strings.HasPrefix(s[i:], "$$"):
			i++
		case strings.HasPrefix(s[i:], "${env."):
			end := strings.IndexByte(s[i:], '}')
			if end < 0 {
				return out
			}
			if v, ok := lookup(s[i+len("${env.") : i+end]); ok {
				out = append(out, v)
			}
			i += end
		}
	}
	return out
}

// templateText escapes a value for a template, where it is taken as text.
var templateText = strings.NewReplacer("$", "$$", "%", "%%")

// templateKeys are the keys of a sink whose values are templates (package template).
var templateKeys = map[string]bool{"key": true, "log_group": true, "log_stream": true}

// expandEnvString expands ${env.NAME} in s, once: a value is not expanded again. "$$" is kept as
// it is, for the templates that see it later as a literal "$", so "$${env.NAME}" is not a
// reference. Other ${...} forms are templates and are kept too; with other, ${NAME} in
// capitals and #{ENV[...]} (Fluent Bit's and Fluentd's syntax) are reported.
func expandEnvString(s string, lookup func(string) (string, bool), other bool) (string, []string) {
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
		case other && strings.HasPrefix(s[i:], "${") && otherSyntax(s[i+2:]) != "":
			// Fluent Bit's ${NAME}: taken as it is, a shared key would be its own name.
			name := otherSyntax(s[i+2:])
			problems = append(problems, "${"+name+"}: for the environment variable write ${env."+name+"}")
			b.WriteString(s[i:])
			i = len(s)
		case other && strings.HasPrefix(s[i:], "${") && !strings.HasPrefix(s[i:], open):
			// ${ENV.NAME}, ${env:NAME} and the like: no template reads this value.
			ref := s[i:]
			if end := strings.IndexByte(ref, '}'); end >= 0 {
				ref = ref[:end+1]
			}
			problems = append(problems, ref+": not a reference this file knows; for an environment variable write ${env.NAME} (only key, log_group and log_stream are templates; a value that holds ${ as it is can come from a variable, whose value is not expanded again)")
			b.WriteString(s[i:])
			i = len(s)
		case strings.HasPrefix(s[i:], `#{ENV[`):
			problems = append(problems, s[i:]+": Fluentd's syntax; for an environment variable write ${env.NAME}")
			b.WriteString(s[i:])
			i = len(s)
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
			if !other {
				// In a template the value is text, as everywhere: its $
				// and % are not read as placeholders.
				value = templateText.Replace(value)
			}
			b.WriteString(value)
		default:
			b.WriteByte(s[i])
			i++
		}
	}
	return b.String(), problems
}

// otherSyntax returns NAME when s (what follows "${") is "NAME}" with NAME shaped like an
// environment variable in capitals (templates' own placeholders are in lower case), else "".
func otherSyntax(s string) string {
	end := strings.IndexByte(s, '}')
	if end <= 0 {
		return ""
	}
	name := s[:end]
	if !capitalsEnvName(name) {
		return ""
	}
	return name
}

// ShellRef returns NAME when s is "$NAME" with NAME an environment variable's name in
// capitals, else "": the shell's syntax, which this file takes as text (a warning, not an
// error: a secret may be just that).
func ShellRef(s string) string {
	if len(s) < 2 || s[0] != '$' {
		return ""
	}
	name := s[1:]
	if !capitalsEnvName(name) {
		return ""
	}
	return name
}

// capitalsEnvName reports whether name is an environment variable's name in capitals, with
// a letter: what Fluent Bit and the shell refer to, and not a template's own placeholder.
func capitalsEnvName(name string) bool {
	return isEnvName(name) && strings.ToUpper(name) == name && strings.Trim(name, "_0123456789") != ""
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
