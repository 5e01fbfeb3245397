package taskpolicy

import (
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// AnnotationWasUnschedulable is nodeops' record on a Node, from cordon to its restoration, of
// whether the node was unschedulable before nodeops cordoned it, and of who cordoned it: the value
// is "<true|false>,<owner>", such as "false,NodeOperation/upgrade/3f2c...". Only the owner
// trusts the record (uncordon restores what cordon found, rule 5).
const AnnotationWasUnschedulable = "nodeops.io/was-unschedulable"

// CordonRecord is the parsed value of AnnotationWasUnschedulable.
type CordonRecord struct {
	WasUnschedulable bool
	// Owner is who cordoned: see OwnerOfTask.
	Owner string
}

func (r CordonRecord) String() string {
	return strconv.FormatBool(r.WasUnschedulable) + "," + r.Owner
}

// ParseCordonRecord reads a node's record; ok is false without one, or for a value without an
// owner (written before records carried one), which nobody trusts.
func ParseCordonRecord(node *corev1.Node) (CordonRecord, bool) {
	was, owner, found := strings.Cut(node.Annotations[AnnotationWasUnschedulable], ",")
	b, err := strconv.ParseBool(was)
	if !found || err != nil || owner == "" {
		return CordonRecord{}, false
	}
	return CordonRecord{WasUnschedulable: b, Owner: owner}, true
}

// Owner names an object that cordons: "<kind>/<name>/<uid>". The uid makes an operation deleted
// and created again under the same name a different owner.
func Owner(kind, name, uid string) string {
	return kind + "/" + name + "/" + uid
}

// OwnerOfTask is who a task cordons for: its controller (the NodeOperation or NodeProfile, so that
// one group's cordon is restored by a later group's uncordon), or the task itself when it has none.
func OwnerOfTask(t *v1alpha1.NodeTask) string {
	if ref := metav1.GetControllerOf(t); ref != nil {
		return Owner(ref.Kind, ref.Name, string(ref.UID))
	}
	return Owner("NodeTask", t.Name, string(t.UID))
}

// OwnerName is the kind and name in an owner, for finding the object that made a record.
func OwnerName(owner string) (kind, name string) {
	parts := strings.SplitN(owner, "/", 3)
	if len(parts) != 3 {
		return "", ""
	}
	return parts[0], parts[1]
}

// CordonPatch is the node after owner cordons it, or nil when there is nothing to change. The
// prior state is recorded in the same update that cordons. The owner's own record is kept (a
// second cordon, or one after someone uncordoned the node meanwhile); any other record (an
// earlier operation's, left by an ending that never restored it) is not trusted: the node's
// schedulability as it is now is the prior state.
func CordonPatch(node *corev1.Node, owner string) *corev1.Node {
	rec, ok := ParseCordonRecord(node)
	mine := ok && rec.Owner == owner
	if mine && node.Spec.Unschedulable {
		return nil
	}
	out := node.DeepCopy()
	if !mine {
		if out.Annotations == nil {
			out.Annotations = map[string]string{}
		}
		out.Annotations[AnnotationWasUnschedulable] = CordonRecord{WasUnschedulable: node.Spec.Unschedulable, Owner: owner}.String()
	}
	out.Spec.Unschedulable = true
	return out
}

// RestorePatch is the node after owner restores what its cordon recorded, or nil when there is
// nothing to change. nodeops undoes only its own change: it makes the node schedulable only when
// owner's record says it was schedulable and it is unschedulable now, and never cordons. A node
// without owner's record (never cordoned by owner, another owner's record, or one an administrator
// removed to keep the node cordoned) is left as it is.
func RestorePatch(node *corev1.Node, owner string) *corev1.Node {
	rec, ok := ParseCordonRecord(node)
	if !ok || rec.Owner != owner {
		return nil
	}
	out := node.DeepCopy()
	delete(out.Annotations, AnnotationWasUnschedulable)
	if !rec.WasUnschedulable {
		out.Spec.Unschedulable = false
	}
	return out
}
