package commands

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/cakeys"
	"github.com/nodeops/nodeops/internal/host"
)

// TestWholeRotationDryRunReissueOnAnUntrustedWorker: in a whole rotation's DryRun trust-both wrote
// nothing, so a worker's re-issue finds no bundle naming the new authority; it lists the kubelet's
// client certificate with its issuer instead of failing ("phase trust-both has not run"), and
// writes nothing.
func TestWholeRotationDryRunReissueOnAnUntrustedWorker(t *testing.T) {
	scratch, root := t.TempDir(), t.TempDir()
	if _, err := cakeys.Generate(host.NewLocal(scratch).Files, "old-ones", nil, false, time.Now()); err != nil {
		t.Fatal(err)
	}
	ca := loadCA(t, scratch, "ca")
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(4242), Subject: pkix.Name{CommonName: "system:node:worker-1", Organization: []string{"system:nodes"}},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, ca.cert, key.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kubernetes"] = &clientcmdapi.Cluster{Server: "https://10.0.0.1:6443", CertificateAuthorityData: ca.pem}
	cfg.AuthInfos["kubelet"] = &clientcmdapi.AuthInfo{ClientCertificateData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		ClientKeyData: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})}
	cfg.Contexts["kubelet"] = &clientcmdapi.Context{Cluster: "kubernetes", AuthInfo: "kubelet"}
	cfg.CurrentContext = "kubelet"
	kc, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	for p, data := range map[string][]byte{cakeys.KubeletKubeconfig: kc, cakeys.PKIDirectory + "/ca.crt": ca.pem} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	before := treeOf(t, root)
	var out bytes.Buffer
	env := &Env{NodeName: "worker-1", Operation: "rot", Host: host.NewLocal(root), Out: &out, DryRun: true}
	res, err := Run(context.Background(), env, &v1alpha1.Command{ReissueCertificates: &v1alpha1.ReissueCertificatesCommand{}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "/etc/kubernetes/kubelet.conf (kubelet-client): issuer CA \"kubernetes\"") ||
		!strings.Contains(out.String(), "-> the new cluster authority") || !strings.Contains(res.Message, "dry run: re-issue would change 1 files") {
		t.Errorf("message %q, output:\n%s", res.Message, out.String())
	}
	if after := treeOf(t, root); after != before {
		t.Error("the DryRun changed the root")
	}
}
