package testutil

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/clock"
	"github.com/nodeops/nodeops/internal/taskpolicy"
)

// FakeAgent plays the node agent in controller tests: each call is one status write of one
// NodeTask, shaped as the agent writes it (intent recorded before action, rule 4: a command is recorded
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
		// A whole Update, not statuswrite.Write: tests also set the manager's conditions through it (metrics_test's AgentLost).
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

// Exit records the task's first command run and exited with code, its output's tail output, as
// the agent records a script that failed (a command gate's check): one write.
func (a FakeAgent) Exit(ctx context.Context, task string, code int32, output string) error {
	return a.Write(ctx, task, func(t *v1alpha1.NodeTask) {
		now := metav1.NowMicro()
		taskpolicy.Apply(&t.Status, &t.Spec, taskpolicy.Action{Kind: taskpolicy.ActStart, Index: 0}, now)
		taskpolicy.ApplyResult(&t.Status, &t.Spec, 0, taskpolicy.Outcome{Err: fmt.Errorf("/bin/sh exited with code %d", code), ExitCode: code, Tail: output}, now)
	})
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

// Heartbeat renews the task's status.agentHeartbeat, as the agent does while it runs a command:
// one merge patch.
func (a FakeAgent) Heartbeat(ctx context.Context, task string) error {
	ts, err := metav1.NowMicro().MarshalJSON()
	if err != nil {
		return fmt.Errorf("fake agent: heartbeat of task %s: %w", task, err)
	}
	patch := []byte(`{"status":{"agentHeartbeat":` + string(ts) + `}}`)
	// The heartbeat alone, as statuswrite.Write under agent.signRule sends it (changed fields only, no lock).
	if err := a.Client.Status().Patch(ctx, &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: task}}, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("fake agent: heartbeat of task %s: %w", task, err)
	}
	return nil
}

// Advance moves an unfinished task on by one write: it begins the first command of a task not
// started yet, else ends its current command successfully (Begin, End).
func (a FakeAgent) Advance(ctx context.Context, t *v1alpha1.NodeTask) error {
	if t.Status.Phase == "" {
		return a.Begin(ctx, t.Name, 0)
	}
	return a.End(ctx, t.Name, int(t.Status.CurrentCommand), true, "ok")
}

// Play is what FakeAgent.Play plays.
type Play struct {
	// Tasks lists the tasks in play in a stable order, once a round; the test may check its
	// invariants here.
	Tasks func() ([]v1alpha1.NodeTask, error)
	// Done reports, once a round, whether play is over, given the unfinished tasks.
	Done func(unfinished []v1alpha1.NodeTask) bool
	// Batch advances a random number of the unfinished tasks each round, in a random order,
	// and pauses between rounds; without it a round advances one, chosen at random.
	Batch bool
	// Step advances one task; nil is Advance.
	Step func(ctx context.Context, t *v1alpha1.NodeTask) error
}

// pollTasks is the pause of Play between rounds in which nothing was advanced.
const pollTasks = 20 * time.Millisecond

// Play plays the agents of many nodes at once, in an order rng chooses (seeded, it is the same
// order every run), until p.Done, an error, or ctx's end (its error).
func (a FakeAgent) Play(ctx context.Context, rng *rand.Rand, p Play) error {
	step := p.Step
	if step == nil {
		step = a.Advance
	}
	for ctx.Err() == nil {
		tasks, err := p.Tasks()
		if err != nil {
			return err
		}
		var open []v1alpha1.NodeTask
		for _, t := range tasks {
			if t.EffectivePhase().Unfinished() {
				open = append(open, t)
			}
		}
		if p.Done(open) {
			return nil
		}
		var next []v1alpha1.NodeTask
		switch {
		case p.Batch:
			rng.Shuffle(len(open), func(i, j int) { open[i], open[j] = open[j], open[i] })
			next = open[:rng.IntN(len(open)+1)]
		case len(open) > 0:
			next = open[rng.IntN(len(open)):][:1]
		}
		for i := range next {
			if err := step(ctx, &next[i]); err != nil {
				return err
			}
		}
		if p.Batch || len(next) == 0 {
			// Nothing to do until the manager creates the next tasks or sees the last writes.
			if err := clock.Sleep(ctx, pollTasks); err != nil {
				return err
			}
		}
	}
	return ctx.Err()
}
