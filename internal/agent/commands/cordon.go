package commands

import (
	"context"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// AnnotationWasUnschedulable remembers, from cordon to uncordon, whether the node was already
// unschedulable before nodeops cordoned it (safety rule 5).
const AnnotationWasUnschedulable = "nodeops.io/was-unschedulable"

// cordonPatch is the change cordon makes to a node, or nil when there is none. The prior state is
// recorded in the same update that cordons; a second cordon keeps the first record.
func cordonPatch(node *corev1.Node) *corev1.Node {
	if _, recorded := node.Annotations[AnnotationWasUnschedulable]; recorded && node.Spec.Unschedulable {
		return nil
	}
	out := node.DeepCopy()
	if out.Annotations == nil {
		out.Annotations = map[string]string{}
	}
	if _, recorded := out.Annotations[AnnotationWasUnschedulable]; !recorded {
		out.Annotations[AnnotationWasUnschedulable] = strconv.FormatBool(node.Spec.Unschedulable)
	}
	out.Spec.Unschedulable = true
	return out
}

// uncordonPatch restores what cordon recorded; with no record it makes the node schedulable.
func uncordonPatch(node *corev1.Node) *corev1.Node {
	was, recorded := node.Annotations[AnnotationWasUnschedulable]
	want := recorded && was == "true"
	if !recorded && !node.Spec.Unschedulable {
		return nil
	}
	out := node.DeepCopy()
	delete(out.Annotations, AnnotationWasUnschedulable)
	out.Spec.Unschedulable = want
	return out
}

func patchNode(ctx context.Context, env *Env, verb string, change func(*corev1.Node) *corev1.Node) (Result, error) {
	var res Result
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var err error
		res, err = patchNodeOnce(ctx, env, verb, change)
		return err
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
		return Result{Message: fmt.Sprintf("node %s already %s", env.NodeName, verb)}, nil
	}
	// The resourceVersion in the patch makes it fail rather than overwrite a concurrent change.
	if err := env.Client.Patch(ctx, next, client.MergeFromWithOptions(node, client.MergeFromWithOptimisticLock{})); err != nil {
		return Result{}, fmt.Errorf("patching node %s: %w", env.NodeName, err)
	}
	return Result{Message: fmt.Sprintf("node %s %s (unschedulable=%t)", env.NodeName, verb, next.Spec.Unschedulable)}, nil
}

func runCordon(ctx context.Context, env *Env, _ *v1alpha1.CordonCommand) (Result, error) {
	return patchNode(ctx, env, "cordoned", cordonPatch)
}

func runUncordon(ctx context.Context, env *Env, _ *v1alpha1.UncordonCommand) (Result, error) {
	return patchNode(ctx, env, "uncordoned", uncordonPatch)
}
