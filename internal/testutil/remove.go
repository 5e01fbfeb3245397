package testutil

import (
	"context"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// RemoveAtEnd deletes objs when the test ends and waits until the API server no longer has them,
// so that nothing a test made is left for the next (go test -count=2 runs a test again in the
// same process, against the same API server, and a fixed name must be free again). Finalizers are
// taken off first and pods go at once: no kubelet acknowledges a graceful delete in envtest, and a
// controller that would remove a finalizer may have stopped with the test.
func RemoveAtEnd(t testing.TB, c client.Client, objs ...client.Object) {
	t.Helper()
	t.Cleanup(func() {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// Deleted again while any is left: a controller still running may make one again (a pod
		// for a task it had not yet seen go).
		Eventually(t, time.Minute, "the test's objects gone", func() error {
			for _, o := range objs {
				if err := remove(ctx, c, o); err != nil {
					return err
				}
			}
			for _, o := range objs {
				err := c.Get(ctx, client.ObjectKeyFromObject(o), o)
				if err == nil {
					return fmt.Errorf("%T %s still there", o, o.GetName())
				}
				if !apierrors.IsNotFound(err) {
					return err
				}
			}
			return nil
		})
	})
}

func remove(ctx context.Context, c client.Client, o client.Object) error {
	if err := c.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
		return client.IgnoreNotFound(err)
	}
	if len(o.GetFinalizers()) > 0 {
		patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))
		if err := c.Patch(ctx, o, patch); err != nil {
			return client.IgnoreNotFound(err)
		}
	}
	if err := c.Delete(ctx, o, client.GracePeriodSeconds(0)); err != nil {
		return client.IgnoreNotFound(err)
	}
	return nil
}
