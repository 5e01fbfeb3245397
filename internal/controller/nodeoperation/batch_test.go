package nodeoperation

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// recordingQueue records how requests were enqueued.
type recordingQueue struct {
	workqueue.TypedRateLimitingInterface[reconcile.Request]
	added []string
	after map[string]time.Duration
}

func (q *recordingQueue) Add(r reconcile.Request) { q.added = append(q.added, r.Name) }
func (q *recordingQueue) AddAfter(r reconcile.Request, d time.Duration) {
	q.after[r.Name] = d
}

func ownedTask(kind, owner string) *v1alpha1.NodeTask {
	t := &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: "t"}}
	if owner != "" {
		t.OwnerReferences = []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: kind, Name: owner, Controller: ptr.To(true)}}
	}
	return t
}

// A task event wakes its operation at once while the operation is cheap to reconcile, and after
// twice its last reconcile (at most a second) once it is not, so that thousands of task events
// make a few reconciles rather than thousands.
func TestTaskEventsAreBatchedByReconcileCost(t *testing.T) {
	r := &Reconciler{}
	r.noteCost("big", 70*time.Millisecond)
	r.noteCost("huge", 3*time.Second)
	h := r.ownTaskEvents()
	q := &recordingQueue{after: map[string]time.Duration{}}
	ctx := context.Background()
	h.Create(ctx, event.TypedCreateEvent[client.Object]{Object: ownedTask("NodeOperation", "new")}, q)
	h.Update(ctx, event.TypedUpdateEvent[client.Object]{ObjectOld: ownedTask("NodeOperation", "big"), ObjectNew: ownedTask("NodeOperation", "big")}, q)
	h.Delete(ctx, event.TypedDeleteEvent[client.Object]{Object: ownedTask("NodeOperation", "huge")}, q)
	h.Create(ctx, event.TypedCreateEvent[client.Object]{Object: ownedTask("NodeProfile", "a-profile")}, q)
	h.Create(ctx, event.TypedCreateEvent[client.Object]{Object: ownedTask("", "")}, q)

	if len(q.added) != 1 || q.added[0] != "new" {
		t.Errorf("enqueued at once: %v, want only the operation never reconciled", q.added)
	}
	want := map[string]time.Duration{"big": 140 * time.Millisecond, "huge": time.Second}
	if len(q.after) != len(want) || q.after["big"] != want["big"] || q.after["huge"] != want["huge"] {
		t.Errorf("enqueued later: %v, want %v (a task of a profile or of no one wakes no operation)", q.after, want)
	}
	r.forget("big")
	if d := r.batchDelay("big"); d != 0 {
		t.Errorf("a deleted operation's cost is kept: %s", d)
	}
}
