package gate

import (
	"strings"
	"testing"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// Compile accepts boolean expressions with the Kubernetes CEL libraries and refuses the rest with
// the reason; Validate names the field.
func TestCompile(t *testing.T) {
	for _, tc := range []struct {
		expr, err string
	}{
		{expr: "self.status.availableReplicas == self.spec.replicas"},
		{expr: "quantity(self.status.capacity.storage).isGreaterThan(quantity('1Gi'))"},
		{expr: "self.status.conditions.exists(c, c.type == 'Ready' && c.status == 'True')"},
		{expr: "isURL(self.spec.url) && self.metadata.name.matches('^osd-')"},
		{expr: "self.status.availableReplicas ==", err: "Syntax error"},
		{expr: "'ready'", err: "not a bool"},
		{expr: "self.spec.replicas + 1", err: "not a bool"},
		{expr: "nosuchfunction(self)", err: "undeclared reference"},
	} {
		_, err := Compile(tc.expr)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%q: %v", tc.expr, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: error %v, want one saying %q", tc.expr, err, tc.err)
		}
	}
	spec := &v1alpha1.NodeOperationSpec{
		Scheduling: v1alpha1.Scheduling{Gates: []v1alpha1.Gate{{Name: "ok", CEL: &v1alpha1.CELGate{Expression: "true"}}}},
		Custom: &v1alpha1.CustomOperation{Groups: []v1alpha1.Group{{Name: "a"}, {Name: "b", Scheduling: v1alpha1.Scheduling{Gates: []v1alpha1.Gate{
			{Name: "approval", Approval: &v1alpha1.ApprovalGate{}}, {Name: "bad", CEL: &v1alpha1.CELGate{Expression: "1"}}}}}}},
	}
	if err := Validate(spec); err == nil || !strings.HasPrefix(err.Error(), "spec.custom.groups[1].gates[1].cel.expression: ") {
		t.Errorf("Validate: %v, want the field path of the bad expression", err)
	}
}
