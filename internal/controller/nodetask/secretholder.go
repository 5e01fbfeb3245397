package nodetask

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/skeleton"
	"github.com/nodeops/nodeops/internal/kubeclient"
	"github.com/nodeops/nodeops/internal/secretholder"
)

// The secret holder pods (internal/secretholder): created and deleted in nodeops-system only. Creating
// a pod there that mounts a Secret reads it, so the manager can read nodeops-system's Secrets that way
// (Kubernetes' own rule; config/admission/manager-pods.yaml limits its pods to the holder's shape).
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;create;delete,namespace=nodeops-system
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// SecretHolderOptions configure the secret holder controller.
type SecretHolderOptions struct {
	secretholder.Options
}

// SecretHolderReconciler keeps one secret holder pod for each unfinished task whose scripts name
// Secrets, and none for any other: the node's kubelet then mounts those Secrets on the task's node,
// and only there, for as long as the task runs, which is where its agent reads them. It writes no
// status; the pod is its record, and events on the task say what it did or could not do.
type SecretHolderReconciler struct {
	// Client reads tasks from the manager's cache and writes pods.
	Client client.Client
	// Pods reads holder pods from their own cache (nodeops-system, the holder label only).
	Pods client.Reader
	// Live reads a pod that holds a holder's name without the holder's label, which Pods never sees.
	Live     client.Reader
	Options  secretholder.Options
	Recorder events.EventRecorder
}

// holderScope is one reconcile of one task's holder.
type holderScope struct {
	name string
	// task is nil when it is gone (the garbage collector removes its pod).
	task *v1alpha1.NodeTask
	// pod is the holder pod as cached, nil when there is none.
	pod *corev1.Pod
	// create and remove are decide's.
	create, remove *corev1.Pod
}

// SetupSecretHoldersWithManager registers the secret holder controller, with a cache of its own that
// holds only holder pods, so the manager caches no other pod of the cluster.
func SetupSecretHoldersWithManager(mgr ctrl.Manager, o SecretHolderOptions) error {
	holders, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
		DefaultNamespaces: map[string]cache.Config{secretholder.Namespace: {}},
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}: {Label: labels.SelectorFromSet(labels.Set{secretholder.LabelComponent: secretholder.Component})},
		},
		DefaultTransform: cache.TransformStripManagedFields(),
		NewInformer:      kubeclient.NewInformer,
	})
	if err != nil {
		return fmt.Errorf("secret holder pod cache: %w", err)
	}
	if err := mgr.Add(holders); err != nil {
		return fmt.Errorf("add the secret holder pod cache: %w", err)
	}
	r := &SecretHolderReconciler{Client: mgr.GetClient(), Pods: holders, Live: mgr.GetAPIReader(), Options: o.Options,
		Recorder: mgr.GetEventRecorder("nodetask-secretholder")}
	named := func(obj client.Object) bool {
		t, ok := obj.(*v1alpha1.NodeTask)
		return ok && len(secretholder.SecretNames(&t.Spec)) > 0
	}
	// Heartbeats never pass: only a task that names Secrets, when it appears or whether it wants a
	// holder changes (it finished, or a retry made it unfinished again).
	tasks := predicate.Funcs{
		CreateFunc: func(e event.CreateEvent) bool { return named(e.Object) },
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, okO := e.ObjectOld.(*v1alpha1.NodeTask)
			n, okN := e.ObjectNew.(*v1alpha1.NodeTask)
			return okO && okN && named(n) && secretholder.Wanted(o) != secretholder.Wanted(n)
		},
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(e event.GenericEvent) bool { return named(e.Object) },
	}
	toTask := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, obj client.Object) []reconcile.Request {
		if ref := skeleton.ControllerRef(obj, "NodeTask"); ref != nil {
			return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: ref.Name}}}
		}
		return nil
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("nodetask-secretholder").
		For(&v1alpha1.NodeTask{}, builder.WithPredicates(tasks)).
		WatchesRawSource(source.Kind(holders, client.Object(&corev1.Pod{}), toTask)).
		Complete(r)
}

// Reconcile converges the task's holder pod: observe, decide, act (no status to write).
func (r *SecretHolderReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	return skeleton.Run(ctx, &holderScope{name: req.Name}, skeleton.Steps[*holderScope]{
		Observe:     r.observe,
		Decide:      decideHolder(r.Options),
		WriteStatus: func(context.Context, *holderScope) (ctrl.Result, error) { return ctrl.Result{}, nil },
		Act:         r.act,
	})
}

func (r *SecretHolderReconciler) observe(ctx context.Context, s *holderScope) error {
	task := &v1alpha1.NodeTask{}
	switch err := r.Client.Get(ctx, client.ObjectKey{Name: s.name}, task); {
	case apierrors.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("reading NodeTask %s: %w", s.name, err)
	default:
		s.task = task
	}
	pod := &corev1.Pod{}
	switch err := r.Pods.Get(ctx, client.ObjectKey{Namespace: secretholder.Namespace, Name: secretholder.PodName(s.name)}, pod); {
	case apierrors.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("reading the secret holder pod of NodeTask %s: %w", s.name, err)
	default:
		s.pod = pod
	}
	return nil
}

// decideHolder is the pure decision: the task's pod when it wants one and has none; the removal of a
// pod it does not want, or of one under its name that another task (an earlier task of the same name)
// controls. A task that is gone is left to the garbage collector.
func decideHolder(o secretholder.Options) func(*holderScope) {
	return func(s *holderScope) {
		if s.task == nil {
			return
		}
		want := secretholder.Wanted(s.task)
		ours := s.pod != nil && secretholder.OwnedBy(s.pod, s.task.UID)
		switch {
		case s.pod != nil && s.pod.DeletionTimestamp != nil:
			// On its way out: its deletion's event brings the next reconcile, which creates anew.
		case s.pod != nil && (!want || !ours):
			s.remove = s.pod
		case s.pod == nil && want:
			s.create = secretholder.Build(s.task, o)
		}
	}
}

func (r *SecretHolderReconciler) act(ctx context.Context, s *holderScope) (ctrl.Result, error) {
	logger := log.FromContext(ctx).WithValues("task", s.name)
	if p := s.remove; p != nil {
		err := r.Client.Delete(ctx, p, client.Preconditions{UID: &p.UID})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			r.event(s.task, corev1.EventTypeWarning, "SecretHolderDeleteFailed", "DeleteSecretHolder", "could not delete pod %s/%s: %v", p.Namespace, p.Name, err)
			return ctrl.Result{}, fmt.Errorf("deleting secret holder pod %s: %w", p.Name, err)
		}
		logger.Info("deleted the secret holder pod", "pod", p.Name)
		r.event(s.task, corev1.EventTypeNormal, "SecretHolderDeleted", "DeleteSecretHolder", "deleted pod %s/%s: the task no longer needs its Secrets on node %s", p.Namespace, p.Name, s.task.Spec.NodeName)
	}
	if p := s.create; p != nil {
		err := r.Client.Create(ctx, p)
		switch {
		case apierrors.IsAlreadyExists(err):
			return r.nameTaken(ctx, s, p)
		case err != nil:
			r.event(s.task, corev1.EventTypeWarning, "SecretHolderCreateFailed", "CreateSecretHolder", "could not create pod %s/%s, so its scripts cannot read their Secrets: %v", p.Namespace, p.Name, err)
			return ctrl.Result{}, fmt.Errorf("creating secret holder pod %s: %w", p.Name, err)
		}
		logger.Info("created the secret holder pod", "pod", p.Name, "node", p.Spec.NodeName)
		r.event(s.task, corev1.EventTypeNormal, "SecretHolderCreated", "CreateSecretHolder", "created pod %s/%s on node %s, whose kubelet mounts Secrets %v for the task's scripts", p.Namespace, p.Name, p.Spec.NodeName, secretholder.SecretNames(&s.task.Spec))
	}
	return ctrl.Result{}, nil
}

// nameTaken handles a holder's name taken by a pod the holder cache does not hold: the task's own (the
// cache is behind; its event comes) or a pod without the holder's label, whose events never come. That
// one is not the task's holder and is deleted, so the holder is made again; nothing else would retry it.
func (r *SecretHolderReconciler) nameTaken(ctx context.Context, s *holderScope, want *corev1.Pod) (ctrl.Result, error) {
	if r.Live == nil {
		return ctrl.Result{}, nil
	}
	found := &corev1.Pod{}
	switch err := r.Live.Get(ctx, client.ObjectKeyFromObject(want), found); {
	case apierrors.IsNotFound(err):
		return ctrl.Result{RequeueAfter: time.Second}, nil
	case err != nil:
		return ctrl.Result{}, fmt.Errorf("reading pod %s, which holds the secret holder's name: %w", want.Name, err)
	case secretholder.OwnedBy(found, s.task.UID):
		return ctrl.Result{}, nil // the pod's event brings the cache up to it
	case found.DeletionTimestamp == nil:
		err := r.Client.Delete(ctx, found, client.Preconditions{UID: &found.UID})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return ctrl.Result{}, fmt.Errorf("deleting pod %s, which holds the secret holder's name: %w", found.Name, err)
		}
		r.event(s.task, corev1.EventTypeWarning, "SecretHolderNameTaken", "DeleteSecretHolder",
			"deleted pod %s/%s, which had the name of the task's secret holder and is not it; the holder is made again", found.Namespace, found.Name)
	}
	// The pod is not in the holder cache, so no event of its deletion comes: look again.
	return ctrl.Result{RequeueAfter: time.Second}, nil
}

func (r *SecretHolderReconciler) event(task *v1alpha1.NodeTask, kind, reason, action, note string, args ...any) {
	if r.Recorder != nil && task != nil {
		r.Recorder.Eventf(task, nil, kind, reason, action, note, args...)
	}
}
