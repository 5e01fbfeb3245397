package nodetask

import (
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/yaml"

	"github.com/nodeops/nodeops/config"
	"github.com/nodeops/nodeops/internal/statuswrite"
)

// TestManagerConditionsMatchItsAdmissionPolicy: the condition types the manager's NodeTask rules own
// (lostRule, drainedRule) are the ones its admission policy lets it change
// (config/admission/manager-nodetask-status.yaml, variable managerConditions), and both rules own
// conditions alone: the check in code before a write and the API's check say the same.
func TestManagerConditionsMatchItsAdmissionPolicy(t *testing.T) {
	data, err := config.Admission.ReadFile("admission/manager-nodetask-status.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc, _, _ := strings.Cut(string(data), "\n---\n")
	var policy admissionregistrationv1.ValidatingAdmissionPolicy
	if err := yaml.UnmarshalStrict([]byte(doc), &policy); err != nil {
		t.Fatal(err)
	}
	var owned []string
	for _, rule := range []statuswrite.Rule{lostRule, drainedRule} {
		if rule.Fields != statuswrite.ConditionsOnly {
			t.Errorf("a manager's NodeTask rule writes %s, want status.conditions alone (NodeTaskStatus)", rule.Fields)
		}
		owned = append(owned, rule.Owned...)
	}
	var want []string
	for _, c := range owned {
		want = append(want, "'"+c+"'")
	}
	want = slices.Sorted(slices.Values(want))
	i := slices.IndexFunc(policy.Spec.Variables, func(v admissionregistrationv1.Variable) bool { return v.Name == "managerConditions" })
	if i < 0 {
		t.Fatal("the policy has no variable managerConditions")
	}
	expr := policy.Spec.Variables[i].Expression
	var got []string
	for _, s := range strings.Split(strings.Trim(expr, "[]"), ",") {
		got = append(got, strings.TrimSpace(s))
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("managerConditions is %s; the manager's rules own %v", expr, owned)
	}
	for _, v := range policy.Spec.Validations {
		for _, c := range owned {
			if !strings.Contains(v.Message, c) || !strings.Contains(v.MessageExpression, c) {
				t.Errorf("the message %q does not name the manager's condition %s", v.Message, c)
			}
		}
	}
}
