package framework

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/nodeops/nodeops/internal/host"
)

// FileSHA256 is the hex sha256 of a file, as a binary source's .sha256 files carry it; it fails t
// when the file cannot be read.
func FileSHA256(t testing.TB, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return SHA256(t, f)
}

// SHA256 is the hex sha256 of what r holds; it fails t when r cannot be read.
func SHA256(t testing.TB, r io.Reader) string {
	t.Helper()
	h := sha256.New()
	if _, err := io.Copy(h, r); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// ReadFile is a file's content; it fails t when the file cannot be read.
func ReadFile(t testing.TB, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return string(data)
}

// ServiceLog is the local service table of a node root (host.LocalServices), empty before the first
// restart.
func ServiceLog(t testing.TB, root string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, host.LocalServiceLog))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return string(data)
}

// Restarts counts the restarts of service recorded in a node root's local service table.
func Restarts(t testing.TB, root, service string) int {
	t.Helper()
	n := 0
	for _, line := range strings.Split(ServiceLog(t, root), "\n") {
		if strings.HasPrefix(line, "restart "+service+" ") {
			n++
		}
	}
	return n
}

// HTTPGet is the body of a GET of url, closed when the test ends; it fails t unless the answer is 200 OK.
func HTTPGet(t testing.TB, url string) io.ReadCloser {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp.Body
}

// HTTPGetText is the body of a GET of url without surrounding white space (a .sha256 file's digest).
func HTTPGetText(t testing.TB, url string) string {
	t.Helper()
	body, err := io.ReadAll(HTTPGet(t, url))
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return strings.TrimSpace(string(body))
}

// ParseCertificate parses the first PEM certificate in data, read from path; it fails t when there is none.
func ParseCertificate(t testing.TB, path string, data []byte) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("%s: no PEM certificate", path)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c
}

// KubeconfigClientCertificate is the embedded client certificate of a kubeconfig with one user, as
// kubeadm writes them (admin.conf, kubelet.conf, ...).
func KubeconfigClientCertificate(t testing.TB, path string) *x509.Certificate {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatalf("loading %s: %v", path, err)
	}
	if len(cfg.AuthInfos) != 1 {
		t.Fatalf("%s has %d users", path, len(cfg.AuthInfos))
	}
	var cert *x509.Certificate
	for _, a := range cfg.AuthInfos {
		cert = ParseCertificate(t, path, a.ClientCertificateData)
	}
	return cert
}
