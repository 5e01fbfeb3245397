package localcluster

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/internal/plan"
)

// Node roles.
const (
	RoleControlPlane = "control-plane"
	RoleWorker       = "worker"
	RoleSim          = "sim"
)

// Labels, taints and annotations on local nodes.
const (
	LabelControlPlane = "node-role.kubernetes.io/control-plane"
	LabelHostname     = "kubernetes.io/hostname"
	LabelOS           = "kubernetes.io/os"
	LabelArch         = "kubernetes.io/arch"
	// AnnotationCRISocket is where kubeadm records a node's container runtime endpoint.
	AnnotationCRISocket = "kubeadm.alpha.kubernetes.io/cri-socket"
	CRISocket           = "unix:///var/run/containerd/containerd.sock"
)

// NodeSpec is one node of the local cluster.
type NodeSpec struct {
	Name string
	Role string
	// IP is the advertise address (192.0.2.0/24, a documentation range nothing is sent to); empty for sim nodes.
	IP string
}

// HasRoot reports whether the node has a host-root directory (and an agent with --host-root).
func (n NodeSpec) HasRoot() bool { return n.Role != RoleSim }

// NodeSpecs lists the nodes of a cluster in creation order: cp-1..cp-N, worker-1..worker-M, sim-1..sim-K.
// Control planes get 192.0.2.11.., workers 192.0.2.111.. (Validate caps both at 100).
func NodeSpecs(controlPlanes, workers, sims int) []NodeSpec {
	nodes := make([]NodeSpec, 0, controlPlanes+workers+sims)
	for i := 1; i <= controlPlanes; i++ {
		nodes = append(nodes, NodeSpec{Name: fmt.Sprintf("cp-%d", i), Role: RoleControlPlane, IP: fmt.Sprintf("192.0.2.%d", 10+i)})
	}
	for i := 1; i <= workers; i++ {
		nodes = append(nodes, NodeSpec{Name: fmt.Sprintf("worker-%d", i), Role: RoleWorker, IP: fmt.Sprintf("192.0.2.%d", 110+i)})
	}
	for i := 1; i <= sims; i++ {
		nodes = append(nodes, NodeSpec{Name: fmt.Sprintf("sim-%d", i), Role: RoleSim})
	}
	return nodes
}

// NodeObject builds the Node for spec. kwok fills in conditions and keeps the node Ready; the
// kubelet version is the cluster's pretended version so version reporting sees a uniform cluster.
func NodeObject(spec NodeSpec, kubeletVersion string) *corev1.Node {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: spec.Name,
			Labels: map[string]string{
				LabelHostname: spec.Name,
				LabelOS:       "linux",
				LabelArch:     "amd64",
			},
		},
		Status: corev1.NodeStatus{
			Allocatable: corev1.ResourceList{
				corev1.ResourceCPU:    resource.MustParse("32"),
				corev1.ResourceMemory: resource.MustParse("128Gi"),
				corev1.ResourcePods:   resource.MustParse("110"),
			},
			NodeInfo: corev1.NodeSystemInfo{
				Architecture:            "amd64",
				OperatingSystem:         "linux",
				OSImage:                 "Debian GNU/Linux 13 (trixie)",
				KubeletVersion:          kubeletVersion,
				ContainerRuntimeVersion: "containerd://2.1.4",
			},
		},
	}
	n.Status.Capacity = n.Status.Allocatable.DeepCopy()
	if spec.HasRoot() {
		n.Annotations = map[string]string{AnnotationCRISocket: CRISocket}
		n.Status.Addresses = []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: spec.IP},
			{Type: corev1.NodeHostName, Address: spec.Name},
		}
	}
	if spec.Role == RoleControlPlane {
		n.Labels[LabelControlPlane] = ""
		n.Spec.Taints = []corev1.Taint{{Key: LabelControlPlane, Effect: corev1.TaintEffectNoSchedule}}
	}
	return n
}

// createNodes creates every node, a few at a time; a node that already exists is left as it is.
func createNodes(ctx context.Context, c client.Client, specs []NodeSpec, kubeletVersion string) error {
	const workers = 16
	work := make(chan NodeSpec)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for spec := range work {
				if err := c.Create(ctx, NodeObject(spec, kubeletVersion)); err != nil && !apierrors.IsAlreadyExists(err) {
					errs <- fmt.Errorf("creating node %s: %w", spec.Name, err)
					return
				}
			}
		})
	}
	var err error
feed:
	for _, s := range specs {
		select {
		case work <- s:
		case err = <-errs:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(work)
	wg.Wait()
	close(errs)
	if err != nil {
		return err
	}
	return <-errs // nil when the channel is empty and closed
}

// NodeReady reports whether n is Ready (plan.NodeReady) and free of the not-ready and unreachable
// taints, so pods can schedule on it: the node lifecycle controller removes the taint a moment later.
func NodeReady(n *corev1.Node) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == corev1.TaintNodeNotReady || t.Key == corev1.TaintNodeUnreachable {
			return false
		}
	}
	return plan.NodeReady(n)
}
