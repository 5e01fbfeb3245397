package taskpolicy

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

func failedTask(mode v1alpha1.RecoveryMode, failedAt int, commands int) *v1alpha1.NodeTask {
	t := &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: "t", Generation: 4}}
	t.Spec.NodeName = "n1"
	t.Spec.RecoveryMode = mode
	for i := range commands {
		t.Spec.Commands = append(t.Spec.Commands, v1alpha1.Command{Wait: &v1alpha1.WaitCommand{}})
		phase := v1alpha1.CommandSucceeded
		switch {
		case i == failedAt:
			phase = v1alpha1.CommandFailed
		case i > failedAt:
			phase = v1alpha1.CommandPending
		}
		t.Status.Commands = append(t.Status.Commands, v1alpha1.CommandStatus{Name: "c" + string(rune('0'+i)), Phase: phase, Attempt: 1})
	}
	t.Status.Phase = v1alpha1.TaskFailed
	t.Status.Reason, t.Status.Message = v1alpha1.ReasonCommandFailed, "command failed"
	t.Status.CurrentCommand = int32(failedAt)
	t.Status.Attempt = 1
	t.Status.RecoveredGeneration = 1
	return t
}

func TestRecover(t *testing.T) {
	now := metav1.NewMicroTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	tests := []struct {
		name      string
		task      *v1alpha1.NodeTask
		acted     bool
		phase     v1alpha1.TaskPhase
		cmdPhase  v1alpha1.CommandPhase
		current   int32
		progress  string
		completed bool
	}{
		{name: "retry", task: failedTask(v1alpha1.RecoveryRetry, 1, 3), acted: true, phase: v1alpha1.TaskPending, cmdPhase: v1alpha1.CommandPending, current: 1, progress: "1/3"},
		{name: "skip a middle command", task: failedTask(v1alpha1.RecoverySkip, 1, 3), acted: true, phase: v1alpha1.TaskPending, cmdPhase: v1alpha1.CommandSkipped, current: 2, progress: "2/3"},
		{name: "skip the last command", task: failedTask(v1alpha1.RecoverySkip, 2, 3), acted: true, phase: v1alpha1.TaskSucceeded, cmdPhase: v1alpha1.CommandSkipped, current: 3, progress: "3/3", completed: true},
		{name: "retry the only command", task: failedTask(v1alpha1.RecoveryRetry, 0, 1), acted: true, phase: v1alpha1.TaskPending, cmdPhase: v1alpha1.CommandPending, current: 0, progress: "0/1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !NeedsRecovery(tt.task) {
				t.Fatal("needsRecovery = false")
			}
			st, note, acted := Recover(tt.task, now)
			if acted != tt.acted || note == "" {
				t.Fatalf("acted %v, note %q", acted, note)
			}
			i := FailedCommand(tt.task)
			if st.Phase != tt.phase || st.Commands[i].Phase != tt.cmdPhase || st.CurrentCommand != tt.current || st.Progress != tt.progress {
				t.Errorf("status %+v", st)
			}
			if st.Attempt != 2 || st.RecoveredGeneration != 4 || st.Reason != "" || st.Message != "" {
				t.Errorf("attempt %d, recoveredGeneration %d, reason %q, message %q", st.Attempt, st.RecoveredGeneration, st.Reason, st.Message)
			}
			if (st.CompletionTime != nil) != tt.completed {
				t.Errorf("completionTime %v", st.CompletionTime)
			}
			if tt.task.Status.Phase != v1alpha1.TaskFailed {
				t.Error("the input task was modified")
			}
		})
	}
}

func TestRecoverIgnoresUnfailedTasks(t *testing.T) {
	for _, phase := range []v1alpha1.TaskPhase{v1alpha1.TaskSucceeded, v1alpha1.TaskAborted, v1alpha1.TaskPending} {
		task := failedTask(v1alpha1.RecoverySkip, 0, 2)
		task.Status.Phase = phase
		st, note, acted := Recover(task, metav1.NowMicro())
		st.RecoveredGeneration = task.Status.RecoveredGeneration
		if acted || !equality.Semantic.DeepEqual(st, task.Status) || note != "recoveryMode Skip ignored: the task is "+string(phase)+", not Failed" {
			t.Errorf("%s: acted %v, note %q, status changed beyond recoveredGeneration: %+v", phase, acted, note, st)
		}
	}
	task := failedTask(v1alpha1.RecoveryRetry, 0, 2)
	task.Status.Phase = v1alpha1.TaskRunning
	st, note, acted := Recover(task, metav1.NowMicro())
	if acted || st.Phase != v1alpha1.TaskRunning || st.RecoveredGeneration != 4 || note != "recoveryMode Retry ignored: the task is Running, not Failed" {
		t.Fatalf("acted %v on a running task (note %q): %+v", acted, note, st)
	}
	task.Status.RecoveredGeneration = 4
	if NeedsRecovery(task) {
		t.Fatal("a recovery already acted on is asked again")
	}
	task.Spec.RecoveryMode = ""
	task.Generation = 9
	if NeedsRecovery(task) {
		t.Fatal("no recoveryMode, no recovery")
	}
}

// An interrupted command (Reason Interrupted) is recovered like a failed one; a failure recorded
// before the command's status entry existed is found at currentCommand.
func TestRecoverInterruptedAndShortStatus(t *testing.T) {
	task := failedTask(v1alpha1.RecoveryRetry, 1, 3)
	task.Status.Reason = v1alpha1.ReasonInterrupted
	st, note, acted := Recover(task, metav1.NowMicro())
	if !acted || st.Commands[1].Phase != v1alpha1.CommandPending || st.Reason != "" || note != "retrying command c1 on node n1 (task attempt 2)" {
		t.Errorf("acted %v, note %q, status %+v", acted, note, st)
	}
	short := failedTask(v1alpha1.RecoverySkip, 1, 3)
	short.Status.Commands = short.Status.Commands[:1]
	st, _, acted = Recover(short, metav1.NowMicro())
	if !acted || len(st.Commands) != 2 || st.Commands[1].Phase != v1alpha1.CommandSkipped || st.CurrentCommand != 2 || st.Phase != v1alpha1.TaskPending || st.Progress != "2/3" {
		t.Errorf("acted %v, status %+v", acted, st)
	}
}

// A lost agent fails its task in bounded time (rule 9): a task marked AgentLost after its agent recorded command 1's result (and before
// command 2 started) retries command 2, never the finished command 1.
func TestSafetyRule9_RetryOfALostTaskRetriesTheFirstUndoneCommand(t *testing.T) {
	task := &v1alpha1.NodeTask{
		ObjectMeta: metav1.ObjectMeta{Generation: 2},
		Spec: v1alpha1.NodeTaskSpec{NodeName: "n1", RecoveryMode: v1alpha1.RecoveryRetry, Commands: []v1alpha1.Command{
			{Script: &v1alpha1.ScriptCommand{Inline: "a"}, Name: "a"}, {Script: &v1alpha1.ScriptCommand{Inline: "b"}, Name: "b"}}},
		Status: v1alpha1.NodeTaskStatus{Phase: v1alpha1.TaskRunning, CurrentCommand: 0, Attempt: 1,
			Commands:   []v1alpha1.CommandStatus{{Name: "a", Phase: v1alpha1.CommandSucceeded}, {Name: "b", Phase: v1alpha1.CommandPending}},
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionAgentLost, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAgentLost}}},
	}
	st, _, ok := Recover(task, metav1.NowMicro())
	if !ok || st.Commands[0].Phase != v1alpha1.CommandSucceeded || st.CurrentCommand != 1 {
		t.Fatalf("retry of a lost task: ok %v, status %+v", ok, st)
	}
}
