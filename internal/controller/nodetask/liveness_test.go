package nodetask_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/clock"
	"github.com/nodeops/nodeops/internal/taskpolicy"
	"github.com/nodeops/nodeops/internal/testutil"
)

// nodeAndTask creates a node and a one-command task on it, both named name, that no agent began.
func nodeAndTask(t *testing.T, name string) {
	t.Helper()
	nodeAndTaskWith(t, name, v1alpha1.NodeTaskSpec{Commands: []v1alpha1.Command{{Wait: &v1alpha1.WaitCommand{}}}})
}

// nodeAndTaskWith creates a node and a task on it with spec, both named name, that no agent began.
func nodeAndTaskWith(t *testing.T, name string, spec v1alpha1.NodeTaskSpec) {
	t.Helper()
	ctx := context.Background()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := cl.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	spec.NodeName = name
	task := &v1alpha1.NodeTask{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1alpha1.LabelNode: name}},
		Spec:       spec,
	}
	if err := cl.Create(ctx, task); err != nil {
		t.Fatal(err)
	}
	testutil.RemoveAtEnd(t, cl, task, node)
}

// markedLost waits until the manager marked task AgentLost, with a message containing want, so
// that it counts as Failed.
func markedLost(t *testing.T, task, want string) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, "task "+task+" marked AgentLost", func() error {
		tk := get(t, task)
		if c := tk.Lost(); c == nil || c.Reason != v1alpha1.ReasonAgentLost || !strings.Contains(c.Message, want) {
			return fmt.Errorf("conditions %+v", tk.Status.Conditions)
		}
		if tk.EffectivePhase() != v1alpha1.TaskFailed {
			return fmt.Errorf("effective phase %s", tk.EffectivePhase())
		}
		return nil
	})
}

// runningTask creates a node and a task on it whose first command the (fake) agent recorded Running.
func runningTask(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	nodeAndTask(t, name)
	if err := (testutil.FakeAgent{Client: cl}).Begin(ctx, name, 0); err != nil {
		t.Fatal(err)
	}
}

// A lost agent fails its task in bounded time (rule 9): a running task whose heartbeat stops gets AgentLost=True (reason AgentLost)
// after lostAfter; one whose heartbeat keeps being renewed does not. Once the agent is back and
// records a person's retry, the manager removes its mark.
func TestSafetyRule9_SilentAgentFailsItsTask(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runningTask(t, "alive-1")
	runningTask(t, "silent-1")
	go func() { // the alive agent's heartbeat, as the agent writes it
		for ctx.Err() == nil {
			_ = (testutil.FakeAgent{Client: cl}).Heartbeat(ctx, "alive-1")
			time.Sleep(lostAfter / 5)
		}
	}()
	markedLost(t, "silent-1", "silent-1")
	// The alive task began before the silent one, so it too went longer than lostAfter since its start.
	if tk := get(t, "alive-1"); tk.Lost() != nil || tk.EffectivePhase() != v1alpha1.TaskRunning {
		t.Fatalf("a task whose heartbeat is renewed was marked: %+v", tk.Status)
	}

	// The agent is back: a person's retry, recorded by the agent, ends the mark.
	task := get(t, "silent-1")
	base := task.DeepCopy()
	task.Spec.RecoveryMode = v1alpha1.RecoveryRetry
	if err := cl.Patch(ctx, task, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
	if err := (testutil.FakeAgent{Client: cl}).Recover(ctx, "silent-1"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "the mark removed after the agent's recovery", func() error {
		tk := get(t, "silent-1")
		if tk.Lost() != nil || tk.Spec.RecoveryMode != "" || tk.EffectivePhase() != v1alpha1.TaskPending {
			return fmt.Errorf("spec %+v, status %+v", tk.Spec, tk.Status)
		}
		return nil
	})
}

// A lost agent fails its task in bounded time (rule 9), measured on the manager's clock: a task whose last heartbeat is long past when
// the manager first sees it (the API server was down while a single control plane restarted its
// static pods, and the manager came back, or took the leader lease, with it) is not marked lost
// at once: its agent gets the full lostAfter to renew. An agent that renews is never marked; one
// that stays silent is, after lostAfter of the manager's own watching.
func TestSafetyRule9_OldHeartbeatAfterAnOutageGetsTheFullGrace(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const name = "outage-1"
	nodeAndTask(t, name)
	// The agent's last write before the outage, ten minutes ago: the manager's first sight of it.
	longAgo := metav1.NewMicroTime(time.Now().Add(-10 * time.Minute))
	if err := (testutil.FakeAgent{Client: cl}).Write(ctx, name, func(tk *v1alpha1.NodeTask) {
		taskpolicy.Apply(&tk.Status, &tk.Spec, taskpolicy.Action{Kind: taskpolicy.ActStart}, longAgo)
	}); err != nil {
		t.Fatal(err)
	}
	// The API server is back: the agent renews its heartbeat within its interval (here lostAfter/2,
	// then every lostAfter/5), as the real agent does once its writes go through again.
	renewing, renewed := context.WithCancel(ctx)
	go func() {
		defer renewed()
		if clock.Sleep(ctx, lostAfter/2) != nil {
			return
		}
		for i := 0; i < 15 && ctx.Err() == nil; i++ {
			_ = (testutil.FakeAgent{Client: cl}).Heartbeat(ctx, name)
			_ = clock.Sleep(ctx, lostAfter/5)
		}
	}()
	// While it renews (15 renewals, 3 lostAfter in all) the task is never marked.
	testutil.ConsistentlyUntil(t, renewing, "the task not marked while its agent renews", func() error {
		if tk := get(t, name); tk.Lost() != nil {
			return fmt.Errorf("a task whose agent renewed within lostAfter of the manager first seeing it was marked lost: %+v", tk.Lost())
		}
		return nil
	})
	// It goes silent: now it is marked, counted from the last renewal the manager saw.
	testutil.Eventually(t, 30*time.Second, "the task marked AgentLost once its agent stopped renewing", func() error {
		tk := get(t, name)
		if c := tk.Lost(); c == nil || c.Reason != v1alpha1.ReasonAgentLost || !strings.Contains(c.Message, "no heartbeat for") {
			return fmt.Errorf("conditions %+v", tk.Status.Conditions)
		}
		return nil
	})
}

// A lost agent fails its task in bounded time (rule 9) for tasks no agent holds: a task that never started, and one that failed, whose
// node is deleted are marked NodeDeleted (so the operation goes Blocked instead of waiting for
// ever), and a person's skip of the failed one is recorded by the manager, as no agent is left.
func TestSafetyRule9_DeletedNodeMarksUnstartedAndFailedTasks(t *testing.T) {
	ctx := context.Background()
	for _, name := range []string{"gone-pending", "gone-failed"} {
		nodeAndTask(t, name)
	}
	agent := testutil.FakeAgent{Client: cl}
	if err := agent.Begin(ctx, "gone-failed", 0); err != nil {
		t.Fatal(err)
	}
	if err := agent.End(ctx, "gone-failed", 0, false, "boom"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"gone-pending", "gone-failed"} {
		if err := cl.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
			t.Fatal(err)
		}
	}
	for name, when := range map[string]string{"gone-pending": "before the task started", "gone-failed": "after the task failed"} {
		testutil.Eventually(t, 30*time.Second, name+" marked NodeDeleted", func() error {
			tk := get(t, name)
			if c := tk.Lost(); c == nil || c.Reason != v1alpha1.ReasonNodeDeleted || !strings.Contains(c.Message, when) {
				return fmt.Errorf("conditions %+v", tk.Status.Conditions)
			}
			if tk.EffectivePhase() != v1alpha1.TaskFailed {
				return fmt.Errorf("effective phase %s", tk.EffectivePhase())
			}
			return nil
		})
	}
	task := get(t, "gone-failed")
	base := task.DeepCopy()
	task.Spec.RecoveryMode = v1alpha1.RecoverySkip
	if err := cl.Patch(ctx, task, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "the skip on a deleted node recorded by the manager", func() error {
		tk := get(t, "gone-failed")
		if c := tk.Lost(); c == nil || c.Reason != v1alpha1.ReasonLostSkipped || tk.EffectivePhase() != v1alpha1.TaskSucceeded {
			return fmt.Errorf("conditions %+v, effective phase %s", tk.Status.Conditions, tk.EffectivePhase())
		}
		return nil
	})
}

// idleTask creates a node and a two-command task on it whose first command the (fake) agent ran
// and recorded Succeeded, so that the agent holds the task with nothing running; controlled tasks
// have only that first command approved.
func idleTask(t *testing.T, name string, mode v1alpha1.ExecutionMode) {
	t.Helper()
	ctx := context.Background()
	nodeAndTaskWith(t, name, v1alpha1.NodeTaskSpec{ExecutionMode: mode, ApprovedCommands: 1,
		Commands: []v1alpha1.Command{{Wait: &v1alpha1.WaitCommand{}}, {Wait: &v1alpha1.WaitCommand{}}}})
	a := testutil.FakeAgent{Client: cl}
	if err := a.Begin(ctx, name, 0); err != nil {
		t.Fatal(err)
	}
	// The first command's result alone, as a stopping agent writes it: the next one stays Pending
	// (a controlled task records it awaiting a person, and then nothing is due from its agent).
	if err := a.Write(ctx, name, func(tk *v1alpha1.NodeTask) {
		now := metav1.NowMicro()
		taskpolicy.ApplyResult(&tk.Status, &tk.Spec, 0, taskpolicy.Outcome{}, now)
		if mode == v1alpha1.ExecutionControlled {
			taskpolicy.Apply(&tk.Status, &tk.Spec, taskpolicy.Action{Kind: taskpolicy.ActAwaitApproval, Index: 1}, now)
		}
	}); err != nil {
		t.Fatal(err)
	}
}

// A lost agent fails its task in bounded time (rule 9): an agent that stops between two commands (SIGTERM leaves the next one Pending
// and frees the node's Lease) and never comes back gets its task marked AgentLost, so that the
// operation goes Blocked and an abort ends it; a task waiting for a person's approval is not
// marked, as nothing is due from its agent.
func TestSafetyRule9_AgentStoppedBetweenCommandsFailsItsTask(t *testing.T) {
	idleTask(t, "between-1", v1alpha1.ExecutionAuto)
	idleTask(t, "awaiting-1", v1alpha1.ExecutionControlled)
	if tk := get(t, "between-1"); !tk.Status.Phase.Unfinished() || tk.Status.StartTime == nil {
		t.Fatalf("the fake agent left the task %s, not held and unfinished", tk.Status.Phase)
	}
	markedLost(t, "between-1", "stopped between commands")
	// It has been idle as long as between-1: only a due step makes silence a loss.
	testutil.Consistently(t, 2*lostAfter, "the task awaiting an approval unmarked", func() error {
		if tk := get(t, "awaiting-1"); tk.Lost() != nil {
			return fmt.Errorf("marked: %+v", tk.Status.Conditions)
		}
		return nil
	})
}
