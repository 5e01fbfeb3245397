package agent

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/plan"
	"github.com/nodeops/nodeops/internal/taskpolicy"
)

// DefaultLeaseNamespace holds the node Leases when the agent runs outside a pod.
const DefaultLeaseNamespace = "nodeops-system"

// LabelLeaseNode marks a node Lease with its node, as admission checks (config/admission).
const LabelLeaseNode = v1alpha1.LabelNode

// AnnotationLeaseNode carries the node's full name on its Lease: admission confines an agent to the
// Lease of its own node by it, since a hashed Lease name cannot be checked in CEL.
const AnnotationLeaseNode = "nodeops.io/node-name"

// AnnotationLeaseAgent names the agent that wrote a node Lease last (its pod, by default): the same
// pod's restarted container (the kubelet starts it only once the old one is gone) takes it over at once.
const AnnotationLeaseAgent = "nodeops.io/agent"

// leaseWait is how often a task waiting for its node's Lease looks again.
const leaseWait = time.Second

// heldLease is the agent's record of a node Lease it wrote last.
type heldLease struct {
	task    string
	lease   *coordinationv1.Lease
	renewed time.Time
	// released: the task has since written a finished status, which frees the Lease for the next
	// taker without a write; the record still proves that the Lease's last write was this agent's.
	released bool
}

// leaseAnswer says whether a task may act on its node.
type leaseAnswer struct {
	held bool
	// took: written to the API just now (not held from before).
	took bool
	// created: took by creating the Lease, so no agent held the node before: nothing the task
	// records can have been written by another holder, and the cache needs no second look.
	created bool
	// stale: the task read from the API is already finished; the caller reads it again.
	stale bool
	// message, when not held: why, for the task's status; empty when another agent runs this same
	// task (that agent is the task's writer, so this one waits without writing).
	message string
}

// The node Lease is the one exclusion on a node the API server decides (docs/design.md, safety rule
// 8): a task runs a command only while the node's Lease names it, taken by a create or an update
// that fails on a concurrent change. Nothing releases it: the next taker reads its holder from the
// API and takes it when that task finished (status.phase Succeeded, Failed or Aborted, written by its
// agent once nothing runs), is deleted, or its agent stopped renewing it for the Lease's duration.
// The duration is compared with the taker's clock, which is the holder's: both run on the node.

// NodeLease is node's Lease in namespace as the agent creates it, holding no task yet.
func NodeLease(namespace, node string) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
		Namespace:   namespace,
		Name:        plan.NodeLeaseName(node),
		Labels:      map[string]string{LabelLeaseNode: plan.LabelValue(node)},
		Annotations: map[string]string{AnnotationLeaseNode: node},
	}}
}

// leaseNeed is what an action needs of the node's Lease.
type leaseNeed int

const (
	leaseNone leaseNeed = iota
	// leaseTake: a command runs.
	leaseTake
	// leaseCheck: a command recorded Running is ended without running (interrupted, aborted).
	leaseCheck
)

func leaseNeeded(a taskpolicy.Action, st *v1alpha1.NodeTaskStatus) leaseNeed {
	switch a.Kind {
	case taskpolicy.ActStart:
		return leaseTake
	case taskpolicy.ActInterrupted:
		return leaseCheck
	case taskpolicy.ActAbort:
		for _, c := range st.Commands {
			if c.Phase == v1alpha1.CommandRunning {
				return leaseCheck
			}
		}
	}
	return leaseNone
}

func (r *Reconciler) lease(ctx context.Context, task *v1alpha1.NodeTask, need leaseNeed) (leaseAnswer, error) {
	if need == leaseTake {
		return r.takeLease(ctx, task)
	}
	return r.checkLease(ctx, task)
}

func (r *Reconciler) leaseDuration() time.Duration {
	if r.LeaseDuration > 0 {
		return r.LeaseDuration
	}
	return 4 * r.heartbeatEvery()
}

func (r *Reconciler) leaseKey(node string) client.ObjectKey {
	return client.ObjectKeyFromObject(NodeLease(r.namespace(), node))
}

// namespace is the agent's own: its node Leases and its pod commands' pods are there.
func (r *Reconciler) namespace() string {
	if r.LeaseNamespace == "" {
		return DefaultLeaseNamespace
	}
	return r.LeaseNamespace
}

// holds reports whether the agent took the node's Lease for task recently enough to act without
// asking the API server: no taker can see it expired before half its duration has passed.
func (r *Reconciler) holds(task *v1alpha1.NodeTask) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, ok := r.leases[task.Spec.NodeName]
	return ok && h.task == task.Name && !h.released && time.Since(h.renewed) < r.leaseDuration()/2
}

func (r *Reconciler) recordLease(node, task string, l *coordinationv1.Lease, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.leases == nil {
		r.leases = map[string]heldLease{}
	}
	r.leases[node] = heldLease{task: task, lease: l.DeepCopy(), renewed: at}
}

// releaseIfFinished marks the node's Lease free once task wrote a finished status.
func (r *Reconciler) releaseIfFinished(task *v1alpha1.NodeTask) {
	if !finished(task.Status.Phase) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if h, ok := r.leases[task.Spec.NodeName]; ok && h.task == task.Name {
		h.released = true
		r.leases[task.Spec.NodeName] = h
	}
}

// mine reports whether the Lease's last write was this agent's, for task.
func (r *Reconciler) mine(l *coordinationv1.Lease, node, task string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, ok := r.leases[node]
	return ok && h.task == task && h.lease.ResourceVersion == l.ResourceVersion
}

// finished: the task's agent wrote that nothing of it runs.
func finished(p v1alpha1.TaskPhase) bool {
	return p == v1alpha1.TaskSucceeded || p == v1alpha1.TaskFailed || p == v1alpha1.TaskAborted
}

func expired(l *coordinationv1.Lease, now time.Time) bool {
	if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return true
	}
	return now.After(l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second))
}

// takeLease makes the node's Lease name task, when it is free for it.
func (r *Reconciler) takeLease(ctx context.Context, task *v1alpha1.NodeTask) (leaseAnswer, error) {
	if r.holds(task) {
		return leaseAnswer{held: true}, nil
	}
	node := task.Spec.NodeName
	key := r.leaseKey(node)
	// The first write needs no read when the agent knows the Lease: a create where it never wrote
	// one, an update of its own last write where that is free for task. The API server refuses
	// either when the Lease is not as believed (it exists, or it changed since), and then it is read.
	l := r.believedLease(key, node, task.Name)
	for range 4 {
		now := time.Now()
		if l == nil {
			l = &coordinationv1.Lease{}
			if err := r.Direct.Get(ctx, key, l); apierrors.IsNotFound(err) {
				l = NodeLease(key.Namespace, node)
			} else if err != nil {
				return leaseAnswer{}, fmt.Errorf("reading the lease of node %s: %w", node, err)
			} else if ans, err := r.leaseFree(ctx, l, task, now); err != nil || !ans.held {
				return ans, err
			}
		}
		r.fillLease(l, task.Name, now)
		var err error
		created := l.ResourceVersion == ""
		if created {
			err = r.Direct.Create(ctx, l)
		} else {
			err = r.Direct.Update(ctx, l)
		}
		if apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err) {
			l = nil
			continue
		}
		if err != nil {
			return leaseAnswer{}, fmt.Errorf("taking the lease of node %s: %w", node, err)
		}
		r.recordLease(node, task.Name, l, now)
		return leaseAnswer{held: true, took: true, created: created}, nil
	}
	return leaseAnswer{message: "node busy: its lease " + key.Name + " changed while being taken"}, nil
}

// believedLease is the node's Lease as the agent last wrote it, when that is free for task (its
// own, or a task's the agent since wrote finished), or a new one where the agent has no record; nil
// when only the API can say (another task's, unfinished as far as the agent knows).
func (r *Reconciler) believedLease(key client.ObjectKey, node, task string) *coordinationv1.Lease {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, ok := r.leases[node]
	switch {
	case !ok:
		return NodeLease(key.Namespace, node)
	case h.task == task || h.released:
		return h.lease.DeepCopy()
	}
	return nil
}

// checkLease reports whether task may write a result for a command recorded Running without
// running anything (interrupted, aborted): unless another agent still renews the Lease for this
// same task, that command's runner is gone.
func (r *Reconciler) checkLease(ctx context.Context, task *v1alpha1.NodeTask) (leaseAnswer, error) {
	if r.holds(task) {
		return leaseAnswer{held: true}, nil
	}
	l := &coordinationv1.Lease{}
	if err := r.Direct.Get(ctx, r.leaseKey(task.Spec.NodeName), l); apierrors.IsNotFound(err) {
		return leaseAnswer{held: true}, nil
	} else if err != nil {
		return leaseAnswer{}, fmt.Errorf("reading the lease of node %s: %w", task.Spec.NodeName, err)
	}
	if ptr.Deref(l.Spec.HolderIdentity, "") != task.Name {
		return leaseAnswer{held: true}, nil
	}
	return r.leaseFree(ctx, l, task, time.Now())
}

// leaseFree decides whether Lease l, read from the API, may be taken for task.
func (r *Reconciler) leaseFree(ctx context.Context, l *coordinationv1.Lease, task *v1alpha1.NodeTask, now time.Time) (leaseAnswer, error) {
	holder := ptr.Deref(l.Spec.HolderIdentity, "")
	if holder == "" || expired(l, now) || r.mine(l, task.Spec.NodeName, task.Name) {
		return leaseAnswer{held: true}, nil
	}
	if holder == task.Name && r.Identity != "" && l.Annotations[AnnotationLeaseAgent] == r.Identity {
		// This agent wrote it before it restarted: nothing of that run goes on.
		return leaseAnswer{held: true}, nil
	}
	held := &v1alpha1.NodeTask{}
	err := r.Direct.Get(ctx, client.ObjectKey{Name: holder}, held)
	if apierrors.IsNotFound(err) {
		return leaseAnswer{held: true}, nil
	}
	if err != nil {
		return leaseAnswer{}, fmt.Errorf("reading task %s, which holds node %s: %w", holder, task.Spec.NodeName, err)
	}
	if holder == task.Name {
		if finished(held.Status.Phase) {
			return leaseAnswer{stale: true}, nil
		}
		// Another agent on the node (or this one before a restart) runs this task: wait for it to
		// finish or to stop renewing.
		return leaseAnswer{}, nil
	}
	if finished(held.Status.Phase) {
		return leaseAnswer{held: true}, nil
	}
	return leaseAnswer{message: "node busy: held by task " + holder}, nil
}

func (r *Reconciler) fillLease(l *coordinationv1.Lease, task string, now time.Time) {
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	if r.Identity != "" {
		l.Annotations[AnnotationLeaseAgent] = r.Identity
	} else {
		delete(l.Annotations, AnnotationLeaseAgent)
	}
	if ptr.Deref(l.Spec.HolderIdentity, "") != task {
		l.Spec.HolderIdentity = ptr.To(task)
		l.Spec.AcquireTime = ptr.To(metav1.NewMicroTime(now))
		l.Spec.LeaseTransitions = ptr.To(ptr.Deref(l.Spec.LeaseTransitions, 0) + 1)
	}
	l.Spec.LeaseDurationSeconds = ptr.To(int32(r.leaseDuration().Seconds()) + 1) //nolint:gosec // minutes at most
	l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(now))
}

// renewLease renews the node's Lease for task, when the agent holds it and half its duration has
// passed since it last wrote it: one Lease write every two heartbeats by default.
func (r *Reconciler) renewLease(ctx context.Context, task *v1alpha1.NodeTask) {
	r.mu.Lock()
	h, ok := r.leases[task.Spec.NodeName]
	r.mu.Unlock()
	if !ok || h.task != task.Name || h.released || time.Since(h.renewed) < r.leaseDuration()/2 {
		return
	}
	now := time.Now()
	l := h.lease.DeepCopy()
	r.fillLease(l, task.Name, now)
	if err := r.Direct.Update(ctx, l); err != nil {
		if ctx.Err() == nil {
			log.FromContext(ctx).Error(err, "renewing the node's lease", "task", task.Name, "lease", l.Name)
		}
		return
	}
	r.recordLease(task.Spec.NodeName, task.Name, l, now)
}

// releaseLeases frees the Leases of tasks left unfinished when the agent stops with nothing
// running, so that the agent that follows (a restart, a rollout) need not wait for them to expire.
func (r *Reconciler) releaseLeases(ctx context.Context) {
	r.mu.Lock()
	var held []heldLease
	for _, h := range r.leases {
		if !h.released {
			held = append(held, h)
		}
	}
	r.mu.Unlock()
	for _, h := range held {
		l := h.lease.DeepCopy()
		l.Spec.HolderIdentity = nil
		if err := r.Direct.Update(ctx, l); err != nil {
			log.FromContext(ctx).Info("could not release the node's lease; it expires", "lease", l.Name, "error", err.Error())
		}
	}
}
