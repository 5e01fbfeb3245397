package skeleton

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/plan"
)

// OwnerIndex is the name of the field index of NodeTasks by the UID of their controller of kind
// ("NodeOperation", "NodeProfile", ...); each kind has its own, registered by IndexTasksByOwner.
func OwnerIndex(kind string) string { return "nodeops.io/owner-uid." + kind }

// IndexTasksByOwner registers OwnerIndex(kind) with the manager's field indexer.
func IndexTasksByOwner(ctx context.Context, indexer client.FieldIndexer, kind string) error {
	err := indexer.IndexField(ctx, &v1alpha1.NodeTask{}, OwnerIndex(kind), func(o client.Object) []string {
		if uid := ControllerUID(o, kind); uid != "" {
			return []string{string(uid)}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("index NodeTasks by %s: %w", kind, err)
	}
	return nil
}

// OwnedBy selects, in a cache List, the NodeTasks whose controller is the kind object with uid.
func OwnedBy(kind string, uid types.UID) client.MatchingFields {
	return client.MatchingFields{OwnerIndex(kind): string(uid)}
}

// ControllerUID is the UID of o's controller when it is a nodeops object of kind, else "".
func ControllerUID(o client.Object, kind string) types.UID {
	for _, ref := range o.GetOwnerReferences() {
		if ref.Controller != nil && *ref.Controller && ref.Kind == kind && ref.APIVersion == v1alpha1.GroupVersion.String() {
			return ref.UID
		}
	}
	return ""
}

// NodeFields are the parts of a Node whose change wakes a controller.
type NodeFields int

const (
	NodeLabels NodeFields = 1 << iota
	NodeAnnotations
	// NodeReadiness: the Ready condition flipped (heartbeats alone never pass).
	NodeReadiness
	// NodeSchedulable: spec.unschedulable changed (a cordon or uncordon).
	NodeSchedulable
)

// NodeChanged passes node creates and deletes, and updates that change one of fields; generic
// events and objects other than nodes do not pass.
func NodeChanged(fields NodeFields) predicate.Predicate {
	return predicate.Funcs{
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, okO := e.ObjectOld.(*corev1.Node)
			n, okN := e.ObjectNew.(*corev1.Node)
			if !okO || !okN {
				return false
			}
			return fields&NodeLabels != 0 && !equality.Semantic.DeepEqual(o.Labels, n.Labels) ||
				fields&NodeAnnotations != 0 && !equality.Semantic.DeepEqual(o.Annotations, n.Annotations) ||
				fields&NodeReadiness != 0 && plan.NodeReady(o) != plan.NodeReady(n) ||
				fields&NodeSchedulable != 0 && o.Spec.Unschedulable != n.Spec.Unschedulable
		},
	}
}
