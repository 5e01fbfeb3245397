package framework

import (
	"context"
	"sort"
	"testing"
	"time"

	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/skeleton"
	"github.com/nodeops/nodeops/internal/testutil"
)

// KubeadmOperationTimeout bounds one kubeadm operation on a loaded 2-core machine.
const KubeadmOperationTimeout = 10 * time.Minute

// WaitForKubeadmOperation waits for a kubeadm operation's phase: one that ends otherwise, or
// blocks, fails the test at once (RunOperationWatched's input).
func WaitForKubeadmOperation(phase v1alpha1.OperationPhase) WaitForOperationInput {
	return WaitForOperationInput{Phase: phase, Timeout: KubeadmOperationTimeout, FailIfBlocked: true}
}

// WaitForClusterTarget waits, KubeadmOperationTimeout at most, until the ClusterTarget meets cond
// and returns it.
func WaitForClusterTarget(t testing.TB, l *Local, what string, cond func(*v1alpha1.ClusterTarget) error) *v1alpha1.ClusterTarget {
	t.Helper()
	ct := &v1alpha1.ClusterTarget{}
	testutil.EventuallyEvery(t, KubeadmOperationTimeout, PollInterval, what, func(ctx context.Context) error {
		if err := l.Client.Get(ctx, client.ObjectKey{Name: v1alpha1.ClusterTargetName}, ct); err != nil {
			return err
		}
		return cond(ct)
	})
	return ct
}

// EditClusterTarget changes the ClusterTarget's spec, as `kubectl edit` would.
func EditClusterTarget(t testing.TB, l *Local, mutate func(*v1alpha1.ClusterTarget)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var ct v1alpha1.ClusterTarget
		if err := l.Client.Get(context.Background(), client.ObjectKey{Name: v1alpha1.ClusterTargetName}, &ct); err != nil {
			return err
		}
		mutate(&ct)
		return l.Client.Update(context.Background(), &ct)
	})
	if err != nil {
		t.Fatalf("editing the ClusterTarget: %v", err)
	}
}

// GeneratedOperations names the operations the ClusterTarget generated, oldest first.
func GeneratedOperations(t testing.TB, l *Local) []string {
	t.Helper()
	var ops v1alpha1.NodeOperationList
	if err := l.Client.List(context.Background(), &ops); err != nil {
		t.Fatal(err)
	}
	sort.Slice(ops.Items, func(i, j int) bool { return ops.Items[i].CreationTimestamp.Before(&ops.Items[j].CreationTimestamp) })
	var out []string
	for i := range ops.Items {
		if skeleton.ControllerRef(&ops.Items[i], "ClusterTarget") != nil {
			out = append(out, ops.Items[i].Name)
		}
	}
	return out
}
