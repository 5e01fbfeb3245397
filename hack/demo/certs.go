package main

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"time"
)

// certInfo is what the demo shows of a certificate.
type certInfo struct {
	serial    string
	notBefore time.Time
	notAfter  time.Time
}

// readCert reads the first certificate of a PEM file.
func readCert(path string) (certInfo, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return certInfo{}, fmt.Errorf("reading certificate: %w", err)
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		return certInfo{}, fmt.Errorf("%s holds no PEM certificate", path)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return certInfo{}, fmt.Errorf("parsing %s: %w", path, err)
	}
	return certInfo{serial: c.SerialNumber.Text(16), notBefore: c.NotBefore.UTC(), notAfter: c.NotAfter.UTC()}, nil
}

func (c certInfo) String() string {
	serial := c.serial
	if len(serial) > 12 {
		serial = serial[:12] + "…"
	}
	return fmt.Sprintf("notBefore %s  notAfter %s  serial %s", c.notBefore.Format(time.RFC3339), c.notAfter.Format(time.RFC3339), serial)
}
