package agent_test

import (
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/internal/agent"
	"github.com/nodeops/nodeops/internal/host"
	"github.com/nodeops/nodeops/internal/host/hosttest"
)

// editingKubeadm counts the drift reader's control-plane renderings and, during the first, edits
// the scheduler's manifest: a hand edit landing while the reader compares.
type editingKubeadm struct {
	root string
	t    *testing.T

	mu        sync.Mutex
	readings  int
	afterEdit chan struct{}
}

func (k *editingKubeadm) Kubeadm(_ context.Context, _ io.Writer, args ...string) error {
	if !strings.Contains(strings.Join(args, " "), "phase control-plane") {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.readings++
	switch k.readings {
	case 1:
		hosttest.WriteFile(k.t, k.root, "/etc/kubernetes/manifests/kube-scheduler.yaml", "edited by hand\n", 0o600)
	case 2:
		close(k.afterEdit)
	}
	return io.ErrUnexpectedEOF // the reading records a problem: what matters here is that it reads
}

// A file edited while the reader compares is compared again at once: otherwise putting the file back
// as it was before the reading would leave the reading of the edit there until the hourly one
// (TestReconfigure's hand edit, fixed, kept showing drift).
func TestDriftReaderComparesAgainAFileEditedDuringAReading(t *testing.T) {
	name := "drift-edit-during-reading"
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := cl.Create(context.Background(), node); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Delete(context.Background(), node) })
	root := hosttest.NewRoot(t, map[string]string{
		"/etc/kubernetes/manifests/kube-apiserver.yaml": "kind: Pod\n",
		"/etc/kubernetes/manifests/kube-scheduler.yaml": "kind: Pod\n",
	})
	k := &editingKubeadm{root: root, t: t, afterEdit: make(chan struct{})}
	h := host.NewLocal(root)
	h.Kubeadm = k
	// Neither the hourly reading nor a look at the files comes within the test: only a reading the
	// reader asks for itself does.
	r := &agent.DriftReader{Client: cl, Node: name, Host: h, Interval: time.Hour, FileCheck: time.Hour}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-k.afterEdit:
	case <-time.After(30 * time.Second):
		k.mu.Lock()
		defer k.mu.Unlock()
		t.Fatalf("%d readings in 30s: the file edited during the first was not compared again", k.readings)
	}
}
