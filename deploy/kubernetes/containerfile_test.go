package kubernetes

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// containerfile is what the tests read from deploy/container/Containerfile: the settings the
// manifests must agree with, and the files the image must hold.
type containerfile struct {
	uid, gid   int               // USER, numeric
	volumes    []string          // VOLUME
	exposed    []string          // EXPOSE, as "24224/tcp"
	entrypoint []string          // ENTRYPOINT, exec form
	copies     map[string]string // COPY: destination -> source in the build directory
	chowned    map[string]string // COPY --chown: destination -> owner
}

// parseContainerfile reads the instructions the forwarder's Containerfile uses. Any other
// instruction, a shell-form ENTRYPOINT or VOLUME, or a user that is not numeric is an
// error, so that the checks built on it cannot pass on something they do not understand.
func parseContainerfile(path string) (*containerfile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read containerfile: %w", err)
	}
	cf := &containerfile{uid: -1, gid: -1, copies: map[string]string{}, chowned: map[string]string{}}
	var logical []string
	var cur strings.Builder
	for _, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if strings.HasSuffix(trimmed, `\`) {
			cur.WriteString(strings.TrimSuffix(trimmed, `\`) + " ")
			continue
		}
		cur.WriteString(trimmed)
		logical = append(logical, cur.String())
		cur.Reset()
	}
	for _, l := range logical {
		instr, rest, _ := strings.Cut(l, " ")
		rest = strings.TrimSpace(rest)
		switch strings.ToUpper(instr) {
		case "FROM":
			if rest != "scratch" && !strings.HasPrefix(rest, "gcr.io/distroless/static") {
				return nil, fmt.Errorf("%s: FROM %s: want scratch or distroless static", path, rest)
			}
		case "ARG", "LABEL":
		case "COPY":
			args := strings.Fields(rest)
			owner := ""
			for len(args) > 0 && strings.HasPrefix(args[0], "--") {
				if v, ok := strings.CutPrefix(args[0], "--chown="); ok {
					owner = v
				} else {
					return nil, fmt.Errorf("%s: COPY option %s not understood", path, args[0])
				}
				args = args[1:]
			}
			if len(args) != 2 {
				return nil, fmt.Errorf("%s: COPY %s: want one source and one destination", path, rest)
			}
			cf.copies[args[1]] = args[0]
			if owner != "" {
				cf.chowned[args[1]] = owner
			}
		case "USER":
			u, g, ok := strings.Cut(rest, ":")
			uid, err1 := strconv.Atoi(u)
			gid, err2 := strconv.Atoi(g)
			if !ok || err1 != nil || err2 != nil {
				return nil, fmt.Errorf("%s: USER %s: want numeric UID:GID", path, rest)
			}
			cf.uid, cf.gid = uid, gid
		case "VOLUME":
			if err := json.Unmarshal([]byte(rest), &cf.volumes); err != nil {
				return nil, fmt.Errorf("%s: VOLUME %s: want the JSON form: %w", path, rest, err)
			}
		case "EXPOSE":
			cf.exposed = append(cf.exposed, strings.Fields(rest)...)
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(rest), &cf.entrypoint); err != nil {
				return nil, fmt.Errorf("%s: ENTRYPOINT %s: want the exec (JSON) form: %w", path, rest, err)
			}
		default:
			return nil, fmt.Errorf("%s: instruction %s not understood by this test", path, instr)
		}
	}
	if cf.uid < 0 || len(cf.entrypoint) == 0 {
		return nil, fmt.Errorf("%s: no USER or no ENTRYPOINT", path)
	}
	return cf, nil
}

// configPath is the file the entrypoint's -c names.
func (cf *containerfile) configPath() string {
	for i, a := range cf.entrypoint {
		if a == "-c" && i+1 < len(cf.entrypoint) {
			return cf.entrypoint[i+1]
		}
		if v, ok := strings.CutPrefix(a, "-c="); ok {
			return v
		}
	}
	return ""
}
