package agent_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent"
	"github.com/nodeops/nodeops/internal/host"
	"github.com/nodeops/nodeops/internal/host/hosttest"
	"github.com/nodeops/nodeops/internal/testutil"
)

// controlPlaneRoot is a host root with the real kubeadm, its certificates made by
// `kubeadm init phase certs all`, and a kube-apiserver static pod manifest.
func controlPlaneRoot(t *testing.T) (string, *host.Host) {
	t.Helper()
	bin := os.Getenv("NODEOPS_BIN")
	if bin == "" {
		t.Fatal("NODEOPS_BIN is not set: run `make test-unit`, or `export NODEOPS_BIN=\"$PWD/bin\"` in the repository after `make tools`")
	}
	kubeadm, err := os.ReadFile(filepath.Join(bin, "kubeadm"))
	if err != nil {
		t.Fatal(err)
	}
	root := hosttest.NewRoot(t, map[string]string{"/etc/kubernetes/manifests/kube-apiserver.yaml": "kind: Pod\n"})
	hosttest.WriteFile(t, root, "/usr/bin/kubeadm", string(kubeadm), 0o755)
	h := host.NewLocal(root)
	var out bytes.Buffer
	if err := h.Kubeadm.Kubeadm(context.Background(), &out, "init", "phase", "certs", "all"); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	return root, h
}

func nodeAnnotation(t *testing.T, name string) (string, string) {
	t.Helper()
	var n corev1.Node
	if err := cl.Get(context.Background(), client.ObjectKey{Name: name}, &n); err != nil {
		t.Fatal(err)
	}
	return n.Annotations[v1alpha1.AnnotationCertificates], n.ResourceVersion
}

// A control plane's agent records its certificates' expiry in its Node, writes again only when
// a reading differs (a renewal), and on a node that is no control plane reads nothing.
func TestCertificateReaderWritesOnlyWhatChanged(t *testing.T) {
	ctx := context.Background()
	_, h := controlPlaneRoot(t)
	for _, n := range []string{"certs-cp-1", "certs-worker-1"} {
		create(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})
	}
	r := &agent.CertificateReader{Client: cl, Node: "certs-cp-1", Host: h}
	if err := r.ReadOnce(ctx); err != nil {
		t.Fatal(err)
	}
	first, rv := nodeAnnotation(t, "certs-cp-1")
	certs, err := v1alpha1.DecodeCertificates(first)
	if err != nil {
		t.Fatalf("annotation %q: %v", first, err)
	}
	byName := map[string]metav1.Time{}
	for _, c := range certs {
		byName[c.Name] = c.NotAfter
	}
	if a, ok := byName["apiserver"]; !ok || !a.After(time.Now().Add(300*24*time.Hour)) {
		t.Fatalf("reading %s: want the apiserver certificate, about a year ahead", first)
	}
	// The certificate authorities beside them (the ClusterTarget shows them apart), ten years ahead.
	for _, name := range v1alpha1.CertificateAuthorityNames {
		if a, ok := byName[name]; !ok || !a.After(time.Now().Add(9*365*24*time.Hour)) {
			t.Errorf("reading %s: want certificate authority %s, about ten years ahead", first, name)
		}
	}

	// At rest: the same reading writes nothing.
	if err := r.ReadOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if again, rv2 := nodeAnnotation(t, "certs-cp-1"); again != first || rv2 != rv {
		t.Fatalf("a second identical reading wrote the node: resourceVersion %s -> %s", rv, rv2)
	}

	// A renewal moves apiserver's notAfter: the next reading records it.
	time.Sleep(1100 * time.Millisecond) // certificate times have a resolution of one second
	var out bytes.Buffer
	if err := h.Kubeadm.Kubeadm(ctx, &out, "certs", "renew", "apiserver"); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if err := r.ReadOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if renewed, _ := nodeAnnotation(t, "certs-cp-1"); renewed == first {
		t.Fatalf("the reading after a renewal was not recorded: %s", renewed)
	}

	// A worker (no kube-apiserver manifest) has nothing to read.
	worker := &agent.CertificateReader{Client: cl, Node: "certs-worker-1", Host: host.NewLocal(hosttest.NewRoot(t, nil))}
	if err := worker.ReadOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if v, _ := nodeAnnotation(t, "certs-worker-1"); v != "" {
		t.Fatalf("a worker recorded certificates: %s", v)
	}
}

// The agent process reads its control plane's certificates soon after it starts
// (--certificate-check-interval).
func TestAgentRecordsItsControlPlanesCertificates(t *testing.T) {
	root, _ := controlPlaneRoot(t)
	create(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "certs-cp-2"}})
	stop := startAgent(t, agent.Options{NodeName: "certs-cp-2", HostRoot: root, CertificateCheckInterval: 2 * time.Second})
	defer stop()
	testutil.Eventually(t, 30*time.Second, "the agent recorded the certificates' expiry on its node", func() error {
		v, _ := nodeAnnotation(t, "certs-cp-2")
		if _, err := v1alpha1.DecodeCertificates(v); err != nil {
			return fmt.Errorf("annotation %q: %w", v, err)
		}
		return nil
	})
}
