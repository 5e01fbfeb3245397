package metrics

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// A failed gate check is its gate's answer: it makes no node unavailable in the metrics and is
// no failed command, while a failed task of the same shape without spec.gateCheck is both.
func TestFailedGateCheckIsNoFailedCommandAndNoDownNode(t *testing.T) {
	failed := func(name, gateCheck string) v1alpha1.NodeTask {
		return v1alpha1.NodeTask{
			ObjectMeta: metav1.ObjectMeta{Name: name,
				OwnerReferences: []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "NodeOperation", Name: "op", Controller: ptr.To(true)}}},
			Spec: v1alpha1.NodeTaskSpec{NodeName: name + "-node", GateCheck: gateCheck,
				Commands: []v1alpha1.Command{{Script: &v1alpha1.ScriptCommand{Inline: "false"}}}},
			Status: v1alpha1.NodeTaskStatus{Phase: v1alpha1.TaskFailed,
				Commands: []v1alpha1.CommandStatus{{Phase: v1alpha1.CommandFailed, Attempt: 1}}},
		}
	}
	check, task := failed("check", "resync"), failed("task", "")
	check.UID, task.UID = "uid-check", "uid-task"
	// A NodeProfile's command gate check is one too.
	pcheck := failed("pcheck", "resync")
	pcheck.UID, pcheck.OwnerReferences[0].Kind = "uid-pcheck", "NodeProfile"

	down := downNodes([]v1alpha1.NodeTask{check, task, pcheck}, nil)
	if down["check-node"] || down["pcheck-node"] || !down["task-node"] {
		t.Errorf("down nodes %v: want task-node only", down)
	}
	f := newFailures()
	f.observe(&check, true)
	f.observe(&pcheck, true)
	f.observe(&task, true)
	var n float64
	for _, c := range f.snapshot() {
		n += c
	}
	if n != 1 {
		t.Errorf("failed commands counted %v, want 1 (the task's, not the check's): %v", n, f.snapshot())
	}
}
