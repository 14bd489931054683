// Package config loads the forwarder's configuration file.
//
// Load reads a YAML file and Parse does the same for bytes. Both start from the defaults
// (Default), decode the file over them, validate the result, and report every problem they
// find in one pass, as Problems, each placed at its file and line:
//
//	config.yaml:12: unknown key "buket" in sink "archive" (type s3)
//	config.yaml:20: wal.when_full: "drop" is not one of block, drop_oldest
//
// # Strict decoding
//
// Every key must be known where it stands: a misspelt key, a key in the wrong section, an s3
// key on a cloudwatch sink or a key written twice in one mapping is a problem, never ignored.
// Every value must have its key's type: a word where a number is wanted, a size or duration
// that does not parse. A key that is absent takes its default; a key given a value keeps it,
// false, 0 and "" included; a key written with no value (null) keeps the default. Leaving out
// inputs enables both inputs with their defaults; writing it enables only the inputs it names,
// and "forward: {}" enables the forward input with its defaults. Anchors and aliases work;
// merge keys (<<) are not supported.
//
// # Environment variables
//
// ${env.NAME}, in any key or value, is replaced by the variable's value, once, when the file
// is loaded: the value is not expanded again. An unset variable is a problem; one set to "" is
// not, but for the secrets that turn authentication on (inputs.forward.shared_key,
// inputs.http.token), which it would turn off. ${NAME} with NAME in capitals (Fluent Bit's
// syntax) and #{ENV[...]} (Fluentd's) are problems that say to write ${env.NAME}. Expansion happens in the parsed values, not the raw text, so a value holding quotes,
// colons or newlines cannot change the structure of the file, and comments are not expanded.
// "$$" is left as it is for the templates that render names and keys later, which read it as
// a literal "$": $${env.NAME} stays $${env.NAME}. The other ${...} forms (${tag},
// ${record.a.b|default}, ${hostname}, ${seq}, ${uuid}) are templates and are left as they are.
//
// # Sizes and durations
//
// A Size is a whole number of bytes with an optional unit: B; KiB, MiB, GiB, TiB (powers of
// 1024); KB, MB, GB, TB (powers of 1000): "100B", "512KiB", "64MiB", "10GiB", "1GB". A plain
// integer is bytes. A Duration is written as Go writes durations: "500ms", "5s", "10m",
// "1h30m". Neither may be negative.
//
// # Tag globs
//
// A sink's match is one tag glob or a list of them; MatchTag says whether a tag matches. A
// glob's dot-separated parts are "*" (exactly one part), "**" (any number of parts, none
// included), a part with "*" in it (any run of characters within one part: "web-*"), or a
// literal part.
package config
