package nodetask_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/nodetask"
	"github.com/nodeops/nodeops/internal/nodelock"
	"github.com/nodeops/nodeops/internal/testutil"
)

var cl client.Client

// managerPod is the manager's own pod in these tests (its --pod-name), which its drains leave.
var managerPod = types.NamespacedName{Namespace: "real-drain", Name: "nodeops-manager-x"}

// lostAfter is the manager's --agent-lost-after in these tests.
const lostAfter = 2 * time.Second

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	logf.SetLogger(testutil.Logger())
	env, err := testutil.Start("nodetasks")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	cl = env.Client
	stop, err := testutil.StartManager(env.Config, env.Scheme, func(mgr manager.Manager, _ *nodelock.Table) error {
		if err := nodetask.SetupWithOptions(mgr, nodetask.Options{AgentLostAfter: lostAfter}); err != nil {
			return err
		}
		if err := nodetask.SetupDrainWithManager(mgr, nodetask.DrainOptions{Poll: 100 * time.Millisecond, Self: managerPod}); err != nil {
			return err
		}
		return nodetask.SetupSecretHoldersWithManager(mgr, nodetask.SecretHolderOptions{Options: holderOptions})
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	stop()
	return code
}

func get(t *testing.T, name string) *v1alpha1.NodeTask {
	t.Helper()
	task := &v1alpha1.NodeTask{}
	if err := cl.Get(context.Background(), client.ObjectKey{Name: name}, task); err != nil {
		t.Fatal(err)
	}
	return task
}

// The controller leaves a request alone until the agent records it acted on, then clears it,
// and never writes status.
func TestClearsRecoveryModeOnlyOnceActedOn(t *testing.T) {
	ctx := context.Background()
	// The node exists: the task's failure is its agent's to recover (a lost agent fails its task in bounded time, rule 9 marks tasks of deleted nodes).
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	if err := cl.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	task := &v1alpha1.NodeTask{
		ObjectMeta: metav1.ObjectMeta{Name: "clear-1", Labels: map[string]string{v1alpha1.LabelNode: "n1"}},
		Spec:       v1alpha1.NodeTaskSpec{NodeName: "n1", Commands: []v1alpha1.Command{{Wait: &v1alpha1.WaitCommand{}}}},
	}
	if err := cl.Create(ctx, task); err != nil {
		t.Fatal(err)
	}
	testutil.RemoveAtEnd(t, cl, task, node)
	// What an agent writes when the command fails.
	task.Status = v1alpha1.NodeTaskStatus{Phase: v1alpha1.TaskFailed, Reason: v1alpha1.ReasonCommandFailed, Attempt: 1, Progress: "0/1",
		Commands: []v1alpha1.CommandStatus{{Name: "wait", Phase: v1alpha1.CommandFailed, Attempt: 1}}}
	if err := cl.Status().Update(ctx, task); err != nil {
		t.Fatal(err)
	}
	base := task.DeepCopy()
	task.Spec.RecoveryMode = v1alpha1.RecoveryRetry
	if err := cl.Patch(ctx, task, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
	failed := task.Status.DeepCopy()

	// Left alone until the controller shows it decided so (AwaitingAgent for this generation).
	testutil.ConsistentlyUntilObserved(t, 20*time.Second, "before the agent acted", func() error {
		got := get(t, "clear-1")
		if got.Spec.RecoveryMode != v1alpha1.RecoveryRetry || !equality.Semantic.DeepEqual(got.Status, *failed) {
			return fmt.Errorf("recoveryMode %q, status %+v", got.Spec.RecoveryMode, got.Status)
		}
		return nil
	}, awaitingAgent(t, "clear-1", task.Generation))
	got := get(t, "clear-1")

	// The agent acts on it: recoveredGeneration records the request as done.
	got.Status.RecoveredGeneration = got.Generation
	got.Status.Phase, got.Status.Attempt = v1alpha1.TaskPending, 2
	got.Status.Commands[0].Phase = v1alpha1.CommandPending
	if err := cl.Status().Update(ctx, got); err != nil {
		t.Fatal(err)
	}
	acted := got.Status.DeepCopy()
	testutil.Eventually(t, 20*time.Second, "recoveryMode cleared", func() error {
		if m := get(t, "clear-1").Spec.RecoveryMode; m != "" {
			return fmt.Errorf("recoveryMode %q", m)
		}
		return nil
	})
	if st := get(t, "clear-1").Status; !equality.Semantic.DeepEqual(st, *acted) {
		t.Errorf("the controller changed status from %+v to %+v", *acted, st)
	}

	// A new request (a new generation) waits for the agent again.
	task = get(t, "clear-1")
	base = task.DeepCopy()
	task.Spec.RecoveryMode = v1alpha1.RecoverySkip
	if err := cl.Patch(ctx, task, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
	testutil.ConsistentlyUntilObserved(t, 20*time.Second, "a request not yet acted on", func() error {
		if m := get(t, "clear-1").Spec.RecoveryMode; m != v1alpha1.RecoverySkip {
			return fmt.Errorf("cleared: recoveryMode %q", m)
		}
		return nil
	}, awaitingAgent(t, "clear-1", task.Generation))
}

// awaitingAgent is nil once the controller has shown that it leaves task's recovery request of
// generation gen to the agent (the AwaitingAgent Event).
func awaitingAgent(t *testing.T, task string, gen int64) func() error {
	return func() error {
		var list eventsv1.EventList
		if err := cl.List(context.Background(), &list); err != nil {
			return err
		}
		want := fmt.Sprintf("of generation %d ", gen)
		for _, e := range list.Items {
			if e.Regarding.Name == task && e.Reason == nodetask.ReasonAwaitingAgent && strings.Contains(e.Note, want) {
				return nil
			}
		}
		return fmt.Errorf("no %s event for %s %s", nodetask.ReasonAwaitingAgent, task, want)
	}
}
