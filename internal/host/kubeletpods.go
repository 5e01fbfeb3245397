package host

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	podsv1alpha1 "k8s.io/kubelet/pkg/apis/pods/v1alpha1"
)

// KubeletPodsSocket is the kubelet's Pods API (beta and on by default from v1.37, feature gate
// PodsAPI): the pods the kubelet runs, with the status the kubelet itself computes, answered on the
// node without the API server.
const KubeletPodsSocket = "/var/lib/kubelet/pods-api/pods-api.sock"

// kubeletPodsCallTimeout bounds one call: the socket is local, an answer takes milliseconds.
const kubeletPodsCallTimeout = 5 * time.Second

// ErrNoKubeletPodsAPI: the node's kubelet serves no Pods API (older than v1.37, or PodsAPI off).
var ErrNoKubeletPodsAPI = errors.New("the kubelet serves no Pods API (" + KubeletPodsSocket + " is not there)")

// ErrKubeletInitializing: the kubelet started and has not yet read all its pod sources (its static
// pod manifests and the API server's pods), so it cannot yet say which pods it runs.
var ErrKubeletInitializing = errors.New("the kubelet is starting and has not yet read its pods")

// KubeletPods reads pods from the kubelet of the node under Root through its Pods API.
type KubeletPods struct {
	Root string
}

// Available says whether the kubelet serves its Pods API (the socket is there).
func (k *KubeletPods) Available() bool {
	return k != nil && (&FS{Root: k.Root}).Exists(KubeletPodsSocket)
}

// Pod is the kubelet's pod namespace/name, with the status the kubelet computed for it; nil when
// the kubelet runs no such pod. It fails with ErrNoKubeletPodsAPI or ErrKubeletInitializing when
// the kubelet cannot answer.
func (k *KubeletPods) Pod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	if !k.Available() {
		return nil, ErrNoKubeletPodsAPI
	}
	ctx, cancel := context.WithTimeout(ctx, kubeletPodsCallTimeout)
	defer cancel()
	addr, done, err := ShortUnixPath(filepath.Join(k.Root, KubeletPodsSocket))
	if err != nil {
		return nil, fmt.Errorf("kubelet Pods API: %w", err)
	}
	defer done()
	conn, err := grpc.NewClient("passthrough:///kubelet-pods",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}))
	if err != nil {
		return nil, fmt.Errorf("kubelet Pods API: %w", err)
	}
	defer func() { _ = conn.Close() }()
	resp, err := podsv1alpha1.NewPodsClient(conn).ListPods(ctx, &podsv1alpha1.ListPodsRequest{})
	if err != nil {
		if status.Code(err) == codes.FailedPrecondition {
			return nil, ErrKubeletInitializing
		}
		return nil, fmt.Errorf("kubelet Pods API %s: %w", KubeletPodsSocket, err)
	}
	for _, raw := range resp.GetPods() {
		pod := &corev1.Pod{}
		if err := pod.Unmarshal(raw); err != nil {
			return nil, fmt.Errorf("kubelet Pods API: a pod it sent does not decode: %w", err)
		}
		if pod.Namespace == namespace && pod.Name == name {
			return pod, nil
		}
	}
	return nil, nil
}

// ServingNow runs, for each container of the kubelet's pod, its HTTP startup and readiness probes
// now (Prober.ServingNow), reading the host's processes under Root/proc. It fails with
// ErrNoHTTPProbe when a container has none to run.
func (k *KubeletPods) ServingNow(ctx context.Context, pod *corev1.Pod) error {
	p := &Prober{Proc: filepath.Join(k.Root, "proc")}
	for _, c := range pod.Spec.Containers {
		if err := p.ServingNow(ctx, pod, c.Name); err != nil {
			return err
		}
	}
	return nil
}
