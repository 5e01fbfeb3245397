package nodeoperation_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/objname"
	"github.com/nodeops/nodeops/internal/testutil"
)

// lostOnDeletedNode starts an operation whose task runs on node n2, deletes n2, and waits for
// the manager's mark (a lost agent fails its task in bounded time, rule 9) and the operation's Blocked.
func lostOnDeletedNode(t *testing.T, f *fixture, name string) (op *v1alpha1.NodeOperation, task string) {
	t.Helper()
	nodes := f.nodes(nil, "n2")
	op = f.operation(name, nil, v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{script("first"), script("second")}})
	task = objname.TaskName(op.Name, "g", nodes[0])
	f.waitTasks(op.Name, 1)
	f.begin(task, 0)
	if err := f.c.Delete(f.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodes[0]}}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "the task marked NodeDeleted", func() error {
		tk := f.task(task)
		if c := tk.Lost(); c == nil || c.Reason != v1alpha1.ReasonNodeDeleted || !strings.Contains(c.Message, nodes[0]) {
			return fmt.Errorf("conditions %+v", tk.Status.Conditions)
		}
		if tk.EffectivePhase() != v1alpha1.TaskFailed {
			return fmt.Errorf("effective phase %s", tk.EffectivePhase())
		}
		return nil
	})
	blocked := f.waitPhase(op.Name, v1alpha1.OperationBlocked)
	if c := condition(blocked, v1alpha1.ConditionBlocked); !strings.Contains(c.Message, v1alpha1.ReasonNodeDeleted) || !strings.Contains(c.Message, nodes[0]) {
		t.Fatalf("the Blocked condition must name the node and NodeDeleted: %+v", c)
	}
	return op, task
}

// A lost agent fails its task in bounded time (rule 9): a task running on a node that is deleted fails with reason NodeDeleted, the
// operation goes Blocked, and abort ends it (no "waiting for running tasks" forever).
func TestSafetyRule9_DeletedNodeFailsItsTask(t *testing.T) {
	f := newFixture(t)
	op, _ := lostOnDeletedNode(t, f, "lost")
	f.update(op.Name, func(o *v1alpha1.NodeOperation) { o.Spec.Abort = true })
	f.waitPhase(op.Name, v1alpha1.OperationAborted)
}

// A lost agent fails its task in bounded time (rule 9): no agent can act on a deleted node's task, so a person's skip is recorded by
// the manager in its condition, and the operation goes on; a retry is refused, saying why.
func TestSafetyRule9_SkipOnADeletedNode(t *testing.T) {
	f := newFixture(t)
	op, task := lostOnDeletedNode(t, f, "lostskip")
	ask(f, task, v1alpha1.RecoveryRetry)
	testutil.Eventually(t, 30*time.Second, "retry refused", func() error {
		if c := f.task(task).Lost(); c == nil || !strings.Contains(c.Message, "retry refused") {
			return fmt.Errorf("condition %+v", c)
		}
		return nil
	})
	ask(f, task, v1alpha1.RecoverySkip)
	testutil.Eventually(t, 30*time.Second, "skip recorded", func() error {
		if c := f.task(task).Lost(); c == nil || c.Reason != v1alpha1.ReasonLostSkipped {
			return fmt.Errorf("condition %+v", c)
		}
		return nil
	})
	done := f.waitPhase(op.Name, v1alpha1.OperationSucceeded)
	if g := done.Status.Groups[0]; g.Nodes.Skipped != 1 {
		t.Fatalf("group %+v: the node must count as skipped", g)
	}
}

// ask sets spec.recoveryMode as `kubectl nodeops retry|skip` does; no agent acts on it.
func ask(f *fixture, task string, mode v1alpha1.RecoveryMode) {
	f.t.Helper()
	t := f.task(task)
	orig := t.DeepCopy()
	t.Spec.RecoveryMode = mode
	if err := f.c.Patch(f.ctx, t, client.MergeFrom(orig)); err != nil {
		f.t.Fatalf("set recoveryMode: %v", err)
	}
}
