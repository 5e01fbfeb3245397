package agentjob

import (
	"context"
	"fmt"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/taskpolicy"
)

// nodeIndex indexes NodeTasks by node for this controller.
const nodeIndex = "agentjob.spec.nodeName"

// +kubebuilder:rbac:groups=batch,resources=jobs,verbs=get;list;watch;create;delete,namespace=nodeops-system
// +kubebuilder:rbac:groups=nodeops.io,resources=nodetasks,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconciler keeps one agent Job per node whose tasks need an agent. Requests are keyed by node name.
type Reconciler struct {
	Client  client.Client
	Options Options
	// Recorder shows a failed task that gets no agent until a person asks (AwaitingPerson); nil for none.
	Recorder events.EventRecorder

	mu sync.Mutex
	// shown is the generation of each failed task last shown AwaitingPerson.
	shown map[types.UID]int64
}

// ReasonAwaitingPerson is the Event of a failed task for which no agent Job is made until a
// person sets its recoveryMode (a failure blocks until a person decides, rule 3).
const ReasonAwaitingPerson = "AwaitingPerson"

// showAwaitingPerson emits AwaitingPerson once per generation of each failed task of a node that
// gets no Job, so that the decision to run no agent can be seen.
func (r *Reconciler) showAwaitingPerson(node string, tasks []v1alpha1.NodeTask) {
	if r.Recorder == nil {
		return
	}
	for i := range tasks {
		t := &tasks[i]
		if t.EffectivePhase() != v1alpha1.TaskFailed || v1alpha1.IsGateCheck(t) {
			continue // a failed gate check is its gate's answer: no person is asked to recover it
		}
		r.mu.Lock()
		if r.shown == nil {
			r.shown = map[types.UID]int64{}
		}
		seen := r.shown[t.UID] == t.Generation
		r.shown[t.UID] = t.Generation
		r.mu.Unlock()
		if !seen {
			r.Recorder.Eventf(t, nil, corev1.EventTypeNormal, ReasonAwaitingPerson, "NoAgentJob",
				"task failed: no agent Job for node %s at generation %d until a person sets spec.recoveryMode (kubectl nodeops retry or skip)", node, t.Generation)
		}
	}
}

// Reconcile converges a node's agent Job: present while a task needs an agent, replaced once it
// finished while one still does.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	node := req.Name
	tasks := &v1alpha1.NodeTaskList{}
	if err := r.Client.List(ctx, tasks, client.MatchingFields{nodeIndex: node}); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing the tasks of node %s: %w", node, err)
	}
	need := false
	for i := range tasks.Items {
		if taskpolicy.NeedsAgent(&tasks.Items[i]) {
			need = true
			break
		}
	}
	if !need {
		r.showAwaitingPerson(node, tasks.Items)
		return ctrl.Result{}, nil
	}
	want := BuildJob(node, r.Options)
	job := &batchv1.Job{}
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(want), job)
	switch {
	case apierrors.IsNotFound(err):
		if err := r.Client.Create(ctx, want); err != nil && !apierrors.IsAlreadyExists(err) {
			return ctrl.Result{}, fmt.Errorf("creating agent job %s: %w", want.Name, err)
		}
		return ctrl.Result{}, nil
	case err != nil:
		return ctrl.Result{}, fmt.Errorf("reading agent job %s: %w", want.Name, err)
	case job.DeletionTimestamp != nil:
		return ctrl.Result{RequeueAfter: time.Second}, nil
	case finished(job):
		// The agent exited (idle, or failed) but the node has work again: start a new one.
		if err := r.Client.Delete(ctx, job, client.PropagationPolicy("Background")); err != nil && !apierrors.IsNotFound(err) {
			return ctrl.Result{}, fmt.Errorf("replacing agent job %s: %w", job.Name, err)
		}
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	return ctrl.Result{}, nil
}

// SetupWithManager registers the controller; the manager's cache must hold Jobs of o.Namespace.
func SetupWithManager(mgr ctrl.Manager, o Options) error {
	o = o.withDefaults()
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &v1alpha1.NodeTask{}, nodeIndex, func(obj client.Object) []string {
		return []string{obj.(*v1alpha1.NodeTask).Spec.NodeName}
	}); err != nil {
		return fmt.Errorf("indexing tasks by node: %w", err)
	}
	r := &Reconciler{Client: mgr.GetClient(), Options: o, Recorder: mgr.GetEventRecorder("agentjob")}
	byTask := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, obj client.Object) []reconcile.Request {
		t, ok := obj.(*v1alpha1.NodeTask)
		if !ok {
			return nil
		}
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: t.Spec.NodeName}}}
	})
	byJob := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, obj client.Object) []reconcile.Request {
		node := obj.GetAnnotations()[AnnotationNode]
		if obj.GetNamespace() != o.Namespace || obj.GetLabels()[LabelComponent] != componentAgent || node == "" {
			return nil
		}
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: node}}}
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("agentjob").
		Watches(&v1alpha1.NodeTask{}, byTask).
		Watches(&batchv1.Job{}, byJob).
		Complete(r)
}
