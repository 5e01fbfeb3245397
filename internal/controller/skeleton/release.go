package skeleton

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// The controllers keep a task someone deleted with a finalizer until its owner has recorded how it
// ended (nothing deleted automatically, rule 7: deleting history by hand never makes anything run
// again); these are the steps of keeping and letting it go that they share.

// AddFinalizer puts finalizer on t, a copy from the cache, under an optimistic lock: a task made
// by an older nodeops, which did not set it at creation, is kept like any other from then on. A
// copy older than the API server's changes nothing and is no error (the newer copy's event brings
// the owner back, and that look tries again), nor does a task already being deleted (the API
// server takes no new finalizer then) or gone.
func AddFinalizer(ctx context.Context, c client.Client, t *v1alpha1.NodeTask, finalizer string) error {
	if controllerutil.ContainsFinalizer(t, finalizer) || !t.DeletionTimestamp.IsZero() {
		return nil
	}
	kept := t.DeepCopy()
	controllerutil.AddFinalizer(kept, finalizer)
	if err := c.Patch(ctx, kept, client.MergeFromWithOptions(t, client.MergeFromWithOptimisticLock{})); ignoreStale(err) != nil {
		return fmt.Errorf("add finalizer %s to NodeTask %s: %w", finalizer, t.Name, err)
	}
	return nil
}

// RemoveFinalizer takes finalizer off t, a copy from the cache, under an optimistic lock, so that a
// copy older than the API server's changes nothing. Such a copy is no error (the newer copy's event
// brings the owner back) but stale is true then: what was decided on t must wait for that look. A
// task without the finalizer, or already gone, is no error either.
func RemoveFinalizer(ctx context.Context, c client.Client, t *v1alpha1.NodeTask, finalizer string) (stale bool, err error) {
	if !controllerutil.ContainsFinalizer(t, finalizer) {
		return false, nil
	}
	released := t.DeepCopy()
	controllerutil.RemoveFinalizer(released, finalizer)
	err = c.Patch(ctx, released, client.MergeFromWithOptions(t, client.MergeFromWithOptimisticLock{}))
	if apierrors.IsConflict(err) {
		return true, nil
	}
	if client.IgnoreNotFound(err) != nil {
		return false, fmt.Errorf("remove finalizer %s from NodeTask %s: %w", finalizer, t.Name, err)
	}
	return false, nil
}

// ignoreStale is err, unless it says the copy written from was older than the API server's
// (Conflict) or the task is gone.
func ignoreStale(err error) error {
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// Orphans returns those of tasks whose owner, of kind and named name, is gone: the API server,
// read once through live into owner (an empty object of that kind), has no object of that name, or
// one under another UID (deleted and created again). The cache's word is not enough: just after a
// start or a leader change the owners' cache can be behind the tasks'.
func Orphans(ctx context.Context, live client.Reader, owner client.Object, kind, name string, tasks []*v1alpha1.NodeTask) ([]*v1alpha1.NodeTask, error) {
	if len(tasks) == 0 {
		return nil, nil
	}
	err := live.Get(ctx, client.ObjectKey{Name: name}, owner)
	if apierrors.IsNotFound(err) {
		return tasks, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s %s before letting its tasks go: %w", kind, name, err)
	}
	var gone []*v1alpha1.NodeTask
	for _, t := range tasks {
		if ControllerUID(t, kind) != owner.GetUID() {
			gone = append(gone, t)
		}
	}
	return gone, nil
}
