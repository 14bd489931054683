package config

import (
	"fmt"
	"reflect"

	"gopkg.in/yaml.v3"
)

// decodeSink decodes one item of sinks. A sink's type decides which keys it takes besides
// name, type and match: the fields of S3 or of CloudWatch, written inline in the same mapping.
// A key of the other type is reported as unknown, saying where it belongs; when the type is
// missing or wrong (reported by validation), keys of either type are accepted unchecked.
func (d *decoder) decodeSink(sink *Sink, n *yaml.Node, path string) {
	n = resolve(n)
	sink.Line = n.Line
	sink.Match = defaultMatch()
	sink.Name, sink.Type = peekString(n, "name"), peekString(n, "type")
	switch sink.Type {
	case SinkS3:
		sink.S3 = defaultS3()
	case SinkCloudWatch:
		sink.CloudWatch = defaultCloudWatch()
	}
	s := sinkScope(path, sink.Name, sink.Type)
	d.eachKey(n, s, func(key, value *yaml.Node) bool {
		switch key.Value {
		case "name":
			d.decodeValue(reflect.ValueOf(&sink.Name).Elem(), value, s, "name")
		case "type":
			d.decodeValue(reflect.ValueOf(&sink.Type).Elem(), value, s, "type")
		case "match":
			d.decodeMatch(sink, value, s)
		default:
			if refs := d.envTemplates[value]; len(refs) > 0 {
				switch {
				case sink.CloudWatch != nil && (key.Value == "log_group" || key.Value == "log_stream"):
					sink.CloudWatch.NamesEnv = append(sink.CloudWatch.NamesEnv, refs...)
				case sink.S3 != nil && key.Value == "key":
					sink.S3.KeyEnv = append(sink.S3.KeyEnv, refs...)
				}
			}
			return d.decodeSinkTypeKey(sink, key, value, s)
		}
		return true
	})
}

// decodeSinkTypeKey decodes a key of the sink's type, and reports whether it is one.
func (d *decoder) decodeSinkTypeKey(sink *Sink, key, value *yaml.Node, s scope) bool {
	var this any
	var other string // the other sink type
	switch {
	case sink.S3 != nil:
		this, other = sink.S3, SinkCloudWatch
	case sink.CloudWatch != nil:
		this, other = sink.CloudWatch, SinkS3
	default:
		return isSinkKey(SinkS3, key.Value) || isSinkKey(SinkCloudWatch, key.Value)
	}
	if d.decodeField(reflect.ValueOf(this).Elem(), key.Value, value, s) {
		return true
	}
	if isSinkKey(other, key.Value) {
		d.add(position{key.Line, key.Column}, "unknown key %q%s: %s is a key of %s sinks", key.Value, s.in(), key.Value, other)
		return true
	}
	if hint := didYouMean(key.Value, append(yamlKeys(reflect.TypeOf(this).Elem()), "name", "type", "match")); hint != "" {
		d.add(position{key.Line, key.Column}, "unknown key %q%s%s", key.Value, s.in(), hint)
		return true
	}
	return false
}

// isSinkKey reports whether key is one of the keys of the sink type.
func isSinkKey(sinkType, key string) bool {
	var t reflect.Type
	switch sinkType {
	case SinkS3:
		t = reflect.TypeFor[S3]()
	case SinkCloudWatch:
		t = reflect.TypeFor[CloudWatch]()
	default:
		return false
	}
	_, ok := fieldIndex(t, key)
	return ok
}

// decodeMatch decodes match: one tag glob, or a list of them.
func (d *decoder) decodeMatch(sink *Sink, n *yaml.Node, s scope) {
	n = resolve(n)
	path := s.keyPath("match")
	if d.unexpanded[n] {
		d.failed[path] = true
		return
	}
	if n.Kind == yaml.ScalarNode && !isNull(n) {
		sink.Match = []string{n.Value}
		return
	}
	if n.Kind != yaml.SequenceNode {
		d.fail(n, path, "%smatch: expected a tag glob or a list of them, got %s", s.label, describe(n))
		return
	}
	d.decodeSlice(reflect.ValueOf(&sink.Match).Elem(), n, s, "match")
}

// sinkScope names a sink in messages by its name, or by its place in the list when it has none.
func sinkScope(path, name, sinkType string) scope {
	what := path
	if name != "" {
		what = fmt.Sprintf("sink %q", name)
	}
	desc := what
	if sinkType == SinkS3 || sinkType == SinkCloudWatch {
		desc += " (type " + sinkType + ")"
	}
	return scope{path: path, label: what + ": ", desc: desc}
}

// peekString returns the string value of key in mapping n, or "" when there is none. It lets
// the decoder know a sink's name and type before it reads the other keys.
func peekString(n *yaml.Node, key string) string {
	if v := peekNode(n, key); v != nil && v.Kind == yaml.ScalarNode && !isNull(v) {
		return v.Value
	}
	return ""
}
