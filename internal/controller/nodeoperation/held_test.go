package nodeoperation_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/objname"
	"github.com/nodeops/nodeops/internal/testutil"
)

// holderAndWaiter makes the fault suite's stall: operation a on the node labelled hold, its task
// there Running, and operation b over every node (maxUnavailable 100%), which does all the others
// and is then left with the held node only, nothing of its own running. It returns a, b and a's task.
func holderAndWaiter(f *fixture) (a, b *v1alpha1.NodeOperation, held, holder string) {
	f.t.Helper()
	others := f.nodes(nil, "n1", "n2")
	held = f.nodes(map[string]string{"nodeops.test/hold": "a"}, "n3")[0]
	a = f.operation("a", func(o *v1alpha1.NodeOperation) {
		o.Spec.NodeSelector = f.selector(map[string]string{"nodeops.test/hold": "a"})
	},
		v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{script("install")}})
	holder = f.waitTasks(a.Name, 1)[0].Name
	f.begin(holder, 0)
	b = f.operation("b", func(o *v1alpha1.NodeOperation) { o.Spec.MaxUnavailable = intOrStr("100%") },
		v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{waitCmd()}})
	for _, task := range f.waitTasks(b.Name, len(others)) {
		f.runAll(task.Name)
	}
	testutil.Eventually(f.t, 20*time.Second, "b has done all but the held node", func() error {
		if g := f.get(b.Name).Status.Groups; len(g) != 1 || g[0].Nodes.Succeeded != int32(len(others)) {
			return fmt.Errorf("groups %+v", g)
		}
		return nil
	})
	return a, b, held, holder
}

// stillRunning checks for a while that the operation stays Running, waiting for node, not Blocked.
func (f *fixture) stillRunning(op, node string, d time.Duration) {
	f.t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		o := f.get(op)
		c := condition(o, v1alpha1.ConditionProgressing)
		if o.Status.Phase != v1alpha1.OperationRunning || c.Reason != "WaitingForNode" || !strings.Contains(c.Message, node) ||
			condition(o, v1alpha1.ConditionBlocked).Status != metav1.ConditionFalse {
			f.t.Fatalf("%s: phase %s, conditions %+v; want Running, waiting for %s", op, o.Status.Phase, o.Status.Conditions, node)
		}
	}
}

// a failure blocks until a person decides and budgets are cluster-wide (rules 3 and 11): an operation whose only node left is held by another
// owner's failed task can do nothing until a person decides, so it says so (Blocked, naming the
// node, the task and its owner); a node held by another owner's running task is a wait that ends
// by itself (Running); and once the holder is retried the operation runs again and succeeds.
func TestSafetyRule11_WaitingOnlyForAnotherOwnersFailedNodeBlocks(t *testing.T) {
	f := newFixture(t)
	a, b, held, holder := holderAndWaiter(f)

	// The holder runs: b waits, Running, however long (the controller looks again every second here).
	f.stillRunning(b.Name, held, 3*time.Second)

	// The holder fails: b can do nothing more on its own.
	f.end(holder, 0, false, "exit status 7")
	f.waitPhase(a.Name, v1alpha1.OperationBlocked)
	blocked := f.waitPhase(b.Name, v1alpha1.OperationBlocked)
	c := condition(blocked, v1alpha1.ConditionBlocked)
	for _, want := range []string{"node " + held, holder, "NodeOperation/" + a.Name, "install", "exit status 7", "retry", "skip", "abort"} {
		if c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonNodeHeldByFailedTask || !strings.Contains(c.Message, want) {
			t.Fatalf("Blocked condition lacks %q: %+v", want, c)
		}
	}
	if p := condition(blocked, v1alpha1.ConditionProgressing); p.Status != metav1.ConditionFalse {
		t.Errorf("Progressing while blocked: %+v", p)
	}
	if g := blocked.Status.Groups[0]; g.Phase != v1alpha1.GroupBlocked || g.Nodes.Pending != 1 || g.Nodes.Failed != 0 {
		t.Errorf("group %+v", g)
	}
	f.waitEvent(b.Name, "Blocked")

	// A person retries the holder: b runs again at once, before the holder ends.
	setRecovery(f, holder, v1alpha1.RecoveryRetry)
	f.waitPhase(b.Name, v1alpha1.OperationRunning)
	f.waitEvent(b.Name, "Resumed")
	f.runAll(holder)
	f.waitPhase(a.Name, v1alpha1.OperationSucceeded)
	last := objname.TaskName(b.Name, "g", held)
	testutil.Eventually(t, 20*time.Second, "b starts the freed node", func() error {
		for _, task := range f.tasks(b.Name) {
			if task.Name == last {
				return nil
			}
		}
		return fmt.Errorf("no task %s", last)
	})
	f.runAll(last)
	f.waitPhase(b.Name, v1alpha1.OperationSucceeded)
}

// An operation blocked on another owner's failed node ends when aborted, and the holder, which is
// not its own, is left as it was; the holder's own owner is unaffected. Skipping the holder's task
// instead would free the node as its retry does.
func TestSafetyRule3_AbortEndsAnOperationBlockedOnAnotherOwnersNode(t *testing.T) {
	f := newFixture(t)
	a, b, _, holder := holderAndWaiter(f)
	f.end(holder, 0, false, "exit status 7")
	f.waitPhase(b.Name, v1alpha1.OperationBlocked)

	f.update(b.Name, func(o *v1alpha1.NodeOperation) { o.Spec.Abort = true })
	aborted := f.waitPhase(b.Name, v1alpha1.OperationAborted)
	if aborted.Status.CompletionTime == nil || aborted.Status.Groups[0].Phase != v1alpha1.GroupAborted {
		t.Errorf("after abort: %+v", aborted.Status)
	}
	if task := f.task(holder); task.Spec.Abort || task.EffectivePhase() != v1alpha1.TaskFailed {
		t.Errorf("the holder of another operation was changed: %+v / %+v", task.Spec, task.Status)
	}
	if p := f.get(a.Name).Status.Phase; p != v1alpha1.OperationBlocked {
		t.Errorf("the holder's operation is %s, want Blocked on its own failure", p)
	}

	// The holder's owner goes on once its task is skipped.
	setRecovery(f, holder, v1alpha1.RecoverySkip)
	f.waitPhase(a.Name, v1alpha1.OperationSucceeded)
}

// The fault suite's case exactly: the node left is held by a NodeProfile's install task that
// failed (there, its agent was killed). The operation goes Blocked naming the profile, and once a
// person skips the profile's task the node is free and the operation finishes.
func TestSafetyRule11_ANodeHeldByAFailedProfileTaskBlocksUntilItIsSkipped(t *testing.T) {
	f := newFixture(t)
	f.nodes(nil, "n1", "n2")
	held := f.nodes(nil, "n3")[0]
	// The NodeProfile controller does not run here: its task is made as it would make it.
	install := &v1alpha1.NodeTask{
		ObjectMeta: metav1.ObjectMeta{Name: f.id + "-wasm-" + held, Labels: map[string]string{v1alpha1.LabelNode: held},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "NodeProfile", Name: f.id + "-wasm",
				UID: types.UID(f.id + "-wasm-uid"), Controller: ptr.To(true)}}},
		Spec: v1alpha1.NodeTaskSpec{NodeName: held, Operation: f.id + "-wasm", Commands: []v1alpha1.Command{script("install")}, ExecutionMode: v1alpha1.ExecutionAuto},
	}
	f.must(f.c.Create(f.ctx, install))
	f.begin(install.Name, 0)
	f.end(install.Name, 0, false, "agent killed")

	b := f.operation("b", func(o *v1alpha1.NodeOperation) { o.Spec.MaxUnavailable = intOrStr("100%") },
		v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{waitCmd()}})
	for _, task := range f.waitTasks(b.Name, 2) {
		f.runAll(task.Name)
	}
	blocked := f.waitPhase(b.Name, v1alpha1.OperationBlocked)
	if g := blocked.Status.Groups[0]; g.Nodes.Succeeded != 2 || g.Nodes.Pending != 1 {
		t.Errorf("group %+v", g)
	}
	c := condition(blocked, v1alpha1.ConditionBlocked)
	for _, want := range []string{"node " + held, install.Name, "NodeProfile/" + f.id + "-wasm", "agent killed"} {
		if c.Reason != v1alpha1.ReasonNodeHeldByFailedTask || !strings.Contains(c.Message, want) {
			t.Fatalf("Blocked condition lacks %q: %+v", want, c)
		}
	}

	setRecovery(f, install.Name, v1alpha1.RecoverySkip)
	last := f.waitTasks(b.Name, 3)
	for _, task := range last {
		if task.Spec.NodeName == held {
			f.runAll(task.Name)
		}
	}
	f.waitPhase(b.Name, v1alpha1.OperationSucceeded)
}
