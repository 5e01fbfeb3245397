package nodetask

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// +kubebuilder:rbac:groups=nodeops.io,resources=nodetasks,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=nodeops.io,resources=nodetasks/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconciler acts on recoveryMode.
type Reconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
}

// SetupWithManager registers the NodeTask recovery controller.
func SetupWithManager(mgr ctrl.Manager) error {
	r := &Reconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("nodetask-controller")}
	return ctrl.NewControllerManagedBy(mgr).
		Named("nodetask").
		For(&v1alpha1.NodeTask{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			t, ok := o.(*v1alpha1.NodeTask)
			return ok && needsRecovery(t)
		}))).
		Complete(r)
}

// Reconcile records the recovery in status first (recoveredGeneration marks it done, so it is
// never applied twice), then clears spec.recoveryMode.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var task v1alpha1.NodeTask
	if err := r.Client.Get(ctx, req.NamespacedName, &task); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if task.Spec.RecoveryMode == v1alpha1.RecoveryNone {
		return ctrl.Result{}, nil
	}
	if needsRecovery(&task) {
		st, note, acted := recover(&task, metav1.NewMicroTime(time.Now()))
		orig := task.DeepCopy()
		task.Status = st
		// Optimistic lock: the agent writes status too, and a recovery computed from a stale
		// status must not overwrite its report.
		if err := r.Client.Status().Patch(ctx, &task, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
			return ctrl.Result{}, fmt.Errorf("record %s on NodeTask %s: %w", orig.Spec.RecoveryMode, task.Name, err)
		}
		if r.Recorder != nil {
			kind, reason := corev1.EventTypeNormal, ReasonRetried
			switch {
			case !acted:
				kind, reason = corev1.EventTypeWarning, ReasonRecoveryIgnored
			case orig.Spec.RecoveryMode == v1alpha1.RecoverySkip:
				reason = ReasonSkipped
			}
			r.Recorder.Eventf(&task, nil, kind, reason, string(orig.Spec.RecoveryMode), "%s", note)
		}
	}
	orig := task.DeepCopy()
	task.Spec.RecoveryMode = v1alpha1.RecoveryNone
	if err := r.Client.Patch(ctx, &task, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		return ctrl.Result{}, fmt.Errorf("clear recoveryMode on NodeTask %s: %w", task.Name, err)
	}
	return ctrl.Result{}, nil
}
