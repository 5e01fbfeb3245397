package nodeprofile

import (
	"context"
	"fmt"

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
	"github.com/nodeops/nodeops/internal/plan"
)

// ownerIndex indexes NodeTasks by the UID of the NodeProfile that controls them.
const ownerIndex = "nodeprofile.nodeops.io/owner-uid"

// SetupWithManager registers the NodeProfile controller with default tunables; lock is the node
// lock table shared with the NodeOperation controller.
func SetupWithManager(mgr ctrl.Manager, lock Locker) error {
	return New(mgr.GetClient(), lock, mgr.GetEventRecorder("nodeprofile-controller")).SetupWithManager(mgr)
}

// SetupWithManager registers r with mgr: it watches profiles, their tasks and RuntimeClasses, and nodes.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	err := mgr.GetFieldIndexer().IndexField(context.Background(), &v1alpha1.NodeTask{}, ownerIndex, func(o client.Object) []string {
		if ref := ownerProfile(o); ref != "" {
			return []string{string(ref)}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("index NodeTasks by NodeProfile: %w", err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("nodeprofile").
		For(&v1alpha1.NodeProfile{}, builder.WithPredicates(profileChanged())).
		Owns(&v1alpha1.NodeTask{}).
		Owns(&nodev1.RuntimeClass{}).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.profilesFor), builder.WithPredicates(nodeChanged())).
		Complete(r)
}

func ownerProfile(o client.Object) types.UID {
	for _, ref := range o.GetOwnerReferences() {
		if ref.Controller != nil && *ref.Controller && ref.Kind == "NodeProfile" && ref.APIVersion == v1alpha1.GroupVersion.String() {
			return ref.UID
		}
	}
	return ""
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

// profileChanged passes spec changes, deletion and finalizer changes, not the controller's own status writes.
func profileChanged() predicate.Funcs {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld, e.ObjectNew
			return o.GetGeneration() != n.GetGeneration() ||
				!o.GetDeletionTimestamp().Equal(n.GetDeletionTimestamp()) ||
				!equality.Semantic.DeepEqual(o.GetFinalizers(), n.GetFinalizers())
		},
	}
}

// nodeChanged passes what membership, labels and readiness depend on; heartbeats are dropped.
func nodeChanged() predicate.Funcs {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*corev1.Node)
			n, ok2 := e.ObjectNew.(*corev1.Node)
			if !ok1 || !ok2 {
				return true
			}
			return !equality.Semantic.DeepEqual(o.Labels, n.Labels) ||
				!equality.Semantic.DeepEqual(o.Annotations, n.Annotations) ||
				plan.NodeReady(o) != plan.NodeReady(n)
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}
