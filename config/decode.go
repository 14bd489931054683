package config

import (
	"encoding"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// decoder fills Go values from a YAML tree, strictly: every key must name a field (by its yaml
// tag) and every value must have the field's type. It does not stop at a problem: it records
// it, leaves the field as it was (its default) and goes on, so one pass finds them all.
//
// A key that is absent leaves the field at its default; a key whose value is null (written
// with no value) does too, except that a null mapping is an empty one.
type decoder struct {
	*checker
	unexpanded map[*yaml.Node]bool // scalars whose ${env.NAME} could not be expanded; reported
}

// fail records a problem with the value at path and marks it unread, so that validation does
// not report it again.
func (d *decoder) fail(n *yaml.Node, path, format string, args ...any) {
	d.failed[path] = true
	d.add(position{n.Line, n.Column}, format, args...)
}

// eachKey calls f for every key of the mapping n with the key and value nodes. f returns
// whether it handled the key; eachKey reports the keys it did not, and keys that are repeated
// or are not strings.
func (d *decoder) eachKey(n *yaml.Node, s scope, f func(key, value *yaml.Node) bool) {
	n = resolve(n)
	if isNull(n) {
		return
	}
	if n.Kind != yaml.MappingNode {
		if s.desc == "" {
			d.fail(n, s.path, "expected a mapping at the top level, got %s", describe(n))
		} else {
			d.fail(n, s.path, "%s: expected a mapping, got %s", s.desc, describe(n))
		}
		return
	}
	seen := map[string]int{} // key -> line
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, value := resolve(n.Content[i]), resolve(n.Content[i+1])
		if d.unexpanded[key] {
			continue
		}
		if key.Kind != yaml.ScalarNode {
			d.add(position{key.Line, key.Column}, "expected a key%s, got %s", s.in(), describe(key))
			continue
		}
		if key.Tag == "!!merge" {
			d.add(position{key.Line, key.Column}, "merge keys (<<) are not supported%s: write the keys out, or alias the whole mapping (*name)", s.in())
			continue
		}
		if line, ok := seen[key.Value]; ok {
			d.add(position{key.Line, key.Column}, "%s%s is repeated (first at line %d)", s.label, key.Value, line)
			continue
		}
		seen[key.Value] = key.Line
		d.pos[s.keyPath(key.Value)] = position{key.Line, key.Column}
		if !f(key, value) {
			d.add(position{key.Line, key.Column}, "unknown key %q%s", key.Value, s.in())
		}
	}
}

// decodeStruct decodes the mapping n into the struct v.
func (d *decoder) decodeStruct(n *yaml.Node, v reflect.Value, s scope) {
	d.eachKey(n, s, func(key, value *yaml.Node) bool {
		if d.decodeField(v, key.Value, value, s) {
			return true
		}
		if hint := didYouMean(key.Value, yamlKeys(v.Type())); hint != "" {
			d.add(position{key.Line, key.Column}, "unknown key %q%s%s", key.Value, s.in(), hint)
			return true
		}
		return false
	})
}

// decodeField decodes n into the field of struct v tagged key, and reports whether there is one.
func (d *decoder) decodeField(v reflect.Value, key string, n *yaml.Node, s scope) bool {
	i, ok := fieldIndex(v.Type(), key)
	if ok {
		d.decodeValue(v.Field(i), n, s, key)
	}
	return ok
}

// fieldIndex finds the field of struct type t whose yaml tag names key.
func fieldIndex(t reflect.Type, key string) (int, bool) {
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if key != "" && key != "-" && name == key {
			return i, true
		}
	}
	return 0, false
}

var textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()

// decodeValue decodes n into v, the value of key in scope s.
func (d *decoder) decodeValue(v reflect.Value, n *yaml.Node, s scope, key string) {
	n = resolve(n)
	path, name := s.keyPath(key), s.label+key
	if d.unexpanded[n] {
		d.failed[path] = true
		return
	}
	if v.Addr().Type().Implements(textUnmarshalerType) {
		if text, ok := d.scalar(n, path, name, "a value"); ok {
			if err := v.Addr().Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(text)); err != nil {
				d.fail(n, path, "%s: %v", name, err)
			}
		}
		return
	}
	switch v.Kind() {
	case reflect.String:
		if text, ok := d.scalar(n, path, name, "a string"); ok {
			v.SetString(text)
		}
	case reflect.Bool:
		if text, ok := d.scalar(n, path, name, "true or false"); ok {
			switch text {
			case "true", "True", "TRUE":
				v.SetBool(true)
			case "false", "False", "FALSE":
				v.SetBool(false)
			default:
				d.fail(n, path, "%s: %q is not true or false", name, text)
			}
		}
	case reflect.Int:
		if text, ok := d.scalar(n, path, name, "an integer"); ok {
			i, err := strconv.ParseInt(text, 10, 0)
			if err != nil {
				d.fail(n, path, "%s: %q is not an integer", name, text)
				return
			}
			v.SetInt(i)
		}
	case reflect.Struct:
		d.decodeStruct(n, v, s.child(key))
	case reflect.Pointer:
		// An optional section: present means enabled, with its defaults under what is written.
		p := reflect.New(v.Type().Elem())
		if def, ok := p.Interface().(interface{ setDefaults() }); ok {
			def.setDefaults()
		}
		d.decodeStruct(n, p.Elem(), s.child(key))
		v.Set(p)
	case reflect.Slice:
		d.decodeSlice(v, n, s, key)
	case reflect.Map:
		d.decodeStringMap(v, n, s, key)
	default:
		panic(fmt.Sprintf("config: field %s has a type the decoder does not handle: %s", path, v.Type()))
	}
}

// decodeSlice decodes a sequence into the slice v. A null value empties the slice.
func (d *decoder) decodeSlice(v reflect.Value, n *yaml.Node, s scope, key string) {
	path := s.keyPath(key)
	if isNull(n) {
		v.SetZero()
		return
	}
	if n.Kind != yaml.SequenceNode {
		d.fail(n, path, "%s: expected a list, got %s", s.label+key, describe(n))
		return
	}
	out := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
	for i, item := range n.Content {
		itemKey := fmt.Sprintf("%s[%d]", key, i)
		d.pos[s.keyPath(itemKey)] = position{item.Line, item.Column}
		if sink, ok := out.Index(i).Addr().Interface().(*Sink); ok {
			d.decodeSink(sink, item, s.keyPath(itemKey))
			continue
		}
		d.decodeValue(out.Index(i), item, s, itemKey)
	}
	v.Set(out)
}

// decodeStringMap decodes a mapping of strings into the map[string]string v. A null value
// empties the map.
func (d *decoder) decodeStringMap(v reflect.Value, n *yaml.Node, s scope, key string) {
	if isNull(n) {
		v.SetZero()
		return
	}
	out := map[string]string{}
	inner := s.child(key)
	d.eachKey(n, inner, func(k, value *yaml.Node) bool {
		var text string
		d.decodeValue(reflect.ValueOf(&text).Elem(), value, inner, k.Value)
		out[k.Value] = text
		return true
	})
	v.Set(reflect.ValueOf(out))
}

// scalar returns the text of the scalar n. It returns false for null, which keeps the default,
// and for any other kind of node, which it reports as not being what was wanted.
func (d *decoder) scalar(n *yaml.Node, path, name, want string) (string, bool) {
	if isNull(n) {
		return "", false
	}
	if n.Kind != yaml.ScalarNode {
		d.fail(n, path, "%s: expected %s, got %s", name, want, describe(n))
		return "", false
	}
	return n.Value, true
}

// resolve follows aliases to the node they name.
func resolve(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// isNull reports whether n is a key's missing value, ~ or null.
func isNull(n *yaml.Node) bool {
	return n.Kind == 0 || n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// describe names what a node is, for messages: a mapping, a list, or the scalar itself.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	default:
		return strconv.Quote(n.Value)
	}
}
