package commands

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/taskpolicy"
	"github.com/nodeops/nodeops/internal/transient"
)

// AnnotationWasUnschedulable is nodeops' record of a node's schedulability before it cordoned it,
// and of who cordoned (uncordon restores what cordon found, rule 5); taskpolicy.CordonPatch and RestorePatch say how it is used.
const AnnotationWasUnschedulable = taskpolicy.AnnotationWasUnschedulable

func patchNode(ctx context.Context, env *Env, verb string, change func(*corev1.Node) *corev1.Node) (Result, error) {
	var res Result
	// A conflict rereads the node; a moment's API server failure (a 503) is waited out.
	err := transient.Retry(ctx, func() error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			var err error
			res, err = patchNodeOnce(ctx, env, verb, change)
			return err
		})
	})
	return res, err
}

func patchNodeOnce(ctx context.Context, env *Env, verb string, change func(*corev1.Node) *corev1.Node) (Result, error) {
	node := &corev1.Node{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: env.NodeName}, node); err != nil {
		return Result{}, fmt.Errorf("reading node %s: %w", env.NodeName, err)
	}
	next := change(node)
	if next == nil {
		if verb == "restored" {
			return Result{Message: fmt.Sprintf("node %s left as it is (unschedulable=%t): no cordon of %s to restore", env.NodeName, node.Spec.Unschedulable, env.owner())}, nil
		}
		return Result{Message: fmt.Sprintf("node %s already %s", env.NodeName, verb)}, nil
	}
	// The resourceVersion in the patch makes it fail rather than overwrite a concurrent change.
	if err := env.Client.Patch(ctx, next, client.MergeFromWithOptions(node, client.MergeFromWithOptimisticLock{})); err != nil {
		return Result{}, fmt.Errorf("patching node %s: %w", env.NodeName, err)
	}
	return Result{Message: fmt.Sprintf("node %s %s (unschedulable=%t)", env.NodeName, verb, next.Spec.Unschedulable)}, nil
}

func runCordon(ctx context.Context, env *Env, _ *v1alpha1.CordonCommand) (Result, error) {
	return patchNode(ctx, env, "cordoned", func(n *corev1.Node) *corev1.Node { return taskpolicy.CordonPatch(n, env.owner()) })
}

// runUncordon restores what this task's owner recorded when it cordoned; a node it did not
// cordon keeps its schedulability, so an administrator's cordon is never undone.
func runUncordon(ctx context.Context, env *Env, _ *v1alpha1.UncordonCommand) (Result, error) {
	return patchNode(ctx, env, "restored", func(n *corev1.Node) *corev1.Node { return taskpolicy.RestorePatch(n, env.owner()) })
}
