package main

import (
	"net"

	"github.com/logfwd/forwarder/config"
)

// warning is a setting that works but leaves something open that an operator should
// know about: run logs it at start, check prints it.
type warning struct {
	msg     string
	address string // the listener it is about, if any
}

// text is the warning with its address, for check.
func (w warning) text() string {
	if w.address == "" {
		return w.msg
	}
	return w.msg + " (address " + w.address + ")"
}

// configWarnings lists what cfg leaves open to other machines: an input they can reach
// without authentication, an input they can reach without TLS (whatever authenticates
// its clients, records and secrets then cross the network in clear), and Go's profiles on
// an admin listener they can reach.
func configWarnings(cfg *config.Config) []warning {
	var ws []warning
	if c := cfg.Inputs.Forward; c != nil && !loopback(c.Listen) {
		if c.SharedKey == "" && c.TLS.ClientCAFile == "" {
			ws = append(ws, warning{"the forward input accepts records from anyone who can reach it: set inputs.forward.shared_key (the handshake) or tls.client_ca_file, or listen on a loopback address", c.Listen})
		}
		if !c.TLS.Enabled() {
			ws = append(ws, warning{"the forward input has no TLS: records, and the handshake that authenticates clients, cross the network in clear for anyone on the path to read or replay; set inputs.forward.tls.cert_file and key_file, or listen on a loopback address", c.Listen})
		}
	}
	if c := cfg.Inputs.HTTP; c != nil && !loopback(c.Listen) {
		if c.Token == "" {
			ws = append(ws, warning{"the HTTP input accepts records from anyone who can reach it: set inputs.http.token, or listen on a loopback address", c.Listen})
		}
		if !c.TLS.Enabled() {
			ws = append(ws, warning{"the HTTP input has no TLS: records and the bearer token cross the network in clear for anyone on the path to read and reuse; set inputs.http.tls.cert_file and key_file, or listen on a loopback address", c.Listen})
		}
	}
	if cfg.Admin.Pprof && !loopback(cfg.Admin.Listen) {
		ws = append(ws, warning{"admin.pprof serves Go's profiles to anyone who can reach the admin listener: listen on a loopback address, or turn admin.pprof off", cfg.Admin.Listen})
	}
	return ws
}

// loopback reports whether a listen address is reachable from this machine only.
func loopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
