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
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/objname"
	"github.com/nodeops/nodeops/internal/plan"
	"github.com/nodeops/nodeops/internal/testutil"
)

// Groups run strictly in order, and within a group unfinished-or-failed tasks never exceed
// maxUnavailable, whatever order the agent finishes tasks in.
func TestGroupsRunInOrderUnderMaxUnavailable(t *testing.T) {
	for seed := range uint64(3) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			f := newFixture(t)
			rng := rand.New(rand.NewPCG(seed, 7))
			f.nodes(map[string]string{"pool": "a"}, "a1", "a2", "a3", "a4")
			f.nodes(map[string]string{"pool": "b"}, "b1", "b2", "b3", "b4")
			type limit struct {
				size, max int
			}
			limits := map[string]limit{"pool-a": {4, 2}, "all": {8, 4}, "tail": {7, 3}}
			order := []string{"pool-a", "all", "tail"}
			op := f.operation("order", nil,
				v1alpha1.Group{Name: "pool-a", NodeSelector: f.selector(map[string]string{"pool": "a"}), MaxUnavailable: intOrStr("2"), Commands: []v1alpha1.Command{waitCmd()}},
				v1alpha1.Group{Name: "all", MaxUnavailable: intOrStr("50%"), Commands: []v1alpha1.Command{script("one"), script("two")}},
				v1alpha1.Group{Name: "tail", NodeFilter: v1alpha1.NodeFilterTail, MaxUnavailable: intOrStr("3"), Commands: []v1alpha1.Command{waitCmd()}},
			)
			step := 0
			checked := func() ([]v1alpha1.NodeTask, error) {
				if step > 500 {
					t.Fatal("no end after 500 steps")
				}
				step++
				tasks := f.tasks(op.Name)
				byGroup := map[string][]v1alpha1.NodeTask{}
				for _, task := range tasks {
					byGroup[task.Spec.Group] = append(byGroup[task.Spec.Group], task)
				}
				for gi, g := range order {
					busy := 0
					for _, task := range byGroup[g] {
						if task.EffectivePhase().Unfinished() {
							busy++
						}
					}
					if busy > limits[g].max {
						t.Fatalf("group %s: %d unfinished tasks, maxUnavailable %d", g, busy, limits[g].max)
					}
					if gi > 0 && len(byGroup[g]) > 0 {
						prev := byGroup[order[gi-1]]
						if len(prev) != limits[order[gi-1]].size {
							t.Fatalf("group %s started with %d of %d tasks of group %s created", g, len(prev), limits[order[gi-1]].size, order[gi-1])
						}
						for _, p := range prev {
							if p.EffectivePhase() != v1alpha1.TaskSucceeded {
								t.Fatalf("group %s started while task %s of group %s is %s", g, p.Name, order[gi-1], p.EffectivePhase())
							}
						}
					}
				}
				return tasks, nil
			}
			// Advance one random task by one agent write, polling while the manager has not
			// created the next tasks yet.
			f.must(f.agent().Play(f.ctx, rng, testutil.Play{Tasks: checked, Done: func(open []v1alpha1.NodeTask) bool {
				return len(open) == 0 && f.get(op.Name).Status.Phase == v1alpha1.OperationSucceeded
			}}))
			done := f.waitPhase(op.Name, v1alpha1.OperationSucceeded)
			if got := len(f.tasks(op.Name)); got != 4+8+7 {
				t.Fatalf("%d tasks, want 19", got)
			}
			if done.Status.Progress != "19/19 nodes" {
				t.Errorf("progress %q", done.Status.Progress)
			}
			for i, g := range done.Status.Groups {
				if g.Name != order[i] || g.Phase != v1alpha1.GroupSucceeded || int(g.Nodes.Succeeded) != limits[g.Name].size || int(g.Nodes.Total) != limits[g.Name].size {
					t.Errorf("group status %+v", g)
				}
			}
			for _, ct := range []string{v1alpha1.ConditionSucceeded, v1alpha1.ConditionProgressing, v1alpha1.ConditionBlocked, v1alpha1.ConditionFailed} {
				c := condition(done, ct)
				if c.Reason == "" {
					t.Errorf("condition %s has no reason: %+v", ct, c)
				}
			}
			if c := condition(done, v1alpha1.ConditionSucceeded); c.Status != metav1.ConditionTrue {
				t.Errorf("Succeeded condition %+v", c)
			}
			if done.Status.StartTime == nil || done.Status.CompletionTime == nil || done.Status.ObservedGeneration != done.Generation {
				t.Errorf("times and observedGeneration: %+v", done.Status)
			}
		})
	}
}

// A failed task blocks the operation and no further task starts; Retry and Skip each unblock it; abort stops it.
func TestSafetyRule3_FailureBlocksRetrySkipAbort(t *testing.T) {
	f := newFixture(t)
	nodes := f.nodes(nil, "n1", "n2", "n3")
	op := f.operation("recover", nil, v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{script("first"), script("second")}})
	t1 := objname.TaskName(op.Name, "g", nodes[0])
	f.waitTasks(op.Name, 1)

	f.begin(t1, 0)
	f.end(t1, 0, false, "exit status 3")
	blocked := f.waitPhase(op.Name, v1alpha1.OperationBlocked)
	c := condition(blocked, v1alpha1.ConditionBlocked)
	if c.Status != metav1.ConditionTrue || c.Reason != nodeoperationReasonTaskFailed || !strings.Contains(c.Message, nodes[0]) || !strings.Contains(c.Message, "first") {
		t.Fatalf("Blocked condition must name the node and the command: %+v", c)
	}
	if g := blocked.Status.Groups[0]; g.Phase != v1alpha1.GroupBlocked || g.Nodes.Failed != 1 {
		t.Fatalf("group %+v", g)
	}
	if n := len(f.tasks(op.Name)); n != 1 {
		t.Fatalf("%d tasks while blocked", n)
	}

	// Retry: the same command runs again.
	setRecovery(f, t1, v1alpha1.RecoveryRetry)
	testutil.Eventually(t, 20*time.Second, "retry recorded", func() error {
		task := f.task(t1)
		if task.Spec.RecoveryMode != "" || task.EffectivePhase() != v1alpha1.TaskPending || task.Status.Commands[0].Phase != v1alpha1.CommandPending || task.Status.Attempt != 2 {
			return fmt.Errorf("task %+v / %+v", task.Spec, task.Status)
		}
		return nil
	})
	f.waitPhase(op.Name, v1alpha1.OperationRunning)
	f.begin(t1, 0)
	if got := f.task(t1).Status.Commands[0].Attempt; got != 2 {
		t.Fatalf("command attempt %d after retry, want 2", got)
	}
	f.end(t1, 0, true, "ok")
	f.end(t1, 1, false, "exit status 1")
	f.waitPhase(op.Name, v1alpha1.OperationBlocked)
	if n := len(f.tasks(op.Name)); n != 1 {
		t.Fatalf("%d tasks while blocked", n)
	}

	// Skip the last command: the task succeeds and the group goes on.
	setRecovery(f, t1, v1alpha1.RecoverySkip)
	tasks := f.waitTasks(op.Name, 2)
	task := f.task(t1)
	if task.EffectivePhase() != v1alpha1.TaskSucceeded || task.Status.Commands[1].Phase != v1alpha1.CommandSkipped || task.Spec.RecoveryMode != "" {
		t.Fatalf("after skip: %+v / %+v", task.Spec, task.Status)
	}
	t2 := objname.TaskName(op.Name, "g", nodes[1])
	if tasks[0].Name != t2 && tasks[1].Name != t2 {
		t.Fatalf("the next task is not on %s: %v, %v", nodes[1], tasks[0].Name, tasks[1].Name)
	}

	// Skip a command that is not the last: the task goes on at the next one.
	f.begin(t2, 0)
	f.end(t2, 0, false, "boom")
	f.waitPhase(op.Name, v1alpha1.OperationBlocked)
	setRecovery(f, t2, v1alpha1.RecoverySkip)
	testutil.Eventually(t, 20*time.Second, "skip recorded", func() error {
		task := f.task(t2)
		if task.EffectivePhase() != v1alpha1.TaskPending || task.Status.CurrentCommand != 1 || task.Status.Commands[0].Phase != v1alpha1.CommandSkipped {
			return fmt.Errorf("task status %+v", task.Status)
		}
		return nil
	})
	f.waitPhase(op.Name, v1alpha1.OperationRunning)
	f.begin(t2, 1)
	f.end(t2, 1, false, "boom again")
	f.waitPhase(op.Name, v1alpha1.OperationBlocked)

	// Abort: the failed task is told to abort, nothing new starts, the operation ends Aborted.
	f.update(op.Name, func(o *v1alpha1.NodeOperation) { o.Spec.Abort = true })
	aborted := f.waitPhase(op.Name, v1alpha1.OperationAborted)
	// The controller writes the operation's status before it acts on its tasks (the skeleton's
	// order, docs/architecture.md), so the mirrored abort may land just after the phase.
	testutil.Eventually(t, 20*time.Second, "abort mirrored onto the failed task", func() error {
		if !f.task(t2).Spec.Abort {
			return fmt.Errorf("task %s spec.abort is false", t2)
		}
		return nil
	})
	if n := len(f.tasks(op.Name)); n != 2 {
		t.Fatalf("%d tasks after abort, want 2", n)
	}
	if aborted.Status.Groups[0].Phase != v1alpha1.GroupAborted || aborted.Status.CompletionTime == nil {
		t.Errorf("after abort: %+v", aborted.Status)
	}
	if c := condition(aborted, v1alpha1.ConditionProgressing); c.Status != metav1.ConditionFalse || c.Reason != "Aborted" {
		t.Errorf("Progressing after abort: %+v", c)
	}
	_ = nodes[2]
}

const nodeoperationReasonTaskFailed = "TaskFailed"

// setKubeadmVersion writes kube-system/kubeadm-config as kubeadm does, with the given version.
func setKubeadmVersion(f *fixture, version string) {
	f.t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kubeadm-config"}}
	_, err := controllerutil.CreateOrUpdate(f.ctx, f.c, cm, func() error {
		cm.Data = map[string]string{"ClusterConfiguration": "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\nkubernetesVersion: " + version + "\n"}
		return nil
	})
	if err != nil {
		f.t.Fatalf("write kubeadm-config: %v", err)
	}
}

func setRecovery(f *fixture, task string, mode v1alpha1.RecoveryMode) {
	f.t.Helper()
	var t v1alpha1.NodeTask
	if err := f.c.Get(f.ctx, client.ObjectKey{Name: task}, &t); err != nil {
		f.t.Fatal(err)
	}
	orig := t.DeepCopy()
	t.Spec.RecoveryMode = mode
	if err := f.c.Patch(f.ctx, &t, client.MergeFrom(orig)); err != nil {
		f.t.Fatalf("set recoveryMode: %v", err)
	}
	// The agent acts on the request (it alone writes command results); the manager then clears it.
	f.must(f.agent().Recover(f.ctx, task))
}

// Abort lets running commands finish: the operation is Aborted only once nothing runs.
func TestAbortWaitsForRunningTasks(t *testing.T) {
	f := newFixture(t)
	f.nodes(nil, "n1", "n2", "n3")
	op := f.operation("abort", func(o *v1alpha1.NodeOperation) { o.Spec.MaxUnavailable = intOrStr("2") },
		v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{waitCmd()}})
	tasks := f.waitTasks(op.Name, 2)
	f.begin(tasks[0].Name, 0)
	f.update(op.Name, func(o *v1alpha1.NodeOperation) { o.Spec.Abort = true })
	testutil.Eventually(t, 20*time.Second, "abort mirrored", func() error {
		for _, task := range f.tasks(op.Name) {
			if !task.Spec.Abort {
				return fmt.Errorf("task %s not told to abort", task.Name)
			}
		}
		op := f.get(op.Name)
		if c := condition(op, v1alpha1.ConditionProgressing); c.Reason != "Aborting" || op.Status.Phase != v1alpha1.OperationRunning {
			return fmt.Errorf("phase %s, Progressing %+v", op.Status.Phase, c)
		}
		return nil
	})
	f.end(tasks[0].Name, 0, true, "ok")
	f.abortTask(tasks[1].Name)
	done := f.waitPhase(op.Name, v1alpha1.OperationAborted)
	if n := len(f.tasks(op.Name)); n != 2 {
		t.Fatalf("%d tasks after abort", n)
	}
	// The pending task told to abort never ran: the operation may end before the agent marks it Aborted.
	if g := done.Status.Groups[0]; g.Nodes.Succeeded != 1 || g.Nodes.Aborted+g.Nodes.Pending != 2 || g.Nodes.Running != 0 {
		t.Errorf("counts after abort: %+v", g.Nodes)
	}
}

// Paused: no task starts while paused; paused is mirrored onto running tasks and lifted again.
func TestPaused(t *testing.T) {
	f := newFixture(t)
	f.nodes(nil, "n1", "n2")
	op := f.operation("paused", func(o *v1alpha1.NodeOperation) { o.Spec.Paused = true },
		v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{script("a"), script("b")}})
	paused := f.waitPhase(op.Name, v1alpha1.OperationPaused)
	if c := condition(paused, v1alpha1.ConditionProgressing); c.Status != metav1.ConditionFalse || c.Reason != "Paused" {
		t.Errorf("Progressing while paused: %+v", c)
	}
	if n := len(f.tasks(op.Name)); n != 0 {
		t.Fatalf("%d tasks created while paused", n)
	}
	f.update(op.Name, func(o *v1alpha1.NodeOperation) { o.Spec.Paused = false })
	tasks := f.waitTasks(op.Name, 1)
	f.begin(tasks[0].Name, 0)
	f.update(op.Name, func(o *v1alpha1.NodeOperation) { o.Spec.Paused = true })
	f.waitPhase(op.Name, v1alpha1.OperationPaused)
	testutil.Eventually(t, 20*time.Second, "paused mirrored", func() error {
		if !f.task(tasks[0].Name).Spec.Paused {
			return fmt.Errorf("task not paused")
		}
		return nil
	})
	f.end(tasks[0].Name, 0, true, "ok")
	f.update(op.Name, func(o *v1alpha1.NodeOperation) { o.Spec.Paused = false })
	testutil.Eventually(t, 20*time.Second, "unpause mirrored", func() error {
		if f.task(tasks[0].Name).Spec.Paused {
			return fmt.Errorf("task still paused")
		}
		return nil
	})
	f.end(tasks[0].Name, 1, true, "ok")
	f.runAll(f.waitTasks(op.Name, 2)[1].Name)
	f.waitPhase(op.Name, v1alpha1.OperationSucceeded)
}

// DryRun and Controlled are carried to tasks; Controlled -> Auto is mirrored.
func TestExecutionModes(t *testing.T) {
	f := newFixture(t)
	f.nodes(nil, "n1")
	dry := f.operation("dry", func(o *v1alpha1.NodeOperation) { o.Spec.ExecutionMode = v1alpha1.ExecutionDryRun },
		v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{waitCmd()}})
	task := f.waitTasks(dry.Name, 1)[0]
	if task.Spec.ExecutionMode != v1alpha1.ExecutionDryRun {
		t.Fatalf("DryRun task has mode %q", task.Spec.ExecutionMode)
	}
	f.runAll(task.Name)
	f.waitPhase(dry.Name, v1alpha1.OperationSucceeded)

	ctl := f.operation("controlled", func(o *v1alpha1.NodeOperation) { o.Spec.ExecutionMode = v1alpha1.ExecutionControlled },
		v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{waitCmd()}})
	task = f.waitTasks(ctl.Name, 1)[0]
	if task.Spec.ExecutionMode != v1alpha1.ExecutionControlled || task.Spec.ApprovedCommands != 0 {
		t.Fatalf("Controlled task: %+v", task.Spec)
	}
	f.update(ctl.Name, func(o *v1alpha1.NodeOperation) { o.Spec.ExecutionMode = v1alpha1.ExecutionAuto })
	testutil.Eventually(t, 20*time.Second, "Auto mirrored", func() error {
		if m := f.task(task.Name).Spec.ExecutionMode; m != v1alpha1.ExecutionAuto {
			return fmt.Errorf("mode %s", m)
		}
		return nil
	})
}

// A group that matches no node succeeds with 0 nodes and says so; the next group runs.
func TestEmptyGroupSucceeds(t *testing.T) {
	f := newFixture(t)
	f.nodes(nil, "n1")
	op := f.operation("empty", nil,
		v1alpha1.Group{Name: "nobody", NodeSelector: f.selector(map[string]string{"role": "none"}), Commands: []v1alpha1.Command{waitCmd()}},
		v1alpha1.Group{Name: "everybody", Commands: []v1alpha1.Command{waitCmd()}})
	f.runAll(f.waitTasks(op.Name, 1)[0].Name)
	done := f.waitPhase(op.Name, v1alpha1.OperationSucceeded)
	g := done.Status.Groups[0]
	if g.Phase != v1alpha1.GroupSucceeded || g.Nodes.Total != 0 || !strings.Contains(g.Message, "no node matched") {
		t.Fatalf("empty group: %+v", g)
	}
	if done.Status.Progress != "1/1 nodes" {
		t.Errorf("progress %q", done.Status.Progress)
	}
}

// A NotReady node counts against maxUnavailable and gets no task until it is Ready.
func TestSafetyRule2_NotReadyNodeWaits(t *testing.T) {
	f := newFixture(t)
	nodes := append(f.nodesReady(false, nil, "n1"), f.nodes(nil, "n2")...)
	op := f.operation("notready", func(o *v1alpha1.NodeOperation) { o.Spec.MaxUnavailable = intOrStr("2") },
		v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{waitCmd()}})
	tasks := f.waitTasks(op.Name, 1)
	if tasks[0].Spec.NodeName != nodes[1] {
		t.Fatalf("task on %s, want the Ready node %s", tasks[0].Spec.NodeName, nodes[1])
	}
	f.runAll(tasks[0].Name)
	testutil.Eventually(t, 20*time.Second, "waiting for NotReady node reported", func() error {
		op := f.get(op.Name)
		if len(op.Status.Groups) == 0 || !strings.Contains(op.Status.Groups[0].Message, "NotReady nodes "+nodes[0]) {
			return fmt.Errorf("group status %+v", op.Status.Groups)
		}
		return nil
	})
	f.setReady(nodes[0], true)
	f.runAll(f.waitTasks(op.Name, 2)[0].Name)
	f.waitPhase(op.Name, v1alpha1.OperationSucceeded)
}

// An upgrade that skips a minor version fails at once, before any task, naming both versions.
func TestUpgradeVersionPolicy(t *testing.T) {
	f := newFixture(t)
	f.nodes(map[string]string{plan.LabelControlPlane: ""}, "cp1", "cp2")
	setKubeadmVersion(f, "v1.35.4")
	upgrade := func(name string) *v1alpha1.NodeOperation {
		op := &v1alpha1.NodeOperation{
			ObjectMeta: metav1.ObjectMeta{Name: f.id + "-" + name},
			Spec: v1alpha1.NodeOperationSpec{NodeSelector: f.selector(nil), Upgrade: &v1alpha1.UpgradeOperation{
				KubernetesVersion: "v1.37.2", BinarySource: &v1alpha1.BinarySource{BaseURL: "https://binaries.local"}}},
		}
		if err := f.c.Create(f.ctx, op); err != nil {
			t.Fatalf("create upgrade: %v", err)
		}
		return op
	}
	refused := upgrade("skip")
	failed := f.waitPhase(refused.Name, v1alpha1.OperationFailed)
	c := condition(failed, v1alpha1.ConditionFailed)
	if c.Status != metav1.ConditionTrue || c.Reason != plan.ReasonUnsupportedVersionSkew || !strings.Contains(c.Message, "v1.35.4") || !strings.Contains(c.Message, "v1.37.2") {
		t.Fatalf("Failed condition: %+v", c)
	}
	if n := len(f.tasks(refused.Name)); n != 0 {
		t.Fatalf("%d tasks for a refused upgrade", n)
	}

	setKubeadmVersion(f, "v1.36.3")
	ok := upgrade("ok")
	// An accepted upgrade starts with every node's preflight.
	for _, task := range f.waitTasks(ok.Name, 2) {
		if task.Spec.Group != plan.GroupPreflight || task.Spec.Commands[0].Preflight == nil {
			t.Fatalf("first upgrade task: %+v", task.Spec)
		}
	}
	f.update(ok.Name, func(o *v1alpha1.NodeOperation) { o.Spec.Abort = true })
	f.waitPhase(ok.Name, v1alpha1.OperationAborted)
}

// ttlSecondsAfterFinished deletes the operation and its tasks; without it nothing is deleted.
func TestSafetyRule7_TTLAfterFinished(t *testing.T) {
	f := newFixture(t)
	f.nodes(nil, "n1")
	keep := f.operation("keep", nil, v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{waitCmd()}})
	f.runAll(f.waitTasks(keep.Name, 1)[0].Name)
	f.waitPhase(keep.Name, v1alpha1.OperationSucceeded)
	ttl := int32(1)
	gone := f.operation("gone", func(o *v1alpha1.NodeOperation) { o.Spec.TTLSecondsAfterFinished = &ttl },
		v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{waitCmd()}})
	f.runAll(f.waitTasks(gone.Name, 1)[0].Name)
	testutil.Eventually(t, 30*time.Second, "expired operation deleted", func() error {
		var op v1alpha1.NodeOperation
		if err := f.c.Get(f.ctx, client.ObjectKey{Name: gone.Name}, &op); err == nil {
			return fmt.Errorf("still there, phase %s", op.Status.Phase)
		}
		if n := len(f.tasks(gone.Name)); n != 0 {
			return fmt.Errorf("%d tasks left", n)
		}
		return nil
	})
	if f.get(keep.Name).Status.Phase != v1alpha1.OperationSucceeded || len(f.tasks(keep.Name)) != 1 {
		t.Fatal("an operation without ttlSecondsAfterFinished lost something")
	}
}

// Events tell the story of an operation.
func TestEvents(t *testing.T) {
	f := newFixture(t)
	f.nodes(nil, "n1")
	op := f.operation("events", nil, v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{waitCmd()}})
	f.runAll(f.waitTasks(op.Name, 1)[0].Name)
	f.waitPhase(op.Name, v1alpha1.OperationSucceeded)
	testutil.Eventually(t, 20*time.Second, "events recorded", func() error {
		var list eventsv1.EventList
		if err := f.c.List(f.ctx, &list); err != nil {
			return err
		}
		seen := map[string]bool{}
		for _, e := range list.Items {
			if e.Regarding.Name == op.Name && e.Regarding.Kind == "NodeOperation" {
				seen[e.Reason] = true
			}
		}
		for _, want := range []string{"Started", "GroupStarted", "GroupSucceeded", "Succeeded"} {
			if !seen[want] {
				return fmt.Errorf("no %s event; have %v", want, seen)
			}
		}
		return nil
	})
}

// A one-command task costs at most 4 API writes per node, everything counted: here the manager
// spends one create per node and a handful of status writes and events per operation. The writes
// are the API server's own count, and the controller's clock is held, so that the status
// throttle's windows open only when the test moves it: the figures hold however slowly anything runs.
func TestWriteBudget(t *testing.T) { writeBudget(t, newFixture(t), nil) }

// Gates read, they never write per check: with gates that pass at once the writes per node and
// the status writes are those of an operation without gates.
func TestWriteBudgetWithGatesThatPass(t *testing.T) {
	f := newFixture(t)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: f.id + "-ready"}, Data: map[string]string{"ready": "true"}}
	f.must(f.c.Create(f.ctx, cm))
	writeBudget(t, f, func(o *v1alpha1.NodeOperation) {
		o.Annotations = map[string]string{v1alpha1.AnnotationApproveGatePrefix + "approved": "true"}
		o.Spec.Gates = []v1alpha1.Gate{
			{Name: "approved", Approval: &v1alpha1.ApprovalGate{}},
			{Name: "ready", CEL: &v1alpha1.CELGate{APIVersion: "v1", Kind: "ConfigMap", Namespace: "default", Name: cm.Name, Expression: "self.data.ready == 'true'"}},
		}
	})
}

func writeBudget(t *testing.T, f *fixture, mutate func(*v1alpha1.NodeOperation)) {
	const n, windows = 60, 6
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("n%02d", i)
	}
	f.nodes(nil, names...)
	clock.hold(t)
	name := f.id + "-budget"
	states := f.watchStates(name)
	before := f.apiServerWrites()
	createsBefore := managerWrites.taskCreates.Load()
	op := f.operation("budget", func(o *v1alpha1.NodeOperation) {
		o.Spec.MaxUnavailable = intOrStr("100%")
		if mutate != nil {
			mutate(o)
		}
	}, v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{waitCmd()}})
	for i, task := range f.waitTasks(op.Name, n) {
		f.begin(task.Name, 0)
		f.end(task.Name, 0, true, "ok")
		// Every tenth task a status window opens: one count-only write may follow, never more.
		if (i+1)%(n/windows) == 0 {
			clock.advance(statusInterval)
		}
	}
	f.waitPhase(op.Name, v1alpha1.OperationSucceeded)
	// The last event is written after the status that caused it.
	f.waitEvent(op.Name, "Succeeded")
	writes := f.apiServerWrites().Sub(before)
	creates := managerWrites.taskCreates.Load() - createsBefore
	status, seen := managerWrites.statusWrites(op.Name), states()
	perNode := float64(writes.Done) / n
	t.Logf("%d nodes: %d writes by everyone (%d refused besides, conflicts): %.2f per node; %d task creates; %d status writes for %d states a watcher saw and %d windows",
		n, writes.Done, writes.Refused, perNode, creates, status, len(seen), windows)
	if creates != n {
		t.Errorf("%d task creates for %d nodes", creates, n)
	}
	if perNode > 4 {
		t.Errorf("%.2f writes per node, budget 4", perNode)
	}
	// Status is batched: one write per state a watcher must see at once (a phase, a condition)
	// and at most one per window for counts that moved.
	if status > len(seen)+windows {
		t.Errorf("%d status writes for %d states (%v) and %d windows: status is not batched", status, len(seen), seen, windows)
	}
}

// apiServerWrites is the API server's count of the writes it answered.
func (f *fixture) apiServerWrites() testutil.Writes {
	f.t.Helper()
	w, err := testutil.APIServerWrites(f.ctx, env.Config)
	f.must(err)
	return w
}

// watchStates watches operation name from now until the test ends and returns what reports the
// distinct states its status writes made, a state being what a watcher must see at once: the phase,
// each group's phase, each condition's status and reason. A watch the API server closes is resumed
// from the last version seen.
func (f *fixture) watchStates(name string) func() []string {
	f.t.Helper()
	var mu sync.Mutex
	// The states after the created one, each of which some status write made.
	var states []string
	last := stateOf(&v1alpha1.NodeOperationStatus{})
	var lost error
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan struct{})
	f.t.Cleanup(func() { cancel(); <-done })
	started := make(chan error, 1)
	go func() {
		defer close(done)
		rv := ""
		for ctx.Err() == nil {
			opts := []client.ListOption{client.MatchingFields{"metadata.name": name}}
			if rv != "" {
				opts = append(opts, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
			}
			w, err := f.c.Watch(ctx, &v1alpha1.NodeOperationList{}, opts...)
			if rv == "" {
				started <- err
			}
			if err != nil {
				if rv == "" || ctx.Err() != nil {
					return
				}
				mu.Lock()
				lost = err
				mu.Unlock()
				return
			}
			for ev := range w.ResultChan() {
				op, ok := ev.Object.(*v1alpha1.NodeOperation)
				if !ok {
					continue
				}
				rv = op.ResourceVersion
				st := stateOf(&op.Status)
				mu.Lock()
				if st != last {
					states, last = append(states, st), st
				}
				mu.Unlock()
			}
			w.Stop()
			if rv == "" {
				rv = "0"
			}
		}
	}()
	f.must(<-started)
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		if lost != nil {
			f.t.Fatalf("watch of %s lost: %v", name, lost)
		}
		return append([]string(nil), states...)
	}
}

// stateOf is what of an operation's status a watcher must see at once.
func stateOf(st *v1alpha1.NodeOperationStatus) string {
	parts := []string{string(st.Phase)}
	for _, g := range st.Groups {
		parts = append(parts, g.Name+"="+string(g.Phase))
	}
	for _, c := range st.Conditions {
		parts = append(parts, c.Type+"="+string(c.Status)+"/"+c.Reason)
	}
	return strings.Join(parts, " ")
}

func (f *fixture) waitEvent(op, reason string) {
	testutil.Eventually(f.t, 20*time.Second, "event "+reason, func() error {
		var list eventsv1.EventList
		if err := f.c.List(f.ctx, &list); err != nil {
			return err
		}
		for _, e := range list.Items {
			if e.Regarding.Name == op && e.Reason == reason {
				return nil
			}
		}
		return fmt.Errorf("no %s event", reason)
	})
}
