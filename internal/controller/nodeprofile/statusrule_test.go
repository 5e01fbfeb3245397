package nodeprofile

import (
	"slices"
	"testing"
)

// Each controller owns its conditions (one writer per field): every condition ComputeStatus sets is
// in the status rule's list, or statuswrite.Write refuses the write.
func TestStatusRuleOwnsEveryCondition(t *testing.T) {
	for _, in := range []StatusInput{{}, {Invalid: "spec.nodeSelector: bad"}, {Deleting: true}} {
		_, conds, _ := ComputeStatus(in)
		for _, c := range conds {
			if !slices.Contains(statusRule.Owned, c.Type) {
				t.Errorf("%+v: ComputeStatus sets condition %s, which the status rule does not own", in, c.Type)
			}
		}
	}
}
