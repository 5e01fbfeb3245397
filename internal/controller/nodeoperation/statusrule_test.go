package nodeoperation

import (
	"slices"
	"testing"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// Each controller owns its conditions (one writer per field): every condition decide sets is in the
// status rule's list, or statuswrite.Write refuses the write.
func TestStatusRuleOwnsEveryCondition(t *testing.T) {
	for _, phase := range []v1alpha1.OperationPhase{v1alpha1.OperationRunning, v1alpha1.OperationBlocked, v1alpha1.OperationSucceeded, v1alpha1.OperationFailed} {
		var st v1alpha1.NodeOperationStatus
		setConditions(&st, 1, phase, "R", "m")
		for _, c := range st.Conditions {
			if !slices.Contains(statusRule.Owned, c.Type) {
				t.Errorf("%s: decide sets condition %s, which the status rule does not own", phase, c.Type)
			}
		}
	}
}
