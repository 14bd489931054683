package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Load reads the file at path and returns its configuration, with defaults applied and every
// value validated. A file that cannot be read is an ordinary error; a file with problems
// returns Problems listing all of them, each with path and line.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return Parse(data, path)
}

// Parse is Load for a file's contents; filename names the file in problems. An empty file is
// valid: it gives Default().
func Parse(data []byte, filename string) (*Config, error) {
	c := newChecker(filename, nil)
	root, err := parseYAML(data)
	if err != nil {
		pos := syntaxErrorPosition(data, err)
		msg := yamlMessage(err)
		if lines := bytes.Split(data, []byte("\n")); !strings.Contains(msg, "tab") && pos.line > 0 && pos.line <= len(lines) && bytes.IndexByte(lines[pos.line-1], '\t') >= 0 {
			msg += " (the line holds a tab: YAML indents with spaces only)"
		}
		c.add(pos, "invalid yaml: %s", msg)
		return nil, c.err()
	}
	unexpanded := expandEnv(c, root)
	d := &decoder{checker: c, unexpanded: unexpanded}

	cfg := Default()
	if peekNode(root, "inputs") != nil {
		cfg.Inputs = Inputs{} // naming the inputs enables only those named
	}
	d.decodeStruct(root, reflect.ValueOf(cfg).Elem(), scope{})
	cfg.file, cfg.pos = filename, c.pos
	cfg.finish()

	cfg.validate(c)
	if err := c.err(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// parseYAML parses the one document of a file into a tree, passing empty documents around
// it. An empty file, or one with only comments, gives an empty node.
func parseYAML(data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	for {
		// Empty documents before the first that holds something (a file
		// that begins ---, or with a document of comments) are passed.
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			return &yaml.Node{}, nil
		} else if err != nil {
			return nil, err
		}
		if !emptyDocument(&doc) {
			break
		}
		doc = yaml.Node{}
	}
	for {
		// Empty documents after it (a --- that ends the file) hold
		// nothing to take or lose.
		var next yaml.Node
		err := dec.Decode(&next)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if !emptyDocument(&next) {
			return nil, &secondDocumentError{line: next.Line}
		}
	}
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		return doc.Content[0], nil
	}
	return &doc, nil
}

// emptyDocument reports whether n is a document with nothing in it.
func emptyDocument(n *yaml.Node) bool {
	if n.Kind != yaml.DocumentNode {
		return false
	}
	for _, c := range n.Content {
		if c.Kind != yaml.ScalarNode || c.Tag != "!!null" || c.Value != "" {
			return false
		}
	}
	return true
}

type secondDocumentError struct{ line int }

func (e *secondDocumentError) Error() string { return "more than one document; the file must hold one" }

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): `)

// yamlMessage is a yaml.v3 error's message without its prefix and line.
func yamlMessage(err error) string {
	msg := err.Error()
	if m := yamlLine.FindString(msg); m != "" {
		return msg[len(m):]
	}
	return strings.TrimPrefix(msg, "yaml: ")
}

// syntaxErrorPosition finds the line of a syntax error. yaml.v3 reports the line where the
// construct around the problem began, counted from 0 for some errors and from 1 for others, and
// none at all on the first line. The line that breaks the file is the first one at which a
// prefix of the file fails with the same message, so it looks for that, and falls back to what
// yaml.v3 says.
func syntaxErrorPosition(data []byte, err error) position {
	var second *secondDocumentError
	if errors.As(err, &second) {
		return position{line: second.line}
	}
	want := yamlMessage(err)
	lines := bytes.SplitAfter(data, []byte("\n"))
	prefix := 0
	for i, line := range lines {
		prefix += len(line)
		if _, err := parseYAML(data[:prefix]); err != nil && yamlMessage(err) == want {
			return position{line: i + 1}
		}
	}
	if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
		n, _ := strconv.Atoi(m[1])
		return position{line: n}
	}
	return position{}
}

// peekNode returns the value of key in mapping n, or nil when there is no such key.
func peekNode(n *yaml.Node, key string) *yaml.Node {
	if n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := resolve(n.Content[i]); k.Kind == yaml.ScalarNode && k.Value == key {
			return resolve(n.Content[i+1])
		}
	}
	return nil
}

// LoadWAL reads what the wal commands use of the file at path: data_dir, wal, admin and
// the names of the sinks; the rest of the Config keeps its defaults. Nothing else is
// decoded, validated or expanded, so a ${env.NAME} elsewhere that is unset where the
// command runs (a secret or an address only the service's environment has) is no problem
// for them.
func LoadWAL(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	c := newChecker(path, nil)
	root, err := parseYAML(data)
	if err != nil {
		c.add(syntaxErrorPosition(data, err), "invalid yaml: %s", yamlMessage(err))
		return nil, c.err()
	}
	used := &yaml.Node{Kind: yaml.MappingNode}
	var sinks *yaml.Node
	cfg := Default()
	empty := root.Kind == 0 || root.Kind == yaml.ScalarNode && root.Tag == "!!null" || root.Kind == yaml.DocumentNode && len(root.Content) == 0
	if root.Kind != yaml.MappingNode && !empty { // an empty file is the defaults, as for check
		// Not a configuration (an environment file given by mistake): its
		// defaults would point the command at another WAL.
		c.add(position{root.Line, root.Column}, "expected a mapping at the top level, got %s", describe(root))
		return nil, c.err()
	}
	if root.Kind == yaml.MappingNode {
		top := yamlKeys(reflect.TypeOf(*cfg))
		seen := map[string]int{} // key -> line
		for i := 0; i+1 < len(root.Content); i += 2 {
			key := resolve(root.Content[i])
			if line, ok := seen[key.Value]; ok {
				// Which one counts is no command's to guess (the last
				// sinks would make the first's sinks look removed).
				c.add(position{key.Line, key.Column}, "%s is repeated (first at line %d)", key.Value, line)
				continue
			}
			seen[key.Value] = key.Line
			switch key.Value {
			case "data_dir", "wal", "admin":
				used.Content = append(used.Content, root.Content[i], root.Content[i+1])
			case "sinks":
				sinks = resolve(root.Content[i+1])
			default:
				// A misspelt data_dir or sinks would point the command at
				// another WAL, or make a configured sink look removed (whose
				// cursor drop-cursor deletes): refused, as check refuses it.
				if !slices.Contains(top, key.Value) {
					c.add(position{key.Line, key.Column}, "unknown key %q%s", key.Value, didYouMean(key.Value, top))
				}
			}
		}
	}
	d := &decoder{checker: c, unexpanded: expandEnv(c, used)}
	d.decodeStruct(used, reflect.ValueOf(cfg).Elem(), scope{})
	if sinks != nil {
		switch sinks.Kind {
		case yaml.SequenceNode:
			for i, n := range sinks.Content {
				n = resolve(n)
				name := peekNode(n, "name")
				if name == nil || name.Kind != yaml.ScalarNode || name.Value == "" {
					c.add(position{n.Line, n.Column}, "sinks[%d]: name is required", i)
					continue
				}
				expandEnv(c, name)
				cfg.Sinks = append(cfg.Sinks, Sink{Name: name.Value, Line: n.Line})
			}
		case yaml.ScalarNode:
			if sinks.Tag != "!!null" {
				c.add(position{sinks.Line, sinks.Column}, "sinks: expected a list, got %s", describe(sinks))
			}
		default:
			c.add(position{sinks.Line, sinks.Column}, "sinks: expected a list, got %s", describe(sinks))
		}
	}
	cfg.file, cfg.pos = path, c.pos
	top := section{c, scope{}}
	top.required("data_dir", cfg.DataDir)
	cfg.WAL.validate(top.child("wal"))
	cfg.Admin.validate(top.child("admin"))
	if err := c.err(); err != nil {
		return nil, err
	}
	return cfg, nil
}
