package nodeoperation_test

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent/commands"
	"github.com/nodeops/nodeops/internal/taskpolicy"
	"github.com/nodeops/nodeops/internal/testutil"
)

// uncordon restores what cordon found (rule 5): a node ends an operation with the schedulability it had before
// the operation, however the operation ends, and a cordon nodeops did not make is never undone.
// The agent is played by testutil.FakeAgent, except that cordon and uncordon run the agent's own
// command handlers against the API server, as the agent runs them.

// command runs command i of the task with the agent's handler, and records its result as the
// agent does (the next command Running, or the task's end); it returns the handler's error.
func (f *fixture) command(task string, i int) error {
	f.t.Helper()
	t := f.task(task)
	env := &commands.Env{NodeName: t.Spec.NodeName, Operation: t.Spec.Operation, Owner: taskpolicy.OwnerOfTask(t), Client: f.c}
	res, err := commands.Run(f.ctx, env, &t.Spec.Commands[i])
	msg := res.Message
	if err != nil {
		msg = err.Error()
	}
	f.end(task, i, err == nil, msg)
	return err
}

// taskOnNode is the operation's task on node, waiting for it.
func (f *fixture) taskOnNode(op, node string) string {
	f.t.Helper()
	var name string
	testutil.Eventually(f.t, 30*time.Second, fmt.Sprintf("a task of %s on %s", op, node), func() error {
		for _, t := range f.tasks(op) {
			if t.Spec.NodeName == node {
				name = t.Name
				return nil
			}
		}
		return fmt.Errorf("none yet")
	})
	return name
}

// wantSchedulability waits for node's spec.unschedulable to be want with no cordon record left.
func (f *fixture) wantSchedulability(node string, want bool) {
	f.t.Helper()
	testutil.Eventually(f.t, 30*time.Second, fmt.Sprintf("node %s unschedulable=%t without a record", node, want), func() error {
		var n corev1.Node
		if err := f.c.Get(f.ctx, client.ObjectKey{Name: node}, &n); err != nil {
			return err
		}
		if rec, ok := n.Annotations[commands.AnnotationWasUnschedulable]; n.Spec.Unschedulable != want || ok {
			return fmt.Errorf("unschedulable=%t, record %q", n.Spec.Unschedulable, rec)
		}
		return nil
	})
}

// keeps fails when node's spec.unschedulable is not want for d.
func (f *fixture) keeps(node string, want bool, d time.Duration) {
	f.t.Helper()
	testutil.Consistently(f.t, d, "node "+node+" keeps its schedulability", func() error {
		var n corev1.Node
		if err := f.c.Get(f.ctx, client.ObjectKey{Name: node}, &n); err != nil {
			f.t.Fatal(err)
		}
		if n.Spec.Unschedulable != want {
			return fmt.Errorf("node %s unschedulable=%t, want %t (record %q)", node, n.Spec.Unschedulable, want, n.Annotations[commands.AnnotationWasUnschedulable])
		}
		return nil
	})
}

func (f *fixture) annotate(node, key, value string) {
	f.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var n corev1.Node
		if err := f.c.Get(f.ctx, client.ObjectKey{Name: node}, &n); err != nil {
			return err
		}
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[key] = value
		return f.c.Update(f.ctx, &n)
	})
	if err != nil {
		f.t.Fatalf("annotate %s: %v", node, err)
	}
}

func cordonThen(cmds ...v1alpha1.Command) []v1alpha1.Command {
	return append([]v1alpha1.Command{{Cordon: &v1alpha1.CordonCommand{}}}, cmds...)
}

// An operation that succeeds without uncordoning (its group cordons for work that leaves the node
// unschedulable) restores each node: a is schedulable again; b, which an administrator cordoned
// after its task was created and before its cordon ran, stays cordoned.
func TestSafetyRule5_SucceededRestoresCordon(t *testing.T) {
	f := newFixture(t)
	nodes := f.nodes(nil, "a", "b")
	op := f.operation("succeed", nil, v1alpha1.Group{Name: "g", MaxUnavailable: intOrStr("2"), Commands: cordonThen(script("work"))})
	a, b := f.taskOnNode(op.Name, nodes[0]), f.taskOnNode(op.Name, nodes[1])
	f.setCordon(nodes[1], true) // the administrator's
	for _, task := range []string{a, b} {
		f.begin(task, 0)
		f.must(f.command(task, 0))
		f.end(task, 1, true, "ok")
	}
	f.waitPhase(op.Name, v1alpha1.OperationSucceeded)
	f.wantSchedulability(nodes[0], false)
	f.wantSchedulability(nodes[1], true)
}

// An uncordon that fails (the API server answering 503) blocks the operation; a person skips it,
// the task and the operation succeed, and the node is restored all the same.
func TestSafetyRule5_FailedThenSkippedRestoresCordon(t *testing.T) {
	f := newFixture(t)
	nodes := f.nodes(nil, "a", "b")
	op := f.operation("skip", nil, v1alpha1.Group{Name: "g", MaxUnavailable: intOrStr("2"), Commands: cordonThen(script("work"), v1alpha1.Command{Uncordon: &v1alpha1.UncordonCommand{}})})
	a, b := f.taskOnNode(op.Name, nodes[0]), f.taskOnNode(op.Name, nodes[1])
	f.setCordon(nodes[1], true) // the administrator's
	for _, task := range []string{a, b} {
		f.begin(task, 0)
		f.must(f.command(task, 0))
		f.end(task, 1, true, "ok")
		f.end(task, 2, false, "patching node: the server is currently unable to handle the request")
	}
	f.waitPhase(op.Name, v1alpha1.OperationBlocked)
	f.keeps(nodes[0], true, 200*time.Millisecond) // a failed task's node stays cordoned while a person decides
	setRecovery(f, a, v1alpha1.RecoverySkip)
	setRecovery(f, b, v1alpha1.RecoverySkip)
	f.waitPhase(op.Name, v1alpha1.OperationSucceeded)
	f.wantSchedulability(nodes[0], false)
	f.wantSchedulability(nodes[1], true)
}

// Aborting restores every node the operation cordoned: a, aborted while its work ran; b, whose
// work failed and blocked the operation before the abort; c, cordoned by an administrator after
// its task was created, stays cordoned.
func TestSafetyRule5_AbortRestoresCordon(t *testing.T) {
	f := newFixture(t)
	nodes := f.nodes(nil, "a", "b", "c")
	op := f.operation("abort", nil, v1alpha1.Group{Name: "g", MaxUnavailable: intOrStr("3"), Commands: cordonThen(script("work"), v1alpha1.Command{Uncordon: &v1alpha1.UncordonCommand{}})})
	tasks := []string{f.taskOnNode(op.Name, nodes[0]), f.taskOnNode(op.Name, nodes[1]), f.taskOnNode(op.Name, nodes[2])}
	f.setCordon(nodes[2], true) // the administrator's
	for _, task := range tasks {
		f.begin(task, 0)
		f.must(f.command(task, 0))
	}
	f.end(tasks[1], 1, false, "exit status 1")
	f.waitPhase(op.Name, v1alpha1.OperationBlocked)
	f.update(op.Name, func(o *v1alpha1.NodeOperation) { o.Spec.Abort = true })
	for _, task := range tasks {
		testutil.Eventually(t, 30*time.Second, "abort mirrored onto "+task, func() error {
			if !f.task(task).Spec.Abort {
				return fmt.Errorf("not yet")
			}
			return nil
		})
		f.abortTask(task)
	}
	f.waitPhase(op.Name, v1alpha1.OperationAborted)
	f.wantSchedulability(nodes[0], false)
	f.wantSchedulability(nodes[1], false)
	f.wantSchedulability(nodes[2], true)
}

// A record left by an earlier operation (one that ended before nodes were restored on every
// ending, or one deleted mid-run and created again under the same name) is not trusted: a, b and
// c were uncordoned and cordoned again by an administrator since, and an uncordon leaves them
// cordoned; d was uncordoned since, and a cordon and uncordon leave it schedulable.
func TestSafetyRule5_StaleRecordIsNotTrusted(t *testing.T) {
	f := newFixture(t)
	cordoned := f.nodes(map[string]string{"set": "cordoned"}, "a", "b", "c")
	open := f.nodes(map[string]string{"set": "open"}, "d")
	for i, value := range []string{"false", "false,NodeOperation/" + f.id + "-remedy/uid-of-a-deleted-one", "false,NodeOperation/" + f.id + "-other/uid"} {
		f.annotate(cordoned[i], commands.AnnotationWasUnschedulable, value)
		f.setCordon(cordoned[i], true)
	}
	f.annotate(open[0], commands.AnnotationWasUnschedulable, "true")
	uncordon := []v1alpha1.Command{{Uncordon: &v1alpha1.UncordonCommand{}}}
	only := func(set string) func(*v1alpha1.NodeOperation) {
		return func(o *v1alpha1.NodeOperation) { o.Spec.NodeSelector = f.selector(map[string]string{"set": set}) }
	}
	remedy := f.operation("remedy", only("cordoned"), v1alpha1.Group{Name: "g", MaxUnavailable: intOrStr("3"), Commands: uncordon})
	for _, n := range cordoned {
		task := f.taskOnNode(remedy.Name, n)
		f.begin(task, 0)
		f.must(f.command(task, 0))
	}
	f.waitPhase(remedy.Name, v1alpha1.OperationSucceeded)
	for _, n := range cordoned {
		f.keeps(n, true, 100*time.Millisecond)
	}
	work := f.operation("work", only("open"), v1alpha1.Group{Name: "g", Commands: cordonThen(script("work"), uncordon[0])})
	task := f.taskOnNode(work.Name, open[0])
	f.begin(task, 0)
	f.must(f.command(task, 0))
	f.end(task, 1, true, "ok")
	f.must(f.command(task, 2))
	f.waitPhase(work.Name, v1alpha1.OperationSucceeded)
	f.wantSchedulability(open[0], false)
}

// A cordon whose record lands after its operation ended (an idempotent cordon runs up to a second
// before it is recorded, intent recorded before action (rule 4), and an abort may end the operation meanwhile) is
// restored when the record arrives.
func TestSafetyRule5_CordonRecordedAfterTheEndIsRestored(t *testing.T) {
	f := newFixture(t)
	nodes := f.nodes(nil, "a")
	op := f.operation("late", nil, v1alpha1.Group{Name: "g", Commands: cordonThen(script("work"))})
	task := f.task(f.taskOnNode(op.Name, nodes[0]))
	f.update(op.Name, func(o *v1alpha1.NodeOperation) { o.Spec.Abort = true })
	f.abortTask(task.Name)
	f.waitPhase(op.Name, v1alpha1.OperationAborted)
	env := &commands.Env{NodeName: nodes[0], Operation: op.Name, Owner: taskpolicy.OwnerOfTask(task), Client: f.c}
	if _, err := commands.Run(f.ctx, env, &task.Spec.Commands[0]); err != nil {
		t.Fatal(err)
	}
	f.wantSchedulability(nodes[0], false)
}
