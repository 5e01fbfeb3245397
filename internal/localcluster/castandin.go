package localcluster

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
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
var followed = struct {
	clientCA, servingCert, servingKey, rootCA, signingCert, signingKey string
	// The service-account keys: the API server's --service-account-key-file (verification) and
	// --service-account-signing-key-file, the controller-manager's --service-account-private-key-file.
	saVerify, saSigning, saPrivate string
}{
	"client-ca.crt", "apiserver.crt", "apiserver.key", "root-ca.crt", "signing-ca.crt", "signing-ca.key",
	"sa-verify.pub", "sa-signing.key", "sa-private.key",
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
		followed.saVerify: "sa.pub", followed.saSigning: "sa.key", followed.saPrivate: "sa.key",
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
//   - kube-apiserver (restarted, as the kubelet restarts its static pod, when its signing key changes
//     or its verification keys lose one): the contents of the manifest's --service-account-key-file
//     (the keys it verifies tokens with; DIR/pki's is not kept, so a token of a dropped key is
//     refused) and --service-account-signing-key-file (the key it signs tokens with). Once it signs
//     with a new key, the pod-bound tokens of the manager and the agents are minted again (creds, when
//     set), as the kubelets' restarts in a rotation's re-issue give every pod a token of the new key;
//   - kube-controller-manager (restarted when they change): the contents of the manifest's
//     --root-ca-file (what it publishes in every namespace's kube-root-ca.crt),
//     --cluster-signing-cert-file/--cluster-signing-key-file (what it signs the kubelets' certificates
//     with) and --service-account-private-key-file (what it signs legacy token Secrets with).
//
// etcd and the API server's etcd client keep DIR/pki's etcd CA.
func followFirstControlPlane(ctx context.Context, l clusterLayout, root string, sup *supervisor, creds *credentials, logf func(string, ...any)) {
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
		ch, err := syncFollowedPKI(l, root)
		if err != nil {
			if msg := err.Error(); msg != last {
				logf("following the first control plane's certificate authorities: %v", err)
				last = msg
			}
			continue
		}
		last = ""
		if ch.apiServer {
			logf("restarting kube-apiserver on the first control plane's service-account keys (the local stand-in for its static pod)")
			sup.restart("kube-apiserver")
		}
		if ch.controllerManager {
			logf("restarting kube-controller-manager on the first control plane's --root-ca-file, signing CA and service-account key (the local stand-in for its static pod)")
			sup.restart("kube-controller-manager")
		}
		if ch.signingKeyID != "" && creds != nil {
			// Not in the loop: the controller-manager's files must be followed meanwhile. A remint
			// for a key replaced again writes nothing (no token names it) until its timeout.
			go func(kid string) {
				rctx, cancel := context.WithTimeout(ctx, remintTimeout)
				defer cancel()
				logf("minting the manager's and agents' tokens again once the API server signs with service-account key %s (the local stand-in for their kubelets' restarts)", kid)
				if err := creds.remint(rctx, kid); err != nil {
					logf("minting tokens of the new service-account key: %v", err)
					return
				}
				logf("the manager's and agents' tokens are signed by service-account key %s", kid)
			}(ch.signingKeyID)
		}
	}
}

// remintTimeout bounds how long the stand-in waits for the restarted API server to sign with a new key.
const remintTimeout = 5 * time.Minute

// followedChanges says what syncFollowedPKI changed that a process reads only when it starts.
type followedChanges struct {
	apiServer, controllerManager bool
	// signingKeyID is the key ID of the API server's new signing key ("" when it is unchanged).
	signingKeyID string
}

// syncFollowedPKI writes DIR/pki-followed from the first control plane's root and says which processes
// must restart to read it.
func syncFollowedPKI(l clusterLayout, root string) (followedChanges, error) {
	var ch followedChanges
	apiserver, err := manifestFlags(filepath.Join(root, "etc/kubernetes/manifests/kube-apiserver.yaml"))
	if err != nil {
		return ch, err
	}
	kcm, err := manifestFlags(filepath.Join(root, "etc/kubernetes/manifests/kube-controller-manager.yaml"))
	if err != nil {
		return ch, err
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
		return ch, err
	}
	oldCA, err := parseCertificates(oldCAPEM)
	if err != nil {
		return ch, fmt.Errorf("DIR/pki/ca.crt: %w", err)
	}
	if len(oldCA) != 1 {
		return ch, fmt.Errorf("DIR/pki/ca.crt: %d certificates, want 1", len(oldCA))
	}
	clientCAPEM, err := read(apiserver, "--client-ca-file")
	if err != nil {
		return ch, err
	}
	clientCAs, err := parseCertificates(clientCAPEM)
	if err != nil {
		return ch, fmt.Errorf("--client-ca-file: %w", err)
	}
	if err := writeIfChanged(l.followedPKI(followed.clientCA), certificatesPEM(append(oldCA, clientCAs...))); err != nil {
		return ch, err
	}

	leafPEM, err := read(apiserver, "--tls-cert-file")
	if err != nil {
		return ch, err
	}
	keyPEM, err := read(apiserver, "--tls-private-key-file")
	if err != nil {
		return ch, err
	}
	if err := followServing(l, oldCA[0], clientCAs, leafPEM, keyPEM); err != nil {
		return ch, err
	}

	verify, err := read(apiserver, "--service-account-key-file")
	if err != nil {
		return ch, err
	}
	signing, err := read(apiserver, "--service-account-signing-key-file")
	if err != nil {
		return ch, err
	}
	kid, err := signingKeyVerified(signing, verify)
	if err != nil {
		return ch, err
	}
	verifying, err := os.ReadFile(l.followedPKI(followed.saVerify))
	if err != nil {
		return ch, err
	}
	lost, err := keysLost(verifying, verify)
	if err != nil {
		return ch, err
	}
	saChanged, err := replaceAll(l, map[string][]byte{followed.saVerify: verify, followed.saSigning: signing})
	if err != nil {
		return ch, err
	}
	if saChanged[followed.saSigning] {
		ch.signingKeyID = kid
	}
	// A verification key gained (trust-both) is read at the next restart: in nodeops-local only the
	// followed signing key signs, so no token of the new key exists before the signing key changes.
	// A restart costs every client a few seconds and the backoffs that follow.
	ch.apiServer = ch.signingKeyID != "" || lost

	rootCA, err := read(kcm, "--root-ca-file")
	if err != nil {
		return ch, err
	}
	signingCert, err := read(kcm, "--cluster-signing-cert-file")
	if err != nil {
		return ch, err
	}
	signingKey, err := read(kcm, "--cluster-signing-key-file")
	if err != nil {
		return ch, err
	}
	if _, err := tls.X509KeyPair(signingCert, signingKey); err != nil {
		return ch, fmt.Errorf("--cluster-signing-cert-file and -key-file do not match (yet): %w", err)
	}
	private, err := read(kcm, "--service-account-private-key-file")
	if err != nil {
		return ch, err
	}
	if _, err := keyutil.ParsePrivateKeyPEM(private); err != nil {
		return ch, fmt.Errorf("the controller-manager's --service-account-private-key-file: %w", err)
	}
	kcmChanged, err := replaceAll(l, map[string][]byte{followed.rootCA: rootCA, followed.signingCert: signingCert, followed.signingKey: signingKey,
		followed.saPrivate: private})
	if err != nil {
		return ch, err
	}
	ch.controllerManager = len(kcmChanged) > 0
	return ch, nil
}

// replaceAll writes each of files (by name in DIR/pki-followed) whose content differs, and says which.
func replaceAll(l clusterLayout, files map[string][]byte) (map[string]bool, error) {
	changed := map[string]bool{}
	for name, data := range files {
		cur, err := os.ReadFile(l.followedPKI(name))
		if err != nil {
			return nil, err
		}
		if bytes.Equal(cur, data) {
			continue
		}
		if err := writeFileAtomic(l.followedPKI(name), data, 0o600); err != nil {
			return nil, err
		}
		changed[name] = true
	}
	return changed, nil
}

// keysLost says whether a public key in before is not in after (PEM files of public keys).
func keysLost(before, after []byte) (bool, error) {
	ids := func(data []byte) (map[string]bool, error) {
		pubs, err := keyutil.ParsePublicKeysPEM(data)
		if err != nil {
			return nil, err
		}
		out := map[string]bool{}
		for _, p := range pubs {
			id, err := ServiceAccountKeyID(p)
			if err != nil {
				return nil, err
			}
			out[id] = true
		}
		return out, nil
	}
	was, err := ids(before)
	if err != nil {
		return false, fmt.Errorf("DIR/%s/%s: %w", FollowedPKIDir, followed.saVerify, err)
	}
	now, err := ids(after)
	if err != nil {
		return false, fmt.Errorf("--service-account-key-file: %w", err)
	}
	for id := range was {
		if !now[id] {
			return true, nil
		}
	}
	return false, nil
}

// signingKeyVerified returns the key ID of the API server's signing key, and fails unless its public
// key is among the verification keys: a manifest caught between two writes of a rotation is
// followed once its files agree, as the kubelet would restart the pod only after the command.
func signingKeyVerified(signing, verify []byte) (string, error) {
	key, err := keyutil.ParsePrivateKeyPEM(signing)
	if err != nil {
		return "", fmt.Errorf("--service-account-signing-key-file: %w", err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return "", errors.New("--service-account-signing-key-file holds no signing key")
	}
	kid, err := ServiceAccountKeyID(signer.Public())
	if err != nil {
		return "", err
	}
	pubs, err := keyutil.ParsePublicKeysPEM(verify)
	if err != nil {
		return "", fmt.Errorf("--service-account-key-file: %w", err)
	}
	for _, p := range pubs {
		if id, err := ServiceAccountKeyID(p); err == nil && id == kid {
			return kid, nil
		}
	}
	return "", fmt.Errorf("--service-account-key-file does not hold the public key of --service-account-signing-key-file (key ID %s) (yet)", kid)
}

// ServiceAccountKeyID is the key ID the API server gives its service-account signing key, and puts
// in the header (kid) of every token it signs: the unpadded base64url SHA-256 of the public key's
// PKIX DER form (keyIDFromPublicKey in k8s.io/kubernetes/pkg/serviceaccount).
func ServiceAccountKeyID(pub crypto.PublicKey) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", fmt.Errorf("marshalling a service-account public key: %w", err)
	}
	sum := sha256.Sum256(der)
	return base64.RawURLEncoding.EncodeToString(sum[:]), nil
}

// TokenKeyID is the key ID (kid) in the header of a JSON Web Token.
func TokenKeyID(token string) (string, error) {
	header, _, ok := strings.Cut(token, ".")
	if !ok {
		return "", errors.New("not a JSON Web Token")
	}
	data, err := base64.RawURLEncoding.DecodeString(header)
	if err != nil {
		return "", fmt.Errorf("a JSON Web Token's header: %w", err)
	}
	var h struct {
		KeyID string `json:"kid"`
	}
	if err := json.Unmarshal(data, &h); err != nil {
		return "", fmt.Errorf("a JSON Web Token's header: %w", err)
	}
	return h.KeyID, nil
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
