package nodeprofile_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/nodeprofile"
	"github.com/nodeops/nodeops/internal/testutil"
)

// A profile whose alertmanager gate holds a silence over each node it works on keeps those
// silences while it looks (observe), before its status write, which is locked: a look on a copy of
// the profile older than the API server's would make a silence that the failed write then records
// nowhere, muting the node's alerts until its lease ends. Here the look is a reconciler whose cache
// returns the profile as it was before a later change, with a task of the profile running on the
// node; it must make no silence.
func TestAStaleProfileMakesNoSilence(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	const profile, node = "stalesilence", "stalesilence-1"
	makeNode(t, ctx, node, profile, nil, kwasm)
	p := makeProfile(t, ctx, profile, profile, func(s *v1alpha1.NodeProfileSpec) {
		s.Gates = []v1alpha1.Gate{{Name: "alerts", Alertmanager: &v1alpha1.AlertmanagerGate{
			// Nothing answers there: the manager's own look holds the gate and makes no silence.
			URL:     "http://127.0.0.1:1",
			Silence: &v1alpha1.AlertmanagerSilence{Matchers: []string{"instance={{node}}"}},
		}}}
	})
	// A task of the profile working on the node, as one a person retried after its silence ended.
	must(t, env.client.Get(ctx, client.ObjectKey{Name: profile}, p))
	task := nodeprofile.BuildTask(p, node, nodeprofile.ActionInstall, nodeprofile.SpecHash(&p.Spec))
	must(t, env.client.Create(ctx, task))
	t.Cleanup(func() {
		_ = env.client.Patch(context.Background(), task, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`)))
		_ = env.client.Delete(context.Background(), task)
	})

	// The stale copy is one the manager's own finalizer is already on: a copy from before it takes
	// the finalizer's path, whose optimistic lock refuses it.
	stale := &v1alpha1.NodeProfile{}
	testutil.Eventually(t, wait, "the profile carrying its finalizer", func() error {
		if err := env.client.Get(ctx, client.ObjectKey{Name: profile}, stale); err != nil {
			return err
		}
		if !controllerutil.ContainsFinalizer(stale, nodeprofile.Finalizer) {
			return fmt.Errorf("finalizers %v", stale.Finalizers)
		}
		return nil
	})
	touch := fmt.Sprintf(`{"metadata":{"annotations":{"test/touched":%q}}}`, time.Now().Format(time.RFC3339Nano))
	must(t, env.client.Patch(ctx, &v1alpha1.NodeProfile{ObjectMeta: metav1.ObjectMeta{Name: profile}}, client.RawPatch(types.MergePatchType, []byte(touch))))

	silences := &countingSilencer{}
	r := laggingReconciler(testutil.StaleGet{Client: env.managerClient, Stale: stale})
	r.Silences = silences
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Name: profile}}); err != nil {
		t.Fatalf("reconcile on the stale profile: %v", err)
	}
	if n := silences.created(); n != 0 {
		t.Fatalf("a look on a profile copy older than the API server's made %d silence(s) in Alertmanager, which its failed status write records nowhere", n)
	}
}

// countingSilencer stands in for Alertmanager's API in the reconciler beside the manager: it
// counts the silences asked for and makes none.
type countingSilencer struct {
	mu sync.Mutex
	n  int
}

func (s *countingSilencer) Silence(_ context.Context, _, id string, _ []string, _ string, _ time.Time) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if id == "" {
		s.n++
		id = fmt.Sprintf("silence-%d", s.n)
	}
	return id, nil
}

func (s *countingSilencer) Expire(context.Context, string, string) error { return nil }

func (s *countingSilencer) created() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}
