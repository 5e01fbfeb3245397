package nodeprofile

import (
	"testing"
	"time"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/nodelock"
)

// Cache lag after a create: a task this profile created that the cache does not show yet is a
// reservation in the lock table, and decide counts it as the node's latest, pending task, so the
// node is Installing and spends maxUnavailable (rule 2) rather than looking free to start again.
// A reservation whose name the cache lists already stands for that name's earlier task.
func TestReservedTasksAreSeenByDecide(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	locks := nodelock.New()
	if _, ok := locks.TryAcquire("a", TaskName("p", ActionInstall, h, "a"), nodelock.ProfileOwner("p")); !ok {
		t.Fatal("acquire a")
	}
	if _, ok := locks.TryAcquire("b", TaskName("p", ActionInstall, h, "b"), nodelock.ProfileOwner("p")); !ok {
		t.Fatal("acquire b")
	}
	if _, ok := locks.TryAcquire("c", TaskName("other", ActionInstall, h, "c"), nodelock.ProfileOwner("other")); !ok {
		t.Fatal("acquire c")
	}
	earlier := task("b", ActionInstall, h, v1alpha1.TaskSucceeded)
	tasks := addReserved("p", h, []TaskView{earlier}, locks.Snapshot(), now)
	if len(tasks) != 2 || tasks[1].Name != TaskName("p", ActionInstall, h, "a") || tasks[1].Phase != v1alpha1.TaskPending || !tasks[1].Created.Equal(now) {
		t.Fatalf("tasks with reservations: %+v; want b's listed task and a's reservation, pending", tasks)
	}
	d, err := decide(input{Hash: h, Now: now, Nodes: []NodeView{member("a"), member("d")}, Tasks: tasks})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range d.Starts {
		if st.Node == "a" {
			t.Errorf("decide starts a second task on a, whose install is reserved: %+v", d.Starts)
		}
	}
	if d.Unavailable != 1 || d.Room != 0 {
		t.Errorf("unavailable %d, room %d; want the reserved node counted: 1, 0", d.Unavailable, d.Room)
	}
}
