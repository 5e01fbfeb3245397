// Package nodetask is the manager's NodeTask controller. It does two things.
//
// It clears spec.recoveryMode once the agent has acted on it: the agent, the one writer of a
// task's command results, acts on a person's spec.recoveryMode and marks it done in
// status.recoveredGeneration; clearing it makes the next `kubectl nodeops retry` or `skip` (which
// sets it again, a new generation) a new request (a failure blocks until a person decides, rule 3).
//
// And it watches the agents' hold on their tasks (a lost agent fails its task in bounded time, rule 9): an unfinished task whose node
// is deleted, or whose running command's heartbeat the manager has seen unrenewed for longer
// than AgentLostAfter, gets the
// condition AgentLost=True (reason NodeDeleted or AgentLost) in status.conditions, the manager's
// own field, which an agent may not change (its writes leave it out); the task then counts as Failed. A
// person's retry or skip is left to the agent while the node exists; the condition is removed
// once the agent has recorded that recovery. On a deleted node no agent can act, so a skip is
// recorded by the manager (reason Skipped, the task counts as Succeeded) and a retry is refused
// in the condition's message.
//
// Silence is measured on the manager's own clock, from when it first saw the current heartbeat,
// as Kubernetes' node lifecycle controller measures a node's (its probeTimestamp), never from the
// heartbeat's own timestamp: while the API server is down (a single control plane restarting its
// static pods) no agent can renew, and a manager that comes back with it, or takes over the
// leader lease, must give every agent the full AgentLostAfter to write again (docs/design.md,
// a lost agent fails its task in bounded time, rule 9).
//
// It writes only its own conditions in a task's status (AgentLost, Drained), clears
// spec.recoveryMode and keeps secret holder pods; it creates no NodeTask, and evicts pods only for a
// drain a task's agent asked for. Command results are the agent's.
package nodetask

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/skeleton"
	"github.com/nodeops/nodeops/internal/statuswrite"
	"github.com/nodeops/nodeops/internal/taskpolicy"
)

// +kubebuilder:rbac:groups=nodeops.io,resources=nodetasks,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=nodeops.io,resources=nodetasks/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch

// DefaultAgentLostAfter is how long a running command's heartbeat may be silent before its task
// is marked AgentLost; the agent renews it every 15 seconds (agent.DefaultHeartbeat).
const DefaultAgentLostAfter = time.Minute

// Options configure the controller.
type Options struct {
	// AgentLostAfter: zero for DefaultAgentLostAfter.
	AgentLostAfter time.Duration
}

// Reconciler clears a recoveryMode that the agent acted on, and marks tasks whose agent is lost.
type Reconciler struct {
	Client client.Client
	// Reader reads without the cache, to confirm that a node the cache misses is gone.
	Reader         client.Reader
	AgentLostAfter time.Duration
	// Now is the manager's clock; nil for time.Now.
	Now func() time.Time
	// Recorder shows a recovery request left to the agent (AwaitingAgent); nil for none.
	Recorder events.EventRecorder

	mu   sync.Mutex
	seen map[string]sighting // by task name
	// awaiting is the generation of each task whose recovery request was last shown left to its agent.
	awaiting map[string]int64
}

// sighting is a heartbeat as this manager first saw it: the agent's last sign and the manager's
// time when that sign was new to it.
type sighting struct {
	uid  types.UID
	gen  int64 // a spec change (an approval, a resume) is news to the agent, too
	sign time.Time
	at   time.Time
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// silentSince is when this manager first saw the task's current sign of life: the time the
// agent's silence is counted from. A sign it has not seen before starts the count now.
func (r *Reconciler) silentSince(task *v1alpha1.NodeTask, sign, now time.Time) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen == nil {
		r.seen = map[string]sighting{}
	}
	s, ok := r.seen[task.Name]
	if !ok || s.uid != task.UID || s.gen != task.Generation || !s.sign.Equal(sign) {
		s = sighting{uid: task.UID, gen: task.Generation, sign: sign, at: now}
		r.seen[task.Name] = s
	}
	return s.at
}

// forget drops what was seen of a task that no agent holds any longer.
func (r *Reconciler) forget(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.seen, name)
}

// SetupWithManager registers the NodeTask controller with the default options.
func SetupWithManager(mgr ctrl.Manager) error { return SetupWithOptions(mgr, Options{}) }

// SetupWithOptions registers the NodeTask controller.
func SetupWithOptions(mgr ctrl.Manager, o Options) error {
	if o.AgentLostAfter <= 0 {
		o.AgentLostAfter = DefaultAgentLostAfter
	}
	r := &Reconciler{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), AgentLostAfter: o.AgentLostAfter,
		Recorder: mgr.GetEventRecorder("nodetask")}
	return ctrl.NewControllerManagedBy(mgr).
		Named("nodetask").
		For(&v1alpha1.NodeTask{}, builder.WithPredicates(predicate.Funcs{
			// Every unfinished task once when it first appears (the manager's start-up list too), so that
			// one whose node was deleted while no manager watched is marked.
			CreateFunc: func(e event.CreateEvent) bool {
				t, ok := e.Object.(*v1alpha1.NodeTask)
				return ok && (watched(t) || t.Status.Phase.Unfinished())
			},
			DeleteFunc:  func(e event.DeleteEvent) bool { return watched(e.Object) },
			GenericFunc: func(e event.GenericEvent) bool { return watched(e.Object) },
			// A task that stops being held comes here once more, so that what was seen of it is forgotten.
			UpdateFunc: func(e event.UpdateEvent) bool { return watched(e.ObjectNew) || watched(e.ObjectOld) },
		})).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.tasksOf), builder.WithPredicates(skeleton.NodeDeleted())).
		Complete(r)
}

// watched reports whether a task needs this controller: a recovery to clear or to leave to the
// agent, a hold to watch or a loss to resolve.
func watched(o client.Object) bool {
	t, ok := o.(*v1alpha1.NodeTask)
	return ok && (actedOn(t) || taskpolicy.NeedsRecovery(t) || held(t) || t.Lost() != nil)
}

// tasksOf are the tasks of a deleted node.
func (r *Reconciler) tasksOf(ctx context.Context, o client.Object) []reconcile.Request {
	var list v1alpha1.NodeTaskList
	if err := r.Client.List(ctx, &list, client.MatchingLabels{v1alpha1.LabelNode: o.GetName()}); err != nil {
		log.FromContext(ctx).Error(err, "listing the tasks of a deleted node", "node", o.GetName())
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: list.Items[i].Name}})
	}
	return out
}

// actedOn reports whether the task carries a recoveryMode its agent has recorded as acted on.
func actedOn(t *v1alpha1.NodeTask) bool {
	return t.Spec.RecoveryMode != v1alpha1.RecoveryNone && !taskpolicy.NeedsRecovery(t)
}

// held reports whether an agent holds the task: its agent recorded it started and not finished
// (Running, or Pending between commands or awaiting an approval after a recorded start).
func held(t *v1alpha1.NodeTask) bool {
	switch t.Status.Phase {
	case v1alpha1.TaskRunning:
		return true
	case v1alpha1.TaskPending:
		return t.Status.StartTime != nil
	}
	return false
}

// lastSign is when the agent last showed it holds a running command: the later of the heartbeat
// and the running command's start (a quick idempotent command is recorded a second after it
// started, with the heartbeat of its start). Zero when no command is running: no heartbeat is due.
func lastSign(t *v1alpha1.NodeTask) time.Time {
	var last time.Time
	running := false
	for _, c := range t.Status.Commands {
		if c.Phase == v1alpha1.CommandRunning {
			running = true
			if c.StartTime != nil && c.StartTime.After(last) {
				last = c.StartTime.Time
			}
		}
	}
	if !running {
		return time.Time{}
	}
	if hb := t.Status.AgentHeartbeat; hb != nil && hb.After(last) {
		last = hb.Time
	}
	if last.IsZero() && t.Status.StartTime != nil {
		last = t.Status.StartTime.Time
	}
	return last
}

// lastStep is when the agent last recorded a step of a task it holds with nothing running: the
// latest start or end of a command, or of the task.
func lastStep(t *v1alpha1.NodeTask) time.Time {
	var last time.Time
	later := func(ts *metav1.MicroTime) {
		if ts != nil && ts.After(last) {
			last = ts.Time
		}
	}
	later(t.Status.StartTime)
	for i := range t.Status.Commands {
		later(t.Status.Commands[i].StartTime)
		later(t.Status.Commands[i].CompletionTime)
	}
	return last
}

// errStale: the task changed since it was read; the next reconcile reads it again.
var errStale = errors.New("the task changed since it was read")

// Reconcile marks a lost task, resolves a lost one a person recovered, and clears an acted-on
// recoveryMode; it waits for the agent's status writes, which bring the task back here.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var task v1alpha1.NodeTask
	if err := r.Client.Get(ctx, req.NamespacedName, &task); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.Name)
			r.mu.Lock()
			delete(r.awaiting, req.Name)
			r.mu.Unlock()
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !held(&task) || task.Lost() != nil {
		r.forget(task.Name)
	}
	res, err := r.liveness(ctx, &task)
	if errors.Is(err, errStale) {
		return ctrl.Result{RequeueAfter: skeleton.StaleRetry}, nil // a fresher write (the agent's, perhaps) is looked at next
	}
	if err != nil {
		return res, err
	}
	if !actedOn(&task) {
		r.showAwaitingAgent(&task)
		return res, nil
	}
	orig := task.DeepCopy()
	task.Spec.RecoveryMode = v1alpha1.RecoveryNone
	// Optimistic lock: a person may have asked again since this read, and that request must stay.
	err = r.Client.Patch(ctx, &task, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
	if apierrors.IsConflict(err) {
		// The write that came first (often the agent's next status write) brings the task back.
		return res, nil
	}
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("clear recoveryMode on NodeTask %s: %w", task.Name, err)
	}
	return res, nil
}

// liveness is a lost agent fails its task in bounded time (rule 9) for one task; it writes only
// its condition AgentLost (writeLost).
func (r *Reconciler) liveness(ctx context.Context, task *v1alpha1.NodeTask) (ctrl.Result, error) {
	if !task.Status.Phase.Unfinished() && task.Status.Phase != "" {
		return ctrl.Result{}, nil // the agent finished it (Succeeded, Aborted)
	}
	now := r.now()
	orig := task.DeepCopy()
	var res ctrl.Result
	if lost := task.Lost(); lost != nil {
		switch {
		case lost.Reason == v1alpha1.ReasonLostSkipped:
			return ctrl.Result{}, nil
		case task.Status.RecoveredGeneration > lost.ObservedGeneration:
			// The agent is back and recorded a person's retry or skip: its own status says the rest.
			meta.RemoveStatusCondition(&task.Status.Conditions, v1alpha1.ConditionAgentLost)
		case taskpolicy.NeedsRecovery(task):
			gone, err := r.nodeGone(ctx, task.Spec.NodeName)
			if err != nil || !gone {
				return ctrl.Result{}, err // the agent acts on it, as on any failed task
			}
			c := *lost
			if task.Spec.RecoveryMode == v1alpha1.RecoverySkip {
				c.Reason, c.ObservedGeneration = v1alpha1.ReasonLostSkipped, task.Generation
				c.Message = fmt.Sprintf("skipped on request: node %s was deleted (%s)", task.Spec.NodeName, lost.Message)
			} else {
				c.Message = fmt.Sprintf("retry refused: node %s was deleted, so no agent can run the task; skip it or abort the operation (%s)", task.Spec.NodeName, lost.Reason)
				if c.Message == lost.Message {
					return ctrl.Result{}, nil
				}
			}
			meta.SetStatusCondition(&task.Status.Conditions, c)
		default:
			return ctrl.Result{}, nil
		}
	} else {
		if !held(task) {
			return r.unheldOnDeletedNode(ctx, task, orig)
		}
		gone, err := r.nodeGone(ctx, task.Spec.NodeName)
		if err != nil {
			return ctrl.Result{}, err
		}
		last := lastSign(task)
		switch {
		case gone:
			msg := fmt.Sprintf("node %s was deleted while the task was unfinished", task.Spec.NodeName)
			if !last.IsZero() {
				msg += fmt.Sprintf("; last heartbeat %s ago", now.Sub(last).Round(time.Second))
			}
			r.mark(task, v1alpha1.ReasonNodeDeleted, msg)
		case last.IsZero() && !taskpolicy.NeedsAgent(task):
			r.forget(task.Name)
			return ctrl.Result{}, nil // nothing running, nothing due (a person's approval or resume): no heartbeat is due
		case last.IsZero():
			// Held with nothing running and a step due (the next command, the end): a live agent
			// takes it within a second. One that stopped between commands (SIGTERM, its node
			// switched off but not deleted) never does, and an abort would wait for it forever.
			step := lastStep(task)
			since := r.silentSince(task, step, now)
			if now.Sub(since) <= r.AgentLostAfter {
				return ctrl.Result{RequeueAfter: since.Add(r.AgentLostAfter).Sub(now) + 100*time.Millisecond}, nil
			}
			msg := fmt.Sprintf("the agent of node %s stopped between commands: nothing ran for %s while a step was due (lost after %s)",
				task.Spec.NodeName, now.Sub(since).Round(time.Second), r.AgentLostAfter)
			if !step.IsZero() {
				msg += "; its last step is from " + step.UTC().Format(time.RFC3339)
			}
			if task.Status.Message != "" {
				msg += "; its last note: " + task.Status.Message
			}
			r.mark(task, v1alpha1.ReasonAgentLost, msg)
		default:
			since := r.silentSince(task, last, now)
			if now.Sub(since) <= r.AgentLostAfter {
				return ctrl.Result{RequeueAfter: since.Add(r.AgentLostAfter).Sub(now) + 100*time.Millisecond}, nil
			}
			r.mark(task, v1alpha1.ReasonAgentLost, fmt.Sprintf("the agent of node %s stopped renewing its hold: no heartbeat for %s (lost after %s); its last one is from %s",
				task.Spec.NodeName, now.Sub(since).Round(time.Second), r.AgentLostAfter, last.UTC().Format(time.RFC3339)))
		}
	}
	if err := r.writeLost(ctx, orig, task); err != nil {
		return ctrl.Result{}, err
	}
	return res, nil
}

// lostRule: the manager's AgentLost condition alone (the agent writes every other field; one
// writer per field, NodeTaskStatus), under a lock, so that it never decides on an agent's write it
// has not seen: a conflict is looked at again (errStale).
var lostRule = statuswrite.Rule{Kind: "NodeTask", Fields: statuswrite.ConditionsOnly, Owned: []string{v1alpha1.ConditionAgentLost}, Lock: true}

// writeLost writes task's AgentLost condition, decided on orig.
func (r *Reconciler) writeLost(ctx context.Context, orig, task *v1alpha1.NodeTask) error {
	_, _, err := statuswrite.Write(ctx, r.Client, lostRule, nil, statuswrite.Change{Orig: orig, Obj: task, Urgent: true})
	if errors.Is(err, statuswrite.ErrStale) {
		return errStale
	}
	if err != nil {
		return fmt.Errorf("write the AgentLost condition of NodeTask %s: %w", task.Name, err)
	}
	return nil
}

// unheldOnDeletedNode marks NodeDeleted a task that no agent holds, whose node is gone: one that
// never started (its operation would wait for it forever) or that failed (no agent is left to
// record a person's skip). The mark makes it Failed, so the operation goes Blocked, and lets the
// manager record a skip (a lost agent fails its task in bounded time, rule 9).
func (r *Reconciler) unheldOnDeletedNode(ctx context.Context, task, orig *v1alpha1.NodeTask) (ctrl.Result, error) {
	var when string
	switch task.EffectivePhase() {
	case v1alpha1.TaskPending:
		when = "before the task started"
	case v1alpha1.TaskFailed:
		when = "after the task failed"
	default:
		return ctrl.Result{}, nil
	}
	gone, err := r.nodeGone(ctx, task.Spec.NodeName)
	if err != nil || !gone {
		return ctrl.Result{}, err
	}
	r.mark(task, v1alpha1.ReasonNodeDeleted, fmt.Sprintf("node %s was deleted %s", task.Spec.NodeName, when))
	return ctrl.Result{}, r.writeLost(ctx, orig, task)
}

// showAwaitingAgent emits AwaitingAgent once per generation for a recovery request this controller
// leaves alone until the agent has acted on it, so that its decision to do nothing can be seen.
func (r *Reconciler) showAwaitingAgent(task *v1alpha1.NodeTask) {
	if r.Recorder == nil || !taskpolicy.NeedsRecovery(task) || task.Lost() != nil {
		return
	}
	r.mu.Lock()
	if r.awaiting == nil {
		r.awaiting = map[string]int64{}
	}
	shown := r.awaiting[task.Name] == task.Generation
	r.awaiting[task.Name] = task.Generation
	r.mu.Unlock()
	if !shown {
		r.Recorder.Eventf(task, nil, corev1.EventTypeNormal, ReasonAwaitingAgent, "WaitForAgent",
			"recoveryMode %s of generation %d is left to the agent of node %s, which records it in status.recoveredGeneration",
			task.Spec.RecoveryMode, task.Generation, task.Spec.NodeName)
	}
}

// ReasonAwaitingAgent is the Event of a recovery request left to the task's agent.
const ReasonAwaitingAgent = "AwaitingAgent"

func (r *Reconciler) mark(task *v1alpha1.NodeTask, reason, msg string) {
	meta.SetStatusCondition(&task.Status.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionAgentLost, Status: metav1.ConditionTrue, Reason: reason, Message: msg, ObservedGeneration: task.Generation,
	})
	log.Log.WithName("nodetask").Info("task lost its agent", "task", task.Name, "node", task.Spec.NodeName, "reason", reason, "message", msg)
}

// nodeGone reports whether the node is deleted: missing from the cache and from the API server.
func (r *Reconciler) nodeGone(ctx context.Context, name string) (bool, error) {
	var n corev1.Node
	err := r.Client.Get(ctx, client.ObjectKey{Name: name}, &n)
	if err == nil {
		return false, nil
	}
	if !apierrors.IsNotFound(err) {
		return false, err
	}
	err = r.Reader.Get(ctx, client.ObjectKey{Name: name}, &n)
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	return false, err
}
