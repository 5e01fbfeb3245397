package nodetask

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/drain"
	"github.com/nodeops/nodeops/internal/statuswrite"
	"github.com/nodeops/nodeops/internal/transient"
)

// The manager drains, so that no agent holds the right to evict (agents confined to their own node, rule 10):
// an Eviction names no node, so only who evicts can confine evictions to a task's node.
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list
// +kubebuilder:rbac:groups="",resources=pods/eviction,verbs=create
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=list

// DefaultDrainWorkers is how many drains the manager runs at once.
const DefaultDrainWorkers = 32

// DrainOptions configure the drain controller.
type DrainOptions struct {
	// Workers: zero for DefaultDrainWorkers.
	Workers int
	// Poll is how often a drain looks again at the pods it waits for; zero for the drain's default.
	Poll time.Duration
	// Self is the manager's own pod, which its drains leave; empty outside a pod.
	Self types.NamespacedName
	// Clock measures drains' timeouts; the real clock when nil (see drain.Target.Clock).
	Clock clock.WithDelayedExecution
}

// DrainReconciler drains the node of a task whose agent asks for it (a running command that
// drains, with its status.commands[i].drain set) and records the outcome in the task's condition
// Drained, its one status write per drain; the agent then ends the command with that outcome.
// The drain is exactly the drain command's (internal/drain): only pods of the task's node are
// evicted, and only for a command whose spec drains.
type DrainReconciler struct {
	// Client reads tasks from the cache and writes evictions and the condition.
	Client client.Client
	// Reader reads without a cache: the node's pods, disruption budgets, and the task before the
	// drain and its write.
	Reader client.Reader
	Poll   time.Duration
	// Self is the manager's own pod, which a drain leaves (see drain.Target.Manager).
	Self types.NamespacedName
	// Clock measures drains' timeouts; the real clock when nil.
	Clock clock.WithDelayedExecution
}

// SetupDrainWithManager registers the drain controller.
func SetupDrainWithManager(mgr ctrl.Manager, o DrainOptions) error {
	if o.Workers <= 0 {
		o.Workers = DefaultDrainWorkers
	}
	r := &DrainReconciler{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Poll: o.Poll, Self: o.Self, Clock: o.Clock}
	pending := func(obj client.Object) bool {
		t, ok := obj.(*v1alpha1.NodeTask)
		if !ok {
			return false
		}
		_, _, ok = t.DrainPending()
		return ok
	}
	// Only tasks that wait for a drain come here, so a worker held by a long drain holds up no other task.
	return ctrl.NewControllerManagedBy(mgr).
		Named("nodetask-drain").
		For(&v1alpha1.NodeTask{}, builder.WithPredicates(predicate.Funcs{
			CreateFunc:  func(e event.CreateEvent) bool { return pending(e.Object) },
			UpdateFunc:  func(e event.UpdateEvent) bool { return pending(e.ObjectNew) },
			DeleteFunc:  func(event.DeleteEvent) bool { return false },
			GenericFunc: func(e event.GenericEvent) bool { return pending(e.Object) },
		})).
		WithOptions(controller.Options{MaxConcurrentReconciles: o.Workers}).
		Complete(r)
}

// Reconcile drains for the task's pending request, read from the API server so that a stale cache
// never drains again for a run already answered, and records the outcome.
func (r *DrainReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var cached v1alpha1.NodeTask
	if err := r.Client.Get(ctx, req.NamespacedName, &cached); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if _, _, ok := cached.DrainPending(); !ok {
		return ctrl.Result{}, nil
	}
	task, err := r.read(ctx, req.NamespacedName)
	if task == nil || err != nil {
		return ctrl.Result{}, err
	}
	i, d, ok := task.DrainPending()
	if !ok {
		return ctrl.Result{}, nil
	}
	cs := task.Status.Commands[i]
	key := v1alpha1.DrainKey(cs.Name, cs.Attempt)
	logger := log.FromContext(ctx).WithValues("task", task.Name, "node", task.Spec.NodeName, "run", key)
	logger.Info("draining for the task's agent")

	var out strings.Builder
	target := drain.Target{
		Node:     task.Spec.NodeName,
		AgentPod: agentPod(cs.Drain),
		Manager:  r.Self,
		Client:   r.Client,
		Reader:   r.Reader,
		DryRun:   task.Spec.ExecutionMode == v1alpha1.ExecutionDryRun,
		Poll:     r.Poll,
		Out:      &out,
		Clock:    r.Clock,
	}
	msg, derr := drain.Run(ctx, target, d)
	if ctx.Err() != nil {
		return ctrl.Result{}, ctx.Err() // the manager is stopping: the next one drains again
	}
	o := v1alpha1.DrainOutcome{Succeeded: derr == nil, Message: msg, Log: out.String()}
	if derr != nil {
		o.Message = derr.Error()
	}
	if err := r.record(ctx, task, i, key, o); err != nil {
		return ctrl.Result{}, err
	}
	logger.Info("drained for the task's agent", "succeeded", o.Succeeded, "message", o.Message)
	return ctrl.Result{}, nil
}

// read is the task from the API server, a moment's failure waited out; nil when it is gone.
func (r *DrainReconciler) read(ctx context.Context, key types.NamespacedName) (*v1alpha1.NodeTask, error) {
	task := &v1alpha1.NodeTask{}
	err := transient.Retry(ctx, func() error { return r.Reader.Get(ctx, key, task) })
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading NodeTask %s: %w", key.Name, err)
	}
	return task, nil
}

// drainedRule: the manager's Drained condition alone (the agent writes every other field; one
// writer per field, NodeTaskStatus), under a lock, so that it never answers a run it has not read.
var drainedRule = statuswrite.Rule{Kind: "NodeTask", Fields: statuswrite.ConditionsOnly, Owned: []string{v1alpha1.ConditionDrained}, Lock: true}

// record writes the Drained condition for run key (drainedRule); on a conflict it reads the task
// again and writes only if the same run still waits (an agent that gave up, or a person's abort,
// needs no answer).
func (r *DrainReconciler) record(ctx context.Context, task *v1alpha1.NodeTask, i int, key string, o v1alpha1.DrainOutcome) error {
	for {
		if j, _, ok := task.DrainPending(); !ok || j != i || v1alpha1.DrainKey(task.Status.Commands[i].Name, task.Status.Commands[i].Attempt) != key {
			return nil
		}
		obj := task.DeepCopy()
		meta.SetStatusCondition(&obj.Status.Conditions, v1alpha1.DrainedCondition(key, o, task.Generation))
		err := transient.Retry(ctx, func() error {
			_, _, werr := statuswrite.Write(ctx, r.Client, drainedRule, nil, statuswrite.Change{Orig: task, Obj: obj, Urgent: true})
			return werr
		})
		if err == nil {
			return nil
		}
		if !errors.Is(err, statuswrite.ErrStale) {
			return fmt.Errorf("write the Drained condition of NodeTask %s: %w", task.Name, err)
		}
		fresh, rerr := r.read(ctx, client.ObjectKeyFromObject(task))
		if fresh == nil || rerr != nil {
			return rerr
		}
		task = fresh
	}
}

// agentPod is the pod the requesting agent runs in, which its drain spares.
func agentPod(req *v1alpha1.DrainRequest) types.NamespacedName {
	if req == nil {
		return types.NamespacedName{}
	}
	ns, name, ok := strings.Cut(req.AgentPod, "/")
	if !ok {
		return types.NamespacedName{}
	}
	return types.NamespacedName{Namespace: ns, Name: name}
}
