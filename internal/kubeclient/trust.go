// Package kubeclient sets up the manager's and the agent's connection to the API server.
package kubeclient

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"sync"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/rest"
)

// TrustCAFileAtEachConnection returns cfg, or, when cfg trusts the API server through a CA file
// alone (in a pod, the ServiceAccount mount's ca.crt, which the kubelet rewrites when the cluster's
// kube-root-ca.crt changes), a copy whose every new TLS connection verifies the server against that
// file as it is at that moment. client-go reads such a file again at most every 5 minutes
// (transport/ca_rotation.go): once an API server serves a certificate of a new authority (a CA
// rotation re-issues it), its clients would refuse it for up to 5 minutes though their mount
// trusts it, and the manager would lose its Lease meanwhile.
func TrustCAFileAtEachConnection(cfg *rest.Config) (*rest.Config, error) {
	tc := cfg.TLSClientConfig
	if tc.CAFile == "" || len(tc.CAData) > 0 || tc.Insecure || cfg.Transport != nil || cfg.Dial != nil {
		return cfg, nil
	}
	serverName := tc.ServerName
	if serverName == "" {
		u, err := url.Parse(cfg.Host)
		if err != nil {
			return nil, fmt.Errorf("the API server's address %q: %w", cfg.Host, err)
		}
		if u.Hostname() == "" {
			// A bare host:port, as rest.InClusterConfig never writes but a kubeconfig may.
			if u, err = url.Parse("https://" + cfg.Host); err != nil || u.Hostname() == "" {
				return nil, fmt.Errorf("the API server's address %q names no host", cfg.Host)
			}
		}
		serverName = u.Hostname()
	}
	trust := &caFile{path: tc.CAFile}
	if _, err := trust.pool(); err != nil {
		return nil, err
	}
	tlsConfig, err := rest.TLSConfigFor(cfg)
	if err != nil {
		return nil, err
	}
	// VerifyConnection does what the handshake's own check would, against the file as it is now.
	tlsConfig.RootCAs = nil
	tlsConfig.InsecureSkipVerify = true
	tlsConfig.VerifyConnection = func(cs tls.ConnectionState) error { return trust.verify(cs, serverName) }

	proxy := http.ProxyFromEnvironment
	if cfg.Proxy != nil {
		proxy = cfg.Proxy
	}
	// client-go's own transport (transport/cache.go), with this TLS configuration.
	transport := utilnet.SetTransportDefaults(&http.Transport{
		Proxy:               proxy,
		TLSHandshakeTimeout: 10 * time.Second,
		TLSClientConfig:     tlsConfig,
		MaxIdleConnsPerHost: 25,
		DialContext:         (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		DisableCompression:  cfg.DisableCompression,
	})
	out := rest.CopyConfig(cfg)
	// The transport holds the TLS settings now; client-go refuses a transport beside its own.
	out.TLSClientConfig = rest.TLSClientConfig{}
	out.Transport = transport
	return out, nil
}

// caFile is a CA bundle file, read again at each connection; a file that cannot be read or holds
// no certificate (a write caught half done) leaves the last good one in use.
type caFile struct {
	path string

	mu   sync.Mutex
	data []byte
	last *x509.CertPool
}

func (f *caFile) pool() (*x509.CertPool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	data, err := os.ReadFile(f.path)
	if err == nil && f.last != nil && bytes.Equal(data, f.data) {
		return f.last, nil
	}
	if err == nil {
		p := x509.NewCertPool()
		if p.AppendCertsFromPEM(data) {
			f.data, f.last = data, p
			return p, nil
		}
		err = fmt.Errorf("%s holds no PEM certificate", f.path)
	}
	if f.last != nil {
		return f.last, nil
	}
	return nil, fmt.Errorf("the API server's CA file: %w", err)
}

// verify checks the server's chain against the file's authorities and its name, as crypto/tls
// does when it verifies by itself.
func (f *caFile) verify(cs tls.ConnectionState, serverName string) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("the API server presented no certificate")
	}
	roots, err := f.pool()
	if err != nil {
		return err
	}
	opts := x509.VerifyOptions{Roots: roots, DNSName: serverName, Intermediates: x509.NewCertPool()}
	for _, c := range cs.PeerCertificates[1:] {
		opts.Intermediates.AddCert(c)
	}
	if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
		return &tls.CertificateVerificationError{UnverifiedCertificates: cs.PeerCertificates, Err: err}
	}
	return nil
}
