package testutil

import (
	"context"
	"errors"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/taskpolicy"
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
	return a.Write(ctx, task, func(t *v1alpha1.NodeTask) {
		taskpolicy.Apply(&t.Status, &t.Spec, taskpolicy.Action{Kind: taskpolicy.ActStart, Index: i}, metav1.NowMicro())
	})
}

// End records command i's result, merged with the next command's Running record or the task's
// end: one write. A failed command fails the task (reason CommandFailed).
func (a FakeAgent) End(ctx context.Context, task string, i int, ok bool, message string) error {
	return a.Write(ctx, task, func(t *v1alpha1.NodeTask) {
		now := metav1.NowMicro()
		o := taskpolicy.Outcome{Message: message}
		if !ok {
			o.Err, o.ExitCode = errors.New(message), 1
		}
		taskpolicy.ApplyResult(&t.Status, &t.Spec, i, o, now)
		switch {
		case !ok:
		case i+1 < len(t.Spec.Commands):
			taskpolicy.Apply(&t.Status, &t.Spec, taskpolicy.Action{Kind: taskpolicy.ActStart, Index: i + 1}, now)
		default:
			taskpolicy.Apply(&t.Status, &t.Spec, taskpolicy.Action{Kind: taskpolicy.ActComplete}, now)
		}
	})
}

// Succeed records every command not yet done, and the task, Succeeded: one write.
func (a FakeAgent) Succeed(ctx context.Context, task string) error {
	return a.Write(ctx, task, func(t *v1alpha1.NodeTask) {
		now := metav1.NowMicro()
		for i := range t.Spec.Commands {
			if i < len(t.Status.Commands) && t.Status.Commands[i].Phase.Done() {
				continue
			}
			if i >= len(t.Status.Commands) || t.Status.Commands[i].Phase != v1alpha1.CommandRunning {
				taskpolicy.Apply(&t.Status, &t.Spec, taskpolicy.Action{Kind: taskpolicy.ActStart, Index: i}, now)
			}
			taskpolicy.ApplyResult(&t.Status, &t.Spec, i, taskpolicy.Outcome{}, now)
		}
		taskpolicy.Apply(&t.Status, &t.Spec, taskpolicy.Action{Kind: taskpolicy.ActComplete}, now)
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
		taskpolicy.Apply(&t.Status, &t.Spec, taskpolicy.Action{Kind: taskpolicy.ActAbort}, metav1.NowMicro())
	})
}

// Recover acts on the task's spec.recoveryMode (retry or skip) as the agent does: one write.
func (a FakeAgent) Recover(ctx context.Context, task string) error {
	return a.Write(ctx, task, func(t *v1alpha1.NodeTask) {
		t.Status, _, _ = taskpolicy.Recover(t, metav1.NowMicro())
	})
}
