package testutil

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// FakeAgent plays the node agent in controller tests: each call is one status write of one
// NodeTask, shaped as the agent writes it (docs/design.md, safety rule 4: a command is recorded
// Running before it starts and its result after it ends). It never runs anything.
type FakeAgent struct {
	// Client writes the tasks' status, straight to the API server.
	Client client.Client
}

// conflictRetry rereads and rewrites a task whose status the manager or another test write
// changed in between.
var conflictRetry = wait.Backoff{Steps: 10, Duration: 10 * time.Millisecond, Factor: 1.5, Jitter: 0.1}

// Write applies mutate to the task's current status and writes it, rereading on conflicts.
func (a FakeAgent) Write(ctx context.Context, task string, mutate func(*v1alpha1.NodeTask)) error {
	err := retry.RetryOnConflict(conflictRetry, func() error {
		var t v1alpha1.NodeTask
		if err := a.Client.Get(ctx, client.ObjectKey{Name: task}, &t); err != nil {
			return err
		}
		mutate(&t)
		return a.Client.Status().Update(ctx, &t)
	})
	if err != nil {
		return fmt.Errorf("fake agent: write status of task %s: %w", task, err)
	}
	return nil
}

// Begin records command i Running (the task Running with it): one write.
func (a FakeAgent) Begin(ctx context.Context, task string, i int) error {
	return a.Write(ctx, task, func(t *v1alpha1.NodeTask) { markRunning(t, i) })
}

// End records command i's result, merged with the next command's Running record or the task's
// end: one write. A failed command fails the task (reason CommandFailed).
func (a FakeAgent) End(ctx context.Context, task string, i int, ok bool, message string) error {
	return a.Write(ctx, task, func(t *v1alpha1.NodeTask) {
		now := metav1.NowMicro()
		ensureCommands(t)
		c := &t.Status.Commands[i]
		c.CompletionTime = &now
		c.Message = message
		code := int32(0)
		if !ok {
			code = 1
		}
		c.ExitCode = &code
		switch {
		case !ok:
			c.Phase = v1alpha1.CommandFailed
			t.Status.Phase = v1alpha1.TaskFailed
			t.Status.Reason = v1alpha1.ReasonCommandFailed
			t.Status.Message = fmt.Sprintf("command %s failed: %s", c.Name, message)
		case i+1 < len(t.Spec.Commands):
			c.Phase = v1alpha1.CommandSucceeded
			markRunning(t, i+1)
		default:
			c.Phase = v1alpha1.CommandSucceeded
			t.Status.Phase = v1alpha1.TaskSucceeded
			t.Status.CompletionTime = &now
		}
		t.Status.Progress = progress(t)
	})
}

// Succeed records every command not yet done, and the task, Succeeded: one write.
func (a FakeAgent) Succeed(ctx context.Context, task string) error {
	return a.Write(ctx, task, func(t *v1alpha1.NodeTask) {
		now := metav1.NowMicro()
		ensureCommands(t)
		for i := range t.Status.Commands {
			c := &t.Status.Commands[i]
			if c.Phase.Done() {
				continue
			}
			if c.Attempt == 0 {
				c.Attempt = 1
			}
			c.Phase, c.CompletionTime = v1alpha1.CommandSucceeded, &now
		}
		t.Status.Phase = v1alpha1.TaskSucceeded
		t.Status.CompletionTime = &now
		t.Status.Progress = progress(t)
	})
}

// RunAll runs every command of the task successfully: 1 + len(commands) writes.
func (a FakeAgent) RunAll(ctx context.Context, task string) error {
	var t v1alpha1.NodeTask
	if err := a.Client.Get(ctx, client.ObjectKey{Name: task}, &t); err != nil {
		return fmt.Errorf("fake agent: get task %s: %w", task, err)
	}
	if err := a.Begin(ctx, task, 0); err != nil {
		return err
	}
	for i := range t.Spec.Commands {
		if err := a.End(ctx, task, i, true, "ok"); err != nil {
			return err
		}
	}
	return nil
}

// Abort ends a task told to abort, as the agent does: one write.
func (a FakeAgent) Abort(ctx context.Context, task string) error {
	return a.Write(ctx, task, func(t *v1alpha1.NodeTask) {
		now := metav1.NowMicro()
		t.Status.Phase = v1alpha1.TaskAborted
		t.Status.Reason = "Aborted"
		t.Status.CompletionTime = &now
	})
}

func ensureCommands(t *v1alpha1.NodeTask) {
	for len(t.Status.Commands) < len(t.Spec.Commands) {
		i := len(t.Status.Commands)
		t.Status.Commands = append(t.Status.Commands, v1alpha1.CommandStatus{Name: t.Spec.Commands[i].DisplayName(), Phase: v1alpha1.CommandPending})
	}
}

func progress(t *v1alpha1.NodeTask) string {
	n := 0
	for _, c := range t.Status.Commands {
		if c.Phase.Done() {
			n++
		}
	}
	return fmt.Sprintf("%d/%d", n, len(t.Spec.Commands))
}

func markRunning(t *v1alpha1.NodeTask, i int) {
	now := metav1.NowMicro()
	ensureCommands(t)
	t.Status.Phase = v1alpha1.TaskRunning
	if t.Status.StartTime == nil {
		t.Status.StartTime = &now
	}
	t.Status.CurrentCommand = int32(i)
	t.Status.Commands[i].Phase = v1alpha1.CommandRunning
	t.Status.Commands[i].Attempt++
	t.Status.Commands[i].StartTime = &now
	t.Status.Progress = progress(t)
}
