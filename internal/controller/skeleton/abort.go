package skeleton

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// Abort asks t, a copy from the cache, to stop. The patch names t's UID, which the API server will
// not change: a task of t's name created since the copy was taken (task names are derived from what
// they do, so a node that left and came back gets its old task's name) is another task and is left
// alone. Only such a task, or t gone, is no error; live is read to tell a refused patch apart.
func Abort(ctx context.Context, c client.Client, live client.Reader, t *v1alpha1.NodeTask) error {
	if t.Spec.Abort {
		return nil
	}
	body := fmt.Appendf(nil, `{"metadata":{"uid":%q},"spec":{"abort":true}}`, t.UID)
	abort := &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: t.Name}}
	err := c.Patch(ctx, abort, client.RawPatch(types.MergePatchType, body))
	if err == nil || apierrors.IsNotFound(err) {
		return nil
	}
	if apierrors.IsConflict(err) || apierrors.IsInvalid(err) {
		var now v1alpha1.NodeTask
		getErr := live.Get(ctx, client.ObjectKey{Name: t.Name}, &now)
		if apierrors.IsNotFound(getErr) || (getErr == nil && now.UID != t.UID) {
			return nil
		}
	}
	return fmt.Errorf("abort NodeTask %s: %w", t.Name, err)
}
