package skeleton

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
func ControllerUID(o metav1.Object, kind string) types.UID {
	if ref := ControllerRef(o, kind); ref != nil {
		return ref.UID
	}
	return ""
}

// ControllerRef is o's controller reference when it names a nodeops object of kind, else nil.
func ControllerRef(o metav1.Object, kind string) *metav1.OwnerReference {
	for _, ref := range o.GetOwnerReferences() {
		if ref.Controller != nil && *ref.Controller && ref.Kind == kind && ref.APIVersion == v1alpha1.GroupVersion.String() {
			return &ref
		}
	}
	return nil
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
	// NodeKubeletVersion: status.nodeInfo.kubeletVersion changed (an upgraded kubelet).
	NodeKubeletVersion
)

// NodeChanged passes node creates and deletes, and updates that change one of fields or the value
// of one of the annotations; generic events and objects other than nodes do not pass.
func NodeChanged(fields NodeFields, annotations ...string) predicate.Predicate {
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
				fields&NodeSchedulable != 0 && o.Spec.Unschedulable != n.Spec.Unschedulable ||
				fields&NodeKubeletVersion != 0 && o.Status.NodeInfo.KubeletVersion != n.Status.NodeInfo.KubeletVersion ||
				slices.ContainsFunc(annotations, func(k string) bool { return o.Annotations[k] != n.Annotations[k] })
		},
	}
}

// NodeDeleted passes node deletes only: for a controller that acts when a node goes.
func NodeDeleted() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		UpdateFunc:  func(event.UpdateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return true },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}
