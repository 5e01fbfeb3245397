package nodeprofile

import (
	"fmt"
	"testing"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// A command gate that runs on the node about to start answers for that node only: once it passed,
// that node alone starts; a gate with a node of its own, or one a person skipped, lets all start.
func TestGatedStarts(t *testing.T) {
	starts := []Start{{Node: "n1", Action: ActionInstall}, {Node: "n2", Action: ActionInstall}}
	perNode := v1alpha1.Gate{Name: "resync", Command: &v1alpha1.CommandGate{Script: "true"}}
	onNode := v1alpha1.Gate{Name: "storage", Command: &v1alpha1.CommandGate{Script: "true", Node: "storage-1"}}
	approval := v1alpha1.Gate{Name: "sign-off", Approval: &v1alpha1.ApprovalGate{}}
	rec := func(name string, state v1alpha1.GateState) v1alpha1.GateStatus {
		return v1alpha1.GateStatus{Name: name, State: state}
	}
	for _, tc := range []struct {
		name    string
		gates   []v1alpha1.Gate
		records []v1alpha1.GateStatus
		want    string
	}{
		{"no command gate", []v1alpha1.Gate{approval}, []v1alpha1.GateStatus{rec("sign-off", v1alpha1.GatePassed)}, "[n1 n2]"},
		{"a per-node gate passed", []v1alpha1.Gate{approval, perNode}, []v1alpha1.GateStatus{rec("sign-off", v1alpha1.GatePassed), rec("resync", v1alpha1.GatePassed)}, "[n2]"},
		{"a per-node gate skipped", []v1alpha1.Gate{perNode}, []v1alpha1.GateStatus{rec("resync", v1alpha1.GateSkipped)}, "[n1 n2]"},
		{"a gate on its own node passed", []v1alpha1.Gate{onNode}, []v1alpha1.GateStatus{rec("storage", v1alpha1.GatePassed)}, "[n1 n2]"},
	} {
		p := &v1alpha1.NodeProfile{Spec: v1alpha1.NodeProfileSpec{Gates: tc.gates}}
		var got []string
		for _, st := range gatedStarts(p, starts, tc.records, "n2") {
			got = append(got, st.Node)
		}
		if fmt.Sprint(got) != tc.want {
			t.Errorf("%s: starts %v, want %s", tc.name, got, tc.want)
		}
	}
}
