package clustertarget

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/clock"
	"github.com/nodeops/nodeops/internal/controller/skeleton"
	"github.com/nodeops/nodeops/internal/kubeclient"
)

// SetupWithManager registers the ClusterTarget controller and the installer that creates the
// ClusterTarget from what it observes when there is none.
func SetupWithManager(mgr ctrl.Manager) error {
	r := &Reconciler{Client: mgr.GetClient(), NodesInterval: 5 * time.Second}
	if err := r.SetupWithManager(mgr); err != nil {
		return err
	}
	return mgr.Add(&Installer{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Interval: 10 * time.Second})
}

// SetupWithManager registers r with mgr. kube-system's kubeadm-config and control-plane mirror
// pods, and its CA bundle kube-root-ca.crt (all its ConfigMaps: a field selector names one), come
// from a cache of their own, so that the manager caches neither every ConfigMap nor
// every Pod of the cluster. Watches pass only what changes the status: spec edits, operation
// phases and conditions, node kubelet versions, labels and certificate readings (never heartbeats), kubeadm-config,
// mirror pod images, and tasks' certificate readings.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	system, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
		DefaultNamespaces: map[string]cache.Config{KubeadmConfig.Namespace: {}},
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}: {Label: labels.SelectorFromSet(labels.Set{"tier": "control-plane"})},
		},
		DefaultTransform: cache.TransformStripManagedFields(),
		NewInformer:      kubeclient.NewInformer,
	})
	if err != nil {
		return fmt.Errorf("kube-system cache: %w", err)
	}
	if err := mgr.Add(system); err != nil {
		return fmt.Errorf("add kube-system cache: %w", err)
	}
	if r.System == nil {
		r.System = system
	}
	toTarget := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: v1alpha1.ClusterTargetName}}}
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("clustertarget").
		For(&v1alpha1.ClusterTarget{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Owns(&v1alpha1.NodeOperation{}, builder.WithPredicates(operationChanged())).
		Watches(&v1alpha1.NodeOperation{}, toTarget, builder.WithPredicates(handMadeOperationChanged())).
		Watches(&corev1.Node{}, toTarget, builder.WithPredicates(nodeChanged())).
		Watches(&v1alpha1.NodeTask{}, toTarget, builder.WithPredicates(certificatesChanged())).
		WatchesRawSource(source.Kind(system, client.Object(&corev1.ConfigMap{}), toTarget, isClusterConfigMap())).
		WatchesRawSource(source.Kind(system, client.Object(&corev1.Pod{}), toTarget, mirrorImageChanged())).
		Complete(r)
}

func updates(f func(o, n client.Object) bool) predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool { return f(e.ObjectOld, e.ObjectNew) },
		GenericFunc: func(event.GenericEvent) bool { return false }}
}

// operationChanged passes an operation's phase or condition status changes, not its progress counts.
func operationChanged() predicate.Predicate {
	return updates(func(o, n client.Object) bool {
		a, okA := o.(*v1alpha1.NodeOperation)
		b, okB := n.(*v1alpha1.NodeOperation)
		if !okA || !okB || a.Status.Phase != b.Status.Phase || (a.Status.CompletionTime == nil) != (b.Status.CompletionTime == nil) ||
			rotationPhase(a) != rotationPhase(b) {
			return true
		}
		return !equality.Semantic.DeepEqual(conditionStates(a.Status.Conditions), conditionStates(b.Status.Conditions))
	})
}

// handMadeOperationChanged passes the NodeOperations no ClusterTarget controls as they appear, go
// or change phase: while one runs, a rotation made by hand holds everything the ClusterTarget
// would generate, and an upgrade, renewal or reconfigure made by hand holds a rotation.
func handMadeOperationChanged() predicate.Predicate {
	handMade := func(o client.Object) bool {
		ref := metav1.GetControllerOf(o)
		return ref == nil || ref.Kind != kind
	}
	return predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return handMade(e.Object) },
		DeleteFunc:  func(e event.DeleteEvent) bool { return handMade(e.Object) },
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			a, okA := e.ObjectOld.(*v1alpha1.NodeOperation)
			b, okB := e.ObjectNew.(*v1alpha1.NodeOperation)
			return okA && okB && handMade(b) && a.Status.Phase != b.Status.Phase
		},
	}
}

func conditionStates(cs []metav1.Condition) map[string]string {
	out := map[string]string{}
	for _, c := range cs {
		out[c.Type] = string(c.Status) + "/" + c.Reason
	}
	return out
}

// nodeChanged passes a node's creation, deletion, and the updates that change its labels, its
// kubelet version or its agent's certificate or drift reading.
func nodeChanged() predicate.Predicate {
	return skeleton.NodeChanged(skeleton.NodeLabels|skeleton.NodeKubeletVersion, v1alpha1.AnnotationCertificates, v1alpha1.AnnotationDrift)
}

// certificatesChanged passes tasks whose certificate reading counts (succeeded, with
// certificates) as it appears, changes or goes.
func certificatesChanged() predicate.Predicate {
	reading := func(o client.Object) bool {
		t, ok := o.(*v1alpha1.NodeTask)
		return ok && t.Status.Phase == v1alpha1.TaskSucceeded && len(t.Status.Certificates) > 0
	}
	return predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return reading(e.Object) },
		DeleteFunc:  func(e event.DeleteEvent) bool { return reading(e.Object) },
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			a, okA := e.ObjectOld.(*v1alpha1.NodeTask)
			b, okB := e.ObjectNew.(*v1alpha1.NodeTask)
			if !okA || !okB || reading(a) != reading(b) {
				return okA && okB
			}
			return reading(b) && !equality.Semantic.DeepEqual(a.Status.Certificates, b.Status.Certificates)
		},
	}
}

// isClusterConfigMap passes kubeadm-config, kubelet-config and the cluster CA bundle, of kube-system's ConfigMaps.
func isClusterConfigMap() predicate.TypedPredicate[client.Object] {
	return predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetNamespace() == KubeadmConfig.Namespace && (o.GetName() == KubeadmConfig.Name || o.GetName() == KubeletConfig.Name || o.GetName() == RootCAConfigMap)
	})
}

// mirrorImageChanged passes mirror pods appearing, going, or changing image or node; not their status.
func mirrorImageChanged() predicate.TypedPredicate[client.Object] {
	key := func(o client.Object) string {
		p, ok := o.(*corev1.Pod)
		if !ok || len(p.Spec.Containers) == 0 {
			return ""
		}
		return p.Spec.NodeName + "|" + p.Labels["component"] + "|" + p.Spec.Containers[0].Image
	}
	return predicate.Funcs{
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc:  func(e event.UpdateEvent) bool { return key(e.ObjectOld) != key(e.ObjectNew) },
	}
}

// Installer creates the ClusterTarget from what it observes when there is none, once: it never
// updates one, so a person's edit is never overwritten.
type Installer struct {
	Client client.Client
	// Reader reads past the cache.
	Reader   client.Reader
	Interval time.Duration
}

var _ manager.LeaderElectionRunnable = (*Installer)(nil)

// NeedLeaderElection: only the leader creates.
func (i *Installer) NeedLeaderElection() bool { return true }

// Start tries until the ClusterTarget exists (kubeadm-config may appear later), then returns.
func (i *Installer) Start(ctx context.Context) error {
	logged := false
	for {
		created, problem, err := Install(ctx, i.Client, i.Reader)
		switch {
		case err != nil:
			log.FromContext(ctx).Error(err, "create the ClusterTarget")
		case problem != "" && !logged:
			log.FromContext(ctx).Info("not creating the ClusterTarget yet", "why", problem)
			logged = true
		case problem == "":
			if created {
				log.FromContext(ctx).Info("created the ClusterTarget from the cluster as observed")
			}
			return nil
		}
		if clock.Sleep(ctx, i.Interval) != nil {
			return nil
		}
	}
}

// Install creates the ClusterTarget at the observed version when it does not exist. problem
// says why it cannot yet (no kubeadm-config); an existing ClusterTarget is left as it is.
func Install(ctx context.Context, c client.Client, reader client.Reader) (created bool, problem string, err error) {
	var ct v1alpha1.ClusterTarget
	err = reader.Get(ctx, types.NamespacedName{Name: v1alpha1.ClusterTargetName}, &ct)
	if err == nil {
		return false, "", nil
	}
	if !apierrors.IsNotFound(err) {
		return false, "", fmt.Errorf("read ClusterTarget: %w", err)
	}
	v, problem, err := ClusterVersion(ctx, reader)
	if err != nil || problem != "" {
		return false, problem, err
	}
	ct = v1alpha1.ClusterTarget{
		ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ClusterTargetName},
		Spec:       v1alpha1.ClusterTargetSpec{KubernetesVersion: v},
	}
	if err := c.Create(ctx, &ct); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return false, "", nil
		}
		return false, "", fmt.Errorf("create ClusterTarget: %w", err)
	}
	return true, "", nil
}
