package nodeoperation

import (
	"context"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/skeleton"
	"github.com/nodeops/nodeops/internal/gate"
	"github.com/nodeops/nodeops/internal/nodelock"
)

// SetupWithManager registers the NodeOperation controller with default tunables; locks is the
// node lock table shared with the NodeProfile controller.
func SetupWithManager(mgr ctrl.Manager, locks skeleton.Locker) error {
	return New(mgr.GetClient(), mgr.GetAPIReader(), locks, mgr.GetEventRecorder("nodeoperation-controller")).SetupWithManager(mgr)
}

// SetupWithManager registers r with mgr: it watches operations (spec changes), their tasks,
// tasks of others that free a node an operation waits for, nodes (labels, readiness and cordons),
// and the cordon records on nodes, for the operation that made them.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := skeleton.IndexTasksByOwner(context.Background(), mgr.GetFieldIndexer(), kind); err != nil {
		return err
	}
	if r.Gates == nil {
		g, err := gate.NewChecker(mgr.GetConfig(), mgr.GetAPIReader(), mgr.GetClient())
		if err != nil {
			return err
		}
		r.Gates = g
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("nodeoperation").
		// Annotations too: a person approves, retries or skips a gate with one.
		For(&v1alpha1.NodeOperation{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		Watches(&v1alpha1.NodeTask{}, r.ownTaskEvents()).
		Watches(&batchv1.Job{}, handler.EnqueueRequestsFromMapFunc(hookJobOwner)).
		Watches(&v1alpha1.NodeTask{}, handler.EnqueueRequestsFromMapFunc(r.waitingFor), builder.WithPredicates(changesHold())).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.unfinished), builder.WithPredicates(skeleton.NodeChanged(skeleton.NodeLabels|skeleton.NodeReadiness|skeleton.NodeSchedulable))).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.recordOwner), builder.WithPredicates(cordonRecordChanged())).
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Complete(r)
}

// ownTaskEvents enqueues the operation that controls a task, after a pause twice as long as the
// operation's last reconcile took to observe and decide. Every reconcile looks at all of the
// operation's tasks, so one per task event, back to back, would cost O(K²) for K nodes (at 5,000
// nodes a reconcile takes tens of milliseconds and thousands of tasks change). Batched, one
// operation's reconciles take at most a third of a core however many of its tasks change, and a
// small operation, reconciled in a millisecond, is not held back noticeably.
func (r *Reconciler) ownTaskEvents() handler.TypedEventHandler[client.Object, reconcile.Request] {
	enqueue := func(o client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		ref := skeleton.ControllerRef(o, kind)
		if ref == nil {
			return
		}
		req := reconcile.Request{NamespacedName: types.NamespacedName{Name: ref.Name}}
		if d := r.batchDelay(ref.Name); d > 0 {
			q.AddAfter(req, d)
			return
		}
		q.Add(req)
	}
	return handler.TypedFuncs[client.Object, reconcile.Request]{
		CreateFunc: func(_ context.Context, e event.TypedCreateEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(e.Object, q)
		},
		UpdateFunc: func(_ context.Context, e event.TypedUpdateEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(e.ObjectNew, q)
		},
		DeleteFunc: func(_ context.Context, e event.TypedDeleteEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(e.Object, q)
		},
	}
}

// batchDelay is how long task events of an operation wait to be reconciled: twice its last
// reconcile's observe and decide, at most a second.
func (r *Reconciler) batchDelay(op string) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return min(2*r.cost[op], time.Second)
}

// noteCost records how long a reconcile of op took.
func (r *Reconciler) noteCost(op string, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cost == nil {
		r.cost = map[string]time.Duration{}
	}
	r.cost[op] = d
}

// waitingFor wakes the operations waiting for the task's node.
func (r *Reconciler) waitingFor(_ context.Context, o client.Object) []reconcile.Request {
	task, ok := o.(*v1alpha1.NodeTask)
	if !ok {
		return nil
	}
	var out []reconcile.Request
	for _, op := range r.waitersOf(task.Spec.NodeName) {
		out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: op}})
	}
	return out
}

// changesHold passes task events after which the task no longer holds its node, and those after
// which a holding task starts or stops waiting for a person (it failed, or a person asked for its
// recovery, or the agent acted on it): an operation waiting for the node goes Blocked or back to
// Running on them.
func changesHold() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return true },
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, okO := e.ObjectOld.(*v1alpha1.NodeTask)
			n, okN := e.ObjectNew.(*v1alpha1.NodeTask)
			return okO && okN && nodelock.Holds(o) && (!nodelock.Holds(n) || failedUnrecovered(o) != failedUnrecovered(n))
		},
	}
}

// failedUnrecovered: the task failed and nobody has asked for its retry or skip yet.
func failedUnrecovered(t *v1alpha1.NodeTask) bool {
	return t.EffectivePhase() == v1alpha1.TaskFailed && t.Spec.RecoveryMode == ""
}

// unfinished maps a node event to every operation not yet finished: any of them may select it.
func (r *Reconciler) unfinished(ctx context.Context, _ client.Object) []reconcile.Request {
	var ops v1alpha1.NodeOperationList
	if err := r.Client.List(ctx, &ops, client.UnsafeDisableDeepCopy); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range ops.Items {
		if !ops.Items[i].Status.Phase.Finished() {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: ops.Items[i].Name}})
		}
	}
	return out
}
