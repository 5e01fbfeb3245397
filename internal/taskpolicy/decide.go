// Package taskpolicy is the whole policy of a NodeTask, free of IO: what its agent does next
// (Decide), how each step changes its status (Apply, ApplyResult, Recover), and whether it needs
// an agent at all (NeedsAgent). The agent, the task's one status writer, carries it out; the
// manager's controllers only read it (a failure blocks until a person decides and intent recorded before action, rules 3 and 4).
//
// It writes nothing itself: the agent writes the statuses it computes, and the manager's controllers
// only read it.
package taskpolicy

import (
	"github.com/nodeops/nodeops/api/v1alpha1"
)

// ActionKind is what the agent does next with a task.
type ActionKind int

// Actions, each one status write (ActStart of an idempotent command: one only if it runs long).
const (
	// ActNone: nothing to do now (finished, failed, paused, or waiting for an approval already recorded).
	ActNone ActionKind = iota
	// ActStart: record command Index Running and run it.
	ActStart
	// ActAwaitApproval: record command Index AwaitingApproval.
	ActAwaitApproval
	// ActComplete: every command is done; the task Succeeded.
	ActComplete
	// ActAbort: the task ends Aborted.
	ActAbort
	// ActInterrupted: command Index was running when the agent stopped and is not idempotent: the task fails.
	ActInterrupted
	// ActRecover: act on spec.recoveryMode (see Recover); the request is recorded in
	// status.recoveredGeneration whether or not there was anything to recover.
	ActRecover
)

// Action is the agent's next step for a task.
type Action struct {
	Kind  ActionKind
	Index int
	// Rerun: command Index was interrupted and is idempotent, so it runs again.
	Rerun bool
}

// Decide is the agent's whole policy for a task, as the task stands in the API. It is pure.
func Decide(t *v1alpha1.NodeTask) Action {
	if NeedsRecovery(t) {
		// First, whatever the phase: a request on a task that is not Failed is recorded as ignored,
		// so that the manager can clear it and a later one can be made.
		return Action{Kind: ActRecover}
	}
	switch t.EffectivePhase() {
	case v1alpha1.TaskSucceeded, v1alpha1.TaskAborted:
		return Action{}
	}
	if t.Spec.Abort {
		return Action{Kind: ActAbort}
	}
	i := firstUndone(t)
	if t.EffectivePhase() == v1alpha1.TaskFailed && (t.Lost() == nil || i < len(t.Spec.Commands)) {
		// Failed, or marked AgentLost by the manager (a lost agent fails its task in bounded time, rule 9): nothing starts until a person
		// decides; a marked task whose commands are all done still completes.
		return Action{}
	}
	if i == len(t.Spec.Commands) {
		return Action{Kind: ActComplete}
	}
	if commandPhase(t, i) == v1alpha1.CommandRunning {
		if !t.Spec.Commands[i].Idempotent() {
			return Action{Kind: ActInterrupted, Index: i}
		}
		if t.Spec.Paused {
			return Action{}
		}
		return Action{Kind: ActStart, Index: i, Rerun: true}
	}
	if t.Spec.Paused {
		return Action{}
	}
	if t.Spec.ExecutionMode == v1alpha1.ExecutionControlled && int32(i) >= t.Spec.ApprovedCommands { //nolint:gosec // at most 32 commands
		if commandPhase(t, i) == v1alpha1.CommandAwaitingApproval {
			return Action{}
		}
		return Action{Kind: ActAwaitApproval, Index: i}
	}
	return Action{Kind: ActStart, Index: i}
}

// NeedsAgent reports whether an agent has work for the task now, a recovery to act on included;
// the Job-mode controller runs an agent for a node only while this holds for one of its tasks.
func NeedsAgent(t *v1alpha1.NodeTask) bool {
	return Decide(t).Kind != ActNone
}

func firstUndone(t *v1alpha1.NodeTask) int {
	for i := range t.Spec.Commands {
		if !commandPhase(t, i).Done() {
			return i
		}
	}
	return len(t.Spec.Commands)
}

func commandPhase(t *v1alpha1.NodeTask, i int) v1alpha1.CommandPhase {
	if i < len(t.Status.Commands) && t.Status.Commands[i].Phase != "" {
		return t.Status.Commands[i].Phase
	}
	return v1alpha1.CommandPending
}
