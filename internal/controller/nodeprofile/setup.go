package nodeprofile

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/skeleton"
	"github.com/nodeops/nodeops/internal/gate"
)

// SetupWithManager registers the NodeProfile controller with default tunables; lock is the node
// lock table shared with the NodeOperation controller.
func SetupWithManager(mgr ctrl.Manager, lock skeleton.Locker) error {
	return New(mgr.GetClient(), lock, mgr.GetEventRecorder("nodeprofile-controller")).SetupWithManager(mgr)
}

// SetupWithManager registers r with mgr: it watches profiles, their tasks and RuntimeClasses, and nodes.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	if r.Gates == nil {
		g, err := gate.NewChecker(mgr.GetConfig(), mgr.GetAPIReader(), mgr.GetClient())
		if err != nil {
			return err
		}
		r.Gates = g
	}
	if err := skeleton.IndexTasksByOwner(context.Background(), mgr.GetFieldIndexer(), kind); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("nodeprofile").
		For(&v1alpha1.NodeProfile{}, builder.WithPredicates(profileChanged())).
		Owns(&v1alpha1.NodeTask{}).
		Owns(&nodev1.RuntimeClass{}).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.profilesFor), builder.WithPredicates(skeleton.NodeChanged(skeleton.NodeLabels|skeleton.NodeAnnotations|skeleton.NodeReadiness|skeleton.NodeSchedulable))).
		Complete(r)
}

// profilesFor maps a node event to every profile: there are few profiles, and any of them may
// select the node or have provisioned it.
func (r *Reconciler) profilesFor(ctx context.Context, _ client.Object) []reconcile.Request {
	var list v1alpha1.NodeProfileList
	if err := r.Client.List(ctx, &list); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "list NodeProfiles for a node event")
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: list.Items[i].Name}})
	}
	return reqs
}

// profileChanged passes spec changes, deletion, finalizer and annotation changes (a person
// approves, retries or skips a gate with an annotation), not the controller's own status writes.
func profileChanged() predicate.Funcs {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld, e.ObjectNew
			return o.GetGeneration() != n.GetGeneration() ||
				!o.GetDeletionTimestamp().Equal(n.GetDeletionTimestamp()) ||
				!equality.Semantic.DeepEqual(o.GetFinalizers(), n.GetFinalizers()) ||
				!equality.Semantic.DeepEqual(o.GetAnnotations(), n.GetAnnotations())
		},
	}
}
