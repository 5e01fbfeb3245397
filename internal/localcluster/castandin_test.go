package localcluster

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/client-go/util/keyutil"

	"github.com/nodeops/nodeops/internal/testutil"
)

type testCA struct {
	cert *x509.Certificate
	key  crypto.Signer
}

func newTestCA(t *testing.T) testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "kubernetes"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return testCA{c, key}
}

func (ca testCA) serving(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := keyutil.MarshalPrivateKeyToPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), kd
}

func (ca testCA) files(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	kd, err := keyutil.MarshalPrivateKeyToPEM(ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw}), kd
}

func writeTestFiles(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	for name, data := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// testSAKey is a service-account key pair as kubeadm writes it: sa.key and sa.pub.
type testSAKey struct{ key, pub []byte }

func newTestSAKey(t *testing.T) testSAKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := keyutil.MarshalPrivateKeyToPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		t.Fatal(err)
	}
	return testSAKey{kd, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})}
}

func (k testSAKey) id(t *testing.T) string {
	t.Helper()
	pubs, err := keyutil.ParsePublicKeysPEM(k.pub)
	if err != nil {
		t.Fatal(err)
	}
	id, err := ServiceAccountKeyID(pubs[0])
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestFollowFirstControlPlane: the local API server and controller-manager files follow the first
// control plane's through a rotation with the service-account key, phase by phase: client CAs
// always include DIR/pki's; a serving certificate of the new CA verifies for clients trusting only
// the old or only the new; a changed root CA, signing CA or service-account private key asks for the
// controller-manager's restart (once); a new signing key, or a verification key dropped, the API
// server's (a verification key gained is written for its next restart), and a new signing key new
// tokens (its key ID); a manifest whose signing key its verification keys do not hold (between two
// writes) is not followed; after complete the API server verifies with the new key alone.
func TestFollowFirstControlPlane(t *testing.T) {
	dir := t.TempDir()
	l := clusterLayout{Dir: dir}
	root := filepath.Join(dir, "nodes", "cp-1")
	oldCA, newCA := newTestCA(t), newTestCA(t)
	oldCert, oldKey := oldCA.files(t)
	newCert, newKey := newCA.files(t)
	oldServing, oldServingKey := oldCA.serving(t)
	oldSA, newSA := newTestSAKey(t), newTestSAKey(t)
	writeTestFiles(t, dir, map[string][]byte{"pki/ca.crt": oldCert, "pki/ca.key": oldKey, "pki/apiserver.crt": oldServing, "pki/apiserver.key": oldServingKey,
		"pki/sa.key": oldSA.key, "pki/sa.pub": oldSA.pub})
	if err := writeFollowedPKI(l); err != nil {
		t.Fatal(err)
	}
	manifests := func(clientCA, rootCA, signing, saVerify string) {
		writeTestFiles(t, root, map[string][]byte{
			"etc/kubernetes/manifests/kube-apiserver.yaml": []byte("spec:\n  containers:\n  - command:\n    - kube-apiserver\n    - --client-ca-file=/etc/kubernetes/pki/" + clientCA +
				"\n    - --tls-cert-file=/etc/kubernetes/pki/apiserver.crt\n    - --tls-private-key-file=/etc/kubernetes/pki/apiserver.key" +
				"\n    - --service-account-key-file=/etc/kubernetes/pki/" + saVerify + "\n    - --service-account-signing-key-file=/etc/kubernetes/pki/sa.key\n"),
			"etc/kubernetes/manifests/kube-controller-manager.yaml": []byte("spec:\n  containers:\n  - command:\n    - --root-ca-file=/etc/kubernetes/pki/" + rootCA +
				"\n    - --cluster-signing-cert-file=/etc/kubernetes/pki/" + signing + ".crt\n    - --cluster-signing-key-file=/etc/kubernetes/pki/" + signing + ".key" +
				"\n    - --service-account-private-key-file=/etc/kubernetes/pki/sa.key\n"),
		})
	}
	sync := func(phase string, want followedChanges) {
		t.Helper()
		got, err := syncFollowedPKI(l, root)
		if err != nil || got != want {
			t.Fatalf("%s: %+v, %v; want %+v", phase, got, err, want)
		}
	}
	// Before a rotation: the same files, nothing to restart.
	writeTestFiles(t, root, map[string][]byte{"etc/kubernetes/pki/ca.crt": oldCert, "etc/kubernetes/pki/ca.key": oldKey,
		"etc/kubernetes/pki/apiserver.crt": oldServing, "etc/kubernetes/pki/apiserver.key": oldServingKey,
		"etc/kubernetes/pki/sa.key": oldSA.key, "etc/kubernetes/pki/sa.pub": oldSA.pub})
	manifests("ca.crt", "ca.crt", "ca", "sa.pub")
	sync("before a rotation", followedChanges{})

	// Trust-both: the bundle is the root CA and the client CAs; the controller-manager restarts once;
	// the API server's verification keys gain the new key, read at its next restart (nothing signs
	// with the new key before its signing key changes).
	writeTestFiles(t, root, map[string][]byte{"etc/kubernetes/pki/ca-bundle.crt": append(append([]byte(nil), oldCert...), newCert...),
		"etc/kubernetes/pki/sa-bundle.pub": append(append([]byte(nil), oldSA.pub...), newSA.pub...)})
	manifests("ca-bundle.crt", "ca-bundle.crt", "ca", "sa-bundle.pub")
	sync("trust-both", followedChanges{controllerManager: true})
	sync("trust-both again", followedChanges{})
	if got := mustRead(t, l.followedPKI(followed.saVerify)); got != string(oldSA.pub)+string(newSA.pub) {
		t.Errorf("trust-both: the API server does not verify with both service-account keys:\n%s", got)
	}

	// A manifest caught between two writes: a signing key its verification keys do not hold is not followed.
	writeTestFiles(t, root, map[string][]byte{"etc/kubernetes/pki/sa.key": newSA.key})
	manifests("ca-bundle.crt", "ca-bundle.crt", "ca", "sa.pub")
	if got, err := syncFollowedPKI(l, root); err == nil || got.apiServer || got.signingKeyID != "" {
		t.Fatalf("a signing key the API server would not verify: %+v, %v", got, err)
	}
	if got := mustRead(t, l.followedPKI(followed.saSigning)); got != string(oldSA.key) {
		t.Error("the signing key was followed though the verification keys lack it")
	}

	// Re-issue: the new authorities and service-account key replace the old; the bundles stay. The
	// API server restarts to sign with the new key (new tokens then carry its key ID), the
	// controller-manager to sign with the new CA and key.
	newServing, newServingKey := newCA.serving(t)
	writeTestFiles(t, root, map[string][]byte{"etc/kubernetes/pki/ca.crt": newCert, "etc/kubernetes/pki/ca.key": newKey,
		"etc/kubernetes/pki/apiserver.crt": newServing, "etc/kubernetes/pki/apiserver.key": newServingKey,
		"etc/kubernetes/pki/sa.key": newSA.key, "etc/kubernetes/pki/sa.pub": newSA.pub})
	manifests("ca-bundle.crt", "ca-bundle.crt", "ca", "sa-bundle.pub")
	sync("re-issue", followedChanges{apiServer: true, controllerManager: true, signingKeyID: newSA.id(t)})
	if got := mustRead(t, l.followedPKI(followed.saPrivate)); got != string(newSA.key) {
		t.Errorf("re-issue: the controller-manager does not sign with the new service-account key")
	}

	// Complete: the new CA alone, the new service-account key alone.
	manifests("ca.crt", "ca.crt", "ca", "sa.pub")
	sync("complete", followedChanges{apiServer: true, controllerManager: true})
	if got := mustRead(t, l.followedPKI(followed.saVerify)); got != string(newSA.pub) {
		t.Errorf("complete: the API server does not verify with the new service-account key alone:\n%s", got)
	}
	clientCAs, err := parseCertificates([]byte(mustRead(t, l.followedPKI(followed.clientCA))))
	if err != nil || len(clientCAs) != 2 || !clientCAs[0].Equal(oldCA.cert) || !clientCAs[1].Equal(newCA.cert) {
		t.Errorf("client CAs: %d, %v; want the old and the new", len(clientCAs), err)
	}
	pair, err := tls.LoadX509KeyPair(l.followedPKI(followed.servingCert), l.followedPKI(followed.servingKey))
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	inter := x509.NewCertPool()
	for _, der := range pair.Certificate[1:] {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		inter.AddCert(c)
	}
	for name, ca := range map[string]*x509.Certificate{"old": oldCA.cert, "new": newCA.cert} {
		roots := x509.NewCertPool()
		roots.AddCert(ca)
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: "127.0.0.1"}); err != nil {
			t.Errorf("a client trusting only the %s CA refuses the served certificate: %v", name, err)
		}
	}
	if got := mustRead(t, l.followedPKI(followed.rootCA)); got != string(newCert) {
		t.Errorf("root CA is not the new CA alone")
	}
	if got := mustRead(t, l.followedPKI(followed.signingKey)); got != string(newKey) {
		t.Errorf("signing key is not the new CA's")
	}
}

func mustRead(t *testing.T, p string) string {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// TestSupervisorRestartIsImmediate: restart starts a young child again at once, not after the 5 s
// back-off of a crash, so the controller-manager the CA stand-in restarts signs again within a second.
func TestSupervisorRestartIsImmediate(t *testing.T) {
	dir := t.TempDir()
	s := newSupervisor(dir, t.Logf)
	defer s.stopAll(5 * time.Second)
	if err := s.start("sleeper", "/bin/busybox", "sleep", "300"); err != nil {
		t.Fatal(err)
	}
	s.setKeepAlive()
	procs, _ := ReadProcesses(dir)
	first := procs["sleeper"]
	s.restart("sleeper")
	testutil.EventuallyEvery(t, 3*time.Second, 20*time.Millisecond, "sleeper started again within 3s (a crash waits 5s)", func(context.Context) error {
		procs, _ = ReadProcesses(dir)
		if pid := procs["sleeper"]; pid == 0 || pid == first {
			return fmt.Errorf("process table %v", procs)
		}
		return nil
	})
}
