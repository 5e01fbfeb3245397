package host_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	podsv1alpha1 "k8s.io/kubelet/pkg/apis/pods/v1alpha1"

	"github.com/nodeops/nodeops/internal/host"
)

// The kubelet's Pods API is read on the real node (test/realnode: the rotation's restarts follow
// it); these are its error paths, which decide between asking again and reading the mirror pod.

func TestKubeletPodsWithoutTheSocketSaysSo(t *testing.T) {
	k := &host.KubeletPods{Root: t.TempDir()}
	if k.Available() {
		t.Fatal("Available() with no socket under the root")
	}
	if _, err := k.Pod(context.Background(), "kube-system", "etcd-vm"); !errors.Is(err, host.ErrNoKubeletPodsAPI) {
		t.Fatalf("Pod() = %v, want ErrNoKubeletPodsAPI", err)
	}
	var none *host.KubeletPods
	if none.Available() {
		t.Fatal("a nil KubeletPods (a local node's) is Available")
	}
}

// initializingKubelet answers as a kubelet that has not yet read all its pod sources.
type initializingKubelet struct {
	podsv1alpha1.UnimplementedPodsServer
}

func (initializingKubelet) ListPods(context.Context, *podsv1alpha1.ListPodsRequest) (*podsv1alpha1.ListPodsResponse, error) {
	return nil, status.Error(codes.FailedPrecondition, "Kubelet is initializing")
}

func TestKubeletPodsWhileTheKubeletStartsAsksAgain(t *testing.T) {
	root := t.TempDir()
	socket := filepath.Join(root, host.KubeletPodsSocket)
	if err := os.MkdirAll(filepath.Dir(socket), 0o755); err != nil {
		t.Fatal(err)
	}
	addr, done, err := host.ShortUnixPath(socket)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", addr)
	done()
	if err != nil {
		t.Fatal(err)
	}
	// As a kubelet that was killed: its socket stays when it stops serving.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	srv := grpc.NewServer()
	podsv1alpha1.RegisterPodsServer(srv, initializingKubelet{})
	go func() { _ = srv.Serve(l) }()
	defer srv.Stop()

	k := &host.KubeletPods{Root: root}
	if !k.Available() {
		t.Fatal("not Available() with the socket there")
	}
	if _, err := k.Pod(context.Background(), "kube-system", "etcd-vm"); !errors.Is(err, host.ErrKubeletInitializing) {
		t.Fatalf("Pod() = %v, want ErrKubeletInitializing", err)
	}

	// A socket a killed kubelet left behind and nobody serves: an error to report and ask again, not a
	// kubelet without the API (whose mirror pods would then be read).
	srv.Stop()
	if _, err := k.Pod(context.Background(), "kube-system", "etcd-vm"); err == nil || errors.Is(err, host.ErrNoKubeletPodsAPI) || errors.Is(err, host.ErrKubeletInitializing) {
		t.Fatalf("Pod() on a socket nobody serves = %v, want a connection error", err)
	}
}
