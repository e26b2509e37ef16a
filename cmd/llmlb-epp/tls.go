package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// tlsConfig returns the ext_proc server's TLS configuration: the key pair in
// dir (tls.crt, tls.key), reloaded when either file changes, or a
// self-signed certificate when dir is "", as the reference EPP serves by
// default (cmd/epp and pkg/epp/server/runserver.go, v1.5.0: gateways
// connect with TLS and do not verify the certificate).
func tlsConfig(dir string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}
	if dir == "" {
		cert, err := selfSigned(time.Now())
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{cert}
		return cfg, nil
	}
	r := &certReloader{crt: filepath.Join(dir, "tls.crt"), key: filepath.Join(dir, "tls.key")}
	if _, err := r.get(); err != nil {
		return nil, err
	}
	cfg.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return r.get() }
	return cfg, nil
}

// certReloader loads a key pair and loads it again when a file's size or
// modification time changes (a Kubernetes Secret volume swaps both files).
type certReloader struct {
	crt, key string

	mu    sync.Mutex // protects the fields below
	cert  *tls.Certificate
	stamp string
}

func (r *certReloader) get() (*tls.Certificate, error) {
	stamp, err := fileStamp(r.crt, r.key)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		if r.cert != nil {
			return r.cert, nil // keep serving the last good pair during a swap
		}
		return nil, err
	}
	if r.cert != nil && stamp == r.stamp {
		return r.cert, nil
	}
	cert, err := tls.LoadX509KeyPair(r.crt, r.key)
	if err != nil {
		if r.cert != nil {
			return r.cert, nil
		}
		return nil, fmt.Errorf("key pair %s, %s: %w", r.crt, r.key, err)
	}
	r.cert, r.stamp = &cert, stamp
	return r.cert, nil
}

func fileStamp(paths ...string) (string, error) {
	s := ""
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return "", err
		}
		s += fmt.Sprintf("%d/%d;", fi.Size(), fi.ModTime().UnixNano())
	}
	return s, nil
}

// selfSigned returns a fresh ECDSA P-256 certificate valid for a year.
func selfSigned(now time.Time) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"llmlb"}, CommonName: "llmlb-epp"},
		DNSNames:              []string{"llmlb-epp", "localhost"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
