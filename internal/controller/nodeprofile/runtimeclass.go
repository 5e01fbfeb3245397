package nodeprofile

import (
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/skeleton"
	"github.com/nodeops/nodeops/internal/objname"
)

// BuildRuntimeClass builds the RuntimeClass rc of profile p: it schedules pods onto the nodes
// the profile has provisioned, by the one label they all carry (not the node name, as KWasm did).
func BuildRuntimeClass(p *v1alpha1.NodeProfile, rc v1alpha1.RuntimeClassSpec) *nodev1.RuntimeClass {
	var tolerations []corev1.Toleration
	for i := range rc.Tolerations {
		tolerations = append(tolerations, *rc.Tolerations[i].DeepCopy())
	}
	return &nodev1.RuntimeClass{
		TypeMeta: metav1.TypeMeta{APIVersion: nodev1.SchemeGroupVersion.String(), Kind: "RuntimeClass"},
		ObjectMeta: metav1.ObjectMeta{
			Name:            rc.Name,
			Labels:          map[string]string{v1alpha1.LabelProfile: objname.LabelValue(p.Name)},
			OwnerReferences: []metav1.OwnerReference{ownerRef(p)},
		},
		Handler: rc.Handler,
		Scheduling: &nodev1.Scheduling{
			NodeSelector: map[string]string{ProvisionedLabel(p.Name): v1alpha1.ProvisionedValue},
			Tolerations:  tolerations,
		},
	}
}

// RuntimeClassChanges is what keeps a profile's RuntimeClasses in step with its spec.
type RuntimeClassChanges struct {
	Create []*nodev1.RuntimeClass
	// Update holds existing classes with the desired labels and scheduling applied.
	Update []*nodev1.RuntimeClass
	// Recreate: the handler changed, and a RuntimeClass's handler is immutable.
	Recreate []*nodev1.RuntimeClass
	Delete   []string
	// Conflicts name classes the spec lists that exist and belong to something else; left alone.
	Conflicts []string
}

// PlanRuntimeClasses compares the desired classes of p (none while it is deleted) with the
// existing ones (all RuntimeClasses, or at least those named by p or owned by it).
func PlanRuntimeClasses(p *v1alpha1.NodeProfile, existing []nodev1.RuntimeClass, deleting bool) RuntimeClassChanges {
	var ch RuntimeClassChanges
	byName := make(map[string]*nodev1.RuntimeClass, len(existing))
	for i := range existing {
		byName[existing[i].Name] = &existing[i]
	}
	desired := map[string]bool{}
	if !deleting {
		for _, spec := range p.Spec.RuntimeClasses {
			if desired[spec.Name] {
				continue
			}
			desired[spec.Name] = true
			want := BuildRuntimeClass(p, spec)
			have, ok := byName[spec.Name]
			switch {
			case !ok:
				ch.Create = append(ch.Create, want)
			case !ownedBy(have, p):
				ch.Conflicts = append(ch.Conflicts, fmt.Sprintf("RuntimeClass %s exists and is not owned by this profile", spec.Name))
			case have.Handler != want.Handler:
				ch.Recreate = append(ch.Recreate, want)
			case !equality.Semantic.DeepEqual(have.Scheduling, want.Scheduling) ||
				have.Labels[v1alpha1.LabelProfile] != want.Labels[v1alpha1.LabelProfile]:
				upd := have.DeepCopy()
				if upd.Labels == nil {
					upd.Labels = map[string]string{}
				}
				upd.Labels[v1alpha1.LabelProfile] = want.Labels[v1alpha1.LabelProfile]
				upd.Scheduling = want.Scheduling
				ch.Update = append(ch.Update, upd)
			}
		}
	}
	for i := range existing {
		if ownedBy(&existing[i], p) && !desired[existing[i].Name] {
			ch.Delete = append(ch.Delete, existing[i].Name)
		}
	}
	sort.Strings(ch.Delete)
	return ch
}

func ownedBy(obj metav1.Object, p *v1alpha1.NodeProfile) bool {
	uid := skeleton.ControllerUID(obj, kind)
	return uid != "" && uid == p.UID
}
