package confinement

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
