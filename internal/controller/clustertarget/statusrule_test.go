package clustertarget

import (
	"slices"
	"testing"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// Each controller owns its conditions (one writer per field): every condition decide sets is in the
// status rule's list, or statuswrite.Write refuses the write.
func TestStatusRuleOwnsEveryCondition(t *testing.T) {
	var st v1alpha1.ClusterTargetStatus
	setConditions(&st, 1, verdict{phase: v1alpha1.ClusterBlocked, reason: "R", reconciling: true, stalls: true})
	for _, c := range st.Conditions {
		if !slices.Contains(statusRule.Owned, c.Type) {
			t.Errorf("decide sets condition %s, which the status rule does not own", c.Type)
		}
	}
}
