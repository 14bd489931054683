package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// ServerConfig loads the certificate, its key and the client CA file (when
// given: clients must then present a certificate it signed) into a server's
// TLS configuration, TLS 1.2 at least. The inputs call it when they start,
// and `forwarder check` too, so that a file missing or not readable is
// found before the service runs.
func (t TLS) ServerConfig() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("load certificate %s and key %s: %w", t.CertFile, t.KeyFile, err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if t.ClientCAFile != "" {
		pem, err := os.ReadFile(t.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("read client CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("no certificate in client CA file %s", t.ClientCAFile)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// ServerConfig is TLS.ServerConfig without client certificates.
func (t HTTPTLS) ServerConfig() (*tls.Config, error) {
	return TLS{CertFile: t.CertFile, KeyFile: t.KeyFile}.ServerConfig()
}
