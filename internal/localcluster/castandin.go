package localcluster

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/util/keyutil"
)

// FollowedPKIDir is where nodeops-local keeps the files its one kube-apiserver and
// kube-controller-manager read in place of the first control plane's (see followFirstControlPlane).
const FollowedPKIDir = "pki-followed"

// followed names the files of DIR/pki-followed the local control plane processes are started with.
var followed = struct{ clientCA, servingCert, servingKey, rootCA, signingCert, signingKey string }{
	"client-ca.crt", "apiserver.crt", "apiserver.key", "root-ca.crt", "signing-ca.crt", "signing-ca.key",
}

func (l clusterLayout) followedPKI(name string) string {
	return filepath.Join(l.Dir, FollowedPKIDir, name)
}

// writeFollowedPKI starts DIR/pki-followed as the cluster PKI: before a certificate authority
// rotation the first control plane's files are the same CAs and the stand-in serves DIR/pki's own
// apiserver certificate.
func writeFollowedPKI(l clusterLayout) error {
	if err := os.MkdirAll(filepath.Join(l.Dir, FollowedPKIDir), 0o700); err != nil {
		return err
	}
	for dst, src := range map[string]string{
		followed.clientCA: "ca.crt", followed.servingCert: "apiserver.crt", followed.servingKey: "apiserver.key",
		followed.rootCA: "ca.crt", followed.signingCert: "ca.crt", followed.signingKey: "ca.key",
	} {
		if err := copyFile(l.pki(src), l.followedPKI(dst), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// followFirstControlPlane is the local stand-in for the control plane components of a certificate
// authority rotation. nodeops-local runs one kube-apiserver and one kube-controller-manager for all its
// control planes, from DIR/pki; a real control plane's static pods read the files their manifests name
// in its root. Five times a second it reads the first control plane's manifests and makes the local
// processes use what that control plane's pods would:
//   - kube-apiserver (which reloads these files itself): as client CAs, DIR/pki's CA and every CA of the
//     manifest's --client-ca-file (so nodeops-local's own kubeconfig, issued by the first CA, keeps
//     working); as serving certificate, DIR/pki's while the manifest's --tls-cert-file is issued by
//     DIR/pki's CA, else that certificate with its issuer cross-signed by DIR/pki's CA, so clients
//     trusting the old CA, the new, or both, all verify it;
//   - kube-controller-manager (restarted when they change, as the kubelet restarts its static pod):
//     the contents of the manifest's --root-ca-file (what it publishes in every namespace's
//     kube-root-ca.crt) and --cluster-signing-cert-file/--cluster-signing-key-file (what it signs the
//     kubelets' certificates with).
//
// etcd and the API server's etcd client keep DIR/pki's etcd CA.
func followFirstControlPlane(ctx context.Context, l clusterLayout, root string, sup *supervisor, logf func(string, ...any)) {
	// Often: the controller-manager signs the workers' certificates with the old CA until it is
	// restarted, and a rotation's next group may start within a second of the control planes'.
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	var last string
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		restart, err := syncFollowedPKI(l, root)
		if err != nil {
			if msg := err.Error(); msg != last {
				logf("following the first control plane's certificate authorities: %v", err)
				last = msg
			}
			continue
		}
		last = ""
		if restart {
			logf("restarting kube-controller-manager on the first control plane's --root-ca-file and signing CA (the local stand-in for its static pod)")
			sup.restart("kube-controller-manager")
		}
	}
}

// syncFollowedPKI writes DIR/pki-followed from the first control plane's root; restart says the
// controller-manager's files changed.
func syncFollowedPKI(l clusterLayout, root string) (restart bool, err error) {
	apiserver, err := manifestFlags(filepath.Join(root, "etc/kubernetes/manifests/kube-apiserver.yaml"))
	if err != nil {
		return false, err
	}
	kcm, err := manifestFlags(filepath.Join(root, "etc/kubernetes/manifests/kube-controller-manager.yaml"))
	if err != nil {
		return false, err
	}
	read := func(flags map[string]string, flag string) ([]byte, error) {
		p, ok := flags[flag]
		if !ok {
			return nil, fmt.Errorf("no %s in the manifest", flag)
		}
		return os.ReadFile(filepath.Join(root, p))
	}
	oldCAPEM, err := os.ReadFile(l.pki("ca.crt"))
	if err != nil {
		return false, err
	}
	oldCA, err := parseCertificates(oldCAPEM)
	if err != nil {
		return false, fmt.Errorf("DIR/pki/ca.crt: %w", err)
	}
	if len(oldCA) != 1 {
		return false, fmt.Errorf("DIR/pki/ca.crt: %d certificates, want 1", len(oldCA))
	}
	clientCAPEM, err := read(apiserver, "--client-ca-file")
	if err != nil {
		return false, err
	}
	clientCAs, err := parseCertificates(clientCAPEM)
	if err != nil {
		return false, fmt.Errorf("--client-ca-file: %w", err)
	}
	if err := writeIfChanged(l.followedPKI(followed.clientCA), certificatesPEM(append(oldCA, clientCAs...))); err != nil {
		return false, err
	}

	leafPEM, err := read(apiserver, "--tls-cert-file")
	if err != nil {
		return false, err
	}
	keyPEM, err := read(apiserver, "--tls-private-key-file")
	if err != nil {
		return false, err
	}
	if err := followServing(l, oldCA[0], clientCAs, leafPEM, keyPEM); err != nil {
		return false, err
	}

	rootCA, err := read(kcm, "--root-ca-file")
	if err != nil {
		return false, err
	}
	signingCert, err := read(kcm, "--cluster-signing-cert-file")
	if err != nil {
		return false, err
	}
	signingKey, err := read(kcm, "--cluster-signing-key-file")
	if err != nil {
		return false, err
	}
	if _, err := tls.X509KeyPair(signingCert, signingKey); err != nil {
		return false, fmt.Errorf("--cluster-signing-cert-file and -key-file do not match (yet): %w", err)
	}
	for name, data := range map[string][]byte{followed.rootCA: rootCA, followed.signingCert: signingCert, followed.signingKey: signingKey} {
		cur, err := os.ReadFile(l.followedPKI(name))
		if err != nil {
			return false, err
		}
		if !bytes.Equal(cur, data) {
			restart = true
			if err := writeFileAtomic(l.followedPKI(name), data, 0o600); err != nil {
				return false, err
			}
		}
	}
	return restart, nil
}

// followServing serves the control plane's own certificate once a CA other than DIR/pki's issued it.
func followServing(l clusterLayout, oldCA *x509.Certificate, cas []*x509.Certificate, leafPEM, keyPEM []byte) error {
	if _, err := tls.X509KeyPair(leafPEM, keyPEM); err != nil {
		return fmt.Errorf("--tls-cert-file and --tls-private-key-file do not match (yet): %w", err)
	}
	leaves, err := parseCertificates(leafPEM)
	if err != nil {
		return fmt.Errorf("--tls-cert-file: %w", err)
	}
	if len(leaves) == 0 {
		return errors.New("--tls-cert-file holds no certificate")
	}
	leaf := leaves[0]
	if leaf.CheckSignatureFrom(oldCA) == nil {
		return nil // DIR/pki's own serving certificate, as at start
	}
	var issuer *x509.Certificate
	for _, ca := range cas {
		if leaf.CheckSignatureFrom(ca) == nil {
			issuer = ca
		}
	}
	if issuer == nil {
		return errors.New("the API server's serving certificate is issued by none of its client CAs")
	}
	cur, err := os.ReadFile(l.followedPKI(followed.servingCert))
	if err != nil {
		return err
	}
	if cs, err := parseCertificates(cur); err == nil && len(cs) == 2 && bytes.Equal(cs[0].Raw, leaf.Raw) {
		return nil // already served (a new cross-signature would differ in its signature only)
	}
	oldKeyPEM, err := os.ReadFile(l.pki("ca.key"))
	if err != nil {
		return err
	}
	oldKey, err := keyutil.ParsePrivateKeyPEM(oldKeyPEM)
	if err != nil {
		return err
	}
	signer, ok := oldKey.(crypto.Signer)
	if !ok {
		return errors.New("DIR/pki/ca.key is no signer")
	}
	cross := *issuer
	cross.AuthorityKeyId = oldCA.SubjectKeyId
	cross.SignatureAlgorithm, cross.PublicKeyAlgorithm = x509.UnknownSignatureAlgorithm, x509.UnknownPublicKeyAlgorithm
	der, err := x509.CreateCertificate(rand.Reader, &cross, oldCA, issuer.PublicKey, signer)
	if err != nil {
		return fmt.Errorf("cross-signing the new CA: %w", err)
	}
	chain := append(append([]byte(nil), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Raw})...),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	if err := writeFileAtomic(l.followedPKI(followed.servingKey), keyPEM, 0o600); err != nil {
		return err
	}
	return writeFileAtomic(l.followedPKI(followed.servingCert), chain, 0o600)
}

// manifestFlags reads a static pod manifest's "- --flag=value" lines.
func manifestFlags(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	flags := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		a := strings.TrimSpace(line)
		a = strings.TrimSpace(strings.TrimPrefix(a, "-"))
		if name, value, ok := strings.Cut(a, "="); ok && strings.HasPrefix(name, "--") {
			flags[name] = value
		}
	}
	return flags, nil
}

func parseCertificates(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return out, nil
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
}

// certificatesPEM encodes certs once each, in order.
func certificatesPEM(certs []*x509.Certificate) []byte {
	var b bytes.Buffer
	seen := map[string]bool{}
	for _, c := range certs {
		if seen[string(c.Raw)] {
			continue
		}
		seen[string(c.Raw)] = true
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return b.Bytes()
}

func writeIfChanged(path string, data []byte) error {
	if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, data) {
		return nil
	}
	return writeFileAtomic(path, data, 0o600)
}
