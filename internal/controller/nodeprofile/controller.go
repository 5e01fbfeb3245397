// Package nodeprofile is the NodeProfile controller: it provisions the nodes in a profile with
// install NodeTasks under maxUnavailable and the node lock, labels them only once the install
// succeeded, uninstalls nodes that leave, keeps the profile's RuntimeClasses, and reports it all
// in the profile's status. The decisions are pure functions (Decide, ComputeStatus, BuildTask,
// PlanRuntimeClasses); this file reads the world and applies them.
package nodeprofile

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/nodelock"
	"github.com/nodeops/nodeops/internal/plan"
)

// +kubebuilder:rbac:groups=nodeops.io,resources=nodeprofiles,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=nodeops.io,resources=nodeprofiles/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=nodeops.io,resources=nodeprofiles/finalizers,verbs=update
// +kubebuilder:rbac:groups=nodeops.io,resources=nodetasks,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=node.k8s.io,resources=runtimeclasses,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Finalizer keeps a deleted profile until every node it provisioned is uninstalled.
const Finalizer = "nodeops.io/profile-uninstall"

// Locker is the manager's node lock (internal/nodelock.Table), shared with the NodeOperation controller.
type Locker interface {
	TryAcquire(node, task, owner string) (nodelock.Holder, bool)
	Release(node, task string)
	Synced() bool
}

// Defaults of Reconciler's tunables.
const (
	DefaultParallelism    = 32
	DefaultStatusInterval = time.Second
	DefaultRetryAfter     = 5 * time.Second
)

// Reconciler reconciles NodeProfiles. Build it with New or SetupWithManager.
type Reconciler struct {
	// Client reads from the manager's cache and writes to the API server.
	Client client.Client
	Lock   Locker
	// Recorder records events on profiles; nil records none.
	Recorder events.EventRecorder
	// Parallelism bounds concurrent writes (task creates, node patches) in one reconcile.
	Parallelism int
	// StatusInterval is the least time between two status writes that change only counts and
	// messages, so that thousands of nodes finishing make a handful of status writes, not thousands.
	StatusInterval time.Duration
	// RetryAfter is when to look again at nodes waiting for a lock held by another owner's task.
	RetryAfter time.Duration

	expect *expectations
	mu     sync.Mutex
	// lastStatus: profile name -> time of its last status write.
	lastStatus map[string]time.Time
}

// New returns a Reconciler with default tunables.
func New(c client.Client, lock Locker, recorder events.EventRecorder) *Reconciler {
	return &Reconciler{
		Client: c, Lock: lock, Recorder: recorder,
		Parallelism: DefaultParallelism, StatusInterval: DefaultStatusInterval, RetryAfter: DefaultRetryAfter,
	}
}

// scope is one reconcile's view of one profile.
type scope struct {
	profile  *v1alpha1.NodeProfile
	orig     *v1alpha1.NodeProfile
	deleting bool
	hash     string
	// nodeRV: node -> resourceVersion in the cache, for patch expectations.
	nodeRV map[string]string
	// started counts tasks created in this reconcile; problems are profile-level faults for status.
	started  int
	problems []string
	// invalid explains a spec the controller cannot act on; decided says decision is set.
	invalid  string
	decided  bool
	decision Decision
}

// Reconcile converges one NodeProfile: finalizer, RuntimeClasses, nodes, then status.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, retErr error) {
	r.init()
	p := &v1alpha1.NodeProfile{}
	if err := r.Client.Get(ctx, req.NamespacedName, p); err != nil {
		if apierrors.IsNotFound(err) {
			r.expect.forget(req.Name)
			r.mu.Lock()
			delete(r.lastStatus, req.Name)
			r.mu.Unlock()
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("get NodeProfile %s: %w", req.Name, err)
	}
	s := &scope{profile: p, orig: p.DeepCopy(), deleting: !p.DeletionTimestamp.IsZero(), hash: SpecHash(&p.Spec)}
	if s.deleting && !controllerutil.ContainsFinalizer(p, Finalizer) {
		return ctrl.Result{}, nil
	}
	if !s.deleting && !controllerutil.ContainsFinalizer(p, Finalizer) {
		patch := client.MergeFromWithOptions(p.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.AddFinalizer(p, Finalizer)
		if err := r.Client.Patch(ctx, p, patch); err != nil {
			return ctrl.Result{}, fmt.Errorf("add finalizer to NodeProfile %s: %w", p.Name, err)
		}
		s.orig = p.DeepCopy()
	}

	res, retErr = r.reconcileProfile(ctx, s)
	if s.deleting && retErr == nil && s.decision.Done {
		// Every node is uninstalled: the finalizer goes, and with it the profile; its status no longer matters.
		if err := r.removeFinalizer(ctx, s); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{}, nil
	}
	statusRes, err := r.writeStatus(ctx, s)
	return minResult(res, statusRes), errors.Join(retErr, err)
}

func (r *Reconciler) init() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.expect == nil {
		r.expect = newExpectations()
		r.lastStatus = map[string]time.Time{}
	}
	if r.Parallelism <= 0 {
		r.Parallelism = DefaultParallelism
	}
	if r.RetryAfter <= 0 {
		r.RetryAfter = DefaultRetryAfter
	}
}

// reconcileProfile converges RuntimeClasses and nodes, recording the decision in s for status.
func (r *Reconciler) reconcileProfile(ctx context.Context, s *scope) (ctrl.Result, error) {
	membership, err := NewMembership(&s.profile.Spec)
	if err != nil {
		s.invalid = err.Error()
		return ctrl.Result{}, reconcile.TerminalError(fmt.Errorf("NodeProfile %s: %w", s.profile.Name, err))
	}
	rcErr := r.syncRuntimeClasses(ctx, s)
	in, err := r.observe(ctx, s, membership)
	if err != nil {
		return ctrl.Result{}, errors.Join(rcErr, err)
	}
	d, err := Decide(in)
	if err != nil {
		s.invalid = err.Error()
		return ctrl.Result{}, errors.Join(rcErr, reconcile.TerminalError(fmt.Errorf("NodeProfile %s: %w", s.profile.Name, err)))
	}
	s.decision, s.decided = d, true
	res, err := r.apply(ctx, s)
	return res, errors.Join(rcErr, err)
}

// observe lists the nodes and the profile's tasks from the cache and turns them into Decide's input.
func (r *Reconciler) observe(ctx context.Context, s *scope, m Membership) (Input, error) {
	p := s.profile
	var nodes corev1.NodeList
	// Read-only use of the cached objects: copying thousands of nodes per reconcile is the cost to avoid.
	if err := r.Client.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return Input{}, fmt.Errorf("list nodes: %w", err)
	}
	var tasks v1alpha1.NodeTaskList
	if err := r.Client.List(ctx, &tasks, client.MatchingFields{ownerIndex: string(p.UID)}, client.UnsafeDisableDeepCopy); err != nil {
		return Input{}, fmt.Errorf("list NodeTasks of NodeProfile %s: %w", p.Name, err)
	}
	label, annotation := ProvisionedLabel(p.Name), HashAnnotation(p.Name)
	in := Input{
		Hash:           s.hash,
		HasUninstall:   len(p.Spec.Uninstall) > 0,
		MaxUnavailable: p.Spec.MaxUnavailable,
		Nodes:          make([]NodeView, 0, len(nodes.Items)),
	}
	s.nodeRV = make(map[string]string, len(nodes.Items))
	for i := range nodes.Items {
		n := &nodes.Items[i]
		s.nodeRV[n.Name] = n.ResourceVersion
		in.Nodes = append(in.Nodes, NodeView{
			Name:     n.Name,
			Member:   !s.deleting && m.Contains(n.Labels, n.Annotations),
			Ready:    plan.NodeReady(n),
			Labelled: n.Labels[label] == v1alpha1.ProvisionedValue,
			Hash:     n.Annotations[annotation],
		})
	}
	for i := range tasks.Items {
		if v, ok := ViewTask(&tasks.Items[i]); ok {
			in.Tasks = append(in.Tasks, v)
		}
	}
	in.Tasks = r.expect.addUnseenTasks(profileKey(p), in.Tasks, time.Now())
	return in, nil
}

// ViewTask turns a task into what Decide needs; ok is false for a task the profile did not build.
func ViewTask(t *v1alpha1.NodeTask) (TaskView, bool) {
	action, hash, ok := parseGroup(t.Spec.Group)
	if !ok {
		return TaskView{}, false
	}
	return TaskView{
		Name:    t.Name,
		Node:    t.Spec.NodeName,
		Action:  action,
		Hash:    hash,
		Phase:   t.EffectivePhase(),
		Abort:   t.Spec.Abort,
		Created: t.CreationTimestamp.Time,
		Failure: FailureMessage(t),
	}, true
}

// FailureMessage explains a failed or aborted task by its failed command and that command's
// message, which is what a person needs to fix it; "" for a task that did not fail.
func FailureMessage(t *v1alpha1.NodeTask) string {
	phase := t.EffectivePhase()
	if phase != v1alpha1.TaskFailed && phase != v1alpha1.TaskAborted {
		return ""
	}
	for _, c := range t.Status.Commands {
		if c.Phase == v1alpha1.CommandFailed {
			msg := c.Message
			if msg == "" {
				msg = t.Status.Message
			}
			if msg == "" && c.ExitCode != nil {
				msg = fmt.Sprintf("exit code %d", *c.ExitCode)
			}
			return fmt.Sprintf("command %s failed: %s", c.Name, msg)
		}
	}
	switch {
	case t.Status.Message != "":
		return t.Status.Message
	case t.Status.Reason != "":
		return fmt.Sprintf("task %s: %s", phase, t.Status.Reason)
	}
	return fmt.Sprintf("task %s", phase)
}

func (r *Reconciler) event(p *v1alpha1.NodeProfile, kind, reason, action, note string) {
	if r.Recorder != nil {
		r.Recorder.Eventf(p, nil, kind, reason, action, "%s", note)
	}
}

func minResult(a, b ctrl.Result) ctrl.Result {
	switch {
	case a.RequeueAfter == 0:
		return b
	case b.RequeueAfter == 0 || a.RequeueAfter < b.RequeueAfter:
		return a
	}
	return b
}

var _ reconcile.Reconciler = &Reconciler{}

var _ Locker = (*nodelock.Table)(nil)
