package nodeoperation_test

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/nodeoperation"
	"github.com/nodeops/nodeops/internal/taskpolicy"
	"github.com/nodeops/nodeops/internal/testutil"
)

// checks lists the operation's gate checks (v1alpha1.IsGateCheck) from the API server, by attempt.
func (f *fixture) checks(op string) []v1alpha1.NodeTask {
	f.t.Helper()
	var list v1alpha1.NodeTaskList
	if err := f.c.List(f.ctx, &list, client.HasLabels{v1alpha1.LabelGateCheck}); err != nil {
		f.t.Fatalf("list gate checks: %v", err)
	}
	var out []v1alpha1.NodeTask
	for _, t := range list.Items {
		if t.Spec.Operation == op && v1alpha1.IsGateCheck(&t) {
			out = append(out, t)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, _ := strconv.Atoi(out[i].Labels[v1alpha1.LabelGateAttempt])
		b, _ := strconv.Atoi(out[j].Labels[v1alpha1.LabelGateAttempt])
		return a < b
	})
	return out
}

// waitCheck waits for attempt n of the operation's check and returns it.
func (f *fixture) waitCheck(op string, n int) v1alpha1.NodeTask {
	f.t.Helper()
	var out v1alpha1.NodeTask
	testutil.Eventually(f.t, 20*time.Second, fmt.Sprintf("check attempt %d of %s", n, op), func() error {
		var seen []string
		for _, t := range f.checks(op) {
			if t.Labels[v1alpha1.LabelGateAttempt] == strconv.Itoa(n) {
				out = t
				return nil
			}
			seen = append(seen, t.Name)
		}
		return fmt.Errorf("checks %v", seen)
	})
	return out
}

// failCheck ends a check's script with exit code and output, as the agent does: one write.
func (f *fixture) failCheck(task string, code int32, output string) {
	f.t.Helper()
	f.must(f.agent().Exit(f.ctx, task, code, output))
}

func commandGate(name, node string, timeout int) v1alpha1.Gate {
	return v1alpha1.Gate{Name: name, Timeout: seconds(timeout), Command: &v1alpha1.CommandGate{Script: "test -f /var/lib/resync-done", Node: node}}
}

// A command gate is answered by a gate-check NodeTask on the node about to start: while its
// script fails the group holds, saying the exit code and the output; each re-check is a new task
// and the older ones go; once a check succeeds that node starts, and the next node is checked on
// its own before it starts. The checks count in no progress and cordon nothing.
func TestCommandGateHoldsTheGroupWhileItsCheckFails(t *testing.T) {
	f := newFixture(t)
	nodes := f.nodes(nil, "n1", "n2")
	op := f.operation("cmd", func(o *v1alpha1.NodeOperation) {
		o.Spec.MaxUnavailable = intOrStr("2")
	}, v1alpha1.Group{Name: "workers", Commands: []v1alpha1.Command{script("a")},
		Scheduling: v1alpha1.Scheduling{Gates: []v1alpha1.Gate{commandGate("resync", "", 120)}}})

	first := f.waitCheck(op.Name, 1)
	if first.Spec.NodeName != nodes[0] || len(first.Spec.Commands) != 1 || first.Spec.Commands[0].Script == nil ||
		first.Spec.Commands[0].Script.Inline != "test -f /var/lib/resync-done" || first.Labels[v1alpha1.LabelGateCheck] != "resync" {
		t.Fatalf("check task: node %s, commands %+v, labels %v", first.Spec.NodeName, first.Spec.Commands, first.Labels)
	}
	f.noTaskIn(op.Name, "workers", time.Second)

	f.failCheck(first.Name, 3, "md0: resync 42% done\n")
	got := f.waitReason(op.Name, v1alpha1.ConditionProgressing, nodeoperation.ReasonWaitingForGate)
	testutil.Eventually(t, 10*time.Second, "the gate's message carries the exit code and output", func() error {
		got = f.get(op.Name)
		c := condition(got, v1alpha1.ConditionProgressing)
		if !strings.Contains(c.Message, "script exited 3 on node "+nodes[0]) || !strings.Contains(c.Message, "resync 42% done") {
			return fmt.Errorf("%s: %s", c.Reason, c.Message)
		}
		return nil
	})
	if g := got.Status.Groups[0]; g.Nodes.Total != 2 || g.Nodes.Pending != 2 || g.Nodes.Failed != 0 {
		t.Errorf("a failed check counts in the group's nodes: %+v", g.Nodes)
	}

	// Re-checked: a new task each time; the one before it stays while it runs, older ones go.
	second := f.waitCheck(op.Name, 2)
	f.failCheck(second.Name, 3, "md0: resync 80% done")
	third := f.waitCheck(op.Name, 3)
	testutil.Eventually(t, 10*time.Second, "older checks deleted", func() error {
		for _, c := range f.checks(op.Name) {
			if c.Name == first.Name {
				return fmt.Errorf("attempt 1 still there")
			}
		}
		return nil
	})
	f.noTaskIn(op.Name, "workers", 500*time.Millisecond)

	f.must(f.agent().RunAll(f.ctx, third.Name))
	one := f.taskIn(op.Name, "workers")
	if one.Spec.NodeName != nodes[0] {
		t.Fatalf("first task on %s, want %s", one.Spec.NodeName, nodes[0])
	}
	// maxUnavailable 2, but the check answered for its own node only: n2 waits for its own.
	next := f.waitCheck(op.Name, 4)
	if next.Spec.NodeName != nodes[1] {
		t.Fatalf("the next check runs on %s, want %s", next.Spec.NodeName, nodes[1])
	}
	if n := len(f.tasks(op.Name)); n != 1 {
		t.Fatalf("%d tasks before n2's check passed", n)
	}
	f.runAll(one.Name)
	f.must(f.agent().RunAll(f.ctx, next.Name))
	f.waitTasks(op.Name, 2)
	for _, task := range f.tasks(op.Name) {
		if task.Spec.NodeName == nodes[1] {
			f.runAll(task.Name)
		}
	}
	done := f.waitPhase(op.Name, v1alpha1.OperationSucceeded)
	if g := gateOf(done, "workers", "resync"); g == nil || g.State != v1alpha1.GatePassed || g.Message != "script exited 0 on node "+nodes[1] {
		t.Errorf("status.gates: %+v", done.Status.Gates)
	}
	for _, n := range nodes {
		var node corev1.Node
		f.must(f.c.Get(f.ctx, client.ObjectKey{Name: n}, &node))
		if node.Spec.Unschedulable {
			t.Errorf("node %s cordoned", n)
		}
	}
}

// A check whose script runs on holds for the gate's timeout, then blocks the operation with the
// gate's word; a person's skip lets the group go on. The running check is told to abort, never
// deleted: deleting it would not stop its script, and the node's task would run beside it (rule 1).
// The node's task starts only once the check's agent recorded its end.
func TestCommandGateTimesOutToBlocked(t *testing.T) {
	f := newFixture(t)
	f.nodes(nil, "n1")
	op := f.operation("cmdto", nil, v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{script("a")},
		Scheduling: v1alpha1.Scheduling{Gates: []v1alpha1.Gate{commandGate("resync", "", 2)}}})
	check := f.waitCheck(op.Name, 1)
	f.must(f.agent().Write(f.ctx, check.Name, func(t *v1alpha1.NodeTask) {
		taskpolicy.Apply(&t.Status, &t.Spec, taskpolicy.Action{Kind: taskpolicy.ActStart, Index: 0}, metav1.NowMicro())
	}))
	got := f.waitReason(op.Name, v1alpha1.ConditionBlocked, nodeoperation.ReasonGateTimedOut)
	c := condition(got, v1alpha1.ConditionBlocked)
	if got.Status.Phase != v1alpha1.OperationBlocked || !strings.Contains(c.Message, "gate resync held group g") || !strings.Contains(c.Message, "checking") {
		t.Fatalf("phase %s, Blocked: %s", got.Status.Phase, c.Message)
	}
	f.noTaskIn(op.Name, "g", time.Second)
	f.update(op.Name, func(o *v1alpha1.NodeOperation) {
		o.Annotations = map[string]string{v1alpha1.AnnotationSkipGatePrefix + "resync": "x"}
	})
	testutil.Eventually(t, 20*time.Second, "the running check told to abort, not deleted", func() error {
		var c v1alpha1.NodeTask
		if err := f.c.Get(f.ctx, client.ObjectKey{Name: check.Name}, &c); err != nil {
			return err
		}
		if !c.Spec.Abort {
			return fmt.Errorf("spec.abort not set")
		}
		return nil
	})
	if n := len(f.tasks(op.Name)); n != 0 {
		t.Fatalf("%d tasks while the check's script runs", n)
	}
	f.must(f.agent().Write(f.ctx, check.Name, func(t *v1alpha1.NodeTask) {
		taskpolicy.Apply(&t.Status, &t.Spec, taskpolicy.Action{Kind: taskpolicy.ActAbort}, metav1.NowMicro())
	}))
	f.runAll(f.taskIn(op.Name, "g").Name)
	f.waitPhase(op.Name, v1alpha1.OperationSucceeded)
}

// A gate whose chosen node does not exist cannot be checked: it holds, naming the node, and
// never lets the group start (a gate that cannot be evaluated blocks, rule 14).
func TestSafetyRule14_CommandGateOnAMissingNodeHolds(t *testing.T) {
	f := newFixture(t)
	f.nodes(nil, "n1")
	missing := f.id + "-storage-9"
	op := f.operation("cmdmiss", nil, v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{script("a")},
		Scheduling: v1alpha1.Scheduling{Gates: []v1alpha1.Gate{commandGate("raid", missing, 120)}}})
	f.waitReason(op.Name, v1alpha1.ConditionProgressing, nodeoperation.ReasonWaitingForGate)
	testutil.Consistently(t, 2*time.Second, "the group holds, naming the node", func() error {
		got := f.get(op.Name)
		c := condition(got, v1alpha1.ConditionProgressing)
		if c.Reason != nodeoperation.ReasonWaitingForGate || !strings.Contains(c.Message, "node "+missing+" does not exist") {
			return fmt.Errorf("%s: %s", c.Reason, c.Message)
		}
		if n := len(f.tasks(op.Name)) + len(f.checks(op.Name)); n != 0 {
			return fmt.Errorf("%d tasks and checks", n)
		}
		return nil
	})
}

// In DryRun a command gate's script is not run: the gate passes saying where it would have run.
func TestCommandGateInDryRunRunsNothing(t *testing.T) {
	f := newFixture(t)
	nodes := f.nodes(nil, "n1")
	op := f.operation("cmddry", func(o *v1alpha1.NodeOperation) {
		o.Spec.ExecutionMode = v1alpha1.ExecutionDryRun
	}, v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{script("a")},
		Scheduling: v1alpha1.Scheduling{Gates: []v1alpha1.Gate{commandGate("resync", "", 120)}}})
	f.runAll(f.taskIn(op.Name, "g").Name)
	got := f.waitPhase(op.Name, v1alpha1.OperationSucceeded)
	if g := gateOf(got, "g", "resync"); g == nil || g.State != v1alpha1.GatePassed || g.Message != "dry run: command gate would run on "+nodes[0] {
		t.Errorf("status.gates: %+v", got.Status.Gates)
	}
	if c := f.checks(op.Name); len(c) != 0 {
		t.Errorf("a dry run created check %s", c[0].Name)
	}
}

// A failed gate check frees its node (its failure is the gate's answer), but a failed task of an
// operation, one script command, that a person labelled as a gate check still holds its node
// until a person acts (rules 1 and 3): labels and owners make nothing a check, only the immutable
// spec.gateCheck the manager sets (v1alpha1.IsGateCheck).
func TestSafetyRule1_AHandLabelledGateCheckStillHoldsItsNode(t *testing.T) {
	f := newFixture(t)
	node := f.nodes(nil, "n1")[0]
	fake := &v1alpha1.NodeTask{
		ObjectMeta: metav1.ObjectMeta{Name: f.id + "-fake-check", Labels: map[string]string{v1alpha1.LabelGateCheck: "resync"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "NodeOperation",
				Name: f.id + "-gone", UID: "0b5e3c1e-0000-4000-8000-000000000001", Controller: ptr.To(true)}}},
		Spec: v1alpha1.NodeTaskSpec{NodeName: node, Commands: []v1alpha1.Command{{Script: &v1alpha1.ScriptCommand{Inline: "true"}}}},
	}
	f.must(f.c.Create(f.ctx, fake))
	testutil.RemoveAtEnd(t, f.c, fake.DeepCopy())
	f.failCheck(fake.Name, 1, "")
	op := f.operation("held", nil, v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{script("a")}})
	got := f.waitPhase(op.Name, v1alpha1.OperationBlocked)
	if c := condition(got, v1alpha1.ConditionBlocked); c.Reason != v1alpha1.ReasonNodeHeldByFailedTask || !strings.Contains(c.Message, fake.Name) {
		t.Fatalf("Blocked: %+v", c)
	}
	if n := len(f.tasks(op.Name)); n != 0 {
		t.Fatalf("%d tasks on a node a failed task holds", n)
	}
}
