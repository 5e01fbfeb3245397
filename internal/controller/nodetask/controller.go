// Package nodetask is the manager's NodeTask controller. The agent, the task's one status writer,
// acts on a person's spec.recoveryMode and marks it done in status.recoveredGeneration; this
// controller then clears spec.recoveryMode, so that the next `kubectl nodeops retry` or `skip`
// (which sets it again, a new generation) is a new request (docs/design.md, safety rule 3). It
// writes no status.
package nodetask

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/taskpolicy"
)

// +kubebuilder:rbac:groups=nodeops.io,resources=nodetasks,verbs=get;list;watch;patch

// Reconciler clears a recoveryMode that the agent acted on.
type Reconciler struct {
	Client client.Client
}

// SetupWithManager registers the NodeTask controller.
func SetupWithManager(mgr ctrl.Manager) error {
	r := &Reconciler{Client: mgr.GetClient()}
	return ctrl.NewControllerManagedBy(mgr).
		Named("nodetask").
		For(&v1alpha1.NodeTask{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			t, ok := o.(*v1alpha1.NodeTask)
			return ok && actedOn(t)
		}))).
		Complete(r)
}

// actedOn reports whether the task carries a recoveryMode its agent has recorded as acted on.
func actedOn(t *v1alpha1.NodeTask) bool {
	return t.Spec.RecoveryMode != v1alpha1.RecoveryNone && !taskpolicy.NeedsRecovery(t)
}

// Reconcile clears spec.recoveryMode once the agent acted on it; until then it waits for the
// agent's status write, which brings the task back here.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var task v1alpha1.NodeTask
	if err := r.Client.Get(ctx, req.NamespacedName, &task); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !actedOn(&task) {
		return ctrl.Result{}, nil
	}
	orig := task.DeepCopy()
	task.Spec.RecoveryMode = v1alpha1.RecoveryNone
	// Optimistic lock: a person may have asked again since this read, and that request must stay.
	err := r.Client.Patch(ctx, &task, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
	if apierrors.IsConflict(err) {
		// The write that came first (often the agent's next status write) brings the task back.
		return ctrl.Result{}, nil
	}
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("clear recoveryMode on NodeTask %s: %w", task.Name, err)
	}
	return ctrl.Result{}, nil
}
