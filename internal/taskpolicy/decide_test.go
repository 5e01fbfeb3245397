package taskpolicy

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

func script(idempotent bool) v1alpha1.Command {
	return v1alpha1.Command{Script: &v1alpha1.ScriptCommand{Inline: "true", Idempotent: idempotent}}
}

// task builds a task of generation 3 whose commands are in the given phases ("" for no status
// entry); the last argument may be a non-idempotent script, the others are idempotent.
func task(phase v1alpha1.TaskPhase, cmds []v1alpha1.Command, phases ...v1alpha1.CommandPhase) *v1alpha1.NodeTask {
	t := &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: "t", Generation: 3}}
	t.Spec.NodeName = "n1"
	t.Spec.Commands = cmds
	t.Status.Phase = phase
	t.Status.RecoveredGeneration = 1
	for i, p := range phases {
		t.Status.Commands = append(t.Status.Commands, v1alpha1.CommandStatus{Name: cmds[i].DisplayName(), Phase: p})
	}
	return t
}

func TestDecide(t *testing.T) {
	two := []v1alpha1.Command{script(true), script(false)}
	with := func(tk *v1alpha1.NodeTask, f func(*v1alpha1.NodeTask)) *v1alpha1.NodeTask { f(tk); return tk }
	const (
		succ    = v1alpha1.CommandSucceeded
		pend    = v1alpha1.CommandPending
		run     = v1alpha1.CommandRunning
		failed  = v1alpha1.CommandFailed
		skipped = v1alpha1.CommandSkipped
		waiting = v1alpha1.CommandAwaitingApproval
	)
	tests := []struct {
		name string
		task *v1alpha1.NodeTask
		want Action
	}{
		{"new task starts its first command", task("", two), Action{Kind: ActStart}},
		{"the next undone command starts", task(v1alpha1.TaskRunning, two, succ, pend), Action{Kind: ActStart, Index: 1}},
		{"a skipped command is done", task(v1alpha1.TaskPending, two, skipped, pend), Action{Kind: ActStart, Index: 1}},
		{"all done: complete", task(v1alpha1.TaskRunning, two, succ, skipped), Action{Kind: ActComplete}},
		{"succeeded: nothing", task(v1alpha1.TaskSucceeded, two, succ, succ), Action{}},
		{"aborted: nothing", task(v1alpha1.TaskAborted, two, succ, pend), Action{}},
		{"failed: nothing", task(v1alpha1.TaskFailed, two, failed, pend), Action{}},
		{"abort asked", with(task(v1alpha1.TaskRunning, two, succ, pend), func(t *v1alpha1.NodeTask) { t.Spec.Abort = true }), Action{Kind: ActAbort}},
		{"abort asked of a failed task", with(task(v1alpha1.TaskFailed, two, failed, pend), func(t *v1alpha1.NodeTask) { t.Spec.Abort = true }), Action{Kind: ActAbort}},
		{"abort of a succeeded task: nothing", with(task(v1alpha1.TaskSucceeded, two, succ, succ), func(t *v1alpha1.NodeTask) { t.Spec.Abort = true }), Action{}},
		{"interrupted idempotent: rerun", task(v1alpha1.TaskRunning, two, run, pend), Action{Kind: ActStart, Rerun: true}},
		{"interrupted idempotent, paused: nothing", with(task(v1alpha1.TaskRunning, two, run, pend), func(t *v1alpha1.NodeTask) { t.Spec.Paused = true }), Action{}},
		{"interrupted non-idempotent: fail", task(v1alpha1.TaskRunning, two, succ, run), Action{Kind: ActInterrupted, Index: 1}},
		{"interrupted non-idempotent, paused: still fail", with(task(v1alpha1.TaskRunning, two, succ, run), func(t *v1alpha1.NodeTask) { t.Spec.Paused = true }), Action{Kind: ActInterrupted, Index: 1}},
		{"paused: nothing starts", with(task(v1alpha1.TaskRunning, two, succ, pend), func(t *v1alpha1.NodeTask) { t.Spec.Paused = true }), Action{}},
		{"controlled, not approved: await", with(task("", two), func(t *v1alpha1.NodeTask) { t.Spec.ExecutionMode = v1alpha1.ExecutionControlled }), Action{Kind: ActAwaitApproval}},
		{"controlled, awaiting: nothing", with(task(v1alpha1.TaskPending, two, waiting, pend), func(t *v1alpha1.NodeTask) { t.Spec.ExecutionMode = v1alpha1.ExecutionControlled }), Action{}},
		{"controlled, approved: start", with(task(v1alpha1.TaskPending, two, waiting, pend), func(t *v1alpha1.NodeTask) {
			t.Spec.ExecutionMode, t.Spec.ApprovedCommands = v1alpha1.ExecutionControlled, 1
		}), Action{Kind: ActStart}},
		{"controlled, second not approved", with(task(v1alpha1.TaskRunning, two, succ, pend), func(t *v1alpha1.NodeTask) {
			t.Spec.ExecutionMode, t.Spec.ApprovedCommands = v1alpha1.ExecutionControlled, 1
		}), Action{Kind: ActAwaitApproval, Index: 1}},
		{"failed, retry asked: recover", with(task(v1alpha1.TaskFailed, two, failed, pend), func(t *v1alpha1.NodeTask) { t.Spec.RecoveryMode = v1alpha1.RecoveryRetry }), Action{Kind: ActRecover}},
		{"failed, skip asked: recover", with(task(v1alpha1.TaskFailed, two, failed, pend), func(t *v1alpha1.NodeTask) { t.Spec.RecoveryMode = v1alpha1.RecoverySkip }), Action{Kind: ActRecover}},
		{"failed, retry already acted on: nothing", with(task(v1alpha1.TaskFailed, two, failed, pend), func(t *v1alpha1.NodeTask) {
			t.Spec.RecoveryMode, t.Status.RecoveredGeneration = v1alpha1.RecoveryRetry, 3
		}), Action{}},
		{"succeeded, retry asked: recover (to record it ignored)", with(task(v1alpha1.TaskSucceeded, two, succ, succ), func(t *v1alpha1.NodeTask) { t.Spec.RecoveryMode = v1alpha1.RecoveryRetry }), Action{Kind: ActRecover}},
		{"running, skip asked: recover before the next step", with(task(v1alpha1.TaskRunning, two, succ, pend), func(t *v1alpha1.NodeTask) { t.Spec.RecoveryMode = v1alpha1.RecoverySkip }), Action{Kind: ActRecover}},
		{"failed, retry asked and abort: recover first", with(task(v1alpha1.TaskFailed, two, failed, pend), func(t *v1alpha1.NodeTask) {
			t.Spec.RecoveryMode, t.Spec.Abort = v1alpha1.RecoveryRetry, true
		}), Action{Kind: ActRecover}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := tt.task.DeepCopy()
			if got := Decide(tt.task); got != tt.want {
				t.Errorf("Decide = %+v, want %+v", got, tt.want)
			}
			if got, want := NeedsAgent(tt.task), tt.want.Kind != ActNone; got != want {
				t.Errorf("NeedsAgent = %v, want %v", got, want)
			}
			if tt.task.Status.Phase != before.Status.Phase || len(tt.task.Status.Commands) != len(before.Status.Commands) {
				t.Error("Decide modified the task")
			}
		})
	}
}

// TestNeedsAgentForRecovery: in Job mode an agent is started only while NeedsAgent holds, so a
// failed task with a pending retry or skip needs one, and one whose request was acted on does not.
func TestNeedsAgentForRecovery(t *testing.T) {
	tk := task(v1alpha1.TaskFailed, []v1alpha1.Command{script(false)}, v1alpha1.CommandFailed)
	if NeedsAgent(tk) {
		t.Fatal("a failed task without a recovery needs an agent")
	}
	for _, mode := range []v1alpha1.RecoveryMode{v1alpha1.RecoveryRetry, v1alpha1.RecoverySkip} {
		tk.Spec.RecoveryMode = mode
		if !NeedsAgent(tk) {
			t.Errorf("a failed task with recoveryMode %s needs no agent", mode)
		}
	}
	tk.Status.RecoveredGeneration = tk.Generation
	if NeedsAgent(tk) {
		t.Error("a recovery already acted on still needs an agent")
	}
}
