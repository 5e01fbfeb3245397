package skeleton

import (
	"context"
	"errors"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/nodelock"
	"github.com/nodeops/nodeops/internal/statuswrite"
)

func testScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

// The conflict rule: with Lock, a status decided on a copy older than the API server's is refused
// (the write carries the resourceVersion read) and comes back as ErrStale; Run then acts on
// nothing and asks again shortly, without an error to back off on.
func TestWriteStatusStaleActsOnNothing(t *testing.T) {
	live := &v1alpha1.ClusterTarget{ObjectMeta: metav1.ObjectMeta{Name: "cluster"}}
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(live).WithStatusSubresource(live).Build()
	var stored v1alpha1.ClusterTarget
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(live), &stored); err != nil {
		t.Fatal(err)
	}
	stale := stored.DeepCopy()
	stored.Status.ObservedGeneration = 7
	if err := c.Status().Update(context.Background(), &stored); err != nil {
		t.Fatal(err)
	}
	var throttle statuswrite.Throttle
	acted := false
	res, err := Run(context.Background(), stale, Steps[*v1alpha1.ClusterTarget]{
		Observe: func(context.Context, *v1alpha1.ClusterTarget) error { return nil },
		Decide:  func(*v1alpha1.ClusterTarget) {},
		WriteStatus: func(ctx context.Context, ct *v1alpha1.ClusterTarget) (ctrl.Result, error) {
			obj := ct.DeepCopy()
			obj.Status.ObservedGeneration = 1
			_, res, err := statuswrite.Write(ctx, c, statuswrite.Rule{Kind: "ClusterTarget", Lock: true}, &throttle, statuswrite.Change{Orig: ct, Obj: obj, Urgent: true, Now: time.Now()})
			if !errors.Is(err, statuswrite.ErrStale) {
				t.Errorf("write over a newer object: %v, want ErrStale", err)
			}
			return res, err
		},
		Act: func(context.Context, *v1alpha1.ClusterTarget) (ctrl.Result, error) {
			acted = true
			return ctrl.Result{}, nil
		},
	})
	if err != nil || acted || res.RequeueAfter != StaleRetry {
		t.Errorf("stale status: acted %v, result %v, error %v; want no act, again in %v, no error", acted, res, err, StaleRetry)
	}
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(live), &stored); err != nil || stored.Status.ObservedGeneration != 7 {
		t.Errorf("the newer status was written over: observedGeneration %d (%v)", stored.Status.ObservedGeneration, err)
	}
}

// The rule when a task already exists (the cache had not shown it): the node is given back and
// the lock table takes the task's real state from the API server. A finished task of that name
// then holds nothing, so the node is free for the next decision rather than held by a
// reservation no informer event will ever clear (one task per node, rule 1, without a node
// blocked for good).
func TestLockThenCreateTaskAlreadyThere(t *testing.T) {
	old := &v1alpha1.NodeTask{
		ObjectMeta: metav1.ObjectMeta{Name: "p-install-n1", CreationTimestamp: metav1.NewTime(time.Now().Add(-time.Hour))},
		Spec:       v1alpha1.NodeTaskSpec{NodeName: "n1"},
		Status:     v1alpha1.NodeTaskStatus{Phase: v1alpha1.TaskSucceeded},
	}
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(old).WithStatusSubresource(old).Build()
	locks := nodelock.New()
	locks.Observe(old) // the informer saw it finish long ago
	task := &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: old.Name}, Spec: v1alpha1.NodeTaskSpec{NodeName: "n1"}}
	got, _, err := LockThenCreate(context.Background(), c, c, locks, nodelock.ProfileOwner("p"), nodelock.Budget{Nodes: []string{"n1"}, Limit: 1},
		[]TaskCreate{{Task: task}}, 2)
	if err != nil || !got[0] {
		t.Fatalf("acquired %v, error %v", got, err)
	}
	if h, held := locks.Holder("n1"); held {
		t.Errorf("node n1 still held by %v after the create found a finished task there", h)
	}
}

// A create that fails gives its node back; Before runs under the lock, before the create, and its
// failure gives the node back too, with no create made.
func TestLockThenCreateFailureReleases(t *testing.T) {
	creates := 0
	c := interceptor.NewClient(fake.NewClientBuilder().WithScheme(testScheme(t)).Build(), interceptor.Funcs{
		Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error {
			creates++
			return errors.New("refused")
		},
	})
	locks := nodelock.New()
	budget := nodelock.Budget{Nodes: []string{"n1", "n2"}, Limit: 2}
	task := func(name, node string) *v1alpha1.NodeTask {
		return &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.NodeTaskSpec{NodeName: node}}
	}
	got, _, err := LockThenCreate(context.Background(), c, c, locks, "o", budget, []TaskCreate{
		{Task: task("a", "n1")},
		{Task: task("b", "n2"), Before: func(context.Context) error { return errors.New("delete failed") }},
	}, 2)
	if !got[0] || !got[1] || err == nil || creates != 1 {
		t.Fatalf("acquired %v, error %v, %d creates; want both acquired, an error, one create", got, err, creates)
	}
	if locks.Held("a") || locks.Held("b") {
		t.Error("a failed create kept its node")
	}
}
