package skeleton

import (
	"context"
	"errors"
	"slices"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// A finalizer written from a copy older than the API server's changes nothing and is no error: a
// conflict is what the newer copy's event follows, so the owner looks again then; logging it as a
// reconciler error and backing off only delayed that look. Removing it from such a copy says so
// (stale), so that a delete decided on that copy waits for the next look.
func TestFinalizersFromAStaleCopyChangeNothingAndAreNoError(t *testing.T) {
	ctx := context.Background()
	const kept = "nodeops.io/test-record"
	with := &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: "with", Finalizers: []string{kept}}}
	without := &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: "without"}}
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(with, without).Build()
	staleCopies := map[string]*v1alpha1.NodeTask{}
	for _, name := range []string{"with", "without"} {
		var t0 v1alpha1.NodeTask
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &t0); err != nil {
			t.Fatal(err)
		}
		staleCopies[name] = t0.DeepCopy()
		t0.Labels = map[string]string{"changed": "since"}
		if err := c.Update(ctx, &t0); err != nil {
			t.Fatal(err)
		}
	}

	if err := AddFinalizer(ctx, c, staleCopies["without"], kept); err != nil {
		t.Errorf("add a finalizer from a stale copy: %v, want no error", err)
	}
	stale, err := RemoveFinalizer(ctx, c, staleCopies["with"], kept)
	if err != nil || !stale {
		t.Errorf("remove a finalizer from a stale copy: stale %v, error %v; want stale and no error", stale, err)
	}
	for name, want := range map[string]bool{"with": true, "without": false} {
		var now v1alpha1.NodeTask
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &now); err != nil {
			t.Fatal(err)
		}
		if got := slices.Contains(now.Finalizers, kept); got != want {
			t.Errorf("task %q carries %s: %v, want %v (a stale copy changed it)", name, kept, got, want)
		}
	}

	// Any other refusal is an error, naming the task.
	refused := interceptor.NewClient(c, interceptor.Funcs{
		Patch: func(context.Context, client.WithWatch, client.Object, client.Patch, ...client.PatchOption) error {
			return apierrors.NewForbidden(schema.GroupResource{Group: v1alpha1.GroupVersion.Group, Resource: "nodetasks"}, "with", errors.New("no"))
		},
	})
	var current v1alpha1.NodeTask
	if err := c.Get(ctx, client.ObjectKey{Name: "with"}, &current); err != nil {
		t.Fatal(err)
	}
	if stale, err := RemoveFinalizer(ctx, refused, &current, kept); stale || !apierrors.IsForbidden(err) {
		t.Errorf("remove refused: stale %v, error %v; want the Forbidden error", stale, err)
	}
}
