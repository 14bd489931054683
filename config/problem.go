package config

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Problem is one thing wrong with a configuration file, at the line (and column) where it is.
type Problem struct {
	File   string
	Line   int // 1-based; 0 when the problem has no place in the file
	Column int // 1-based; 0 when unknown
	Msg    string
}

// Error gives "file:line: msg".
func (p Problem) Error() string {
	var b strings.Builder
	if p.File != "" {
		b.WriteString(p.File + ":")
	}
	if p.Line > 0 {
		b.WriteString(strconv.Itoa(p.Line) + ":")
	}
	if b.Len() > 0 {
		b.WriteString(" ")
	}
	b.WriteString(p.Msg)
	return b.String()
}

// Problems is every problem found in a file, in the order of their lines. Load, Parse and
// Config.Validate return it as their error.
type Problems []Problem

// Error gives one problem per line.
func (ps Problems) Error() string {
	lines := make([]string, len(ps))
	for i, p := range ps {
		lines[i] = p.Error()
	}
	return strings.Join(lines, "\n")
}

// position is where a key was found in the file.
type position struct{ line, column int }

// checker collects problems while a file is decoded and validated.
type checker struct {
	file     string
	pos      map[string]position // where each key was found, by path ("wal.sync", "sinks[0].bucket")
	failed   map[string]bool     // paths whose value could not be read; already reported
	emptyEnv map[position]string // keys whose values referred to variables and came out empty
	// envTemplates are the template values (a sink's key, log_group, log_stream) that
	// referred to environment variables, with the variables' values: names that may be
	// per replica by another means than ${hostname} (a pod's name from the downward API).
	envTemplates map[*yaml.Node][]string
	problems     Problems
}

func newChecker(file string, pos map[string]position) *checker {
	if pos == nil {
		pos = map[string]position{}
	}
	return &checker{file: file, pos: pos, failed: map[string]bool{}}
}

// add records a problem at a place in the file.
func (c *checker) add(p position, format string, args ...any) {
	c.problems = append(c.problems, Problem{File: c.file, Line: p.line, Column: p.column, Msg: fmt.Sprintf(format, args...)})
}

// at records a problem about the key at path. It is placed at the key, or, for a key that is
// not in the file, at the nearest enclosing one that is. A problem about a value that could not
// be read is dropped: that value was reported already.
func (c *checker) at(path string, format string, args ...any) {
	var where position
	found := false
	for p := path; ; p = parentPath(p) {
		if c.failed[p] {
			return
		}
		if !found {
			where, found = c.pos[p]
		}
		if p == "" {
			break
		}
	}
	c.add(where, format, args...)
}

// parentPath strips the last key or index from a path: "sinks[0].bucket" -> "sinks[0]" -> "sinks" -> "".
func parentPath(path string) string {
	i := strings.LastIndexAny(path, ".[")
	if i < 0 {
		return ""
	}
	return path[:i]
}

// err returns the problems sorted by place, or nil.
func (c *checker) err() error {
	if len(c.problems) == 0 {
		return nil
	}
	slices.SortStableFunc(c.problems, func(a, b Problem) int {
		return cmp.Or(cmp.Compare(a.Line, b.Line), cmp.Compare(a.Column, b.Column))
	})
	return c.problems
}

// scope is a mapping of the file, as the decoder and the validators see it: where its keys are
// in the position table, and how messages name it and its keys.
type scope struct {
	path  string // "inputs.forward.tls", "sinks[0]"; "" for the top level
	label string // prefix of a key's name in messages: "inputs.forward.tls.", `sink "archive": `
	desc  string // the mapping in messages: "inputs.forward.tls", `sink "archive" (type s3)`
}

// keyPath is the path of one of the scope's keys.
func (s scope) keyPath(key string) string {
	if s.path == "" {
		return key
	}
	return s.path + "." + key
}

// child is the scope of the mapping under one of the scope's keys.
func (s scope) child(key string) scope {
	return scope{path: s.keyPath(key), label: s.label + key + ".", desc: s.label + key}
}

// in names the scope after a key: ` in wal`, or nothing at the top level.
func (s scope) in() string {
	if s.desc == "" {
		return ""
	}
	return " in " + s.desc
}
