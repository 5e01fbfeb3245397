package nodeprofile

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/nodelock"
)

// lockLag is when to look again at a node whose lock is still held by this profile's own finished
// task: the lock table follows the informer a moment behind the cache.
const lockLag = time.Second

// writes runs independent API writes concurrently, at most limit at once, and gathers their errors.
type writes struct {
	sem  chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	errs []error
}

func newWrites(limit int) *writes { return &writes{sem: make(chan struct{}, limit)} }

func (w *writes) do(f func() error) {
	w.wg.Add(1)
	w.sem <- struct{}{}
	go func() {
		defer func() { <-w.sem; w.wg.Done() }()
		if err := f(); err != nil {
			w.mu.Lock()
			w.errs = append(w.errs, err)
			w.mu.Unlock()
		}
	}()
}

func (w *writes) wait() error {
	w.wg.Wait()
	return errors.Join(w.errs...)
}

// apply carries out the decision: aborts, deletions, node patches and, under maxUnavailable and
// the node lock, new tasks, all concurrently.
func (r *Reconciler) apply(ctx context.Context, s *scope) (ctrl.Result, error) {
	p, d, key := s.profile, s.decision, profileKey(s.profile)
	w := newWrites(r.Parallelism)
	for _, name := range d.Abort {
		w.do(func() error { return r.abortTask(ctx, name) })
	}
	for _, name := range d.Delete {
		w.do(func() error { return r.deleteTask(ctx, name) })
	}
	for _, np := range d.Patches {
		rv := s.nodeRV[np.Node]
		if r.expect.nodeStale(key, np.Node, rv) {
			continue // patched already; the cache has not caught up
		}
		w.do(func() error {
			if err := r.patchNode(ctx, p.Name, np, s.hash); err != nil {
				return err
			}
			r.expect.patched(key, np.Node, rv)
			return nil
		})
	}

	var res ctrl.Result
	var mu sync.Mutex
	if len(d.Starts) > 0 && d.Room > 0 && !r.Lock.Synced() {
		res.RequeueAfter = lockLag
	} else if d.Room > 0 {
		owner := nodelock.ProfileOwner(p.Name)
		n := 0
		for _, st := range d.Starts {
			if n == d.Room {
				break
			}
			task := BuildTask(p, st.Node, st.Action, s.hash)
			// Nodes are tried in sorted order; one held by another owner's task is passed over, so
			// it neither blocks the rest nor counts against this profile's maxUnavailable.
			if holder, ok := r.Lock.TryAcquire(st.Node, task.Name, owner); !ok {
				retry := r.RetryAfter
				if holder.Owner == owner {
					retry = lockLag
				}
				res = minResult(res, ctrl.Result{RequeueAfter: retry})
				continue
			}
			n++
			w.do(func() error {
				if err := r.startTask(ctx, s, st, task); err != nil {
					r.Lock.Release(st.Node, task.Name)
					return err
				}
				mu.Lock()
				s.started++
				mu.Unlock()
				return nil
			})
		}
	}
	err := w.wait()
	return res, err
}

// startTask deletes the finished task st supersedes, then creates task.
func (r *Reconciler) startTask(ctx context.Context, s *scope, st Start, task *v1alpha1.NodeTask) error {
	for _, name := range st.Delete {
		if err := r.deleteTask(ctx, name); err != nil {
			return err
		}
	}
	if err := r.Client.Create(ctx, task); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create NodeTask %s (%s on node %s): %w", task.Name, st.Action, st.Node, err)
	}
	v, _ := ViewTask(task)
	v.Created = time.Now()
	r.expect.created(profileKey(s.profile), v, v.Created)
	return nil
}

func (r *Reconciler) deleteTask(ctx context.Context, name string) error {
	t := &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := r.Client.Delete(ctx, t); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete NodeTask %s: %w", name, err)
	}
	return nil
}

func (r *Reconciler) abortTask(ctx context.Context, name string) error {
	t := &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := r.Client.Patch(ctx, t, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"abort":true}}`))); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("abort NodeTask %s: %w", name, err)
	}
	return nil
}

// patchNode sets or removes the profile's label and hash annotation on a node in one merge patch.
func (r *Reconciler) patchNode(ctx context.Context, profile string, np NodePatch, hash string) error {
	body, err := NodePatchBody(profile, np, hash)
	if err != nil {
		return err
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: np.Node}}
	if err := r.Client.Patch(ctx, n, client.RawPatch(types.MergePatchType, body)); err != nil {
		if apierrors.IsNotFound(err) {
			return nil // a deleted node is forgotten
		}
		return fmt.Errorf("label node %s for NodeProfile %s: %w", np.Node, profile, err)
	}
	return nil
}

// syncRuntimeClasses keeps the profile's RuntimeClasses in step with its spec; conflicts go to status.
func (r *Reconciler) syncRuntimeClasses(ctx context.Context, s *scope) error {
	var list nodev1.RuntimeClassList
	if err := r.Client.List(ctx, &list); err != nil {
		return fmt.Errorf("list RuntimeClasses: %w", err)
	}
	ch := PlanRuntimeClasses(s.profile, list.Items, s.deleting)
	s.problems = append(s.problems, ch.Conflicts...)
	var errs []error
	for _, rc := range ch.Create {
		if err := r.Client.Create(ctx, rc); err != nil && !apierrors.IsAlreadyExists(err) {
			errs = append(errs, fmt.Errorf("create RuntimeClass %s: %w", rc.Name, err))
		}
	}
	for _, rc := range ch.Update {
		if err := r.Client.Update(ctx, rc); err != nil {
			errs = append(errs, fmt.Errorf("update RuntimeClass %s: %w", rc.Name, err))
		}
	}
	for _, rc := range ch.Recreate {
		// The handler is immutable: delete, then create; pods already running keep their handler.
		old := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: rc.Name}}
		if err := r.Client.Delete(ctx, old); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete RuntimeClass %s to change its handler: %w", rc.Name, err))
			continue
		}
		if err := r.Client.Create(ctx, rc); err != nil {
			errs = append(errs, fmt.Errorf("create RuntimeClass %s with handler %s: %w", rc.Name, rc.Handler, err))
		}
	}
	for _, name := range ch.Delete {
		rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if err := r.Client.Delete(ctx, rc); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete RuntimeClass %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}
