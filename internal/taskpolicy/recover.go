package taskpolicy

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// NeedsRecovery reports whether the task asks for a recovery not yet acted on: a person's
// spec.recoveryMode from a generation newer than status.recoveredGeneration.
func NeedsRecovery(t *v1alpha1.NodeTask) bool {
	return t.Spec.RecoveryMode != v1alpha1.RecoveryNone && t.Status.RecoveredGeneration < t.Generation
}

// FailedCommand is the index of the command that failed: the first recorded Failed, else (a task
// the manager marked AgentLost, a lost agent fails its task in bounded time, rule 9) the first not done, else the current one.
func FailedCommand(t *v1alpha1.NodeTask) int {
	for i, c := range t.Status.Commands {
		if c.Phase == v1alpha1.CommandFailed {
			return i
		}
	}
	if t.Lost() != nil && len(t.Status.Commands) > 0 {
		return firstUndone(t)
	}
	return int(t.Status.CurrentCommand)
}

// Recover returns the task's status after acting on its recoveryMode, and a note saying what was
// done. Retry puts the failed command back to Pending, Skip marks it Skipped and goes on after it
// (the task succeeds if it was the last); either starts a new task attempt. ok is false when the
// task is not Failed: there is nothing to recover, and only the request is marked as seen.
func Recover(t *v1alpha1.NodeTask, now metav1.MicroTime) (st v1alpha1.NodeTaskStatus, note string, ok bool) {
	st = *t.Status.DeepCopy()
	st.RecoveredGeneration = t.Generation
	if t.EffectivePhase() != v1alpha1.TaskFailed {
		return st, fmt.Sprintf("recoveryMode %s ignored: the task is %s, not Failed", t.Spec.RecoveryMode, t.EffectivePhase()), false
	}
	i := FailedCommand(t)
	if i < 0 || i >= len(t.Spec.Commands) {
		i = max(0, min(i, len(t.Spec.Commands)-1))
	}
	for len(st.Commands) <= i {
		st.Commands = append(st.Commands, v1alpha1.CommandStatus{Name: t.Spec.Commands[len(st.Commands)].DisplayName(), Phase: v1alpha1.CommandPending})
	}
	cmd := &st.Commands[i]
	st.Reason, st.Message = "", ""
	st.CompletionTime = nil
	st.Attempt = max(st.Attempt, 1) + 1
	switch t.Spec.RecoveryMode {
	case v1alpha1.RecoveryRetry:
		cmd.Phase = v1alpha1.CommandPending
		st.Phase = v1alpha1.TaskPending
		st.CurrentCommand = int32(i) //nolint:gosec // at most 32 commands
		note = fmt.Sprintf("retrying command %s on node %s (task attempt %d)", cmd.Name, t.Spec.NodeName, st.Attempt)
	case v1alpha1.RecoverySkip:
		cmd.Phase = v1alpha1.CommandSkipped
		cmd.CompletionTime = &now
		st.CurrentCommand = int32(i + 1) //nolint:gosec // at most 32 commands
		if i == len(t.Spec.Commands)-1 {
			st.Phase = v1alpha1.TaskSucceeded
			st.CompletionTime = &now
		} else {
			st.Phase = v1alpha1.TaskPending
		}
		note = fmt.Sprintf("skipped command %s on node %s", cmd.Name, t.Spec.NodeName)
	}
	st.Progress = Progress(&st, len(t.Spec.Commands))
	return st, note, true
}
