package taskpolicy

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

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

// Progress is "done/total" commands: what status.progress holds, and what the CLI shows when it is empty.
func Progress(s *v1alpha1.NodeTaskStatus, total int) string {
	done := 0
	for _, c := range s.Commands {
		if c.Phase.Done() {
			done++
		}
	}
	return fmt.Sprintf("%d/%d", done, total)
}

// Apply records an action in status (the write that precedes the step, or ends the task).
// ActRecover is not applied here but by Recover, which needs the whole task.
func Apply(s *v1alpha1.NodeTaskStatus, spec *v1alpha1.NodeTaskSpec, a Action, now metav1.MicroTime) {
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
		c.OutputTail, c.Drain, c.Waits = "", nil, nil
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
	s.Progress = Progress(s, len(spec.Commands))
}

// Outcome is how one run of a command ended.
type Outcome struct {
	Err      error
	ExitCode int32
	Message  string
	Tail     string
	Certs    []v1alpha1.CertificateExpiry
	// CAServer is where the agent serves a rotation's new authorities (generateCertificateAuthorities).
	CAServer *v1alpha1.CertificateAuthorityServer
	// Waits is what the run waited for, apart from the time its work ran.
	Waits []v1alpha1.CommandWait
	// Retry: the command failed but has retries left; it goes back to Pending.
	Retry bool
}

// ApplyResult records command i's result; a failure without retries left fails the task.
func ApplyResult(s *v1alpha1.NodeTaskStatus, spec *v1alpha1.NodeTaskSpec, i int, o Outcome, now metav1.MicroTime) {
	c := &s.Commands[i]
	code := o.ExitCode
	c.ExitCode = &code
	c.CompletionTime = &now
	c.OutputTail = o.Tail
	c.Message = o.Message
	c.Drain = nil
	c.Waits = o.Waits
	if len(o.Certs) > 0 {
		s.Certificates = o.Certs
	}
	if o.CAServer != nil {
		s.CertificateAuthorityServer = o.CAServer
	}
	switch {
	case o.Err == nil:
		c.Phase = v1alpha1.CommandSucceeded
	case o.Retry:
		c.Phase = v1alpha1.CommandPending
		c.Message = fmt.Sprintf("attempt %d failed, retrying: %v", c.Attempt, o.Err)
	default:
		c.Phase = v1alpha1.CommandFailed
		c.Message = o.Err.Error()
		s.Phase = v1alpha1.TaskFailed
		s.Reason = v1alpha1.ReasonCommandFailed
		s.Message = fmt.Sprintf("command %d/%d (%s) failed: %v", i+1, len(spec.Commands), c.Name, o.Err)
	}
	s.Progress = Progress(s, len(spec.Commands))
}
