package v1alpha1

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The Drained condition answers one run of one command: another command's, or an earlier
// attempt's, is no answer, and a pending request is one whose run has none.
func TestDrainAnswerIsKeyedToTheRun(t *testing.T) {
	task := func(attempt int32, cond *metav1.Condition) *NodeTask {
		tk := &NodeTask{
			Spec: NodeTaskSpec{Commands: []Command{{Drain: &DrainCommand{}}, {Name: "other", Drain: &DrainCommand{}}}},
			Status: NodeTaskStatus{Phase: TaskRunning, Commands: []CommandStatus{
				{Name: "drain", Phase: CommandRunning, Attempt: attempt, Drain: &DrainRequest{}}, {Name: "other", Phase: CommandPending}}},
		}
		if cond != nil {
			tk.Status.Conditions = []metav1.Condition{*cond}
		}
		return tk
	}
	ok := DrainedCondition(DrainKey("drain", 1), DrainOutcome{Succeeded: true, Message: "drained node n: 1 pods evicted, 0 left", Log: "evicted ns/a\n"}, 1)
	failed := DrainedCondition(DrainKey("drain", 1), DrainOutcome{Message: "cannot drain node n:\nrefusing to evict ns/b"}, 1)
	other := DrainedCondition(DrainKey("other", 1), DrainOutcome{Succeeded: true, Message: "drained"}, 1)
	tests := []struct {
		name    string
		task    *NodeTask
		answer  bool
		want    DrainOutcome
		pending bool
	}{
		{name: "no answer yet", task: task(1, nil), pending: true},
		{name: "answered", task: task(1, &ok), answer: true, want: DrainOutcome{Succeeded: true, Message: "drained node n: 1 pods evicted, 0 left", Log: "evicted ns/a"}},
		{name: "refused, on one line", task: task(1, &failed), answer: true, want: DrainOutcome{Message: "cannot drain node n: refusing to evict ns/b"}},
		{name: "an earlier attempt's answer", task: task(2, &ok), pending: true},
		{name: "another command's answer", task: task(1, &other), pending: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, answered := tt.task.DrainAnswer(0)
			if answered != tt.answer || got != tt.want {
				t.Errorf("DrainAnswer = %+v, %v; want %+v, %v", got, answered, tt.want, tt.answer)
			}
			if _, _, pending := tt.task.DrainPending(); pending != tt.pending {
				t.Errorf("DrainPending = %v, want %v", pending, tt.pending)
			}
		})
	}
	if c := DrainedCondition("k", DrainOutcome{Message: strings.Repeat("x", 40<<10), Log: strings.Repeat("y\n", 40<<10)}, 1); len(c.Message) > 32768 {
		t.Errorf("a long outcome makes a message of %d bytes, more than a condition holds", len(c.Message))
	}
}
