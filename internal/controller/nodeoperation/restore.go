package nodeoperation

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/skeleton"
	"github.com/nodeops/nodeops/internal/taskpolicy"
)

// restoreCordons gives back the schedulability the operation's cordons recorded on every node
// that still carries its record once the operation has ended (uncordon restores what cordon found, rule 5): a
// task aborted, failed then skipped past its uncordon, marked AgentLost then aborted, or a group
// that cordons without uncordoning. While a task runs, its agent is the one that cordons and
// restores; an ended operation has no task left running, so the manager is then the one writer.
// Nodes are found in the cache; a record the cache has not seen yet wakes the operation when it
// arrives (recordOwner).
func (r *Reconciler) restoreCordons(ctx context.Context, op *v1alpha1.NodeOperation) error {
	owner := taskpolicy.Owner(kind, op.Name, string(op.UID))
	var nodes corev1.NodeList
	if err := r.Client.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	w := skeleton.NewWrites(r.CreateParallelism)
	for i := range nodes.Items {
		if rec, ok := taskpolicy.ParseCordonRecord(&nodes.Items[i]); !ok || rec.Owner != owner {
			continue
		}
		name := nodes.Items[i].Name
		w.Go(func() error { return r.restoreCordon(ctx, name, owner) })
	}
	return w.Wait()
}

// restoreCordon restores one node from the API server's copy, with an optimistic lock so that a
// change made since (an administrator's cordon or uncordon) is read before anything is written.
func (r *Reconciler) restoreCordon(ctx context.Context, name, owner string) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var node corev1.Node
		if err := r.APIReader.Get(ctx, client.ObjectKey{Name: name}, &node); err != nil {
			return client.IgnoreNotFound(err)
		}
		next := taskpolicy.RestorePatch(&node, owner)
		if next == nil {
			return nil
		}
		return r.Client.Patch(ctx, next, client.MergeFromWithOptions(&node, client.MergeFromWithOptimisticLock{}))
	})
	if err != nil {
		return fmt.Errorf("restore the schedulability of node %s recorded by %s: %w", name, owner, err)
	}
	return nil
}

// recordOwner maps a node event to the NodeOperation named in its cordon record, so that an
// ended operation restores a record its reconcile had not seen yet.
func (r *Reconciler) recordOwner(_ context.Context, o client.Object) []reconcile.Request {
	node, ok := o.(*corev1.Node)
	if !ok {
		return nil
	}
	rec, ok := taskpolicy.ParseCordonRecord(node)
	if !ok {
		return nil
	}
	if k, name := taskpolicy.OwnerName(rec.Owner); k == kind {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: name}}}
	}
	return nil
}

// cordonRecordChanged passes node events that add or change a cordon record.
func cordonRecordChanged() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc: func(e event.CreateEvent) bool {
			return e.Object.GetAnnotations()[taskpolicy.AnnotationWasUnschedulable] != ""
		},
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			now := e.ObjectNew.GetAnnotations()[taskpolicy.AnnotationWasUnschedulable]
			return now != "" && now != e.ObjectOld.GetAnnotations()[taskpolicy.AnnotationWasUnschedulable]
		},
	}
}
