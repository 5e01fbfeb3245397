package confinement

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/testutil/confine"
)

// TestSafetyRule10_AgentLeavesTheManagersConditions: a task's status.conditions are the manager's
// (AgentLost, Drained; NodeTaskStatus says whose each field is). Node-a's agent may neither clear
// the AgentLost mark on its own task (which would let it run again, rule 9) nor write a condition
// of its own; its write of its own fields keeps the manager's mark.
func TestSafetyRule10_AgentLeavesTheManagersConditions(t *testing.T) {
	ctx := context.Background()
	c, _ := as(t, token(t, "node-a"))
	tasks(t)
	task := get(t, taskA)
	meta.SetStatusCondition(&task.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionAgentLost, Status: metav1.ConditionTrue,
		Reason: v1alpha1.ReasonAgentLost, Message: "no heartbeat", ObservedGeneration: task.Generation})
	if err := manager.Status().Update(ctx, task); err != nil {
		t.Fatalf("the manager marking task-a AgentLost: %v", err)
	}

	task = get(t, taskA)
	task.Status.Conditions = nil
	confine.Refused(t, "node-a's agent clearing AgentLost on its task", c.Status().Update(ctx, task),
		[]string{"status.conditions", "task-a"})

	task = get(t, taskA)
	meta.SetStatusCondition(&task.Status.Conditions, v1alpha1.DrainedCondition("cordon/1", v1alpha1.DrainOutcome{Succeeded: true}, task.Generation))
	confine.Refused(t, "node-a's agent writing a Drained condition", c.Status().Update(ctx, task),
		[]string{"status.conditions", "task-a"})

	// The agent's own write, a merge patch of its fields (agent.writeStatus), keeps the mark.
	if err := c.Status().Patch(ctx, &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: taskA}},
		confine.Merge(`{"status":{"phase":"Running","progress":"0/1"}}`)); err != nil {
		t.Fatalf("node-a's agent writing its own fields: %v", err)
	}
	if got := get(t, taskA); got.Lost() == nil || got.Status.Phase != v1alpha1.TaskRunning {
		t.Errorf("after the agent's write: phase %s, conditions %+v; want Running with AgentLost kept", got.Status.Phase, got.Status.Conditions)
	}
}

// TestSafetyRule10_ManagerLeavesTheAgentsFields: a task's status but its conditions is its agent's
// (NodeTaskStatus; config/admission/manager-nodetask-status.yaml). The manager may write its
// conditions, but neither a command's result, the task's phase, nor the heartbeat it judges the
// agent's liveness by (a lost agent fails its task in bounded time, rule 9).
func TestSafetyRule10_ManagerLeavesTheAgentsFields(t *testing.T) {
	ctx := context.Background()
	c, _ := as(t, token(t, "node-a"))
	tasks(t)
	// The agent records the command Running, with its heartbeat.
	if err := c.Status().Patch(ctx, &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: taskA}}, confine.Merge(
		`{"status":{"phase":"Running","progress":"0/1","agentHeartbeat":"2026-01-01T00:00:00.000000Z",`+
			`"commands":[{"name":"cordon","phase":"Running","attempt":1}]}}`)); err != nil {
		t.Fatalf("node-a's agent recording its command Running: %v", err)
	}
	want := []string{"ValidatingAdmissionPolicy 'nodeops-manager-nodetask-status'", "writes only status.conditions", taskA}
	for _, tc := range []struct {
		name   string
		change func(*v1alpha1.NodeTaskStatus)
	}{
		{"failing the task", func(s *v1alpha1.NodeTaskStatus) { s.Phase = v1alpha1.TaskFailed }},
		{"recording a command's result", func(s *v1alpha1.NodeTaskStatus) { s.Commands[0].Phase = v1alpha1.CommandSucceeded }},
		{"renewing the heartbeat", func(s *v1alpha1.NodeTaskStatus) { s.AgentHeartbeat = ptr.To(metav1.NowMicro()) }},
		{"clearing the progress", func(s *v1alpha1.NodeTaskStatus) { s.Progress = "" }},
		{"setting the recovered generation", func(s *v1alpha1.NodeTaskStatus) { s.RecoveredGeneration = 9 }},
	} {
		task := get(t, taskA)
		tc.change(&task.Status)
		confine.Refused(t, "the manager "+tc.name, manager.Status().Update(ctx, task), want)
	}
	// The manager's own writes: its conditions alone (statuswrite.ConditionsOnly), in a merge patch
	// or a whole update that leaves the agent's fields as they are.
	task := get(t, taskA)
	meta.SetStatusCondition(&task.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionAgentLost, Status: metav1.ConditionTrue,
		Reason: v1alpha1.ReasonAgentLost, Message: "no heartbeat", ObservedGeneration: task.Generation})
	if err := manager.Status().Update(ctx, task); err != nil {
		t.Fatalf("the manager marking task-a AgentLost: %v", err)
	}
	if err := manager.Status().Patch(ctx, &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: taskA}},
		confine.Merge(`{"status":{"conditions":null}}`)); err != nil {
		t.Fatalf("the manager clearing its conditions: %v", err)
	}
	if got := get(t, taskA); got.Status.Phase != v1alpha1.TaskRunning || got.Status.Commands[0].Phase != v1alpha1.CommandRunning || got.Lost() != nil {
		t.Errorf("after the manager's writes: phase %s, command %s, conditions %+v; want the agent's Running record kept, no condition",
			got.Status.Phase, got.Status.Commands[0].Phase, got.Status.Conditions)
	}
}
