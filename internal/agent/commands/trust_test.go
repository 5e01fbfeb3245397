package commands

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/cakeys"
	"github.com/nodeops/nodeops/internal/host"
)

// oldPKI gives root the /etc/kubernetes of a kubeadm node with real authorities of its own (made by
// cakeys.Generate in a scratch root): on a control plane every CA certificate, sa.pub, the kubeconfigs
// and kubeadm's static pod manifests; on a worker ca.crt and kubelet.conf. It returns the old cluster
// CA's PEM.
func oldPKI(t *testing.T, root string, controlPlane bool) []byte {
	t.Helper()
	scratch := t.TempDir()
	if _, err := cakeys.Generate(host.NewLocal(scratch).Files, "the-old-ones", nil, true, time.Now()); err != nil {
		t.Fatal(err)
	}
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
	read := func(p string) []byte {
		t.Helper()
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	caPEM := read(filepath.Join(scratch, v1alpha1.StagingDirectory, "ca.crt"))
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kubernetes"] = &clientcmdapi.Cluster{Server: "https://10.0.0.1:6443", CertificateAuthorityData: caPEM}
	kc, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	put(cakeys.PKIDirectory+"/ca.crt", caPEM, 0o644)
	put("/etc/kubernetes/kubelet.conf", kc, 0o600)
	put(cakeys.KubeletConfigFile, []byte("kind: KubeletConfiguration\nauthentication:\n  x509:\n    clientCAFile: /etc/kubernetes/pki/ca.crt\n"), 0o644)
	if !controlPlane {
		return caPEM
	}
	for _, rel := range []string{"etcd/ca.crt", "front-proxy-ca.crt", "sa.pub"} {
		put(cakeys.PKIDirectory+"/"+rel, read(filepath.Join(scratch, v1alpha1.StagingDirectory, rel)), 0o644)
	}
	for _, kc := range cakeys.Kubeconfigs {
		put(kc, read(filepath.Join(root, "/etc/kubernetes/kubelet.conf")), 0o600)
	}
	for _, comp := range cakeys.StaticPodComponents {
		put(host.Manifest(host.ManifestsDir, comp), read(filepath.Join("../../cakeys/testdata/manifests", comp+".yaml")), 0o600)
	}
	return caPEM
}

// trustOldAndNew runs trustCertificateAuthorities OldAndNew on root as an agent of node would.
func trustOldAndNew(ctx context.Context, t *testing.T, c client.Client, node, root string, dryRun bool) (Result, string, error) {
	t.Helper()
	var out bytes.Buffer
	env := &Env{NodeName: node, Operation: "rot", Namespace: "nodeops-system", Host: host.NewLocal(root), Client: c, Out: &out, DryRun: dryRun, Poll: 10 * time.Millisecond}
	res, err := Run(ctx, env, &v1alpha1.Command{TrustCertificateAuthorities: &v1alpha1.TrustCertificateAuthoritiesCommand{ServiceAccountKey: true, Trust: v1alpha1.TrustOldAndNew}})
	return res, out.String(), err
}

// A worker's trust waits for the cluster to publish the new cluster CA in kube-root-ca.crt (beside the
// old one), then trusts both; a DryRun on a control plane lists every file with what it trusts before
// and after and changes none.
func TestTrustCertificateAuthoritiesOnWorkerAndDryRun(t *testing.T) {
	ctx := context.Background()
	cp, worker := t.TempDir(), t.TempDir()
	if _, err := cakeys.Generate(host.NewLocal(cp).Files, "rot", nil, true, time.Now()); err != nil {
		t.Fatal(err)
	}
	oldPKI(t, cp, true)
	oldCA := oldPKI(t, worker, false)
	newCA, err := os.ReadFile(filepath.Join(cp, v1alpha1.StagingDirectory, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}

	before := treeText(t, cp)
	res, out, err := trustOldAndNew(ctx, t, nil, "cp-1", cp, true)
	if err != nil {
		t.Fatal(err)
	}
	if after := treeText(t, cp); after != before {
		t.Fatal("a DryRun changed the control plane's files")
	}
	if !strings.HasPrefix(res.Message, "dry run: ") {
		t.Errorf("message %q", res.Message)
	}
	for _, want := range []string{"/etc/kubernetes/pki/ca-bundle.crt", "/etc/kubernetes/manifests/kube-apiserver.yaml", "--client-ca-file=/etc/kubernetes/pki/ca.crt", `CA "kubernetes"`, "/etc/kubernetes/admin.conf"} {
		if !strings.Contains(out, want) {
			t.Errorf("the DryRun's output lacks %q:\n%s", want, out)
		}
	}

	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "nodeops-system", Name: "kube-root-ca.crt"}, Data: map[string]string{"ca.crt": string(oldCA)}}
	c := fake.NewClientBuilder().WithObjects(cm).Build()
	// Only the old CA is published: the worker waits, and its files stay as they are.
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	before = treeText(t, worker)
	if _, _, err := trustOldAndNew(wctx, t, c, "worker-1", worker, false); err == nil || !strings.Contains(err.Error(), "holds only the cluster authority this node trusts") {
		t.Fatalf("err = %v", err)
	}
	if treeText(t, worker) != before {
		t.Fatal("the waiting worker changed its files")
	}
	cm.Data["ca.crt"] = string(oldCA) + string(newCA)
	if err := c.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	res, _, err = trustOldAndNew(ctx, t, c, "worker-1", worker, false)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(res.Message, "3 files changed") {
		t.Errorf("message %q", res.Message)
	}
	cfg, err := clientcmd.LoadFromFile(filepath.Join(worker, "/etc/kubernetes/kubelet.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if got := string(cfg.Clusters["kubernetes"].CertificateAuthorityData); got != string(oldCA)+string(newCA) {
		t.Errorf("kubelet.conf trusts %v", cakeys.Trusted([]byte(got)))
	}
}

func treeText(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		b.WriteString(p + " " + fi.Mode().String() + " " + base64.StdEncoding.EncodeToString(data) + "\n")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// trustNewOnly runs trustCertificateAuthorities NewOnly (phase complete) on root as an agent of node would.
func trustNewOnly(ctx context.Context, t *testing.T, c client.Client, node, root string, dryRun bool) (Result, string, error) {
	t.Helper()
	var out bytes.Buffer
	env := &Env{NodeName: node, Operation: "rot", Namespace: "nodeops-system", Host: host.NewLocal(root), Client: c, Out: &out, DryRun: dryRun, Poll: 10 * time.Millisecond}
	res, err := Run(ctx, env, &v1alpha1.Command{TrustCertificateAuthorities: &v1alpha1.TrustCertificateAuthoritiesCommand{ServiceAccountKey: true, Trust: v1alpha1.TrustNewOnly}})
	return res, out.String(), err
}

// Phase complete on a worker waits while kube-root-ca.crt still holds the old cluster CA beside the
// new, then trusts the new alone; its DryRun lists the files and changes none. A control plane whose
// staging directory complete removed is still taken for one (it runs static pods), not for a worker.
func TestTrustNewOnlyOnWorkerWaitsAndDryRun(t *testing.T) {
	ctx := context.Background()
	cp, worker := t.TempDir(), t.TempDir()
	if _, err := cakeys.Generate(host.NewLocal(cp).Files, "rot", nil, true, time.Now()); err != nil {
		t.Fatal(err)
	}
	oldCA := oldPKI(t, worker, false)
	newCA, err := os.ReadFile(filepath.Join(cp, v1alpha1.StagingDirectory, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	both := string(oldCA) + string(newCA)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "nodeops-system", Name: "kube-root-ca.crt"}, Data: map[string]string{"ca.crt": both}}
	c := fake.NewClientBuilder().WithObjects(cm).Build()
	if _, _, err := trustOldAndNew(ctx, t, c, "worker-1", worker, false); err != nil {
		t.Fatal(err)
	}

	// Both still published: it waits, and its files stay as they are.
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	before := treeText(t, worker)
	if _, _, err := trustNewOnly(wctx, t, c, "worker-1", worker, false); err == nil || !strings.Contains(err.Error(), "the old authority is still published") {
		t.Fatalf("err = %v", err)
	}
	if treeText(t, worker) != before {
		t.Fatal("the waiting worker changed its files")
	}
	cm.Data["ca.crt"] = string(newCA)
	if err := c.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	res, out, err := trustNewOnly(ctx, t, c, "worker-1", worker, true)
	if err != nil {
		t.Fatal(err)
	}
	if treeText(t, worker) != before {
		t.Fatal("a DryRun changed the worker's files")
	}
	for _, want := range []string{"/etc/kubernetes/kubelet.conf: trusts", "/etc/kubernetes/pki/ca-bundle.crt: trusts", "after: (removed)", "would remove /etc/kubernetes/pki/ca-bundle.crt"} {
		if !strings.Contains(out, want) {
			t.Errorf("the DryRun's output lacks %q:\n%s", want, out)
		}
	}
	if !strings.HasPrefix(res.Message, "dry run: ") {
		t.Errorf("message %q", res.Message)
	}
	res, _, err = trustNewOnly(ctx, t, c, "worker-1", worker, false)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(res.Message, "the new authorities alone: 4 files changed") {
		t.Errorf("message %q", res.Message)
	}
	cfg, err := clientcmd.LoadFromFile(filepath.Join(worker, "/etc/kubernetes/kubelet.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if got := string(cfg.Clusters["kubernetes"].CertificateAuthorityData); got != string(newCA) {
		t.Errorf("kubelet.conf trusts %v", cakeys.Trusted([]byte(got)))
	}
	if _, err := os.Stat(filepath.Join(worker, cakeys.PKIDirectory, "ca-bundle.crt")); !os.IsNotExist(err) {
		t.Errorf("ca-bundle.crt is still there: %v", err)
	}

	// A control plane after complete: no staging directory, static pods, nothing left to change.
	done := t.TempDir()
	oldPKI(t, done, true)
	for _, f := range []string{"sa.pub", "sa.key"} {
		data, err := os.ReadFile(filepath.Join(cp, v1alpha1.StagingDirectory, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(done, cakeys.PKIDirectory, f), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	res, out, err = trustNewOnly(ctx, t, nil, "cp-1", done, false)
	if err != nil || !strings.Contains(res.Message, "nothing changed") {
		t.Fatalf("%q, %v\n%s", res.Message, err, out)
	}
}

// TestWholeRotationDryRunOnAnUnpreparedControlPlane: in a whole rotation's DryRun, prepare stages
// nothing, so trust-both and complete find a control plane without the operation's authorities; they
// list the files they would change instead of failing ("phase prepare has not run on it"), the
// service-account key's (sa-bundle.pub, the API server's --service-account-key-file) among them, and
// write nothing.
func TestWholeRotationDryRunOnAnUnpreparedControlPlane(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	oldPKI(t, root, true)
	before := treeOf(t, root)
	res, out, err := trustOldAndNew(ctx, t, nil, "cp-1", root, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"/etc/kubernetes/pki/ca-bundle.crt: would be created: trusts CA \"kubernetes\"",
		"kube-apiserver.yaml: flag --client-ca-file: /etc/kubernetes/pki/ca.crt -> /etc/kubernetes/pki/ca-bundle.crt",
		"/etc/kubernetes/admin.conf: certificate-authority-data: CA \"kubernetes\"", "/etc/kubernetes/pki/etcd/ca-bundle.crt",
		// serviceAccountKey: the API server would verify with both public keys.
		"/etc/kubernetes/pki/sa-bundle.pub: would be created: trusts public key (sha256 ",
		"and the new service-account key (staged by prepare)",
		"kube-apiserver.yaml: flag --service-account-key-file: /etc/kubernetes/pki/sa.pub -> /etc/kubernetes/pki/sa-bundle.pub"} {
		if !strings.Contains(out, want) {
			t.Errorf("trust-both's DryRun output lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(res.Message, "dry run: trust-both would change") {
		t.Errorf("message %q", res.Message)
	}
	var buf bytes.Buffer
	env := &Env{NodeName: "cp-1", Operation: "rot", Host: host.NewLocal(root), Out: &buf, DryRun: true}
	if _, err := Run(ctx, env, &v1alpha1.Command{TrustCertificateAuthorities: &v1alpha1.TrustCertificateAuthoritiesCommand{ServiceAccountKey: true, Trust: v1alpha1.TrustNewOnly}}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"/etc/kubernetes/pki/ca-bundle.crt: would be removed",
		"/etc/kubernetes/pki/sa-bundle.pub: would be removed once /etc/kubernetes/pki/sa.pub is the new service-account key alone",
		"kube-apiserver.yaml: flag --service-account-key-file: /etc/kubernetes/pki/sa-bundle.pub -> /etc/kubernetes/pki/sa.pub"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("complete's DryRun output lacks %q:\n%s", want, buf.String())
		}
	}
	if after := treeOf(t, root); after != before {
		t.Errorf("the DryRun changed the root")
	}
}

// treeOf is every file under root with its content.
func treeOf(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		fmt.Fprintf(&b, "%s %o %x\n", p, info.Mode(), data)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
