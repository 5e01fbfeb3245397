package cakeys

import (
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"path"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nodeops/nodeops/internal/host"
)

// A worker holds no authority's key: its kubelet's client certificate is issued by the cluster's
// signer, as the kubelet's own certificate rotation has it done. The agent asks with the kubelet's
// current credentials (a CertificateSigningRequest for signer kubernetes.io/kube-apiserver-client-kubelet
// made by system:node:NAME for system:node:NAME in system:nodes, which the controller-manager's
// csrapproving controller approves as a node renewing its own client certificate) and the
// controller-manager signs it with its --cluster-signing-cert-file, ca.crt, which after phase
// re-issue on the control planes is the new authority.

// journalKeyFile records the key a worker's request is made for before the request is sent, so a
// resumed run asks again for the same key (and so under the same name) instead of making another. It
// is the operation's: a worker keeps no staging directory of its own operation, and a later rotation
// must not take an earlier one's key.
func journalKeyFile(operation string) string {
	return path.Join(JournalDirectory, "kubelet-client-request-"+operation+".key")
}

// KubeletRequest is a worker's request for a new kubelet client certificate.
type KubeletRequest struct {
	Target Target
	// Name is the CertificateSigningRequest's: the operation, the node and the key's fingerprint, so
	// that a resumed run finds the request it made and a request for another key never takes its place.
	Name string
	// Request is the PEM certificate request (public: it holds the public key only).
	Request []byte
	// CommonName the certificate must have: system:node:NAME.
	CommonName string
	NewCA      *x509.Certificate
	Before     string
	key        crypto.Signer
	keyPEM     []byte
	keyFile    string
}

// WorkerNewClusterCA is the new cluster authority on a worker: the one in the bundle trust-both wrote
// (ca-bundle.crt) that the node's ca.crt is not; trust-both must have run.
func WorkerNewClusterCA(files host.Files) (*x509.Certificate, error) {
	bundle, err := files.ReadFile(pki("ca-bundle.crt"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s is missing: phase trust-both (trustCertificateAuthorities OldAndNew) has not run on this node", pki("ca-bundle.crt"))
	}
	if err != nil {
		return nil, err
	}
	old, err := files.ReadFile(pki("ca.crt"))
	if err != nil {
		return nil, err
	}
	var fresh []*x509.Certificate
	for rest := bundle; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", pki("ca-bundle.crt"), err)
		}
		if !bundleHolds(old, c) {
			fresh = append(fresh, c)
		}
	}
	if len(fresh) != 1 {
		return nil, fmt.Errorf("%s holds %d authorities besides ca.crt's, want the one new cluster CA of the rotation", pki("ca-bundle.crt"), len(fresh))
	}
	return fresh[0], nil
}

// PrepareKubeletRequest is what a worker does before it asks the cluster for a new kubelet client
// certificate. It returns a kept or installed Step, and no request, when the certificate in place or
// the one the journal recorded is the new authority's. Otherwise the request's key is taken from the
// journal, or made and recorded there first (not in a DryRun, which records nothing).
func PrepareKubeletRequest(files host.Files, operation, node string, dryRun bool) (*KubeletRequest, *Step, error) {
	t, err := KubeletClientTarget(files)
	if err != nil {
		return nil, nil, err
	}
	if t == nil {
		return nil, nil, fmt.Errorf("%s is missing: this node has no kubelet client certificate to re-issue", KubeletKubeconfig)
	}
	newCA, err := WorkerNewClusterCA(files)
	if err != nil {
		return nil, nil, err
	}
	cur, key, err := ReadTarget(files, *t)
	if err != nil {
		return nil, nil, err
	}
	want := "system:node:" + node
	if cur.Subject.CommonName != want {
		return nil, nil, fmt.Errorf("%s: the kubelet's client certificate names %q, not %q", t.Path, cur.Subject.CommonName, want)
	}
	if IssuedBy(cur, key, newCA) {
		return nil, &Step{Path: t.Path, State: "kept", After: describeIssuer(newCA), Serial: serial(cur)}, nil
	}
	before := describeIssuerOf(cur, files)
	if jc, certPEM, keyPEM, ok, err := readJournal(files, *t, newCA); err != nil {
		return nil, nil, err
	} else if ok {
		s := &Step{Path: t.Path, State: "install", Before: before, After: describeIssuer(newCA), Serial: serial(jc)}
		if !dryRun {
			err = install(files, *t, certPEM, keyPEM)
		}
		return nil, s, err
	}
	var keyPEM []byte
	var k crypto.Signer
	keyFile := journalKeyFile(operation)
	if data, err := files.ReadFile(keyFile); err == nil {
		if k, err = parseAnyKey(data); err == nil {
			keyPEM = data
		}
	}
	if k == nil {
		if k, keyPEM, err = newKeyLike(cur, key); err != nil {
			return nil, nil, err
		}
		if !dryRun {
			// The record before the request (rule 16): a resumed run asks for this key again.
			if err := record(files, keyFile, keyPEM); err != nil {
				return nil, nil, err
			}
		}
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: want, Organization: []string{"system:nodes"}}}, k)
	if err != nil {
		return nil, nil, err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(k.Public())
	if err != nil {
		return nil, nil, err
	}
	sum := sha256.Sum256(pubDER)
	return &KubeletRequest{
		Target: *t, Name: requestName(operation, node, hex.EncodeToString(sum[:8])), CommonName: want,
		Request: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
		NewCA:   newCA, Before: before, key: k, keyPEM: keyPEM, keyFile: keyFile,
	}, nil, nil
}

// requestName is "nodeops-OPERATION-NODE-KEY", shortened with a hash past the 253 characters a name may have.
func requestName(operation, node, keyID string) string {
	n := "nodeops-" + operation + "-" + node + "-" + keyID
	if len(n) <= 253 {
		return n
	}
	sum := sha256.Sum256([]byte(n))
	return n[:200] + "-" + hex.EncodeToString(sum[:8])
}

// SamePublicKey says whether the PEM certificate request request is for r's key: a request of the
// same name made for another key is not r's.
func (r *KubeletRequest) SamePublicKey(request []byte) bool {
	b, _ := pem.Decode(request)
	if b == nil {
		return false
	}
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return false
	}
	pub, ok := r.key.Public().(interface{ Equal(crypto.PublicKey) bool })
	return ok && pub.Equal(csr.PublicKey)
}

// ErrIssuedByOldAuthority: the cluster signed the request with an authority other than the new one
// (a controller-manager that still signs with the old ca.crt).
var ErrIssuedByOldAuthority = errors.New("not issued by the new cluster authority")

// Complete checks the certificate the cluster issued for r (the new authority's, for r's key and
// node, a client certificate), records it in the journal with its key, then puts it in place. A
// certificate of another authority is refused and the request's key dropped, so that a retry asks
// anew once the signer signs with the new authority.
func (r *KubeletRequest) Complete(files host.Files, certPEM []byte) (Step, error) {
	c, err := firstCert(certPEM)
	if err != nil {
		return Step{}, fmt.Errorf("the issued certificate: %w", err)
	}
	if !IssuedBy(c, r.key, r.NewCA) {
		_ = files.Remove(r.keyFile)
		return Step{}, fmt.Errorf("the cluster issued %s a certificate %w (issuer %q): the controller-manager that signs (--cluster-signing-cert-file) has not been restarted on the new ca.crt; run group ca-reissue-control-planes on every control plane first: %w",
			r.CommonName, ErrIssuedByOldAuthority, c.Issuer.CommonName, c.CheckSignatureFrom(r.NewCA))
	}
	if c.Subject.CommonName != r.CommonName {
		return Step{}, fmt.Errorf("the issued certificate names %q, not %q", c.Subject.CommonName, r.CommonName)
	}
	certOnly := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	if err := record(files, journalFile(r.Target), append(append([]byte(nil), certOnly...), r.keyPEM...)); err != nil {
		return Step{}, err
	}
	if err := install(files, r.Target, certOnly, r.keyPEM); err != nil {
		return Step{}, err
	}
	return Step{Path: r.Target.Path, State: "issue", Before: r.Before, After: describeIssuer(r.NewCA), Serial: serial(c)}, nil
}

// KubeletRESTConfig is a client configuration with the kubelet's own credentials, read from
// kubelet.conf and the files it names under the host root.
func KubeletRESTConfig(files host.Files) (*rest.Config, error) {
	data, err := files.ReadFile(KubeletKubeconfig)
	if err != nil {
		return nil, err
	}
	cfg, err := clientcmd.Load(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", KubeletKubeconfig, err)
	}
	cl, err := currentCluster(cfg, KubeletKubeconfig)
	if err != nil {
		return nil, err
	}
	ai, err := currentAuthInfo(cfg, KubeletKubeconfig)
	if err != nil {
		return nil, err
	}
	read := func(data []byte, p string) ([]byte, error) {
		if len(data) > 0 || p == "" {
			return data, nil
		}
		return files.ReadFile(p)
	}
	rc := &rest.Config{Host: cl.Server}
	if rc.TLSClientConfig.CAData, err = read(cl.CertificateAuthorityData, cl.CertificateAuthority); err != nil {
		return nil, err
	}
	if rc.TLSClientConfig.CertData, err = read(ai.ClientCertificateData, ai.ClientCertificate); err != nil {
		return nil, err
	}
	keyPath := ai.ClientKey
	if keyPath == "" {
		keyPath = ai.ClientCertificate
	}
	if rc.TLSClientConfig.KeyData, err = read(ai.ClientKeyData, keyPath); err != nil {
		return nil, err
	}
	rc.TLSClientConfig.ServerName = cl.TLSServerName
	return rc, nil
}
