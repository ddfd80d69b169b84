package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// selfSignedCert makes a throwaway P-256 certificate for 127.0.0.1 and localhost that is its
// own CA, and writes it as PEM to caPath for the proxies' -ca-file. The PEM is written to a temp
// file and renamed, so a reader polling for caPath never sees half a certificate.
func selfSignedCert(caPath string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "sidecar-fsm bench origin"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		DNSNames:              []string{"localhost"},
		// 0.0.0.0: bench/egress.py names the upstream so, an address Go does not count as
		// loopback (so HTTPS_PROXY applies) that Linux connects to the local host.
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1"), net.ParseIP("0.0.0.0")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	tmp, err := os.CreateTemp(filepath.Dir(caPath), ".ca-*.pem")
	if err != nil {
		return tls.Certificate{}, err
	}
	if _, err := tmp.Write(certPEM); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return tls.Certificate{}, err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return tls.Certificate{}, err
	}
	if err := os.Rename(tmp.Name(), caPath); err != nil {
		os.Remove(tmp.Name())
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
