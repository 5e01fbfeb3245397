package kubeclient

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// authority is a CA that issues serving certificates for the test's server.
type authority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newAuthority(t *testing.T, name string) *authority {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &authority{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// serving issues a serving certificate for ip.
func (a *authority) serving(t *testing.T, ip net.IP) *tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{ip}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// rotatingServer serves over TLS with whichever certificate serve holds at each handshake.
func rotatingServer(t *testing.T) (*httptest.Server, *atomic.Pointer[tls.Certificate]) {
	t.Helper()
	var serve atomic.Pointer[tls.Certificate]
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	// Not GetCertificate: without SNI (an IP address) the server would present httptest's own certificate.
	srv.TLS = &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		return &tls.Config{Certificates: []tls.Certificate{*serve.Load()}}, nil
	}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, &serve
}

// newClient builds the client once, to be held as the manager and the agent hold theirs: client-go's
// transport cache lets go of a transport no client holds (ClientsAllowTLSCacheGC), and a client built
// anew after a collection reads the CA file afresh, which would hide the 5 minutes.
func newClient(t *testing.T, cfg *rest.Config) *http.Client {
	t.Helper()
	c, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.Timeout = 5 * time.Second
	return c
}

func get(c *http.Client, host string) error {
	resp, err := c.Get(host + "/readyz")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return nil
}

// TestTrustCAFileAtEachConnection: the mount's ca.crt changes from the old CA to the old and the new
// (the kubelet rewrites it from kube-root-ca.crt), then the API server restarts serving a
// certificate of the new CA. A client of client-go's own set-up refuses it (it reads the file again
// only after 5 minutes); one set up by TrustCAFileAtEachConnection connects at once; neither trusts
// a server of an authority the file does not name, or a certificate for another name.
func TestTrustCAFileAtEachConnection(t *testing.T) {
	oldCA, newCA, otherCA := newAuthority(t, "old"), newAuthority(t, "new"), newAuthority(t, "other")
	srv, serve := rotatingServer(t)
	ip := srv.Listener.Addr().(*net.TCPAddr).IP
	serve.Store(oldCA.serving(t, ip))
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, oldCA.pem, 0o600); err != nil {
		t.Fatal(err)
	}
	base := &rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{CAFile: caFile}}
	reloading, err := TrustCAFileAtEachConnection(base)
	if err != nil {
		t.Fatal(err)
	}
	if reloading == base || reloading.Transport == nil {
		t.Fatal("a config trusting a CA file alone was left as it was")
	}
	clientGo, reloader := newClient(t, base), newClient(t, reloading)
	for name, c := range map[string]*http.Client{"client-go's": clientGo, "reloading": reloader} {
		if err := get(c, srv.URL); err != nil {
			t.Fatalf("%s client, the old CA serving: %v", name, err)
		}
	}

	// The kubelet rewrites the mount; the API server restarts on a certificate of the new CA.
	if err := os.WriteFile(caFile, append(append([]byte{}, oldCA.pem...), newCA.pem...), 0o600); err != nil {
		t.Fatal(err)
	}
	serve.Store(newCA.serving(t, ip))
	srv.CloseClientConnections()
	var unknown x509.UnknownAuthorityError
	if err := get(clientGo, srv.URL); !errors.As(err, &unknown) {
		t.Errorf("client-go's own client against the new CA's certificate: %v; want x509's unknown authority (it reads the file again only after 5 minutes)", err)
	}
	if err := get(reloader, srv.URL); err != nil {
		t.Errorf("the reloading client against the new CA's certificate, which its file now names: %v", err)
	}

	// Not trusted: an authority the file does not name, a name the certificate does not carry.
	serve.Store(otherCA.serving(t, ip))
	srv.CloseClientConnections()
	if err := get(reloader, srv.URL); !errors.As(err, &unknown) {
		t.Errorf("the reloading client against a certificate of an authority its file does not name: %v; want unknown authority", err)
	}
	serve.Store(newCA.serving(t, net.IPv4(192, 0, 2, 1)))
	srv.CloseClientConnections()
	var hostname x509.HostnameError
	if err := get(reloader, srv.URL); !errors.As(err, &hostname) {
		t.Errorf("the reloading client against a certificate for another address: %v; want a hostname error", err)
	}

	// A file caught half written keeps the last good authorities.
	serve.Store(newCA.serving(t, ip))
	srv.CloseClientConnections()
	if err := os.WriteFile(caFile, []byte("-----BEGIN CERT"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := get(reloader, srv.URL); err != nil {
		t.Errorf("the reloading client with a torn file: %v; want the last good authorities", err)
	}
}

// TestTrustCAFileAtEachConnectionLeavesOtherConfigs: embedded CA data, an insecure config or a
// transport of one's own are left as they are.
func TestTrustCAFileAtEachConnectionLeavesOtherConfigs(t *testing.T) {
	for name, cfg := range map[string]*rest.Config{
		"CA data":   {Host: "https://192.0.2.1", TLSClientConfig: rest.TLSClientConfig{CAData: []byte("x"), CAFile: "/nonexistent"}},
		"insecure":  {Host: "https://192.0.2.1", TLSClientConfig: rest.TLSClientConfig{Insecure: true}},
		"transport": {Host: "https://192.0.2.1", Transport: http.DefaultTransport},
		"no CA":     {Host: "https://192.0.2.1"},
	} {
		got, err := TrustCAFileAtEachConnection(cfg)
		if err != nil || got != cfg {
			t.Errorf("%s: changed (%v)", name, err)
		}
	}
	if _, err := TrustCAFileAtEachConnection(&rest.Config{Host: "https://192.0.2.1", TLSClientConfig: rest.TLSClientConfig{CAFile: "/nonexistent/ca.crt"}}); err == nil ||
		!strings.Contains(err.Error(), "/nonexistent/ca.crt") {
		t.Errorf("a missing CA file: %v, want an error naming it", err)
	}
}
