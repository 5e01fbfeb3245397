package nodeoperation

import (
	"context"
	"testing"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/nodelock"
	"github.com/nodeops/nodeops/internal/objname"
)

// A node another task took between decide and act is passed over: no create, no error, and the
// operation waits for it. Decide saw the node free, so only act's acquire can catch this.
func TestCreateTasksPassesOverNodeTakenSinceDecide(t *testing.T) {
	locks := nodelock.New()
	if _, ok := locks.TryAcquire("n1", "other-g-n1", nodelock.ProfileOwner("wasm")); !ok {
		t.Fatal("acquire")
	}
	// No client: a create would panic, and none may happen.
	r := &Reconciler{Locks: locks, CreateParallelism: 4}
	op := &v1alpha1.NodeOperation{}
	op.Name = "op"
	g := &v1alpha1.Group{Name: "g"}
	waiting := map[string]nodelock.Holder{}
	lost, err := r.createTasks(context.Background(), op, []start{{group: g, node: "n1"}}, nodelock.Budget{Nodes: []string{"n1"}, Limit: 1}, waiting)
	if err != nil || lost != 1 {
		t.Fatalf("lost %d, error %v; want 1, nil", lost, err)
	}
	if h := waiting["n1"]; h.Task != "other-g-n1" || h.Owner != "NodeProfile/wasm" {
		t.Errorf("waiting %+v", waiting)
	}
	if locks.Held(objname.TaskName("op", "g", "n1")) {
		t.Error("the passed-over task holds a reservation")
	}
}

// budgets are cluster-wide (rule 11): a budget another controller spent between decide and act (it
// took a node of the group that decide saw free) refuses the create; the operation looks again.
func TestCreateTasksKeepsBudgetSpentSinceDecide(t *testing.T) {
	locks := nodelock.New()
	if _, ok := locks.TryAcquire("n1", "other-g-n1", nodelock.OperationOwner("other")); !ok {
		t.Fatal("acquire")
	}
	r := &Reconciler{Locks: locks, CreateParallelism: 4}
	op := &v1alpha1.NodeOperation{}
	op.Name = "op"
	g := &v1alpha1.Group{Name: "g"}
	waiting := map[string]nodelock.Holder{}
	lost, err := r.createTasks(context.Background(), op, []start{{group: g, node: "n2"}}, nodelock.Budget{Nodes: []string{"n1", "n2"}, Limit: 1}, waiting)
	if err != nil || lost != 1 || len(waiting) != 0 {
		t.Fatalf("lost %d, waiting %v, error %v; want 1, none, nil", lost, waiting, err)
	}
	if locks.Held(objname.TaskName("op", "g", "n2")) {
		t.Error("the refused task holds a reservation")
	}
}
