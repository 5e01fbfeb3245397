package commands

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/cakeys"
	"github.com/nodeops/nodeops/internal/host"
	"github.com/nodeops/nodeops/internal/testutil"
)

func kubeadmBin(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("NODEOPS_BIN")
	if dir == "" {
		dir = "../../../bin"
	}
	p, err := filepath.Abs(filepath.Join(dir, "kubeadm"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("kubeadm: %v (set NODEOPS_BIN)", err)
	}
	return p
}

func reissue(ctx context.Context, t *testing.T, env *Env) (Result, string, error) {
	t.Helper()
	var out bytes.Buffer
	env.Out = &out
	res, err := Run(ctx, env, &v1alpha1.Command{ReissueCertificates: &v1alpha1.ReissueCertificatesCommand{ServiceAccountKey: true}})
	return res, out.String(), err
}

// keyMaterial is every private key's DER under root, base64 and raw, to look for in what a command records.
func keyMaterial(t *testing.T, root string) [][]byte {
	t.Helper()
	var out [][]byte
	_ = filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		data, _ := os.ReadFile(p)
		for rest := data; ; {
			var b *pem.Block
			b, rest = pem.Decode(rest)
			if b == nil {
				break
			}
			if strings.Contains(b.Type, "PRIVATE KEY") {
				out = append(out, b.Bytes[:32], pem.EncodeToMemory(b)[40:100])
			}
		}
		return nil
	})
	return out
}

// reissueCertificates on a control plane kubeadm made (bin/kubeadm init phase certs and kubeconfig),
// after prepare and trust-both: a DryRun lists every file with its old and new issuer and changes
// nothing; the run re-issues every certificate and records no key; a second run keeps them all.
func TestReissueCertificatesOnAControlPlane(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	pkiDir := filepath.Join(root, cakeys.PKIDirectory)
	for _, args := range [][]string{
		{"init", "phase", "certs", "all", "--cert-dir", pkiDir, "--apiserver-advertise-address", "10.0.0.1"},
		{"init", "phase", "kubeconfig", "all", "--cert-dir", pkiDir, "--kubeconfig-dir", filepath.Join(root, "/etc/kubernetes"), "--apiserver-advertise-address", "10.0.0.1", "--node-name", "cp-1"},
	} {
		if out, err := exec.Command(kubeadmBin(t), args...).CombinedOutput(); err != nil {
			t.Fatalf("kubeadm %v: %v\n%s", args, err, out)
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "/var/lib/kubelet"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, cakeys.KubeletConfigFile), []byte("kind: KubeletConfiguration\nauthentication:\n  x509:\n    clientCAFile: /etc/kubernetes/pki/ca.crt\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := cakeys.Generate(host.NewLocal(root).Files, "rot", nil, true, time.Now()); err != nil {
		t.Fatal(err)
	}
	env := func(dryRun bool) *Env {
		return &Env{NodeName: "cp-1", Operation: "rot", Host: host.NewLocal(root), DryRun: dryRun}
	}
	// Before trust-both it refuses.
	if _, _, err := reissue(ctx, t, env(false)); err == nil || !strings.Contains(err.Error(), "trust-both") {
		t.Fatalf("before trust-both: err = %v", err)
	}
	if _, _, err := trustOldAndNew(ctx, t, nil, "cp-1", root, false); err != nil {
		t.Fatal(err)
	}

	before := treeText(t, root)
	res, out, err := reissue(ctx, t, env(true))
	if err != nil {
		t.Fatal(err)
	}
	if treeText(t, root) != before {
		t.Fatal("a DryRun changed files")
	}
	if !strings.HasPrefix(res.Message, "dry run: ") || !strings.Contains(res.Message, "12 certificates issued") {
		t.Errorf("message %q", res.Message)
	}
	for _, want := range []string{
		"dry run: would change /etc/kubernetes/pki/apiserver.crt: issued by CA \"kubernetes\"",
		"dry run: would change /etc/kubernetes/pki/etcd/server.crt: issued by CA \"etcd-ca\"",
		"dry run: would change /etc/kubernetes/admin.conf: issued by CA",
		"dry run: would change /etc/kubernetes/kubelet.conf: issued by CA",
		"dry run: would change /etc/kubernetes/pki/ca.crt: CA \"kubernetes\"",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the DryRun's output lacks %q:\n%s", want, out)
		}
	}

	res, out, err = reissue(ctx, t, env(false))
	if err != nil {
		t.Fatal(err)
	}
	if res.Message != "8 authority files replaced by the new; 12 certificates issued by the new authorities, 0 installed as an interrupted run recorded them, 0 kept (issued by them already)" {
		t.Errorf("message %q", res.Message)
	}
	recorded, _ := json.Marshal(res)
	recorded = append(recorded, out...)
	for _, k := range keyMaterial(t, root) {
		if bytes.Contains(recorded, k) {
			t.Fatalf("what the command records holds a private key:\n%s", recorded)
		}
	}
	if bytes.Contains(recorded, []byte("PRIVATE KEY")) {
		t.Fatalf("what the command records holds a private key:\n%s", recorded)
	}
	res, _, err = reissue(ctx, t, env(false))
	if err != nil || !strings.Contains(res.Message, "0 certificates issued by the new authorities, 0 installed as an interrupted run recorded them, 12 kept") {
		t.Fatalf("second run: %q, %v", res.Message, err)
	}
}

// A worker's kubelet client certificate is asked of the cluster with the kubelet's own credentials
// (a real API server, with the Node authorizer): the request is made as system:node:NAME; a run
// cut while it waits resumes with the same request (no second one); a certificate of another
// authority than the new is refused and the kubelet's certificate left alone; the new authority's is
// put in place, through kubelet-client-current.pem's link; a DryRun asks for nothing.
func TestReissueCertificatesOnAWorkerAsksTheClusterAsTheKubelet(t *testing.T) {
	te, err := testutil.StartWith(testutil.Options{CRDs: []string{"nodetasks"}, NodeAuthorizer: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = te.Stop() }()
	// A run that would wait for a request nobody signs fails the test instead of hanging it.
	ctx, cancelAll := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancelAll()
	node := "worker-" + strings.ToLower(rand.Text()[:6])
	kubelet, err := te.AddUser("system:node:"+node, "system:nodes")
	if err != nil {
		t.Fatal(err)
	}

	// The worker after trust-both: ca.crt the cluster's (old) authority, ca-bundle.crt and
	// kubelet.conf the old and the new, the kubelet's credentials in kubelet-client-current.pem.
	root := t.TempDir()
	scratch := t.TempDir()
	if _, err := cakeys.Generate(host.NewLocal(scratch).Files, "new-ones", nil, false, time.Now()); err != nil {
		t.Fatal(err)
	}
	newCA := loadCA(t, scratch, "ca")
	stranger := t.TempDir()
	if _, err := cakeys.Generate(host.NewLocal(stranger).Files, "strangers", nil, false, time.Now()); err != nil {
		t.Fatal(err)
	}
	strangerCA := loadCA(t, stranger, "ca")
	put := func(p string, data []byte, mode os.FileMode) {
		t.Helper()
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, data, mode); err != nil {
			t.Fatal(err)
		}
	}
	bundle := append(append([]byte(nil), kubelet.CAData...), newCA.pem...)
	put(cakeys.PKIDirectory+"/ca.crt", kubelet.CAData, 0o644)
	put(cakeys.PKIDirectory+"/ca-bundle.crt", bundle, 0o644)
	dated := cakeys.KubeletPKIDirectory + "/kubelet-client-2026-01-02-03-04-05.pem"
	put(dated, append(append([]byte(nil), kubelet.CertData...), kubelet.KeyData...), 0o600)
	if err := os.Symlink(filepath.Base(dated), filepath.Join(root, cakeys.KubeletPKIDirectory, "kubelet-client-current.pem")); err != nil {
		t.Fatal(err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["default-cluster"] = &clientcmdapi.Cluster{Server: kubelet.Host, CertificateAuthorityData: bundle}
	cfg.AuthInfos["default-auth"] = &clientcmdapi.AuthInfo{ClientCertificate: cakeys.KubeletPKIDirectory + "/kubelet-client-current.pem", ClientKey: cakeys.KubeletPKIDirectory + "/kubelet-client-current.pem"}
	cfg.Contexts["default-context"] = &clientcmdapi.Context{Cluster: "default-cluster", AuthInfo: "default-auth"}
	cfg.CurrentContext = "default-context"
	kc, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	put(cakeys.KubeletKubeconfig, kc, 0o600)

	env := func(dryRun bool) *Env {
		return &Env{NodeName: node, Operation: "rot", Host: host.NewLocal(root), DryRun: dryRun, Poll: 20 * time.Millisecond}
	}
	requests := func() []certificatesv1.CertificateSigningRequest {
		t.Helper()
		l := &certificatesv1.CertificateSigningRequestList{}
		if err := te.Client.List(ctx, l); err != nil {
			t.Fatal(err)
		}
		return l.Items
	}
	current := func() *x509.Certificate {
		t.Helper()
		data, err := os.ReadFile(filepath.Join(root, dated))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := pem.Decode(data)
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	oldSerial := current().SerialNumber

	before := treeText(t, root)
	res, out, err := reissue(ctx, t, env(true))
	if err != nil {
		t.Fatal(err)
	}
	if treeText(t, root) != before || len(requests()) != 0 {
		t.Fatal("a DryRun changed files or asked the cluster")
	}
	if !strings.Contains(out, "kubelet-client-current.pem: issued by") || !strings.Contains(out, "kubernetes.io/kube-apiserver-client-kubelet") || !strings.HasPrefix(res.Message, "dry run") {
		t.Errorf("DryRun: %q\n%s", res.Message, out)
	}

	// Nobody signs: the run is cut while it waits.
	cut, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, _, err = reissue(cut, t, env(false))
	cancel()
	if err == nil || !strings.Contains(err.Error(), "waiting for CertificateSigningRequest") {
		t.Fatalf("err = %v", err)
	}
	reqs := requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests", len(reqs))
	}
	// Run again, cut again: it waits for the same request, and makes no second one.
	cut, cancel = context.WithTimeout(ctx, time.Second)
	_, _, _ = reissue(cut, t, env(false))
	cancel()
	if again := requests(); len(again) != 1 {
		t.Fatalf("the resumed run made another request: %d requests", len(again))
	}
	if reqs[0].Spec.Username != "system:node:"+node || reqs[0].Spec.SignerName != "kubernetes.io/kube-apiserver-client-kubelet" {
		t.Fatalf("the request was made by %q for %q, want the kubelet's own", reqs[0].Spec.Username, reqs[0].Spec.SignerName)
	}
	// Signed by an authority that is not the new one (a controller-manager still on the old ca.crt).
	sign(ctx, t, te.Client, &reqs[0], strangerCA)
	if _, _, err := reissue(ctx, t, env(false)); err == nil || !strings.Contains(err.Error(), "not issued by the new cluster authority") {
		t.Fatalf("err = %v", err)
	}
	if current().SerialNumber.Cmp(oldSerial) != 0 {
		t.Fatal("a certificate of another authority was put in place")
	}
	// A retry asks again, for a new key, and waits; the signer now signs with the new authority.
	cut, cancel = context.WithTimeout(ctx, 2*time.Second)
	_, _, _ = reissue(cut, t, env(false))
	cancel()
	reqs = requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests, want a second one for a new key", len(reqs))
	}
	second := reqs[0]
	if second.Name == reqs[1].Name || len(second.Status.Certificate) > 0 {
		second = reqs[1]
	}
	signed := sign(ctx, t, te.Client, &second, newCA)
	res, out, err = reissue(ctx, t, env(false))
	if err != nil {
		t.Fatal(err)
	}
	if len(requests()) != 2 {
		t.Fatal("the resumed run made another request")
	}
	c := current()
	if c.SerialNumber.Cmp(signed) != 0 || c.CheckSignatureFrom(newCA.cert) != nil {
		t.Fatalf("the kubelet's certificate is serial %s, want %s of the new authority", c.SerialNumber, signed)
	}
	if link, err := os.Readlink(filepath.Join(root, cakeys.KubeletPKIDirectory, "kubelet-client-current.pem")); err != nil || link != filepath.Base(dated) {
		t.Errorf("kubelet-client-current.pem -> %q, %v", link, err)
	}
	if _, err := tlsPair(t, filepath.Join(root, dated)); err != nil {
		t.Errorf("kubelet-client-current.pem: %v", err)
	}
	for _, d := range []string{v1alpha1.StagingDirectory, cakeys.JournalDirectory} {
		if fi, err := os.Stat(filepath.Join(root, d)); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s on the worker: %v %v, want mode 0700: it holds the request's key", d, fi, err)
		}
	}
	if !strings.Contains(out, "after: issued by CA \"kubernetes\"") || strings.Contains(out, "PRIVATE KEY") {
		t.Errorf("output:\n%s", out)
	}
	res, _, err = reissue(ctx, t, env(false))
	if err != nil || !strings.Contains(res.Message, "1 kept") || len(requests()) != 2 {
		t.Fatalf("a third run: %q %v, %d requests", res.Message, err, len(requests()))
	}
}

type testCA struct {
	cert *x509.Certificate
	key  any
	pem  []byte
}

func loadCA(t *testing.T, root, base string) testCA {
	t.Helper()
	certPEM, err := os.ReadFile(filepath.Join(root, v1alpha1.StagingDirectory, base+".crt"))
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(root, v1alpha1.StagingDirectory, base+".key"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(certPEM)
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := pem.Decode(keyPEM)
	k, err := x509.ParsePKCS1PrivateKey(kb.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return testCA{cert: c, key: k, pem: certPEM}
}

// sign approves csr and signs it with ca, as the controller-manager's csrapproving and csrsigning
// controllers would; it returns the serial.
func sign(ctx context.Context, t *testing.T, c client.Client, csr *certificatesv1.CertificateSigningRequest, ca testCA) *big.Int {
	t.Helper()
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "AutoApproved", Message: "test", LastUpdateTime: metav1.Now()})
	if err := c.SubResource("approval").Update(ctx, csr); err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(csr.Spec.Request)
	req, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	sn := big.NewInt(time.Now().UnixNano())
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: sn, Subject: req.Subject,
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, ca.cert, req.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	csr.Status.Certificate = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := c.Status().Update(ctx, csr); err != nil {
		t.Fatal(err)
	}
	return sn
}

func tlsPair(t *testing.T, p string) (any, error) {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	return tls.X509KeyPair(data, data)
}
