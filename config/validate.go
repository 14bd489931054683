package config

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Validate checks c against the rules of each section and returns every problem found, as
// Problems, or nil. Load and Parse call it; call it again after changing a Config in code.
// Problems are placed at the lines the keys came from, when c came from a file.
func (c *Config) Validate() error {
	ck := newChecker(c.file, c.pos)
	c.validate(ck)
	return ck.err()
}

func (c *Config) validate(ck *checker) {
	top := section{ck, scope{}}
	top.required("data_dir", c.DataDir)
	c.Log.validate(top.child("log"))
	if c.ShutdownTimeout <= 0 {
		top.invalid("shutdown_timeout", "must be greater than 0, not %s", c.ShutdownTimeout)
	}
	atLeast(top, "memory_limit", c.MemoryLimit, 32*MiB)
	c.WAL.validate(top.child("wal"))
	c.Inputs.validate(top.child("inputs"))
	c.Admin.validate(top.child("admin"))
	c.validateListeners(top)
	validateSinks(top, c.Sinks)
	c.validateDropCursors(top.child("wal"))
}

// validateDropCursors refuses to drop the cursor of a configured sink: it would start
// over at the oldest record at every start, delivering again what it had delivered.
func (c *Config) validateDropCursors(s section) {
	for i, name := range c.WAL.DropCursors {
		key := fmt.Sprintf("drop_cursors[%d]", i)
		switch {
		case name == "":
			s.invalid(key, "is empty: name the cursor of a removed sink (forwarder wal stats lists the cursors)")
		case slices.ContainsFunc(c.Sinks, func(sk Sink) bool { return sk.Name == name }):
			s.invalid(key, "%q is a configured sink: dropping its cursor at every start would deliver again what it has delivered; list only sinks removed from sinks", name)
		}
	}
}

func (l *Log) validate(s section) {
	s.oneOf("level", l.Level, LevelDebug, LevelInfo, LevelWarn, LevelError)
	s.oneOf("format", l.Format, FormatText, FormatJSON)
}

func (w *WAL) validate(s section) {
	atLeast(s, "max_bytes", w.MaxBytes, MiB)
	atLeast(s, "min_free_bytes", w.MinFreeBytes, MiB)
	s.oneOf("when_full", w.WhenFull, WhenFullBlock, WhenFullDropOldest)
	s.oneOf("sync", w.Sync, SyncAlways, SyncInterval)
	s.positive("dedup_window", w.DedupWindow) // re-sent chunks would be stored twice
}

func (in *Inputs) validate(s section) {
	if in.Forward != nil {
		in.Forward.validate(s.child("forward"))
	}
	if in.HTTP != nil {
		in.HTTP.validate(s.child("http"))
	}
}

func (f *Forward) validate(s section) {
	s.listen("listen", f.Listen)
	s.notEmptyEnv("shared_key", f.SharedKey)
	if len(f.Users) > 0 && f.SharedKey == "" {
		s.invalid("users", "need shared_key: users are checked in the handshake it enables")
	}
	for i := range f.Users {
		user := s.child(fmt.Sprintf("users[%d]", i))
		user.required("username", f.Users[i].Username)
		user.required("password", f.Users[i].Password)
	}
	tls := s.child("tls")
	tls.certAndKey(f.TLS.CertFile, f.TLS.KeyFile)
	if f.TLS.ClientCAFile != "" && f.TLS.CertFile == "" && !s.c.failed[tls.keyPath("cert_file")] {
		tls.invalid("client_ca_file", "needs cert_file and key_file")
	}
	atLeast(s, "max_message_bytes", f.MaxMessageBytes, 1)
	atLeast(s, "max_connections", f.MaxConnections, 1)
	s.positive("handshake_timeout", f.HandshakeTimeout)
	atLeast(s, "max_records_per_message", f.MaxRecordsPerMessage, 1)
	if f.SelfHostname != "" {
		switch {
		case f.SharedKey == "":
			s.invalid("self_hostname", "needs shared_key: it is the name the handshake it enables gives")
		case len(f.SelfHostname) > 255 || !utf8.ValidString(f.SelfHostname) || strings.ContainsFunc(f.SelfHostname, unicode.IsControl):
			s.invalid("self_hostname", "at most 255 bytes of valid UTF-8 without control characters")
		}
	}
}

func (h *HTTP) validate(s section) {
	s.listen("listen", h.Listen)
	s.notEmptyEnv("token", h.Token)
	if h.Token != strings.TrimSpace(h.Token) {
		// HTTP trims header values: no request could carry it.
		s.invalid("token", "begins or ends with white space (a newline left by the file or Secret it came from?): no request's Authorization header can carry it, so every request would be refused; remove it")
	}
	s.child("tls").certAndKey(h.TLS.CertFile, h.TLS.KeyFile)
	atLeast(s, "max_body_bytes", h.MaxBodyBytes, 1)
	atLeast(s, "max_connections", h.MaxConnections, 1)
	s.positive("read_header_timeout", h.ReadHeaderTimeout)
	atLeast(s, "max_records_per_request", h.MaxRecordsPerRequest, 1)
}

func (a *Admin) validate(s section) {
	s.listen("listen", a.Listen)
}

// validateListeners reports two servers given the same port on overlapping addresses.
func (c *Config) validateListeners(top section) {
	type listener struct{ path, addr string }
	var ls []listener
	if c.Inputs.Forward != nil {
		ls = append(ls, listener{"inputs.forward.listen", c.Inputs.Forward.Listen})
	}
	if c.Inputs.HTTP != nil {
		ls = append(ls, listener{"inputs.http.listen", c.Inputs.HTTP.Listen})
	}
	ls = append(ls, listener{"admin.listen", c.Admin.Listen})
	for i, l := range ls {
		for _, earlier := range ls[:i] {
			if sameListener(l.addr, earlier.addr) {
				top.at(l.path, "%s: %s is also %s", l.path, l.addr, earlier.path)
				break
			}
		}
	}
}

// sameListener reports whether two host:port addresses would take the same port.
func sameListener(a, b string) bool {
	hostA, portA, errA := net.SplitHostPort(a)
	hostB, portB, errB := net.SplitHostPort(b)
	if errA != nil || errB != nil || portA != portB || portA == "0" {
		return false
	}
	anyHost := func(h string) bool { return h == "" || h == "0.0.0.0" || h == "::" }
	// localhost is 127.0.0.1 to the listener (Go resolves it so), however written.
	canon := func(h string) string {
		if h == "localhost" {
			return "127.0.0.1"
		}
		if ip := net.ParseIP(h); ip != nil {
			return ip.String()
		}
		return h
	}
	return canon(hostA) == canon(hostB) || anyHost(hostA) || anyHost(hostB)
}

// section validates the keys of one mapping, placing and naming problems by its scope.
type section struct {
	c *checker
	scope
}

func (s section) child(key string) section { return section{s.c, s.scope.child(key)} }

// name is a key's name in messages: "wal.sync", `sink "archive": bucket`.
func (s section) name(key string) string { return s.label + key }

// at reports a problem about key, with the message as given.
func (s section) at(key, format string, args ...any) { s.c.at(s.keyPath(key), format, args...) }

// invalid reports a problem with key's value: "name: message".
func (s section) invalid(key, format string, args ...any) {
	s.at(key, "%s: %s", s.name(key), fmt.Sprintf(format, args...))
}

// notEmptyEnv reports a secret whose ${env.NAME} references gave an empty value: a variable
// set but empty would otherwise turn the authentication off without a word.
func (s section) notEmptyEnv(key, value string) {
	if value != "" {
		return
	}
	p, ok := s.c.pos[s.keyPath(key)]
	if !ok {
		return
	}
	if ref, ok := s.c.emptyEnv[p]; ok {
		s.invalid(key, "%s gives an empty value (the environment variable is set but empty): set it, or remove %s to go without", ref, key)
	}
}

func (s section) required(key, value string) {
	if value == "" {
		s.at(key, "%s is required", s.name(key))
	}
}

func (s section) oneOf(key, value string, allowed ...string) {
	if slices.Contains(allowed, value) {
		return
	}
	shown := make([]string, len(allowed))
	for i, a := range allowed {
		shown[i] = a
		if a == "" {
			shown[i] = `""`
		}
	}
	s.invalid(key, "%q is not one of %s", value, strings.Join(shown, ", "))
}

// atLeast reports a number or size below min.
func atLeast[N ~int | ~int64](s section, key string, value, min N) {
	if value < min {
		s.invalid(key, "must be at least %v, not %v", min, value)
	}
}

func (s section) between(key string, value, min, max int) {
	if value < min || value > max {
		s.invalid(key, "must be %d to %d, not %d", min, max, value)
	}
}

func (s section) positive(key string, d Duration) {
	if d <= 0 {
		s.invalid(key, "must be greater than 0, not %s", d)
	}
}

// listen checks a listen address: host:port, the port a number (0 picks a free one).
func (s section) listen(key, addr string) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		s.invalid(key, "%q is not host:port", addr)
		return
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		s.invalid(key, "port %q is not a number from 0 to 65535", port)
	}
}

// endpoint checks a service endpoint: empty (AWS's own), or an http or https URL with a
// host, which the SDK needs (a bare host:port fails every call as it is made).
func (s section) endpoint(key, v string) {
	if v == "" {
		return
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		s.invalid(key, "%q is not an http:// or https:// URL with a host (such as https://logs.eu-west-1.amazonaws.com or http://127.0.0.1:4566)", v)
	}
}

// certAndKey checks that a TLS certificate and its key are given together.
func (s section) certAndKey(cert, key string) {
	switch { // a file named by an unset ${env.NAME} was reported already
	case cert != "" && key == "" && !s.c.failed[s.keyPath("key_file")]:
		s.at("cert_file", "%s: cert_file needs key_file", s.desc)
	case cert == "" && key != "" && !s.c.failed[s.keyPath("cert_file")]:
		s.at("key_file", "%s: key_file needs cert_file", s.desc)
	}
}
