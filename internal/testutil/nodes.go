package testutil

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// NodeConditions are the conditions of a Ready node, or of a NotReady one, as its kubelet reports
// them (heartbeat now); envtest runs no kubelet.
func NodeConditions(ready bool) []corev1.NodeCondition {
	status := corev1.ConditionTrue
	if !ready {
		status = corev1.ConditionFalse
	}
	return []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, Reason: "Test", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
}

// CreateNode creates n and then writes its status, the status n came with plus NodeConditions(ready):
// the API server drops the status of a create.
func CreateNode(ctx context.Context, c client.Client, n *corev1.Node, ready bool) error {
	status := n.Status
	if err := c.Create(ctx, n); err != nil {
		return fmt.Errorf("create node %s: %w", n.Name, err)
	}
	n.Status = status
	n.Status.Conditions = NodeConditions(ready)
	// A Node's status is its kubelet's, which this stands in for; statuswrite writes nodeops' kinds.
	if err := c.Status().Update(ctx, n); err != nil {
		return fmt.Errorf("write status of node %s: %w", n.Name, err)
	}
	return nil
}

// SetNodeReady writes node's conditions NodeConditions(ready), rereading on conflicts.
func SetNodeReady(ctx context.Context, c client.Client, node string, ready bool) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var n corev1.Node
		if err := c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
			return err
		}
		n.Status.Conditions = NodeConditions(ready)
		// As above: the kubelet's write.
		return c.Status().Update(ctx, &n)
	})
	if err != nil {
		return fmt.Errorf("set node %s ready=%t: %w", node, ready, err)
	}
	return nil
}
