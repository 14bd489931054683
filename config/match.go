package config

import "strings"

// MatchTag reports whether tag matches any of the globs. Tags and globs are made of parts
// separated by dots. In a glob, "*" matches exactly one part, "**" matches any number of parts
// (none included: "pod.**" matches "pod"), a "*" within a part matches any run of characters
// in that part ("pod.web-*" matches "pod.web-1"), and any other part matches itself.
func MatchTag(globs []string, tag string) bool {
	parts := strings.Split(tag, ".")
	for _, glob := range globs {
		if matchParts(strings.Split(glob, "."), parts) {
			return true
		}
	}
	return false
}

func matchParts(glob, parts []string) bool {
	for len(glob) > 0 {
		if glob[0] == "**" {
			for len(glob) > 0 && glob[0] == "**" {
				glob = glob[1:]
			}
			for i := 0; i <= len(parts); i++ {
				if matchParts(glob, parts[i:]) {
					return true
				}
			}
			return false
		}
		if len(parts) == 0 || !matchPart(glob[0], parts[0]) {
			return false
		}
		glob, parts = glob[1:], parts[1:]
	}
	return len(parts) == 0
}

// matchPart matches one part against a glob part in which "*" stands for any run of characters.
func matchPart(glob, part string) bool {
	literals := strings.Split(glob, "*")
	if len(literals) == 1 {
		return glob == part
	}
	first, last := literals[0], literals[len(literals)-1]
	if !strings.HasPrefix(part, first) {
		return false
	}
	part = part[len(first):]
	for _, lit := range literals[1 : len(literals)-1] {
		i := strings.Index(part, lit)
		if i < 0 {
			return false
		}
		part = part[i+len(lit):]
	}
	return strings.HasSuffix(part, last)
}
