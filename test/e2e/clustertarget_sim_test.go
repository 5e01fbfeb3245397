package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/test/e2e/framework"
)

// TestClusterTargetUpToDateWithSimNodes is the demo's last step on a smaller cluster: one edit of the
// ClusterTarget upgrades a control plane and simulated nodes, and the walk-through ends where a user
// expects, with `kubectl wait --for=condition=UpToDate` returning. The simulated nodes' one agent runs
// nothing, so their kubelets' new version is nodeops-local's to report, as it does for the control plane.
func TestClusterTargetUpToDateWithSimNodes(t *testing.T) {
	t.Parallel()
	const sims = 3
	l := framework.StartLocal(t, "--control-planes=1", "--workers=0", fmt.Sprintf("--sim-nodes=%d", sims))
	l.WaitNodesReady(t, 1+sims, 3*time.Minute)
	source := l.BinarySourceURL(t)
	framework.WaitForClusterTarget(t, l, "the ClusterTarget of a fresh install", func(ct *v1alpha1.ClusterTarget) error {
		if ct.Spec.KubernetesVersion != "v1.36.4" {
			return fmt.Errorf("spec %s", ct.Spec.KubernetesVersion)
		}
		return nil
	})

	framework.EditClusterTarget(t, l, func(ct *v1alpha1.ClusterTarget) {
		ct.Spec.KubernetesVersion = "v1.37.2"
		ct.Spec.Upgrade.BinarySource = &v1alpha1.BinarySource{BaseURL: source, InsecureHTTP: true} // nodeops-local serves plain http
		ct.Spec.Upgrade.IgnorePreflightErrors = framework.LocalPreflightIgnores
	})
	in := framework.WaitForKubeadmOperation(v1alpha1.OperationSucceeded)
	in.Name = "cluster-upgrade-v1.37.2-1"
	framework.WaitForOperation(t, l, in)

	// What the demo runs; before nodeops-local played the sim nodes' kubelets it timed out, the
	// target Progressing (AwaitingObservedVersion) on sim-1..sim-3 still at v1.36.4.
	if out, err := l.Kubectl("wait", "clustertarget/cluster", "--for=condition=UpToDate", "--timeout=2m"); err != nil {
		var ct v1alpha1.ClusterTarget
		_ = l.Client.Get(context.Background(), client.ObjectKey{Name: v1alpha1.ClusterTargetName}, &ct)
		t.Fatalf("%v%s\nconditions: %+v", err, out, ct.Status.Conditions)
	}
	var nodes corev1.NodeList
	if err := l.Client.List(context.Background(), &nodes); err != nil {
		t.Fatal(err)
	}
	var behind []string
	for _, n := range nodes.Items {
		if n.Status.NodeInfo.KubeletVersion != "v1.37.2" {
			behind = append(behind, n.Name+" "+n.Status.NodeInfo.KubeletVersion)
		}
	}
	if len(behind) > 0 {
		t.Errorf("kubelets not at v1.37.2: %s", strings.Join(behind, ", "))
	}
}
