package taskpolicy

import (
	"errors"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

var t0 = metav1.NewMicroTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))

func TestApply(t *testing.T) {
	spec := &v1alpha1.NodeTaskSpec{NodeName: "n1", Commands: []v1alpha1.Command{script(true), script(false)}}
	t.Run("start fills status and records the command running", func(t *testing.T) {
		s := &v1alpha1.NodeTaskStatus{}
		Apply(s, spec, Action{Kind: ActStart}, t0)
		c := s.Commands[0]
		if s.Phase != v1alpha1.TaskRunning || s.Attempt != 1 || s.StartTime == nil || s.AgentHeartbeat == nil || s.Progress != "0/2" || len(s.Commands) != 2 {
			t.Errorf("task status %+v", s)
		}
		if c.Phase != v1alpha1.CommandRunning || c.Attempt != 1 || c.StartTime == nil || c.Message != "" || s.Commands[1].Phase != v1alpha1.CommandPending || c.Name != "script" {
			t.Errorf("command status %+v", c)
		}
	})
	t.Run("a rerun says so and keeps the task's start time", func(t *testing.T) {
		start := metav1.NewMicroTime(t0.Add(-time.Hour))
		s := &v1alpha1.NodeTaskStatus{Phase: v1alpha1.TaskRunning, StartTime: &start, Commands: []v1alpha1.CommandStatus{{Phase: v1alpha1.CommandRunning, Attempt: 1}}}
		Apply(s, spec, Action{Kind: ActStart, Rerun: true}, t0)
		if !s.StartTime.Equal(&start) || s.Commands[0].Attempt != 2 || s.Commands[0].Message == "" {
			t.Errorf("status %+v", s)
		}
	})
	t.Run("await approval", func(t *testing.T) {
		s := &v1alpha1.NodeTaskStatus{}
		Apply(s, spec, Action{Kind: ActAwaitApproval, Index: 0}, t0)
		if s.Phase != v1alpha1.TaskPending || s.Commands[0].Phase != v1alpha1.CommandAwaitingApproval {
			t.Errorf("status %+v", s)
		}
	})
	t.Run("complete", func(t *testing.T) {
		s := &v1alpha1.NodeTaskStatus{Commands: []v1alpha1.CommandStatus{{Phase: v1alpha1.CommandSucceeded}, {Phase: v1alpha1.CommandSkipped}}}
		Apply(s, spec, Action{Kind: ActComplete}, t0)
		if s.Phase != v1alpha1.TaskSucceeded || s.CompletionTime == nil || s.CurrentCommand != 1 || s.Progress != "2/2" {
			t.Errorf("status %+v", s)
		}
	})
	t.Run("abort fails a running command and returns an awaited one to pending", func(t *testing.T) {
		s := &v1alpha1.NodeTaskStatus{Commands: []v1alpha1.CommandStatus{{Phase: v1alpha1.CommandRunning}, {Phase: v1alpha1.CommandAwaitingApproval}}}
		Apply(s, spec, Action{Kind: ActAbort}, t0)
		if s.Phase != v1alpha1.TaskAborted || s.Reason != "Aborted" || s.CompletionTime == nil ||
			s.Commands[0].Phase != v1alpha1.CommandFailed || s.Commands[1].Phase != v1alpha1.CommandPending {
			t.Errorf("status %+v", s)
		}
	})
	t.Run("interrupted fails the task", func(t *testing.T) {
		s := &v1alpha1.NodeTaskStatus{Commands: []v1alpha1.CommandStatus{{Phase: v1alpha1.CommandSucceeded}, {Phase: v1alpha1.CommandRunning}}}
		Apply(s, spec, Action{Kind: ActInterrupted, Index: 1}, t0)
		if s.Phase != v1alpha1.TaskFailed || s.Reason != v1alpha1.ReasonInterrupted || s.Commands[1].Phase != v1alpha1.CommandFailed || s.Progress != "1/2" {
			t.Errorf("status %+v", s)
		}
	})
}

func TestApplyResult(t *testing.T) {
	spec := &v1alpha1.NodeTaskSpec{NodeName: "n1", Commands: []v1alpha1.Command{script(true), script(false)}}
	running := func() *v1alpha1.NodeTaskStatus {
		s := &v1alpha1.NodeTaskStatus{}
		Apply(s, spec, Action{Kind: ActStart}, t0)
		return s
	}
	boom := errors.New("exit status 3")
	tests := []struct {
		name     string
		o        Outcome
		task     v1alpha1.TaskPhase
		cmd      v1alpha1.CommandPhase
		progress string
	}{
		{"success", Outcome{Message: "ok", Tail: "out"}, v1alpha1.TaskRunning, v1alpha1.CommandSucceeded, "1/2"},
		{"failure with retries left", Outcome{Err: boom, ExitCode: 3, Retry: true}, v1alpha1.TaskRunning, v1alpha1.CommandPending, "0/2"},
		{"failure", Outcome{Err: boom, ExitCode: 3, Tail: "out"}, v1alpha1.TaskFailed, v1alpha1.CommandFailed, "0/2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := running()
			ApplyResult(s, spec, 0, tt.o, t0)
			c := s.Commands[0]
			if s.Phase != tt.task || c.Phase != tt.cmd || s.Progress != tt.progress || c.ExitCode == nil || *c.ExitCode != tt.o.ExitCode || c.OutputTail != tt.o.Tail || c.CompletionTime == nil {
				t.Errorf("status %+v, command %+v", s, c)
			}
			if tt.task == v1alpha1.TaskFailed && (s.Reason != v1alpha1.ReasonCommandFailed || s.Message != "command 1/2 (script) failed: exit status 3") {
				t.Errorf("reason %q, message %q", s.Reason, s.Message)
			}
		})
	}
}

// TestRunThroughRecovery drives a task the way the agent does, with Decide and the Apply
// functions only: a command fails, a person retries (it fails again), then skips; the task succeeds.
func TestRunThroughRecovery(t *testing.T) {
	tk := task("", []v1alpha1.Command{script(false), script(true), script(false)})
	tk.Generation, tk.Status.RecoveredGeneration = 1, 0
	runs := map[int]int{}
	fails := func(i int) bool { return i == 1 }
	step := func() Action {
		a := Decide(tk)
		switch a.Kind {
		case ActRecover:
			tk.Status, _, _ = Recover(tk, t0)
		case ActNone:
		default:
			Apply(&tk.Status, &tk.Spec, a, t0)
			if a.Kind == ActStart {
				runs[a.Index]++
				var o Outcome
				if fails(a.Index) {
					o.Err = errors.New("boom")
				}
				ApplyResult(&tk.Status, &tk.Spec, a.Index, o, t0)
			}
		}
		return a
	}
	// settle steps until the agent would have nothing left to do.
	settle := func() {
		for range 10 {
			if step().Kind == ActNone {
				return
			}
		}
		t.Fatalf("the task does not settle: %+v", tk.Status)
	}
	settle()
	if tk.Status.Phase != v1alpha1.TaskFailed || runs[0] != 1 || runs[1] != 1 || runs[2] != 0 {
		t.Fatalf("before recovery: %+v, runs %v", tk.Status, runs)
	}
	ask := func(mode v1alpha1.RecoveryMode) {
		tk.Spec.RecoveryMode = mode
		tk.Generation++
	}
	ask(v1alpha1.RecoveryRetry)
	settle()
	if tk.Status.Phase != v1alpha1.TaskFailed || runs[1] != 2 || tk.Status.Commands[1].Attempt != 2 || tk.Status.Attempt != 2 || tk.Status.RecoveredGeneration != tk.Generation {
		t.Fatalf("after retry: %+v, runs %v", tk.Status, runs)
	}
	if NeedsAgent(tk) {
		t.Fatal("a retry acted on is acted on again")
	}
	ask(v1alpha1.RecoveryNone) // the manager clears it
	ask(v1alpha1.RecoverySkip)
	settle()
	if tk.Status.Phase != v1alpha1.TaskSucceeded || runs[0] != 1 || runs[1] != 2 || runs[2] != 1 || tk.Status.Commands[1].Phase != v1alpha1.CommandSkipped ||
		tk.Status.Progress != "3/3" || tk.Status.Attempt != 3 {
		t.Fatalf("after skip: %+v, runs %v", tk.Status, runs)
	}
}
