package nodelock

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

func task(name, node string, phase v1alpha1.TaskPhase, abort bool) *v1alpha1.NodeTask {
	return &v1alpha1.NodeTask{
		ObjectMeta: metav1.ObjectMeta{Name: name, OwnerReferences: []metav1.OwnerReference{
			{Kind: "NodeOperation", Name: "op-" + name, Controller: ptr.To(true)}}},
		Spec:   v1alpha1.NodeTaskSpec{NodeName: node, Abort: abort},
		Status: v1alpha1.NodeTaskStatus{Phase: phase},
	}
}

func TestHolds(t *testing.T) {
	tests := []struct {
		phase v1alpha1.TaskPhase
		abort bool
		want  bool
	}{
		{"", false, true}, {v1alpha1.TaskPending, false, true}, {v1alpha1.TaskRunning, false, true},
		{v1alpha1.TaskFailed, false, true}, {v1alpha1.TaskSucceeded, false, false}, {v1alpha1.TaskAborted, false, false},
		{"", true, false}, {v1alpha1.TaskPending, true, false}, {v1alpha1.TaskFailed, true, false},
		{v1alpha1.TaskRunning, true, true}, {v1alpha1.TaskAborted, true, false},
	}
	for _, tt := range tests {
		if got := Holds(task("t", "n", tt.phase, tt.abort)); got != tt.want {
			t.Errorf("Holds(phase %q, abort %v) = %v, want %v", tt.phase, tt.abort, got, tt.want)
		}
	}
}

// A gate check its agent recorded failed frees its node; anything short of one (the label without
// spec.gateCheck, spec.gateCheck on a task of no operation or profile, on a task of more
// than one script command, a check only the manager marked lost) fails and holds as any task (rules 1 and 3).
func TestSafetyRule1_OnlyARealGateCheckFreesItsNodeWhenItFails(t *testing.T) {
	check := func(mutate func(*v1alpha1.NodeTask)) *v1alpha1.NodeTask {
		tk := &v1alpha1.NodeTask{
			ObjectMeta: metav1.ObjectMeta{Name: "c", Labels: map[string]string{v1alpha1.LabelGateCheck: "resync"},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "NodeOperation", Name: "op", Controller: ptr.To(true)}}},
			Spec:   v1alpha1.NodeTaskSpec{NodeName: "n", GateCheck: "resync", Commands: []v1alpha1.Command{{Script: &v1alpha1.ScriptCommand{Inline: "true"}}}},
			Status: v1alpha1.NodeTaskStatus{Phase: v1alpha1.TaskFailed},
		}
		if mutate != nil {
			mutate(tk)
		}
		return tk
	}
	for _, tc := range []struct {
		name   string
		mutate func(*v1alpha1.NodeTask)
		holds  bool
	}{
		{"a failed gate check", nil, false},
		{"a running gate check", func(t *v1alpha1.NodeTask) { t.Status.Phase = v1alpha1.TaskRunning }, true},
		{"no owner", func(t *v1alpha1.NodeTask) { t.OwnerReferences = nil }, true},
		{"the label without spec.gateCheck", func(t *v1alpha1.NodeTask) { t.Spec.GateCheck = "" }, true},
		{"a running check the manager marked lost", func(t *v1alpha1.NodeTask) {
			t.Status.Phase = v1alpha1.TaskRunning
			t.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionAgentLost, Status: metav1.ConditionTrue}}
		}, true},
		{"a profile's failed gate check", func(t *v1alpha1.NodeTask) { t.OwnerReferences[0].Kind = "NodeProfile" }, false},
		{"spec.gateCheck on a task of another kind", func(t *v1alpha1.NodeTask) { t.OwnerReferences[0].Kind = "ClusterTarget" }, true},
		{"an owner that is not the controller", func(t *v1alpha1.NodeTask) { t.OwnerReferences[0].Controller = nil }, true},
		{"two commands", func(t *v1alpha1.NodeTask) {
			t.Spec.Commands = append(t.Spec.Commands, v1alpha1.Command{Cordon: &v1alpha1.CordonCommand{}})
		}, true},
		{"one command that is no script", func(t *v1alpha1.NodeTask) {
			t.Spec.Commands = []v1alpha1.Command{{Cordon: &v1alpha1.CordonCommand{}}}
		}, true},
		{"no label: spec.gateCheck decides", func(t *v1alpha1.NodeTask) { t.Labels = nil }, false},
	} {
		if got := Holds(check(tc.mutate)); got != tc.holds {
			t.Errorf("%s: Holds = %v, want %v", tc.name, got, tc.holds)
		}
	}
}

func TestAcquireWaitsForHolder(t *testing.T) {
	tb := New()
	if _, ok := tb.TryAcquire("n1", "a-g-n1", OperationOwner("a")); !ok {
		t.Fatal("free node not acquired")
	}
	if _, ok := tb.TryAcquire("n1", "a-g-n1", OperationOwner("a")); !ok {
		t.Fatal("re-acquiring one's own node must succeed")
	}
	h, ok := tb.TryAcquire("n1", "b-g-n1", ProfileOwner("b"))
	if ok || h.Task != "a-g-n1" || h.Owner != "NodeOperation/a" {
		t.Fatalf("second task got the node: ok=%v holder=%v", ok, h)
	}
	if h.String() != "NodeTask a-g-n1 of NodeOperation/a" {
		t.Errorf("holder reads %q", h)
	}
	if _, ok := tb.TryAcquire("n2", "b-g-n2", ProfileOwner("b")); !ok {
		t.Fatal("another node is free")
	}
}

// The cache lags: it delivers old news about other tasks and about the reserved task itself.
// Only news that the holding task itself stopped holding frees the node.
func TestSafetyRule1_StaleCacheNeverFreesAReservation(t *testing.T) {
	tb := New()
	tb.TryAcquire("n1", "new", "NodeOperation/b")
	tb.Observe(task("old", "n1", v1alpha1.TaskSucceeded, false))  // an older task on the node finished
	tb.Forget(task("older", "n1", v1alpha1.TaskSucceeded, false)) // and another was deleted
	if _, ok := tb.TryAcquire("n1", "other", "NodeOperation/c"); ok {
		t.Fatal("a stale cache event freed a reserved node")
	}
	tb.Observe(task("new", "n1", v1alpha1.TaskPending, false))
	tb.Observe(task("new", "n1", v1alpha1.TaskRunning, false))
	if !tb.Held("new") {
		t.Fatal("running task does not hold")
	}
	tb.Release("n1", "new") // a seen task is not released by a controller
	if _, ok := tb.TryAcquire("n1", "other", "NodeOperation/c"); ok {
		t.Fatal("Release dropped a task the cache has seen")
	}
	tb.Observe(task("new", "n1", v1alpha1.TaskSucceeded, false))
	if _, ok := tb.TryAcquire("n1", "other", "NodeOperation/c"); !ok {
		t.Fatal("node not freed when its task succeeded")
	}
}

func TestReleaseAfterFailedCreate(t *testing.T) {
	tb := New()
	tb.TryAcquire("n1", "a", "NodeOperation/a")
	tb.Release("n1", "a")
	if _, ok := tb.Holder("n1"); ok {
		t.Fatal("reservation survived its release")
	}
}

func TestSeededFromCacheAndFailedTasksHold(t *testing.T) {
	tb := New()
	tb.Observe(task("failed", "n1", v1alpha1.TaskFailed, false))
	tb.Observe(task("aborting", "n2", v1alpha1.TaskPending, true))
	tb.Observe(task("aborting-running", "n3", v1alpha1.TaskRunning, true))
	if h, ok := tb.TryAcquire("n1", "x", ""); ok || h.Task != "failed" || h.Owner != "NodeOperation/op-failed" {
		t.Fatalf("failed task must hold its node until recovered: %v %v", h, ok)
	}
	if _, ok := tb.TryAcquire("n2", "y", ""); !ok {
		t.Fatal("a pending task told to abort does not hold")
	}
	if _, ok := tb.TryAcquire("n3", "z", ""); ok {
		t.Fatal("a running task told to abort still holds until it stops")
	}
	tb.forget(toolscache.DeletedFinalStateUnknown{Key: "aborting-running", Obj: task("aborting-running", "n3", v1alpha1.TaskRunning, true)})
	if _, ok := tb.TryAcquire("n3", "z", ""); !ok {
		t.Fatal("a deleted task (tombstone) still holds")
	}
}

func TestSafetyRule1_ConcurrentAcquireHasOneWinner(t *testing.T) {
	tb := New()
	for node := range 50 {
		var winners atomic.Int32
		var wg sync.WaitGroup
		for i := range 16 {
			wg.Go(func() {
				if _, ok := tb.TryAcquire(fmt.Sprint("n", node), fmt.Sprint("t", node, "-", i), ""); ok {
					winners.Add(1)
				}
			})
		}
		wg.Wait()
		if winners.Load() != 1 {
			t.Fatalf("node %d: %d winners", node, winners.Load())
		}
	}
}

func TestSnapshot(t *testing.T) {
	tab := New()
	tab.Observe(task("b", "n1", v1alpha1.TaskRunning, false))
	tab.Observe(task("a", "n1", v1alpha1.TaskPending, false))
	tab.Observe(task("c", "n2", v1alpha1.TaskSucceeded, false))
	if _, ok := tab.TryAcquire("n3", "r", "NodeProfile/p"); !ok {
		t.Fatal("acquire n3")
	}
	v := tab.Snapshot()
	if h, ok := v.Holder("n1"); !ok || h != (Holder{Task: "a", Owner: "NodeOperation/op-a"}) {
		t.Errorf("n1 held by %+v, %v; want a, the first by name", h, ok)
	}
	if _, ok := v.Holder("n2"); ok {
		t.Error("a finished task holds n2")
	}
	if h, ok := v.Holder("n3"); !ok || h.Owner != "NodeProfile/p" || !v.IsReserved("r") {
		t.Errorf("the reservation of n3 is missing: %+v", v)
	}
	if v.IsReserved("a") || v.IsReserved("b") || v.IsReserved("c") {
		t.Errorf("tasks the informer delivered are not reservations: %v", v.Reserved)
	}
	// The view is a copy: later changes to the table do not show in it.
	tab.Release("n3", "r")
	if !v.IsReserved("r") || tab.Snapshot().IsReserved("r") {
		t.Error("the view follows the table")
	}
}

// A NodeProfile deletes the finished task it supersedes and creates one of the same name: the
// cache's news of the earlier task (its deletion, its last update) never frees the reservation
// of the new one; the new one's own end does.
func TestSafetyRule1_AnEarlierTaskOfTheSameNameNeverFreesAReservation(t *testing.T) {
	tb := New()
	if _, ok := tb.TryAcquire("n1", "p-install-n1", "NodeProfile/p"); !ok {
		t.Fatal("free node refused")
	}
	earlier := task("p-install-n1", "n1", v1alpha1.TaskSucceeded, false)
	earlier.CreationTimestamp = metav1.NewTime(time.Now().Add(-time.Hour))
	tb.Observe(earlier)
	tb.Forget(earlier)
	if _, ok := tb.TryAcquire("n1", "other", "NodeOperation/c"); ok {
		t.Fatal("the earlier task's deletion freed the reservation of the new one")
	}
	now := task("p-install-n1", "n1", v1alpha1.TaskPending, false)
	now.CreationTimestamp = metav1.Now()
	tb.Observe(now)
	now.Status.Phase = v1alpha1.TaskSucceeded
	tb.Observe(now)
	if _, ok := tb.TryAcquire("n1", "other", "NodeOperation/c"); !ok {
		t.Fatal("the new task ended, yet its node is held")
	}

	// Once the create returned, the UIDs tell them apart, whatever the clocks say.
	tb = New()
	tb.TryAcquire("n2", "p-install-n2", "NodeProfile/p")
	made := task("p-install-n2", "n2", v1alpha1.TaskPending, false)
	made.UID, made.CreationTimestamp = "new", metav1.Now()
	tb.Created(made)
	before := task("p-install-n2", "n2", v1alpha1.TaskSucceeded, false)
	before.UID, before.CreationTimestamp = "old", metav1.NewTime(made.CreationTimestamp.Add(-time.Minute))
	tb.Forget(before)
	if _, ok := tb.TryAcquire("n2", "other", "NodeOperation/c"); ok {
		t.Fatal("the earlier task's deletion, told by its UID, freed the reservation of the new one")
	}
	made.Status.Phase = v1alpha1.TaskSucceeded
	tb.Observe(made)
	if _, ok := tb.TryAcquire("n2", "other", "NodeOperation/c"); !ok {
		t.Fatal("the new task ended, yet its node is held")
	}
}

func TestAcquireWithinBudget(t *testing.T) {
	tb := New()
	tb.Observe(task("other", "n1", v1alpha1.TaskRunning, false))
	scope := []string{"n1", "n2", "n3", "n4"}
	down := func(n string) bool { return n == "n4" }
	ok, holders, _ := tb.AcquireWithin(context.Background(), "NodeOperation/op", []Claim{{"n1", "op-n1"}, {"n2", "op-n2"}, {"n3", "op-n3"}}, Budget{Nodes: scope, Down: down, Limit: 3})
	if ok[0] || holders[0].Task != "other" {
		t.Errorf("n1, held by another task: ok %v, holder %+v", ok[0], holders[0])
	}
	if !ok[1] || ok[2] || holders[2].Task != "" {
		t.Errorf("limit 3 with n1 held and n4 down: ok %v, holders %+v; want only n2", ok, holders)
	}
	// Acquiring again what the task holds succeeds and spends nothing more.
	if ok, _, _ := tb.AcquireWithin(context.Background(), "NodeOperation/op", []Claim{{"n2", "op-n2"}}, Budget{Nodes: scope, Limit: 2}); !ok[0] {
		t.Error("re-acquire of a held reservation refused")
	}
	if ok, _, _ := tb.AcquireWithin(context.Background(), "NodeOperation/op", []Claim{{"n3", "op-n3"}}, Budget{Nodes: scope, Limit: 2}); ok[0] {
		t.Error("n3 acquired beyond the limit")
	}
	// A node down already is counted already: a task on it spends nothing, even with no room.
	if ok, _, _ := tb.AcquireWithin(context.Background(), "NodeOperation/op", []Claim{{"n4", "op-n4"}}, Budget{Nodes: scope, Down: down, Limit: 1}); !ok[0] {
		t.Error("a claim on a node already down refused")
	}
}
