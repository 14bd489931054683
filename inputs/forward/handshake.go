package forward

import (
	"crypto/rand"
	"crypto/sha512"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/tinylib/msgp/msgp"

	"github.com/logfwd/forwarder/config"
)

// The forward protocol's handshake, when shared_key is set:
//
//	server → ["HELO", {"nonce": bin, "auth": bin salt or "", "keepalive": true}]
//	client → ["PING", client_hostname, shared_key_salt,
//	          sha512_hex(shared_key_salt + client_hostname + nonce + shared_key),
//	          username, sha512_hex(auth_salt + username + password)]
//	server → ["PONG", ok, reason, server_hostname,
//	          sha512_hex(shared_key_salt + server_hostname + nonce + shared_key)]
//
// A failed PING is answered with PONG false and a reason, then the
// connection is closed.
type handshake struct {
	sharedKey string
	users     []config.User
	hostname  string
	nonce     []byte
	authSalt  []byte // empty when no users are configured
	// clientHost is the hostname an accepted PING gave.
	clientHost string
}

func newHandshake(cfg config.Forward, hostname string) (*handshake, error) {
	h := &handshake{sharedKey: cfg.SharedKey, users: cfg.Users, hostname: hostname, nonce: make([]byte, 16)}
	if _, err := rand.Read(h.nonce); err != nil {
		return nil, fmt.Errorf("handshake nonce: %w", err)
	}
	if len(cfg.Users) > 0 {
		h.authSalt = make([]byte, 16)
		if _, err := rand.Read(h.authSalt); err != nil {
			return nil, fmt.Errorf("handshake salt: %w", err)
		}
	}
	return h, nil
}

func (h *handshake) helo() []byte {
	b := msgp.AppendArrayHeader(nil, 2)
	b = msgp.AppendString(b, "HELO")
	b = msgp.AppendMapHeader(b, 3)
	b = msgp.AppendString(b, "nonce")
	b = msgp.AppendBytes(b, h.nonce)
	b = msgp.AppendString(b, "auth")
	b = msgp.AppendBytes(b, h.authSalt)
	b = msgp.AppendString(b, "keepalive")
	return msgp.AppendBool(b, true)
}

func sha512Hex(parts ...[]byte) string {
	s := sha512.New()
	for _, p := range parts {
		s.Write(p)
	}
	return hex.EncodeToString(s.Sum(nil))
}

// ping checks a PING and returns the PONG to send and, when the client
// is refused, why (for the log; the client gets the same reason).
func (h *handshake) ping(msg []byte) (pong []byte, refused error) {
	fields, err := readPing(msg)
	if err != nil {
		return h.pong(false, "invalid ping message", nil), err
	}
	hostname, salt, digest, user, passDigest := fields[0], fields[1], fields[2], fields[3], fields[4]
	want := sha512Hex(salt, hostname, h.nonce, []byte(h.sharedKey))
	if subtle.ConstantTimeCompare([]byte(want), digest) != 1 {
		return h.pong(false, "shared_key mismatch", salt), fmt.Errorf("shared_key mismatch (client hostname %q)", hostname)
	}
	if len(h.users) > 0 {
		ok := false
		for _, u := range h.users {
			d := sha512Hex(h.authSalt, []byte(u.Username), []byte(u.Password))
			if subtle.ConstantTimeCompare([]byte(u.Username), user) == 1 && subtle.ConstantTimeCompare([]byte(d), passDigest) == 1 {
				ok = true
			}
		}
		if !ok {
			return h.pong(false, "username/password mismatch", salt), fmt.Errorf("username/password mismatch for user %q (client hostname %q)", user, hostname)
		}
	}
	h.clientHost = string(hostname)
	return h.pong(true, "", salt), nil
}

func (h *handshake) pong(ok bool, reason string, salt []byte) []byte {
	b := msgp.AppendArrayHeader(nil, 5)
	b = msgp.AppendString(b, "PONG")
	b = msgp.AppendBool(b, ok)
	b = msgp.AppendString(b, reason)
	b = msgp.AppendString(b, h.hostname)
	digest := ""
	if ok {
		digest = sha512Hex(salt, []byte(h.hostname), h.nonce, []byte(h.sharedKey))
	}
	return msgp.AppendString(b, digest)
}

// errNotPing is what comes in place of a PING when it is not even a
// msgpack array: another protocol (an HTTP request, a probe sending text)
// rather than a forward client with other credentials.
var errNotPing = errors.New("PING is not an array of 6 elements: not the forward protocol (an HTTP request, or another protocol's probe, on the forward port?)")

// readPing returns hostname, salt, digest, username and password digest.
func readPing(b []byte) ([5][]byte, error) {
	var f [5][]byte
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return f, errNotPing
	}
	kind, rest, kindErr := readStrOrBin(b)
	if n >= 2 && n <= 4 && (kindErr != nil || string(kind) != "PING") {
		// [tag, ...] in place of [PING, ...]: a forward message.
		return f, fmt.Errorf("expected the handshake's PING, got a message (an array of %d): shared_key is set here, so the client must have it set too (Fluent Bit: Shared_Key in its forward output; Fluentd: <security> shared_key)", n)
	}
	if n != 6 {
		return f, fmt.Errorf("PING is not an array of 6 elements")
	}
	if kindErr != nil || string(kind) != "PING" {
		return f, fmt.Errorf("expected PING, got %q", kind)
	}
	b = rest
	for i := range f {
		if f[i], b, err = readStrOrBin(b); err != nil {
			return f, fmt.Errorf("PING element %d: %w", i+1, err)
		}
	}
	return f, nil
}

func readStrOrBin(b []byte) ([]byte, []byte, error) {
	switch msgp.NextType(b) {
	case msgp.StrType:
		return msgp.ReadStringZC(b)
	case msgp.BinType:
		return msgp.ReadBytesZC(b)
	case msgp.NilType:
		rest, err := msgp.ReadNilBytes(b)
		return nil, rest, err
	}
	return nil, b, fmt.Errorf("a %s, want a string", msgp.NextType(b))
}
