package nodeoperation_test

import (
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/plan"
	"github.com/nodeops/nodeops/internal/testutil"
)

// deleteTask deletes a task as `kubectl delete ntask` does, without waiting for it to go.
func (f *fixture) deleteTask(name string) {
	f.t.Helper()
	task := f.task(name)
	if err := f.c.Delete(f.ctx, task); err != nil {
		f.t.Fatalf("delete task %s: %v", name, err)
	}
}

// taskOn returns the task of group on node, and whether it exists.
func (f *fixture) taskOn(op, group, node string) (*v1alpha1.NodeTask, bool) {
	f.t.Helper()
	var t v1alpha1.NodeTask
	err := f.c.Get(f.ctx, client.ObjectKey{Name: plan.TaskName(op, group, node)}, &t)
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		f.t.Fatalf("get task on %s: %v", node, err)
	}
	return &t, true
}

// neverAgain fails when, for d, node has a task in group other than the one with uid (none when
// uid is empty): a task created again would run its commands a second time.
func (f *fixture) neverAgain(op, group, node string, uid types.UID, d time.Duration) {
	f.t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if t, ok := f.taskOn(op, group, node); ok && t.UID != uid {
			f.t.Fatalf("node %s got a new task %s (phase %q) after its task was deleted: its commands would run again", node, t.Name, t.Status.Phase)
		}
	}
}

// docs/design.md, safety rule 7: deleting a finished task by hand never makes the operation
// create it again; the operation's status keeps what the node finished.
func TestSafetyRule7_DeletedTaskIsNotRunAgain(t *testing.T) {
	f := newFixture(t)
	nodes := f.nodes(nil, "a", "b")
	op := f.operation("rerun", nil, v1alpha1.Group{Name: "g", MaxUnavailable: intOrStr("1"),
		Commands: []v1alpha1.Command{{Name: "once", Script: &v1alpha1.ScriptCommand{Inline: "echo >> /var/lib/counter"}}}})
	first := f.waitTasks(op.Name, 1)[0]
	if first.Spec.NodeName != nodes[0] {
		t.Fatalf("first task on %s, want %s", first.Spec.NodeName, nodes[0])
	}
	f.runAll(first.Name)
	f.deleteTask(first.Name)
	testutil.Eventually(t, 30*time.Second, "the deleted task gone", func() error {
		if _, ok := f.taskOn(op.Name, "g", nodes[0]); ok {
			return fmt.Errorf("task %s still there", first.Name)
		}
		return nil
	})
	f.neverAgain(op.Name, "g", nodes[0], "", 2*time.Second)

	second := f.waitTasks(op.Name, 1)[0]
	if second.Spec.NodeName != nodes[1] {
		t.Fatalf("the task after the deleted one is on %s, want %s", second.Spec.NodeName, nodes[1])
	}
	f.runAll(second.Name)
	done := f.waitPhase(op.Name, v1alpha1.OperationSucceeded)
	if c := done.Status.Groups[0].Nodes; c.Succeeded != 2 || c.Total != 2 {
		t.Errorf("counts %+v, want both nodes succeeded (one from the record)", c)
	}
	f.neverAgain(op.Name, "g", nodes[0], "", time.Second)
}

// docs/design.md, safety rule 7: a running task deleted by hand stays until it ended and its
// operation recorded how; it is never replaced by a new task that would run its commands again.
func TestSafetyRule7_DeletedRunningTaskIsNotRunAgain(t *testing.T) {
	f := newFixture(t)
	nodes := f.nodes(nil, "a")
	op := f.operation("running", nil, v1alpha1.Group{Name: "g",
		Commands: []v1alpha1.Command{{Name: "once", Script: &v1alpha1.ScriptCommand{Inline: "echo >> /var/lib/counter"}}}})
	task := f.waitTasks(op.Name, 1)[0]
	f.begin(task.Name, 0)
	f.deleteTask(task.Name)
	// The task is still there, running, and no other replaces it.
	f.neverAgain(op.Name, "g", nodes[0], task.UID, 2*time.Second)
	live, ok := f.taskOn(op.Name, "g", nodes[0])
	if !ok {
		t.Fatalf("the running task vanished while its command runs")
	}
	if live.DeletionTimestamp.IsZero() || live.Status.Phase != v1alpha1.TaskRunning {
		t.Fatalf("task: deletion %v, phase %q; want deleting and still Running", live.DeletionTimestamp, live.Status.Phase)
	}
	f.end(task.Name, 0, true, "ok")
	f.waitPhase(op.Name, v1alpha1.OperationSucceeded)
	testutil.Eventually(t, 30*time.Second, "the deleted task gone once it ended", func() error {
		if _, ok := f.taskOn(op.Name, "g", nodes[0]); ok {
			return fmt.Errorf("task %s still there", task.Name)
		}
		return nil
	})
	f.neverAgain(op.Name, "g", nodes[0], "", time.Second)
	if c := f.get(op.Name).Status.Groups[0].Nodes; c.Succeeded != 1 {
		t.Errorf("counts %+v, want the node succeeded", c)
	}
}
