package v1alpha1

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A lost agent fails its task in bounded time (rule 9): a task the manager marked AgentLost counts as Failed unless its agent had
// finished it; a person's skip on a deleted node (reason Skipped) counts as Succeeded.
func TestSafetyRule9_EffectivePhaseOfALostTask(t *testing.T) {
	lost := func(reason string, status metav1.ConditionStatus) []metav1.Condition {
		return []metav1.Condition{{Type: ConditionAgentLost, Status: status, Reason: reason}}
	}
	for _, tc := range []struct {
		name  string
		phase TaskPhase
		conds []metav1.Condition
		want  TaskPhase
	}{
		{"no report", "", nil, TaskPending},
		{"running", TaskRunning, nil, TaskRunning},
		{"running, agent lost", TaskRunning, lost(ReasonAgentLost, metav1.ConditionTrue), TaskFailed},
		{"running, node deleted", TaskRunning, lost(ReasonNodeDeleted, metav1.ConditionTrue), TaskFailed},
		{"pending, node deleted", TaskPending, lost(ReasonNodeDeleted, metav1.ConditionTrue), TaskFailed},
		{"no report, node deleted", "", lost(ReasonNodeDeleted, metav1.ConditionTrue), TaskFailed},
		{"running, condition False", TaskRunning, lost(ReasonAgentLost, metav1.ConditionFalse), TaskRunning},
		{"failed, agent lost", TaskFailed, lost(ReasonAgentLost, metav1.ConditionTrue), TaskFailed},
		{"succeeded before the mark", TaskSucceeded, lost(ReasonAgentLost, metav1.ConditionTrue), TaskSucceeded},
		{"aborted before the mark", TaskAborted, lost(ReasonNodeDeleted, metav1.ConditionTrue), TaskAborted},
		{"skipped on a deleted node", TaskRunning, lost(ReasonLostSkipped, metav1.ConditionTrue), TaskSucceeded},
	} {
		task := &NodeTask{Status: NodeTaskStatus{Phase: tc.phase, Conditions: tc.conds}}
		if got := task.EffectivePhase(); got != tc.want {
			t.Errorf("%s: EffectivePhase() = %s, want %s", tc.name, got, tc.want)
		}
	}
}
