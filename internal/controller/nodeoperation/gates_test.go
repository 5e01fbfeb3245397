package nodeoperation_test

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/nodeoperation"
	"github.com/nodeops/nodeops/internal/testutil"
)

func seconds(n int) *metav1.Duration {
	return &metav1.Duration{Duration: time.Duration(n) * time.Second}
}

// gateOf is the operation's recorded result of gate name in group.
func gateOf(op *v1alpha1.NodeOperation, group, name string) *v1alpha1.GateStatus {
	for i := range op.Status.Gates {
		if g := &op.Status.Gates[i]; g.Group == group && g.Name == name {
			return g
		}
	}
	return nil
}

// waitReason waits until the operation's Progressing (or Blocked) condition has reason, returning the operation.
func (f *fixture) waitReason(name, condType, reason string) *v1alpha1.NodeOperation {
	f.t.Helper()
	var got *v1alpha1.NodeOperation
	testutil.Eventually(f.t, 20*time.Second, name+" "+condType+" "+reason, func() error {
		got = f.get(name)
		if c := condition(got, condType); c.Reason != reason || c.Status != metav1.ConditionTrue && condType == v1alpha1.ConditionBlocked {
			return fmt.Errorf("%s %s %s: %s", condType, c.Status, c.Reason, c.Message)
		}
		return nil
	})
	return got
}

// noTaskIn asserts, for d, that the operation has no task in group.
func (f *fixture) noTaskIn(op, group string, d time.Duration) {
	f.t.Helper()
	testutil.Consistently(f.t, d, "no task in group "+group, func() error {
		for _, t := range f.tasks(op) {
			if t.Spec.Group == group {
				return fmt.Errorf("task %s created", t.Name)
			}
		}
		return nil
	})
}

func (f *fixture) taskIn(op, group string) v1alpha1.NodeTask {
	f.t.Helper()
	var out v1alpha1.NodeTask
	testutil.Eventually(f.t, 20*time.Second, "a task in group "+group, func() error {
		for _, t := range f.tasks(op) {
			if t.Spec.Group == group {
				out = t
				return nil
			}
		}
		return fmt.Errorf("none yet")
	})
	return out
}

// A CEL gate on a Deployment holds the second group until the Deployment's status, set through
// the status subresource as its controller would, says it is available; then the group starts.
func TestCELGateHoldsAGroupUntilTheDeploymentIsAvailable(t *testing.T) {
	f := newFixture(t)
	f.nodes(nil, "n1", "n2")
	one := int32(1)
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: f.id + "-storage"},
		Spec: appsv1.DeploymentSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": f.id}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": f.id}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}},
	}
	f.must(f.c.Create(f.ctx, dep))
	gate := v1alpha1.Gate{Name: "storage-available", CEL: &v1alpha1.CELGate{APIVersion: "apps/v1", Kind: "Deployment", Namespace: "default", Name: dep.Name,
		Expression: "has(self.status.availableReplicas) && self.status.availableReplicas >= self.spec.replicas"}}
	op := f.operation("cel", nil,
		v1alpha1.Group{Name: "first", NodeFilter: v1alpha1.NodeFilterHead, Commands: []v1alpha1.Command{script("a")}},
		v1alpha1.Group{Name: "rest", NodeFilter: v1alpha1.NodeFilterTail, Commands: []v1alpha1.Command{script("a")}, Scheduling: v1alpha1.Scheduling{Gates: []v1alpha1.Gate{gate}}})
	first := f.taskIn(op.Name, "first")
	f.runAll(first.Name)

	got := f.waitReason(op.Name, v1alpha1.ConditionProgressing, nodeoperation.ReasonWaitingForGate)
	c := condition(got, v1alpha1.ConditionProgressing)
	if !strings.Contains(c.Message, "storage-available") || !strings.Contains(c.Message, "false on Deployment default/"+dep.Name) {
		t.Errorf("message does not name the gate and what it saw: %s", c.Message)
	}
	if g := gateOf(got, "rest", "storage-available"); g == nil || g.State != v1alpha1.GateWaiting {
		t.Errorf("status.gates: %+v", got.Status.Gates)
	}
	f.noTaskIn(op.Name, "rest", 2*time.Second)

	f.must(f.c.Get(f.ctx, client.ObjectKeyFromObject(dep), dep))
	dep.Status.Replicas, dep.Status.AvailableReplicas, dep.Status.ReadyReplicas = 1, 1, 1
	f.must(f.c.Status().Update(f.ctx, dep))
	rest := f.taskIn(op.Name, "rest")
	f.runAll(rest.Name)
	got = f.waitPhase(op.Name, v1alpha1.OperationSucceeded)
	if g := gateOf(got, "rest", "storage-available"); g == nil || g.State != v1alpha1.GatePassed || g.LastChecked.IsZero() {
		t.Errorf("status.gates after the gate passed: %+v", got.Status.Gates)
	}
}

// An expression that does not compile fails the operation before anything runs, naming the field.
func TestBadCELFailsTheOperationNamingTheField(t *testing.T) {
	f := newFixture(t)
	f.nodes(nil, "n1")
	op := f.operation("badcel", nil, v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{script("a")}, Scheduling: v1alpha1.Scheduling{Gates: []v1alpha1.Gate{
		{Name: "bad", CEL: &v1alpha1.CELGate{APIVersion: "v1", Kind: "ConfigMap", Namespace: "default", Name: "x", Expression: "self.data.ready =="}}}}})
	got := f.waitPhase(op.Name, v1alpha1.OperationFailed)
	c := condition(got, v1alpha1.ConditionFailed)
	if c.Reason != nodeoperation.ReasonInvalidSpec || !strings.Contains(c.Message, "spec.custom.groups[0].gates[0].cel.expression") {
		t.Errorf("Failed %s: %s", c.Reason, c.Message)
	}
	if tasks := f.tasks(op.Name); len(tasks) != 0 {
		t.Errorf("%d tasks created", len(tasks))
	}
}

// An approval gate holds until the annotation is set, writing nothing per check; then the node starts.
func TestApprovalGateReleasesOnTheAnnotation(t *testing.T) {
	f := newFixture(t)
	f.nodes(nil, "n1")
	op := f.operation("approval", func(o *v1alpha1.NodeOperation) {
		o.Spec.Gates = []v1alpha1.Gate{{Name: "change-board", Approval: &v1alpha1.ApprovalGate{}}}
	}, v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{script("a")}})
	got := f.waitReason(op.Name, v1alpha1.ConditionProgressing, nodeoperation.ReasonWaitingForGate)
	if c := condition(got, v1alpha1.ConditionProgressing); !strings.Contains(c.Message, "kubectl nodeops approve "+op.Name+" --gate change-board") {
		t.Errorf("message does not say how to approve: %s", c.Message)
	}
	// Checked every 300 ms here, the holding gate writes nothing while its result stays the same.
	writes := managerWrites.statusWrites(op.Name)
	f.noTaskIn(op.Name, "g", 2*time.Second)
	if n := managerWrites.statusWrites(op.Name) - writes; n != 0 {
		t.Errorf("%d status writes while the gate held with the same result", n)
	}
	f.update(op.Name, func(o *v1alpha1.NodeOperation) {
		o.Annotations = map[string]string{v1alpha1.AnnotationApproveGatePrefix + "change-board": "true"}
	})
	f.runAll(f.taskIn(op.Name, "g").Name)
	f.waitPhase(op.Name, v1alpha1.OperationSucceeded)
}

// A gate that holds past its timeout blocks the operation with its own message; approving then
// changes nothing until a person retries, which checks the gate again.
func TestGateTimeoutBlocksAndRetryChecksAgain(t *testing.T) {
	f := newFixture(t)
	f.nodes(nil, "n1")
	op := f.operation("timeout", func(o *v1alpha1.NodeOperation) {
		o.Spec.Gates = []v1alpha1.Gate{{Name: "sign-off", Timeout: seconds(2), Approval: &v1alpha1.ApprovalGate{}}}
	}, v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{script("a")}})
	got := f.waitReason(op.Name, v1alpha1.ConditionBlocked, nodeoperation.ReasonGateTimedOut)
	if got.Status.Phase != v1alpha1.OperationBlocked {
		t.Errorf("phase %s", got.Status.Phase)
	}
	if c := condition(got, v1alpha1.ConditionBlocked); !strings.Contains(c.Message, "waiting for approval") || !strings.Contains(c.Message, "retry "+op.Name+" --gate sign-off") {
		t.Errorf("Blocked message: %s", c.Message)
	}
	f.update(op.Name, func(o *v1alpha1.NodeOperation) {
		o.Annotations = map[string]string{v1alpha1.AnnotationApproveGatePrefix + "sign-off": "true"}
	})
	f.noTaskIn(op.Name, "g", 2*time.Second)
	if p := f.get(op.Name).Status.Phase; p != v1alpha1.OperationBlocked {
		t.Errorf("approved after the timeout, before a retry: phase %s", p)
	}
	f.update(op.Name, func(o *v1alpha1.NodeOperation) {
		o.Annotations[v1alpha1.AnnotationRetryGatePrefix+"sign-off"] = "1"
	})
	f.runAll(f.taskIn(op.Name, "g").Name)
	got = f.waitPhase(op.Name, v1alpha1.OperationSucceeded)
	if g := gateOf(got, "g", "sign-off"); g == nil || g.State != v1alpha1.GatePassed || g.Retried != "1" {
		t.Errorf("status.gates: %+v", got.Status.Gates)
	}
}

// Cluster health holds while a control plane's API server mirror pod is not Ready.
func TestClusterHealthHoldsWhileAnAPIServerMirrorPodIsNotReady(t *testing.T) {
	f := newFixture(t)
	cp := f.nodes(map[string]string{"node-role.kubernetes.io/control-plane": ""}, "cp")[0]
	f.nodes(nil, "w1")
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "default"}}
	if err := f.c.Create(f.ctx, sa); err != nil && !apierrors.IsAlreadyExists(err) {
		f.must(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-apiserver-" + cp},
		Spec: corev1.PodSpec{NodeName: cp, Containers: []corev1.Container{{Name: "kube-apiserver", Image: "k"}}}}
	f.must(f.c.Create(f.ctx, pod))
	t.Cleanup(func() { _ = f.c.Delete(f.ctx, pod) })
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}
	f.must(f.c.Status().Update(f.ctx, pod))

	op := f.operation("health", func(o *v1alpha1.NodeOperation) {
		o.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{testLabel: f.id}}
		o.Spec.Gates = []v1alpha1.Gate{{Name: "healthy", ClusterHealth: &v1alpha1.ClusterHealthGate{}}}
	}, v1alpha1.Group{Name: "g", NodeSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "node-role.kubernetes.io/control-plane", Operator: metav1.LabelSelectorOpDoesNotExist}}},
		Commands: []v1alpha1.Command{script("a")}})
	got := f.waitReason(op.Name, v1alpha1.ConditionProgressing, nodeoperation.ReasonWaitingForGate)
	if c := condition(got, v1alpha1.ConditionProgressing); !strings.Contains(c.Message, "kube-system/kube-apiserver-"+cp+" is not Ready") {
		t.Errorf("message: %s", c.Message)
	}
	f.noTaskIn(op.Name, "g", time.Second)
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	f.must(f.c.Status().Update(f.ctx, pod))
	f.runAll(f.taskIn(op.Name, "g").Name)
	f.waitPhase(op.Name, v1alpha1.OperationSucceeded)
}

// closedPort is a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// a gate that cannot be evaluated blocks (rule 14): an unreachable Prometheus holds the group,
// says why, and then blocks the operation; no node ever starts.
func TestSafetyRule14_UnreachablePrometheusBlocks(t *testing.T) {
	f := newFixture(t)
	f.nodes(nil, "n1")
	op := f.operation("prom", func(o *v1alpha1.NodeOperation) {
		o.Spec.Gates = []v1alpha1.Gate{{Name: "no-alerts", Timeout: seconds(3), Prometheus: &v1alpha1.PrometheusGate{URL: "http://" + closedPort(t), Query: `ALERTS{alertstate="firing"}`}}}
	}, v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{script("a")}})
	got := f.waitReason(op.Name, v1alpha1.ConditionProgressing, nodeoperation.ReasonWaitingForGate)
	if c := condition(got, v1alpha1.ConditionProgressing); !strings.Contains(c.Message, "cannot query Prometheus") {
		t.Errorf("message: %s", c.Message)
	}
	got = f.waitReason(op.Name, v1alpha1.ConditionBlocked, nodeoperation.ReasonGateTimedOut)
	if c := condition(got, v1alpha1.ConditionBlocked); !strings.Contains(c.Message, "cannot query Prometheus") {
		t.Errorf("Blocked message: %s", c.Message)
	}
	if tasks := f.tasks(op.Name); len(tasks) != 0 {
		t.Errorf("%d tasks created past a gate that could not be evaluated", len(tasks))
	}
}

// a gate that cannot be evaluated blocks (rule 14): an expression that compiles but fails on the
// object (a field it does not have) holds and then blocks; it never counts as passing.
func TestSafetyRule14_ExpressionThatFailsBlocks(t *testing.T) {
	f := newFixture(t)
	f.nodes(nil, "n1")
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: f.id + "-health"}, Data: map[string]string{"other": "x"}}
	f.must(f.c.Create(f.ctx, cm))
	op := f.operation("celerr", func(o *v1alpha1.NodeOperation) {
		o.Spec.Gates = []v1alpha1.Gate{{Name: "healthy", Timeout: seconds(3), CEL: &v1alpha1.CELGate{APIVersion: "v1", Kind: "ConfigMap", Namespace: "default", Name: cm.Name,
			Expression: "self.data.healthy == 'true'"}}}
	}, v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{script("a")}})
	got := f.waitReason(op.Name, v1alpha1.ConditionBlocked, nodeoperation.ReasonGateTimedOut)
	if c := condition(got, v1alpha1.ConditionBlocked); !strings.Contains(c.Message, "cannot evaluate the expression") {
		t.Errorf("Blocked message: %s", c.Message)
	}
	if tasks := f.tasks(op.Name); len(tasks) != 0 {
		t.Errorf("%d tasks created past a gate that could not be evaluated", len(tasks))
	}
}
