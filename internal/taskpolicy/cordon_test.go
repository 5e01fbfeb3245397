package taskpolicy

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	me    = "NodeOperation/upgrade/uid-2"
	other = "NodeOperation/upgrade/uid-1" // the same name, deleted and created again
)

func node(unschedulable bool, record string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Spec: corev1.NodeSpec{Unschedulable: unschedulable}}
	if record != "" {
		n.Annotations = map[string]string{AnnotationWasUnschedulable: record}
	}
	return n
}

// apply is the node after a patch, or the node itself when the patch changes nothing.
func apply(n *corev1.Node, patch func(*corev1.Node, string) *corev1.Node, owner string) *corev1.Node {
	if out := patch(n, owner); out != nil {
		return out
	}
	return n
}

func TestSafetyRule5_CordonUncordonRestoresPriorState(t *testing.T) {
	for _, tc := range []struct {
		name string
		// before is the node when the owner's cordon runs; between changes it before the restore.
		before  *corev1.Node
		between func(*corev1.Node)
		want    bool
	}{
		{name: "schedulable", before: node(false, ""), want: false},
		{name: "cordoned by an administrator before", before: node(true, ""), want: true},
		{name: "a stale record of another owner on a node an administrator cordoned since", before: node(true, "false,"+other), want: true},
		{name: "a stale record without an owner (written before records had one)", before: node(true, "false"), want: true},
		{name: "a stale record of another owner on a schedulable node", before: node(false, "true,"+other), want: false},
		{name: "uncordoned by someone meanwhile: left schedulable", before: node(false, ""), between: func(n *corev1.Node) { n.Spec.Unschedulable = false }, want: false},
		{name: "administrator cordoned and uncordoned meanwhile: never cordoned by the restore", before: node(true, ""), between: func(n *corev1.Node) { n.Spec.Unschedulable = false }, want: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cordoned := CordonPatch(tc.before, me)
			if cordoned == nil || !cordoned.Spec.Unschedulable {
				t.Fatalf("cordon made no change: %+v", cordoned)
			}
			if again := CordonPatch(cordoned, me); again != nil {
				t.Errorf("a second cordon changed the node: %v", again.Annotations)
			}
			if tc.between != nil {
				tc.between(cordoned)
			}
			if other := RestorePatch(cordoned, other); other != nil {
				t.Errorf("another owner restored this owner's cordon: %+v", other)
			}
			restored := apply(cordoned, RestorePatch, me)
			if restored.Spec.Unschedulable != tc.want {
				t.Errorf("restored unschedulable=%t, want %t", restored.Spec.Unschedulable, tc.want)
			}
			if _, ok := restored.Annotations[AnnotationWasUnschedulable]; ok {
				t.Errorf("the restore left the record %q", restored.Annotations[AnnotationWasUnschedulable])
			}
		})
	}
}

func TestSafetyRule5_RestoreLeavesWhatItDidNotCordon(t *testing.T) {
	for name, n := range map[string]*corev1.Node{
		"no record, cordoned":         node(true, ""),
		"no record, schedulable":      node(false, ""),
		"another owner's record":      node(true, "false,"+other),
		"a record without an owner":   node(true, "false"),
		"a record that is not a bool": node(true, "maybe,"+me),
	} {
		if out := RestorePatch(n, me); out != nil {
			t.Errorf("%s: restore changed the node to unschedulable=%t, annotations %v", name, out.Spec.Unschedulable, out.Annotations)
		}
	}
}

func TestOwnerName(t *testing.T) {
	kind, name := OwnerName(Owner("NodeOperation", "upgrade", "u"))
	if kind != "NodeOperation" || name != "upgrade" {
		t.Errorf("OwnerName = %q, %q", kind, name)
	}
}
