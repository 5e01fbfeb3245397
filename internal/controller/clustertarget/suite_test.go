package clustertarget_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/clustertarget"
	"github.com/nodeops/nodeops/internal/controller/nodeoperation"
	"github.com/nodeops/nodeops/internal/controller/nodetask"
	"github.com/nodeops/nodeops/internal/nodelock"
	"github.com/nodeops/nodeops/internal/objname"
	"github.com/nodeops/nodeops/internal/plan"
	"github.com/nodeops/nodeops/internal/testutil"
)

// One API server and one manager (NodeOperation, NodeTask and ClusterTarget controllers) for the
// package. The ClusterTarget is a singleton, so tests run one after another and each resets the
// cluster first.
var env *testutil.Env

// installedVersion is kubeadm-config's version when the manager starts, so that the installer
// creates the ClusterTarget from it.
const installedVersion = "v1.37.2"

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	logf.SetLogger(testutil.Logger())
	var err error
	env, err = testutil.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := env.Client.Create(ctx, kubeadmConfig(installedVersion)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	stop, err := testutil.StartManager(env.Config, env.Scheme, func(mgr manager.Manager, locks *nodelock.Table) error {
		r := nodeoperation.New(mgr.GetClient(), mgr.GetAPIReader(), locks, mgr.GetEventRecorder("nodeoperation-controller"))
		r.StatusInterval = 100 * time.Millisecond
		for _, setup := range []func() error{
			func() error { return r.SetupWithManager(mgr) },
			func() error { return nodetask.SetupWithManager(mgr) },
			func() error { return clustertarget.SetupWithManager(mgr) },
		} {
			if err := setup(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer stop()
	// The manager's installer creates the ClusterTarget from kubeadm-config at start.
	if err := waitInstalled(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

func waitInstalled(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var ct v1alpha1.ClusterTarget
	if err := testutil.Poll(ctx, 100*time.Millisecond, func(ctx context.Context) error {
		return env.Client.Get(ctx, client.ObjectKey{Name: "cluster"}, &ct)
	}); err != nil {
		return fmt.Errorf("the manager did not create the ClusterTarget: %w", err)
	}
	if ct.Spec.KubernetesVersion != installedVersion {
		return fmt.Errorf("installed ClusterTarget at %s, want %s", ct.Spec.KubernetesVersion, installedVersion)
	}
	return nil
}

func kubeadmConfig(v string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kubeadm-config"},
		Data:       map[string]string{"ClusterConfiguration": "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\nkubernetesVersion: " + v + "\n"},
	}
}

type fixture struct {
	t   *testing.T
	ctx context.Context
	c   client.WithWatch
}

func newFixture(t *testing.T) *fixture {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return &fixture{t: t, ctx: ctx, c: env.Client}
}

func (f *fixture) must(err error) {
	f.t.Helper()
	if err != nil {
		f.t.Fatal(err)
	}
}

// reset empties the cluster of nodes, operations, tasks, mirror pods and the ClusterTarget, then
// makes it a kubeadm cluster at version with a control plane cp-1 and a worker w-1, and a
// ClusterTarget at that version with a binary source.
func (f *fixture) reset(version string) {
	f.t.Helper()
	f.empty(version)
	f.must(f.c.Create(f.ctx, &v1alpha1.ClusterTarget{ObjectMeta: metav1.ObjectMeta{Name: "cluster"}, Spec: v1alpha1.ClusterTargetSpec{
		KubernetesVersion: version,
		Upgrade:           v1alpha1.ClusterUpgrade{BinarySource: &v1alpha1.BinarySource{BaseURL: "https://binaries.example"}},
	}}))
}

// empty is reset without a ClusterTarget.
func (f *fixture) empty(version string) {
	f.t.Helper()
	ctx := f.ctx
	// Deleted again on every try: a reconcile in flight may still create an operation.
	testutil.Eventually(f.t, 30*time.Second, "cluster emptied", func() error {
		for _, err := range []error{
			client.IgnoreNotFound(f.c.Delete(ctx, &v1alpha1.ClusterTarget{ObjectMeta: metav1.ObjectMeta{Name: "cluster"}})),
			f.c.DeleteAllOf(ctx, &v1alpha1.NodeOperation{}),
			f.c.DeleteAllOf(ctx, &v1alpha1.NodeTask{}),
			f.c.DeleteAllOf(ctx, &corev1.Node{}),
			f.c.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace("kube-system"), client.GracePeriodSeconds(0)),
		} {
			if err != nil {
				return err
			}
		}
		var ops v1alpha1.NodeOperationList
		var tasks v1alpha1.NodeTaskList
		var nodes corev1.NodeList
		var pods corev1.PodList
		var ct v1alpha1.ClusterTarget
		for _, l := range []client.ObjectList{&ops, &tasks, &nodes} {
			if err := f.c.List(ctx, l); err != nil {
				return err
			}
		}
		if err := f.c.List(ctx, &pods, client.InNamespace("kube-system")); err != nil {
			return err
		}
		if err := f.c.Get(ctx, client.ObjectKey{Name: "cluster"}, &ct); !apierrors.IsNotFound(err) {
			return fmt.Errorf("ClusterTarget still there (%w)", err)
		}
		if n := len(ops.Items) + len(tasks.Items) + len(nodes.Items) + len(pods.Items); n > 0 {
			return fmt.Errorf("%d objects left", n)
		}
		return nil
	})
	f.setClusterVersion(version)
	f.node("cp-1", true, version)
	f.node("w-1", false, version)
	f.mirrorPod("cp-1", version)
}

func (f *fixture) setClusterVersion(v string) {
	f.t.Helper()
	cm := kubeadmConfig(v)
	f.must(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cur corev1.ConfigMap
		if err := f.c.Get(f.ctx, client.ObjectKeyFromObject(cm), &cur); err != nil {
			return err
		}
		cur.Data = cm.Data
		return f.c.Update(f.ctx, &cur)
	}))
}

// node creates a Ready node whose kubelet reports version.
func (f *fixture) node(name string, controlPlane bool, version string) {
	f.t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
	if controlPlane {
		n.Labels[plan.LabelControlPlane] = ""
	}
	n.Status.NodeInfo.KubeletVersion = version
	f.must(testutil.CreateNode(f.ctx, f.c, n, true))
}

func (f *fixture) nodeStatus(name, version string) {
	f.t.Helper()
	f.must(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var n corev1.Node
		if err := f.c.Get(f.ctx, client.ObjectKey{Name: name}, &n); err != nil {
			return err
		}
		n.Status.NodeInfo.KubeletVersion = version
		n.Status.Conditions = testutil.NodeConditions(true)
		return f.c.Status().Update(f.ctx, &n)
	}))
}

// mirrorPod creates or updates the kube-apiserver mirror pod of node at version.
func (f *fixture) mirrorPod(node, version string) {
	f.t.Helper()
	name := "kube-apiserver-" + node
	image := "registry.k8s.io/kube-apiserver:" + version
	var p corev1.Pod
	err := f.c.Get(f.ctx, client.ObjectKey{Namespace: "kube-system", Name: name}, &p)
	if apierrors.IsNotFound(err) {
		f.must(f.c.Create(f.ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: name,
				Labels:      map[string]string{"component": "kube-apiserver", "tier": "control-plane"},
				Annotations: map[string]string{"kubernetes.io/config.mirror": "hash"}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "kube-apiserver", Image: image}}},
		}))
		return
	}
	f.must(err)
	p.Spec.Containers[0].Image = image
	f.must(f.c.Update(f.ctx, &p))
}

func (f *fixture) target() *v1alpha1.ClusterTarget {
	f.t.Helper()
	var ct v1alpha1.ClusterTarget
	f.must(f.c.Get(f.ctx, client.ObjectKey{Name: "cluster"}, &ct))
	return &ct
}

func (f *fixture) edit(mutate func(*v1alpha1.ClusterTarget)) {
	f.t.Helper()
	f.must(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var ct v1alpha1.ClusterTarget
		if err := f.c.Get(f.ctx, client.ObjectKey{Name: "cluster"}, &ct); err != nil {
			return err
		}
		mutate(&ct)
		return f.c.Update(f.ctx, &ct)
	}))
}

// observed edits upgrade.maxUnavailable, which nothing here depends on while no upgrade is due, and
// waits until the controller observed that generation, which it returns: the controller reconciles
// the one ClusterTarget at a time, so whatever it would do on what it saw before is done by then.
func (f *fixture) observed() int64 {
	f.t.Helper()
	var gen int64
	f.edit(func(ct *v1alpha1.ClusterTarget) {
		mu := intstr.FromInt32(2)
		if m := ct.Spec.Upgrade.MaxUnavailable; m != nil && m.IntValue() == 2 {
			mu = intstr.FromInt32(1)
		}
		ct.Spec.Upgrade.MaxUnavailable = &mu
		gen = ct.Generation + 1
	})
	testutil.Eventually(f.t, 30*time.Second, fmt.Sprintf("ClusterTarget generation %d observed", gen), func() error {
		if ct := f.target(); ct.Status.ObservedGeneration < gen {
			return fmt.Errorf("generation %d observed %d", ct.Generation, ct.Status.ObservedGeneration)
		}
		return nil
	})
	return gen
}

// waitCondition waits for the ClusterTarget's condition to have status and reason.
func (f *fixture) waitCondition(t string, s metav1.ConditionStatus, reason string) *v1alpha1.ClusterTarget {
	f.t.Helper()
	var ct *v1alpha1.ClusterTarget
	testutil.Eventually(f.t, 30*time.Second, fmt.Sprintf("ClusterTarget %s=%s (%s)", t, s, reason), func() error {
		ct = f.target()
		c := meta.FindStatusCondition(ct.Status.Conditions, t)
		if ct.Status.ObservedGeneration != ct.Generation || c == nil || c.Status != s || (reason != "" && c.Reason != reason) {
			return fmt.Errorf("generation %d observed %d, phase %s, conditions %+v", ct.Generation, ct.Status.ObservedGeneration, ct.Status.Phase, ct.Status.Conditions)
		}
		return nil
	})
	return ct
}

func (f *fixture) operations() []v1alpha1.NodeOperation {
	f.t.Helper()
	var ops v1alpha1.NodeOperationList
	f.must(f.c.List(f.ctx, &ops))
	sort.Slice(ops.Items, func(i, j int) bool { return ops.Items[i].Name < ops.Items[j].Name })
	return ops.Items
}

func names(ops []v1alpha1.NodeOperation) []string {
	var out []string
	for _, op := range ops {
		out = append(out, op.Name)
	}
	return out
}

// waitOperations waits until exactly the named operations exist.
func (f *fixture) waitOperations(want ...string) []v1alpha1.NodeOperation {
	f.t.Helper()
	var ops []v1alpha1.NodeOperation
	testutil.Eventually(f.t, 30*time.Second, fmt.Sprintf("operations %v", want), func() error {
		ops = f.operations()
		if got := strings.Join(names(ops), ","); got != strings.Join(want, ",") {
			return fmt.Errorf("operations %q", got)
		}
		return nil
	})
	return ops
}

// stillOperations checks, several times over a while, that exactly the named operations exist:
// the ClusterTarget generated nothing more. It waits on the status having settled first.
func (f *fixture) stillOperations(want ...string) {
	f.t.Helper()
	testutil.Consistently(f.t, 1500*time.Millisecond, "no other operation", func() error {
		if got := strings.Join(names(f.operations()), ","); got != strings.Join(want, ",") {
			return fmt.Errorf("operations %q, want %q", got, strings.Join(want, ","))
		}
		return nil
	})
}

// annotateCertificates writes a reading into node's nodeops.io/certificates, as its agent would.
func (f *fixture) annotateCertificates(node string, certs []v1alpha1.CertificateExpiry) {
	f.t.Helper()
	value := v1alpha1.EncodeCertificates(certs)
	f.must(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var n corev1.Node
		if err := f.c.Get(f.ctx, client.ObjectKey{Name: node}, &n); err != nil {
			return err
		}
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[v1alpha1.AnnotationCertificates] = value
		return f.c.Update(f.ctx, &n)
	}))
}

func (f *fixture) agent() testutil.FakeAgent { return testutil.FakeAgent{Client: f.c} }

// runOperation plays the agent for every task of op until op ends in phase; certificates, when
// set, are reported by every task, as a renewal's agent does.
func (f *fixture) runOperation(op string, certs []v1alpha1.CertificateExpiry, phase v1alpha1.OperationPhase) {
	f.t.Helper()
	testutil.Eventually(f.t, 60*time.Second, "operation "+op+" "+string(phase), func() error {
		if err := f.succeedTasks(op, certs); err != nil {
			return err
		}
		var o v1alpha1.NodeOperation
		if err := f.c.Get(f.ctx, client.ObjectKey{Name: op}, &o); err != nil {
			return err
		}
		if o.Status.Phase != phase {
			return fmt.Errorf("phase %q", o.Status.Phase)
		}
		return nil
	})
}

// succeedTasks plays the agent once for every pending task of op: each succeeds, reporting certs.
func (f *fixture) succeedTasks(op string, certs []v1alpha1.CertificateExpiry) error {
	var tasks v1alpha1.NodeTaskList
	if err := f.c.List(f.ctx, &tasks, client.MatchingLabels{v1alpha1.LabelOperation: objname.LabelValue(op)}); err != nil {
		return err
	}
	for _, t := range tasks.Items {
		if t.EffectivePhase() != v1alpha1.TaskPending {
			continue
		}
		err := f.agent().Write(f.ctx, t.Name, func(t *v1alpha1.NodeTask) {
			now := metav1.NowMicro()
			t.Status.Phase, t.Status.StartTime, t.Status.CompletionTime = v1alpha1.TaskSucceeded, &now, &now
			t.Status.Progress = fmt.Sprintf("%d/%d", len(t.Spec.Commands), len(t.Spec.Commands))
			for _, c := range t.Spec.Commands {
				t.Status.Commands = append(t.Status.Commands, v1alpha1.CommandStatus{Name: c.DisplayName(), Phase: v1alpha1.CommandSucceeded, Attempt: 1})
			}
			t.Status.Certificates = certs
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// kstatus is what Flux and Argo CD's kstatus reading makes of the ClusterTarget.
func (f *fixture) kstatus() status.Status {
	f.t.Helper()
	ct := f.target()
	ct.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("ClusterTarget"))
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ct)
	f.must(err)
	res, err := status.Compute(&unstructured.Unstructured{Object: obj})
	f.must(err)
	return res.Status
}

// waitKstatus waits for kstatus to read s.
func (f *fixture) waitKstatus(s status.Status) {
	f.t.Helper()
	testutil.Eventually(f.t, 30*time.Second, "kstatus "+string(s), func() error {
		if got := f.kstatus(); got != s {
			return fmt.Errorf("kstatus %s; conditions %+v", got, f.target().Status.Conditions)
		}
		return nil
	})
}
