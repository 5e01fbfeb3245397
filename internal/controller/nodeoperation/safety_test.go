package nodeoperation_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/nodeoperation"
	"github.com/nodeops/nodeops/internal/nodelock"
	"github.com/nodeops/nodeops/internal/objname"
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

// waitTaskGone waits until op has no task of group on node, the deleted task name being gone.
func (f *fixture) waitTaskGone(op, group, node, name, what string) {
	f.t.Helper()
	testutil.Eventually(f.t, 30*time.Second, what, func() error {
		if _, ok := f.taskOn(op, group, node); ok {
			return fmt.Errorf("task %s still there", name)
		}
		return nil
	})
}

// taskOn returns the task of group on node, and whether it exists.
func (f *fixture) taskOn(op, group, node string) (*v1alpha1.NodeTask, bool) {
	f.t.Helper()
	var t v1alpha1.NodeTask
	err := f.c.Get(f.ctx, client.ObjectKey{Name: objname.TaskName(op, group, node)}, &t)
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
	testutil.Consistently(f.t, d, "no new task on "+node, func() error {
		if t, ok := f.taskOn(op, group, node); ok && t.UID != uid {
			return fmt.Errorf("node %s got a new task %s (phase %q) after its task was deleted: its commands would run again", node, t.Name, t.Status.Phase)
		}
		return nil
	})
}

// nothing deleted automatically (rule 7): deleting a finished task by hand never makes the operation
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
	f.waitTaskGone(op.Name, "g", nodes[0], first.Name, "the deleted task gone")
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

// nothing deleted automatically (rule 7): a running task deleted by hand stays until it ended and its
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
	f.waitTaskGone(op.Name, "g", nodes[0], task.Name, "the deleted task gone once it ended")
	f.neverAgain(op.Name, "g", nodes[0], "", time.Second)
	if c := f.get(op.Name).Status.Groups[0].Nodes; c.Succeeded != 1 {
		t.Errorf("counts %+v, want the node succeeded", c)
	}
}

// nothing deleted automatically (rule 7), for a task made by a nodeops from before the Finalizer:
// the manager puts it on the running task, so that deleting the task by hand while its command
// runs cannot make the operation create it again either.
func TestSafetyRule7_ARunningTaskFromAnOlderNodeopsIsKeptToo(t *testing.T) {
	f := newFixture(t)
	nodes := f.nodes(nil, "a")
	op := f.operation("older", nil, v1alpha1.Group{Name: "g",
		Commands: []v1alpha1.Command{{Name: "once", Script: &v1alpha1.ScriptCommand{Inline: "echo >> /var/lib/counter"}}}})
	task := f.waitTasks(op.Name, 1)[0]
	f.begin(task.Name, 0)
	// As an older nodeops made it: no finalizer.
	if err := f.c.Patch(f.ctx, f.task(task.Name), client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))); err != nil {
		t.Fatalf("take the finalizer off: %v", err)
	}
	testutil.Eventually(t, 30*time.Second, "the running task kept by the manager", func() error {
		if got := f.task(task.Name); !controllerutil.ContainsFinalizer(got, nodeoperation.Finalizer) {
			return fmt.Errorf("task %s has finalizers %v; want %s", task.Name, got.Finalizers, nodeoperation.Finalizer)
		}
		return nil
	})
	f.deleteTask(task.Name)
	f.neverAgain(op.Name, "g", nodes[0], task.UID, 2*time.Second)
	if live, ok := f.taskOn(op.Name, "g", nodes[0]); !ok || live.DeletionTimestamp.IsZero() {
		t.Fatalf("the running task vanished, or was not deleted, while its command runs")
	}
	f.end(task.Name, 0, true, "ok")
	f.waitPhase(op.Name, v1alpha1.OperationSucceeded)
	f.waitTaskGone(op.Name, "g", nodes[0], task.Name, "the deleted task gone once it ended")
	f.neverAgain(op.Name, "g", nodes[0], "", time.Second)
}

// nothing deleted automatically (rule 7), with the operation's cache behind: a task deleted by hand
// is let go once the operation's status records its end, and the tasks' informer can deliver the
// deletion before the operations' informer delivers that record. A look in that moment sees the
// task gone and the node not recorded; it must not create the task again. Here the look is a
// reconciler whose cache returns the operation as it was while the task ran (every other read is
// the API server's), after the task ended, was recorded and was deleted.
func TestSafetyRule7_AStaleOperationNeverCreatesADeletedTaskAgain(t *testing.T) {
	f := newFixture(t)
	nodes := f.nodes(nil, "a")
	op := f.operation("stale", nil, v1alpha1.Group{Name: "g",
		Commands: []v1alpha1.Command{{Name: "once", Script: &v1alpha1.ScriptCommand{Inline: "echo >> /var/lib/counter"}}}})
	task := f.waitTasks(op.Name, 1)[0]
	f.begin(task.Name, 0)
	var stale *v1alpha1.NodeOperation
	testutil.Eventually(t, 30*time.Second, "the operation recording its node running", func() error {
		stale = f.get(op.Name)
		if len(stale.Status.Groups) == 0 || stale.Status.Groups[0].Nodes.Running != 1 {
			return fmt.Errorf("groups %+v", stale.Status.Groups)
		}
		return nil
	})
	f.end(task.Name, 0, true, "ok")
	f.waitPhase(op.Name, v1alpha1.OperationSucceeded)
	f.deleteTask(task.Name)
	f.waitTaskGone(op.Name, "g", nodes[0], task.Name, "the deleted task gone once its end is recorded")

	testutil.Eventually(t, 30*time.Second, "the manager's cache without the task", func() error {
		err := managerClient.Get(f.ctx, client.ObjectKey{Name: task.Name}, &v1alpha1.NodeTask{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("the cache still has task %s (%w)", task.Name, err)
	})
	lagging := testutil.StaleGet{Client: managerClient, Stale: stale}
	r := nodeoperation.New(lagging, f.c, managerLocks, events.NewFakeRecorder(10))
	r.StatusInterval = time.Hour
	if _, err := r.Reconcile(f.ctx, ctrl.Request{NamespacedName: client.ObjectKey{Name: op.Name}}); err != nil {
		t.Fatalf("reconcile on the stale operation: %v", err)
	}
	f.neverAgain(op.Name, "g", nodes[0], "", time.Second)
	if got := f.get(op.Name); got.Status.Phase != v1alpha1.OperationSucceeded || got.Status.Groups[0].Nodes.Succeeded != 1 {
		t.Errorf("the operation's record was undone: phase %q, counts %+v; want Succeeded with the node", got.Status.Phase, got.Status.Groups[0].Nodes)
	}
}

// nothing deleted automatically (rule 7), with the operation not yet in the cache: a look that
// does not find the operation lets its deleted tasks go (their record is not needed once it is
// gone). Just after a start or a leader change, the operations' informer can be behind the tasks';
// a running task deleted by hand must not be let go then, unrecorded, or the next look would
// create it again. Here the look is a reconciler whose cache does not have the operation.
func TestSafetyRule7_AnOperationMissingFromTheCacheKeepsItsDeletedTask(t *testing.T) {
	f := newFixture(t)
	f.nodes(nil, "a")
	op := f.operation("missing", nil, v1alpha1.Group{Name: "g",
		Commands: []v1alpha1.Command{{Name: "once", Script: &v1alpha1.ScriptCommand{Inline: "echo >> /var/lib/counter"}}}})
	task := f.waitTasks(op.Name, 1)[0]
	f.begin(task.Name, 0)
	f.deleteTask(task.Name)
	testutil.Eventually(t, 30*time.Second, "the manager's cache showing the task being deleted", func() error {
		var got v1alpha1.NodeTask
		if err := managerClient.Get(f.ctx, client.ObjectKey{Name: task.Name}, &got); err != nil {
			return err
		}
		if got.DeletionTimestamp.IsZero() {
			return fmt.Errorf("task %s not being deleted in the cache yet", task.Name)
		}
		return nil
	})

	r := nodeoperation.New(missingOperation{Client: managerClient, name: op.Name}, f.c, managerLocks, events.NewFakeRecorder(10))
	r.StatusInterval = time.Hour
	if _, err := r.Reconcile(f.ctx, ctrl.Request{NamespacedName: client.ObjectKey{Name: op.Name}}); err != nil {
		t.Fatalf("reconcile without the operation in the cache: %v", err)
	}
	var got v1alpha1.NodeTask
	if err := f.c.Get(f.ctx, client.ObjectKey{Name: task.Name}, &got); err != nil {
		t.Fatalf("the running task %s, deleted by hand, was let go while its operation exists (get: %v); its end is unrecorded and it would be created again", task.Name, err)
	}
	if !controllerutil.ContainsFinalizer(&got, nodeoperation.Finalizer) {
		t.Fatalf("task %s lost its finalizer %s while its operation exists", task.Name, nodeoperation.Finalizer)
	}
}

// missingOperation is the manager's cached client, except that one operation is not found.
type missingOperation struct {
	client.Client
	name string
}

func (c missingOperation) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*v1alpha1.NodeOperation); ok && key.Name == c.name {
		return apierrors.NewNotFound(v1alpha1.GroupVersion.WithResource("nodeoperations").GroupResource(), key.Name)
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

// setCordon sets a node's spec.unschedulable, as `kubectl cordon` (or another tool) does.
func (f *fixture) setCordon(node string, cordoned bool) {
	f.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var n corev1.Node
		if err := f.c.Get(f.ctx, client.ObjectKey{Name: node}, &n); err != nil {
			return err
		}
		n.Spec.Unschedulable = cordoned
		return f.c.Update(f.ctx, &n)
	})
	if err != nil {
		f.t.Fatalf("cordon %s=%v: %v", node, cordoned, err)
	}
}

// unavailable nodes count against maxUnavailable and budgets are cluster-wide (rules 2 and 11): a node an administrator cordoned is unavailable, so a
// group at maxUnavailable 1 that selects it starts nothing until it is uncordoned, and says why.
func TestSafetyRule11_CordonedNodeCountsAgainstMaxUnavailable(t *testing.T) {
	f := newFixture(t)
	nodes := f.nodes(nil, "a", "b", "c")
	f.setCordon(nodes[1], true)
	op := f.operation("cordoned", nil, v1alpha1.Group{Name: "g", MaxUnavailable: intOrStr("1"), Commands: []v1alpha1.Command{waitCmd()}})
	testutil.Eventually(t, 20*time.Second, "the operation names the cordoned node", func() error {
		c := condition(f.get(op.Name), v1alpha1.ConditionProgressing)
		if !strings.Contains(c.Message, "cordoned") || !strings.Contains(c.Message, nodes[1]) {
			return fmt.Errorf("Progressing %+v", c)
		}
		return nil
	})
	testutil.Consistently(t, 2*time.Second, "no task while a node is cordoned", func() error {
		if tasks := f.tasks(op.Name); len(tasks) != 0 {
			return fmt.Errorf("task %s started on %s while %s is cordoned at maxUnavailable 1", tasks[0].Name, tasks[0].Spec.NodeName, nodes[1])
		}
		return nil
	})
	f.setCordon(nodes[1], false)
	for i := range nodes {
		task := f.waitTasks(op.Name, i+1)
		for _, t := range task {
			if t.EffectivePhase().Unfinished() {
				f.runAll(t.Name)
			}
		}
	}
	f.waitPhase(op.Name, v1alpha1.OperationSucceeded)
}

// budgets are cluster-wide (rule 11): two operations at maxUnavailable 1 over the same nodes never
// make a second node unavailable while one is (a task holding it, or cordoned): checked on every
// task the API server reports newly holding its node, while the agent finishes tasks in random
// order and an administrator cordons a node for a while.
//
// The cordon is made while a task holds a node, so nothing may start until that task ends, and
// the agent ends nothing until both operations say they wait for the cordoned node: from then on
// every decision the manager makes has seen the cordon, whatever the time it took to see it.
func TestSafetyRule11_TwoOperationsShareOneBudget(t *testing.T) {
	f := newFixture(t)
	nodes := f.nodes(nil, "w1", "w2", "w3", "w4")
	var mu sync.Mutex
	var violation string
	seen := map[string]bool{}      // tasks the watch saw, so the check is not vacuous
	holding := map[string]string{} // task -> node
	cordoned := ""                 // the administrator's cordon, set by the test before it cordons and cleared before it uncordons
	check := func(what string) {
		down := map[string]bool{}
		for _, n := range holding {
			down[n] = true
		}
		if cordoned != "" {
			down[cordoned] = true
		}
		if len(down) > 1 && violation == "" {
			violation = fmt.Sprintf("after %s: %d nodes unavailable at once (tasks %v, cordoned %q)", what, len(down), holding, cordoned)
		}
	}
	watchTasks, err := f.c.Watch(f.ctx, &v1alpha1.NodeTaskList{})
	if err != nil {
		t.Fatal(err)
	}
	defer watchTasks.Stop()
	go func() {
		for ev := range watchTasks.ResultChan() {
			task, isTask := ev.Object.(*v1alpha1.NodeTask)
			if !isTask || !strings.HasPrefix(task.Name, f.id) {
				continue
			}
			mu.Lock()
			seen[task.Name] = true
			_, held := holding[task.Name]
			if ev.Type == watch.Deleted || !nodelock.Holds(task) {
				delete(holding, task.Name)
			} else if !held {
				// A task that starts holding its node is what nodeops decided: check then.
				holding[task.Name] = task.Spec.NodeName
				check("task " + task.Name + " created")
			}
			mu.Unlock()
		}
	}()

	one := func(o *v1alpha1.NodeOperation) { o.Spec.MaxUnavailable = intOrStr("1") }
	a := f.operation("a", one, v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{waitCmd()}})
	b := f.operation("b", one, v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{waitCmd()}})
	ops := []string{a.Name, b.Name}
	// observe reads both operations, then their tasks: in that order, a task the manager created
	// after the status it wrote is listed.
	observe := func() (status []*v1alpha1.NodeOperation, all, open []v1alpha1.NodeTask) {
		for _, op := range ops {
			status = append(status, f.get(op))
		}
		for _, op := range ops {
			all = append(all, f.tasks(op)...)
		}
		for _, task := range all {
			if task.EffectivePhase().Unfinished() {
				open = append(open, task)
			}
		}
		return status, all, open
	}
	// waitsFor reports whether every operation's status names node among the cordoned nodes it
	// waits for and counts as succeeded every task listed as such.
	waitsFor := func(node string, status []*v1alpha1.NodeOperation, tasks []v1alpha1.NodeTask) error {
		for _, op := range status {
			if c := condition(op, v1alpha1.ConditionProgressing); !strings.Contains(c.Message, "waiting for cordoned nodes "+node) {
				return fmt.Errorf("%s: Progressing %q does not name the cordoned %s", op.Name, c.Message, node)
			}
			done := 0
			for _, task := range tasks {
				if task.Spec.Operation == op.Name && task.EffectivePhase() == v1alpha1.TaskSucceeded {
					done++
				}
			}
			if got := op.Status.Groups[0].Nodes.Succeeded; int(got) != done {
				return fmt.Errorf("%s: status counts %d succeeded, %d tasks did", op.Name, got, done)
			}
		}
		return nil
	}
	cordon, uncordoned := "", false
	f.playAgents(rand.New(rand.NewPCG(3, 4)), func(step int) {
		switch {
		case uncordoned || step < 3:
		case cordon == "":
			_, all, open := observe()
			if len(open) == 0 {
				return // cordon while a task holds a node: nothing may start until it ends
			}
			// The node to cordon has no task of either operation: a cordon on a node with its own
			// task counts only while that task is unfinished (a drain's).
			used := map[string]bool{}
			for _, task := range all {
				used[task.Spec.NodeName] = true
			}
			for i := len(nodes) - 1; i >= 0 && cordon == ""; i-- {
				if !used[nodes[i]] {
					cordon = nodes[i]
				}
			}
			if cordon == "" {
				t.Fatalf("every node has a task at step %d: the cordon comes too late", step)
			}
			// The watch must have seen the open tasks hold their nodes, or it would count them as
			// new beside the cordon.
			testutil.Eventually(t, 30*time.Second, "the watch saw the open tasks", func() error {
				mu.Lock()
				defer mu.Unlock()
				for _, task := range open {
					if _, ok := holding[task.Name]; !ok {
						return fmt.Errorf("task %s not seen holding %s", task.Name, task.Spec.NodeName)
					}
				}
				return nil
			})
			mu.Lock()
			cordoned = cordon
			mu.Unlock()
			f.setCordon(cordon, true) // an administrator's, for a while
			testutil.Eventually(t, 30*time.Second, "both operations wait for the cordoned node", func() error {
				status, all, _ := observe()
				return waitsFor(cordon, status, all)
			})
		default:
			// Uncordon once the manager, with every task ended, says it waits for the cordon: so
			// the cordon held back the next node.
			status, all, open := observe()
			if len(open) > 0 || waitsFor(cordon, status, all) != nil {
				return
			}
			mu.Lock()
			cordoned = ""
			mu.Unlock()
			f.setCordon(cordon, false)
			uncordoned = true
		}
	}, a.Name, b.Name)
	f.waitPhase(a.Name, v1alpha1.OperationSucceeded)
	f.waitPhase(b.Name, v1alpha1.OperationSucceeded)
	// The watch has checked every task once it saw all 8 and none still holds its node.
	testutil.Eventually(t, 30*time.Second, "the watch saw every task end", func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(seen) != 8 || len(holding) > 0 {
			return fmt.Errorf("the watch saw %d of 8 tasks, %v still holding", len(seen), holding)
		}
		return nil
	})
	watchTasks.Stop()
	mu.Lock()
	defer mu.Unlock()
	if violation != "" {
		t.Fatal(violation)
	}
	if !uncordoned {
		t.Fatalf("the administrator's cordon never came or never went (cordon %q)", cordon)
	}
}

// The record's finalizer never outlives the operation: once the operation is deleted, its tasks
// go as the garbage collector deletes them (played here by the test: envtest runs none).
func TestDeletedOperationReleasesItsTasks(t *testing.T) {
	f := newFixture(t)
	f.nodes(nil, "a")
	op := f.operation("deleted", nil, v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{waitCmd()}})
	task := f.waitTasks(op.Name, 1)[0]
	f.begin(task.Name, 0)
	if err := f.c.Delete(f.ctx, f.get(op.Name)); err != nil {
		t.Fatal(err)
	}
	f.deleteTask(task.Name)
	f.waitTaskGone(op.Name, "g", task.Spec.NodeName, task.Name, "the task of the deleted operation gone")
}

// A cordon left by another operation (a drain that failed, then was aborted) can be undone by an
// operation that only uncordons: it finds the node counted already and spends nothing more, and
// the group's other nodes wait for it (test/e2e's "uncordon-after" relies on this).
func TestSafetyRule11_UncordonRunsOnCordonedNode(t *testing.T) {
	f := newFixture(t)
	nodes := f.nodes(nil, "a", "b")
	f.setCordon(nodes[1], true)
	op := f.operation("uncordon", nil, v1alpha1.Group{Name: "g", MaxUnavailable: intOrStr("1"), Commands: []v1alpha1.Command{{Uncordon: &v1alpha1.UncordonCommand{}}}})
	first := f.waitTasks(op.Name, 1)[0]
	if first.Spec.NodeName != nodes[1] {
		t.Fatalf("first task on %s, want the cordoned %s", first.Spec.NodeName, nodes[1])
	}
	f.neverAgain(op.Name, "g", nodes[0], "", time.Second) // a is not started beside the cordoned b
	f.runAll(first.Name)
	f.setCordon(nodes[1], false) // what the agent's uncordon does
	for _, task := range f.waitTasks(op.Name, 2) {
		if task.Name != first.Name {
			f.runAll(task.Name)
		}
	}
	f.waitPhase(op.Name, v1alpha1.OperationSucceeded)
}
