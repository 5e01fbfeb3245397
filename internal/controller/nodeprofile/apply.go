package nodeprofile

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/skeleton"
	"github.com/nodeops/nodeops/internal/nodelock"
	"github.com/nodeops/nodeops/internal/objname"
)

// lockLag is when to look again at a node whose lock is still held by this profile's own finished
// task: the lock table follows the informer a moment behind the cache.
const lockLag = time.Second

// apply carries out the decision: aborts, deletions, node patches and the chosen tasks, each
// after acquiring its node, all concurrently. A node another task took since decide looked is
// passed over this round.
func (r *Reconciler) apply(ctx context.Context, s *scope) (ctrl.Result, error) {
	p, d, key := s.profile, s.decision, profileKey(s.profile)
	w := skeleton.NewWrites(r.Parallelism)
	for _, name := range d.Abort {
		if t := s.tasks[name]; t != nil {
			w.Go(func() error { return skeleton.Abort(ctx, r.Client, r.live(), t) })
		}
	}
	deleting := make(map[string]bool, len(d.Delete))
	for _, name := range d.Delete {
		if t := s.tasks[name]; t != nil {
			deleting[name] = true
			w.Go(func() error { return r.deleteTask(ctx, t) })
		}
	}
	for _, name := range d.Release {
		if t := s.tasks[name]; t != nil && !deleting[name] {
			w.Go(func() error { return r.releaseTask(ctx, t) })
		}
	}
	for _, name := range d.Keep {
		if t := s.tasks[name]; t != nil {
			w.Go(func() error { return skeleton.AddFinalizer(ctx, r.Client, t, RecordFinalizer) })
		}
	}
	for _, np := range d.Patches {
		rv := s.nodeRV[np.Node]
		if r.patched.stale(key, np.Node, rv) {
			continue // patched already; the cache has not caught up
		}
		w.Go(func() error {
			if err := r.patchNode(ctx, p.Name, p.Spec.ProvisionedLabels, np, s.hash); err != nil {
				return err
			}
			r.patched.patched(key, np.Node, rv)
			return nil
		})
	}

	var res ctrl.Result
	starts, recorded, err := r.confirmFirsts(ctx, s)
	if err != nil {
		return res, errors.Join(err, w.Wait())
	}
	if recorded {
		// The cache is behind a node's label: it delivers it soon, and the node's event brings the
		// profile back; this look is the safety net.
		res = ctrl.Result{RequeueAfter: lockLag}
	}
	owner := nodelock.ProfileOwner(p.Name)
	created := r.Now.Now().UTC().Format(time.RFC3339Nano)
	creates := make([]skeleton.TaskCreate, len(starts))
	for i, st := range starts {
		task := BuildTask(p, st.Node, st.Action, s.hash)
		metav1.SetMetaDataAnnotation(&task.ObjectMeta, CreatedAnnotation, created)
		creates[i] = skeleton.TaskCreate{Task: task, Before: func(ctx context.Context) error {
			// The finished task st supersedes goes first: the new one may take its name.
			for _, name := range st.Delete {
				t := s.tasks[name]
				if t == nil {
					return fmt.Errorf("NodeTask %s, which the new task replaces, is not in the cache any more; looking again", name)
				}
				if err := r.deleteTask(ctx, t); err != nil {
					return err
				}
			}
			return nil
		}}
	}
	// The budget is checked again as the nodes are acquired, counting every task's holds, so that
	// an operation deciding at the same moment cannot spend the same room (budgets are cluster-wide, rule 11).
	got, holders, createErr := skeleton.LockThenCreate(ctx, r.Client, r.APIReader, r.Lock, owner, s.budget(), creates, r.Parallelism)
	for i := range starts {
		if got[i] {
			continue
		}
		retry := r.RetryAfter
		if holders[i].Owner == owner || holders[i].Task == "" {
			retry = lockLag
		}
		res = skeleton.LowestNonZero(res, ctrl.Result{RequeueAfter: retry})
	}
	return res, errors.Join(createErr, w.Wait())
}

// deleteTask deletes t, the very task decide saw: its RecordFinalizer comes off first under an
// optimistic lock (a copy older than the API server's deletes nothing; the next look decides
// again), and the delete carries its UID, so that a cache behind the API server (a task of the
// same name created since) deletes nothing.
func (r *Reconciler) deleteTask(ctx context.Context, t *v1alpha1.NodeTask) error {
	if stale, err := skeleton.RemoveFinalizer(ctx, r.Client, t, RecordFinalizer); stale || err != nil {
		return err
	}
	uid := t.UID
	del := &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: t.Name}}
	if err := r.Client.Delete(ctx, del, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete NodeTask %s: %w", t.Name, err)
	}
	return nil
}

// releaseTask takes RecordFinalizer off t under an optimistic lock: a task someone deleted then
// goes. Nothing to do for a task without it (one created before the finalizer existed).
func (r *Reconciler) releaseTask(ctx context.Context, t *v1alpha1.NodeTask) error {
	_, err := skeleton.RemoveFinalizer(ctx, r.Client, t, RecordFinalizer)
	return err
}

// releaseAll takes RecordFinalizer off every one of tasks: the profile is going, and its tasks
// with it.
func (r *Reconciler) releaseAll(ctx context.Context, tasks []*v1alpha1.NodeTask) error {
	w := skeleton.NewWrites(r.Parallelism)
	for _, t := range tasks {
		w.Go(func() error { return r.releaseTask(ctx, t) })
	}
	return w.Wait()
}

// releaseOrphans lets the tasks of the profile named name go once it is gone: found missing in
// the cache, confirmed by the API server (a cache just started can be behind its tasks'), or
// there under a new UID (deleted and created again).
func (r *Reconciler) releaseOrphans(ctx context.Context, name string) error {
	var list v1alpha1.NodeTaskList
	if err := r.Client.List(ctx, &list, client.MatchingLabels{v1alpha1.LabelProfile: objname.LabelValue(name)}, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("list tasks of deleted NodeProfile %s: %w", name, err)
	}
	var kept []*v1alpha1.NodeTask
	for i := range list.Items {
		if t := &list.Items[i]; controllerutil.ContainsFinalizer(t, RecordFinalizer) && skeleton.ControllerUID(t, kind) != "" {
			kept = append(kept, t)
		}
	}
	orphans, err := skeleton.Orphans(ctx, r.live(), &v1alpha1.NodeProfile{}, kind, name, kept)
	if err != nil {
		return err
	}
	return r.releaseAll(ctx, orphans)
}

// live reads from the API server itself.
func (r *Reconciler) live() client.Reader {
	if r.APIReader != nil {
		return r.APIReader
	}
	return r.Client
}

// confirmFirsts returns s.starts less the first tasks (Start.First: the node has no task of the
// profile left) that the API server shows are not needed: with no task left, a node's label and
// hash are the only record of what ran there, and a cache can show a task's deletion before the
// label its install earned (or an uninstall's removal of it), as a manager just elected may.
// recorded says some were left out. First installs cost one list of the nodes carrying the
// profile's label, however many start (none carry it when a profile first provisions); a first
// uninstall, which is rare, reads its node.
func (r *Reconciler) confirmFirsts(ctx context.Context, s *scope) (starts []Start, recorded bool, err error) {
	if !slices.ContainsFunc(s.starts, func(st Start) bool { return st.First }) {
		return s.starts, false, nil // every reconcile comes here: no work without a first task
	}
	var labelled map[string]*corev1.Node
	views := make(map[string]NodeView, len(s.in.Nodes))
	for _, n := range s.in.Nodes {
		views[n.Name] = n
	}
	p := s.profile
	for _, st := range s.starts {
		if !st.First {
			starts = append(starts, st)
			continue
		}
		var live *corev1.Node
		if st.Action == ActionInstall {
			if labelled == nil {
				var list corev1.NodeList
				if err := r.live().List(ctx, &list, client.MatchingLabels{ProvisionedLabel(p.Name): v1alpha1.ProvisionedValue}); err != nil {
					return nil, false, fmt.Errorf("list the nodes labelled for NodeProfile %s before their first task: %w", p.Name, err)
				}
				labelled = make(map[string]*corev1.Node, len(list.Items))
				for i := range list.Items {
					labelled[list.Items[i].Name] = &list.Items[i]
				}
			}
			live = labelled[st.Node]
		} else {
			live = &corev1.Node{}
			if err := r.live().Get(ctx, client.ObjectKey{Name: st.Node}, live); err != nil {
				return nil, false, fmt.Errorf("read node %s before its first task of NodeProfile %s: %w", st.Node, p.Name, err)
			}
		}
		v := views[st.Node]
		v.Installed, v.Labelled, v.Hash = false, false, ""
		if live != nil {
			marks(&v, live, p.Name, p.Spec.ProvisionedLabels)
		}
		if _, again, _, _, _ := decideNode(s.in, &v, nil); again == nil || again.Action != st.Action {
			log.FromContext(ctx).Info("the cache is behind a node's record; not starting its task", "node", st.Node, "action", st.Action, "provisioned", v.Installed, "hash", v.Hash)
			recorded = true
			continue
		}
		starts = append(starts, st)
	}
	return starts, recorded, nil
}

// patchNode sets or removes the profile's label and hash annotation on a node in one merge patch.
func (r *Reconciler) patchNode(ctx context.Context, profile string, extra []v1alpha1.ProvisionedLabel, np NodePatch, hash string) error {
	body, err := NodePatchBody(profile, extra, np, hash)
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

// syncRuntimeClasses carries out the RuntimeClass changes decide planned; conflicts went to status.
func (r *Reconciler) syncRuntimeClasses(ctx context.Context, s *scope) error {
	ch := s.classes
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

// budget is the profile's maxUnavailable over the nodes it concerns, for the lock table's check
// at acquisition: NotReady and cordoned nodes count besides those a task holds.
func (s *scope) budget() nodelock.Budget {
	down := make(map[string]bool, len(s.in.Nodes))
	for _, n := range s.in.Nodes {
		if !n.Ready || n.Cordoned {
			down[n.Name] = true
		}
	}
	nodes := make([]string, len(s.decision.Nodes))
	for i, n := range s.decision.Nodes {
		nodes[i] = n.Node
	}
	return nodelock.Budget{Nodes: nodes, Limit: s.decision.Limit, Down: func(n string) bool { return down[n] }}
}
