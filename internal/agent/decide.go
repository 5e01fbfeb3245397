// Package agent executes NodeTasks on their nodes: it records each non-idempotent command Running
// before it starts (an idempotent one once it has run for a second) and every result after it
// ends, resumes safely after a restart, and honours approvals, DryRun, pause and abort (safety rule 4).
package agent

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
	switch t.EffectivePhase() {
	case v1alpha1.TaskSucceeded, v1alpha1.TaskAborted:
		return Action{}
	}
	if t.Spec.Abort {
		return Action{Kind: ActAbort}
	}
	if t.EffectivePhase() == v1alpha1.TaskFailed {
		return Action{}
	}
	i := firstUndone(t)
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

// NeedsAgent reports whether an agent has work for the task now; the Job-mode controller runs an
// agent for a node only while this holds for one of its tasks.
func NeedsAgent(t *v1alpha1.NodeTask) bool {
	return Decide(t).Kind != ActNone
}

// ensureCommands gives status one entry per command, by position.
func ensureCommands(s *v1alpha1.NodeTaskStatus, spec *v1alpha1.NodeTaskSpec) {
	for len(s.Commands) < len(spec.Commands) {
		s.Commands = append(s.Commands, v1alpha1.CommandStatus{})
	}
	for i := range spec.Commands {
		s.Commands[i].Name = spec.Commands[i].DisplayName()
		if s.Commands[i].Phase == "" {
			s.Commands[i].Phase = v1alpha1.CommandPending
		}
	}
	if s.Attempt == 0 {
		s.Attempt = 1
	}
	if s.Phase == "" {
		s.Phase = v1alpha1.TaskPending
	}
}

func progress(s *v1alpha1.NodeTaskStatus, total int) string {
	done := 0
	for _, c := range s.Commands {
		if c.Phase.Done() {
			done++
		}
	}
	return fmt.Sprintf("%d/%d", done, total)
}

// apply records an action in status (the write that precedes the step, or ends the task).
func apply(s *v1alpha1.NodeTaskStatus, spec *v1alpha1.NodeTaskSpec, a Action, now metav1.MicroTime) {
	ensureCommands(s, spec)
	switch a.Kind {
	case ActStart:
		s.Phase = v1alpha1.TaskRunning
		if s.StartTime == nil {
			s.StartTime = &now
		}
		s.Reason, s.Message = "", ""
		s.CurrentCommand = int32(a.Index) //nolint:gosec // at most 32 commands
		c := &s.Commands[a.Index]
		c.Phase = v1alpha1.CommandRunning
		c.Attempt++
		c.StartTime, c.CompletionTime, c.ExitCode = &now, nil, nil
		c.OutputTail = ""
		if !a.Rerun {
			c.Message = ""
		} else {
			c.Message = "running again: the agent was interrupted while it ran"
		}
		s.AgentHeartbeat = &now
	case ActAwaitApproval:
		s.CurrentCommand = int32(a.Index) //nolint:gosec // at most 32 commands
		s.Commands[a.Index].Phase = v1alpha1.CommandAwaitingApproval
		s.Commands[a.Index].Message = "waiting for approval"
	case ActComplete:
		s.Phase = v1alpha1.TaskSucceeded
		s.Reason, s.Message = "", ""
		s.CompletionTime = &now
		s.CurrentCommand = int32(len(spec.Commands) - 1) //nolint:gosec // at most 32 commands
	case ActAbort:
		for i := range s.Commands {
			switch s.Commands[i].Phase {
			case v1alpha1.CommandAwaitingApproval:
				s.Commands[i].Phase, s.Commands[i].Message = v1alpha1.CommandPending, ""
			case v1alpha1.CommandRunning:
				s.Commands[i].Phase, s.Commands[i].Message = v1alpha1.CommandFailed, "aborted: the agent stopped while this command ran"
			}
		}
		s.Phase = v1alpha1.TaskAborted
		s.Reason, s.Message = "Aborted", "aborted on request"
		s.CompletionTime = &now
	case ActInterrupted:
		c := &s.Commands[a.Index]
		c.Phase = v1alpha1.CommandFailed
		c.CompletionTime = &now
		c.Message = "interrupted: the agent stopped while this command ran, and it is not idempotent"
		s.Phase = v1alpha1.TaskFailed
		s.Reason = v1alpha1.ReasonInterrupted
		s.Message = fmt.Sprintf("command %d/%d (%s) was interrupted and is not idempotent, so it was not run again", a.Index+1, len(spec.Commands), c.Name)
	}
	s.Progress = progress(s, len(spec.Commands))
}

// outcome is how one run of a command ended.
type outcome struct {
	err      error
	exitCode int32
	message  string
	tail     string
	certs    []v1alpha1.CertificateExpiry
	// retry: the command failed but has retries left; it goes back to Pending.
	retry bool
}

// applyResult records a command's result; a failure without retries left fails the task.
func applyResult(s *v1alpha1.NodeTaskStatus, spec *v1alpha1.NodeTaskSpec, i int, o outcome, now metav1.MicroTime) {
	c := &s.Commands[i]
	code := o.exitCode
	c.ExitCode = &code
	c.CompletionTime = &now
	c.OutputTail = o.tail
	c.Message = o.message
	if len(o.certs) > 0 {
		s.Certificates = o.certs
	}
	switch {
	case o.err == nil:
		c.Phase = v1alpha1.CommandSucceeded
	case o.retry:
		c.Phase = v1alpha1.CommandPending
		c.Message = fmt.Sprintf("attempt %d failed, retrying: %v", c.Attempt, o.err)
	default:
		c.Phase = v1alpha1.CommandFailed
		c.Message = o.err.Error()
		s.Phase = v1alpha1.TaskFailed
		s.Reason = v1alpha1.ReasonCommandFailed
		s.Message = fmt.Sprintf("command %d/%d (%s) failed: %v", i+1, len(spec.Commands), c.Name, o.err)
	}
	s.Progress = progress(s, len(spec.Commands))
}
