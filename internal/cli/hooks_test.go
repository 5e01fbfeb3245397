package cli

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	nodeopsv1 "github.com/nodeops/nodeops/api/v1alpha1"
)

// The plan lists each group's hooks, the group's own over the operation's, with the operation's
// pre and post hooks on its first and last group; a template that is no JobTemplateSpec is refused
// with its field path before anything is created; describe shows the recorded hook runs.
func TestPlanShowsHooksAndRefusesABadTemplate(t *testing.T) {
	node := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	wait := []nodeopsv1.Command{{Wait: &nodeopsv1.WaitCommand{}}}
	tell := nodeopsv1.Hook{Name: "tell", HTTP: &nodeopsv1.HTTPHook{URL: "https://events.example.com", SigningKey: "k"}}
	check := nodeopsv1.Hook{Name: "check", Timeout: &metav1.Duration{Duration: time.Minute}, Job: &nodeopsv1.JobHook{Template: runtime.RawExtension{Raw: []byte(
		`{"spec":{"template":{"spec":{"containers":[{"name":"c","image":"registry.example.com/check:1"}]}}}}`)}}}
	op := &nodeopsv1.NodeOperation{ObjectMeta: metav1.ObjectMeta{Name: "op"}, Spec: nodeopsv1.NodeOperationSpec{
		Scheduling: nodeopsv1.Scheduling{Hooks: &nodeopsv1.Hooks{PreOperation: []nodeopsv1.Hook{tell}, PostNode: []nodeopsv1.Hook{tell}, PostOperation: []nodeopsv1.Hook{tell}}},
		Custom: &nodeopsv1.CustomOperation{Groups: []nodeopsv1.Group{
			{Name: "first", Commands: wait},
			{Name: "second", Commands: wait, Scheduling: nodeopsv1.Scheduling{Hooks: &nodeopsv1.Hooks{PreNode: []nodeopsv1.Hook{check}}}},
		}},
	}}
	p, err := buildPlan(op, []corev1.Node{node})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	writePlan(&out, op, p, false)
	first, second, _ := strings.Cut(out.String(), "2. second:")
	for _, c := range []struct{ in, want string }{
		{first, "hook preOperation tell: http https://events.example.com, signed with key k of secret nodeops-hooks/nodeops-hook-signing (timeout 10m0s)"},
		{first, "hook postNode tell: http"},
		{second, "hook preNode check: job registry.example.com/check:1 (timeout 1m0s)"},
		{second, "hook postNode tell: http"},
		{second, "hook postOperation tell: http"},
	} {
		if !strings.Contains(c.in, c.want) {
			t.Errorf("plan lacks %q in its group:\n%s", c.want, out.String())
		}
	}
	if strings.Contains(first, "postOperation") || strings.Contains(second, "preOperation") {
		t.Errorf("operation hooks shown on the wrong group:\n%s", out.String())
	}
	op.Spec.Custom.Groups[1].Hooks.PreNode[0].Job.Template.Raw = []byte(`{"spec":{"template":{"spec":{"containerz":[]}}}}`)
	if _, err := buildPlan(op, []corev1.Node{node}); err == nil || !strings.Contains(err.Error(), "spec.custom.groups[1].hooks.preNode[0].job.template") {
		t.Errorf("bad template: %v, want an error naming spec.custom.groups[1].hooks.preNode[0].job.template", err)
	}

	op.Status.Hooks = []nodeopsv1.HookRun{{Point: nodeopsv1.HookPreNode, Group: "second", Node: "a", Hook: "check", State: nodeopsv1.HookFailed, Attempt: 1,
		Since: metav1.NewTime(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)), Message: "Job op-check-x failed: BackoffLimitExceeded"}}
	var d strings.Builder
	describeTo(&d, op, nil, 0)
	if want := "PreNode second/a: check Failed (attempt 1, since 2026-12-02T12:00:00Z): Job op-check-x failed: BackoffLimitExceeded"; !strings.Contains(d.String(), want) {
		t.Errorf("describe lacks %q:\n%s", want, d.String())
	}
}
