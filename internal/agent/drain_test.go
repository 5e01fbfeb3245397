package agent_test

import (
	"context"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent"
	"github.com/nodeops/nodeops/internal/host"
	"github.com/nodeops/nodeops/internal/host/hosttest"
)

// drainScene is a node with pods a drain evicts, in a namespace of its own.
type drainScene struct {
	ns, node string
}

func newDrainScene(t *testing.T, name string) drainScene {
	t.Helper()
	s := drainScene{ns: name, node: name + "-1"}
	create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.ns}})
	create(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: s.node}})
	return s
}

// pod creates a pod on the scene's node that a ReplicaSet owns, labelled app=name, in phase
// (Running ones Ready, which a disruption budget counts; a Succeeded one goes at once when evicted,
// as no kubelet here ends a graceful deletion).
func (s drainScene) pod(t *testing.T, name string, phase corev1.PodPhase) {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.ns, Labels: map[string]string{"app": name},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: name, UID: types.UID("uid-rs-" + name), Controller: ptr.To(true)}}},
		Spec: corev1.PodSpec{NodeName: s.node, Containers: []corev1.Container{{Name: "c", Image: "pause"}}},
	}
	create(t, pod)
	pod.Status.Phase = phase
	if phase == corev1.PodRunning {
		pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	}
	if err := cl.Status().Update(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
}

func (s drainScene) podsLeft(t *testing.T) string {
	t.Helper()
	pods := &corev1.PodList{}
	if err := cl.List(context.Background(), pods, client.InNamespace(s.ns)); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pods.Items {
		names = append(names, p.Name)
	}
	sort.Strings(names)
	return strings.Join(names, ",")
}

// drained is the task's Drained condition, failing the test without one.
func drained(t *testing.T, task *v1alpha1.NodeTask) *metav1.Condition {
	t.Helper()
	c := meta.FindStatusCondition(task.Status.Conditions, v1alpha1.ConditionDrained)
	if c == nil {
		t.Fatalf("task %s has no Drained condition: %+v", task.Name, task.Status.Conditions)
	}
	return c
}

// agents confined to their own node (rule 10): the manager drains for the agent (which may not evict). The drain
// command and containerdRuntime's restart.drain ask for it on their run; the manager evicts the
// node's pods and records its outcome in the condition Drained, and the agent ends the command
// with that outcome, its output naming each pod evicted or left.
func TestSafetyRule10_TheManagerDrainsForTheAgent(t *testing.T) {
	s := newDrainScene(t, "mgr-drain")
	s.pod(t, "web", corev1.PodRunning)
	s.pod(t, "api", corev1.PodRunning)
	cfgToml, err := os.ReadFile("../containerdtoml/testdata/containerd/v2-default.toml")
	if err != nil {
		t.Fatal(err)
	}
	root := hosttest.NewRoot(t, map[string]string{"/etc/containerd/config.toml": string(cfgToml)})
	startAgent(t, agent.Options{NodeName: s.node, HostRoot: root, PodName: "agent-pod", PodNamespace: s.ns})
	zero := int64(0)
	create(t, newTask("mgr-drain-1", s.node, v1alpha1.ExecutionAuto,
		v1alpha1.Command{Cordon: &v1alpha1.CordonCommand{}},
		v1alpha1.Command{Drain: &v1alpha1.DrainCommand{GracePeriodSeconds: &zero}},
	))
	task := waitTask(t, "mgr-drain-1", func(tk *v1alpha1.NodeTask) bool {
		return !tk.EffectivePhase().Unfinished() || tk.Status.Phase == v1alpha1.TaskFailed
	})
	if task.Status.Phase != v1alpha1.TaskSucceeded {
		t.Fatalf("task %s: %s", task.Status.Phase, task.Status.Message)
	}
	if got := s.podsLeft(t); got != "" {
		t.Errorf("pods left after the drain: %s", got)
	}
	c := drained(t, task)
	cmd := task.Status.Commands[1]
	if c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonDrained || !strings.HasPrefix(c.Message, v1alpha1.DrainKey("drain", 1)+": ") {
		t.Errorf("Drained condition %+v, want True for the drain's first run", c)
	}
	if want := "drained node " + s.node + ": 2 pods evicted, 0 left"; cmd.Message != want || !strings.Contains(c.Message, want) {
		t.Errorf("drain command's message %q, condition %q, want the manager's %q", cmd.Message, c.Message, want)
	}
	for _, want := range []string{"evicted mgr-drain/api", "evicted mgr-drain/web"} {
		if !strings.Contains(cmd.OutputTail, want) {
			t.Errorf("drain output does not say %q:\n%s", want, cmd.OutputTail)
		}
	}
	if cmd.Drain != nil {
		t.Errorf("the ended command still carries its request: %+v", cmd.Drain)
	}

	// containerdRuntime's restart.drain asks mid-command, after its cordon: the manager drains then
	// (with the drain's defaults: a Running pod's graceful deletion would wait for a kubelet).
	s.pod(t, "done", corev1.PodSucceeded)
	create(t, newTask("mgr-drain-2", s.node, v1alpha1.ExecutionAuto,
		v1alpha1.Command{ContainerdRuntime: &v1alpha1.ContainerdRuntimeCommand{Name: "spin", RuntimeType: "io.containerd.spin.v2", Restart: &v1alpha1.ContainerdRestart{Drain: true}}},
	))
	task = waitTask(t, "mgr-drain-2", func(tk *v1alpha1.NodeTask) bool {
		return !tk.EffectivePhase().Unfinished() || tk.Status.Phase == v1alpha1.TaskFailed
	})
	if task.Status.Phase != v1alpha1.TaskSucceeded {
		t.Fatalf("containerdRuntime with restart.drain: %s: %s", task.Status.Phase, task.Status.Message)
	}
	if got := s.podsLeft(t); got != "" {
		t.Errorf("pods left after the drained restart: %s", got)
	}
	if c := drained(t, task); c.Status != metav1.ConditionTrue || !strings.HasPrefix(c.Message, v1alpha1.DrainKey("containerdRuntime", 1)+": ") {
		t.Errorf("Drained condition %+v, want True for containerdRuntime's first run", c)
	}
	if out := task.Status.Commands[0].OutputTail; !strings.Contains(out, "evicted mgr-drain/done") {
		t.Errorf("containerdRuntime's output does not name the pod evicted:\n%s", out)
	}
	if log := hosttest.ReadFile(t, root, host.LocalServiceLog); !strings.Contains(log, "restart containerd") {
		t.Errorf("containerd not restarted: %q", log)
	}
}

// A retried drain waits for the manager's answer to its own run: the Drained condition left by the
// failed first attempt (a budget that allowed nothing) is not taken for the second's.
func TestSafetyRule10_ARetriedDrainIgnoresTheEarlierOutcome(t *testing.T) {
	ctx := context.Background()
	s := newDrainScene(t, "stale-drain")
	s.pod(t, "db", corev1.PodRunning)
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "db-pdb", Namespace: s.ns},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}},
	}
	create(t, pdb)
	// What the disruption controller (not part of envtest) would report: the one db pod is needed.
	pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, DisruptionsAllowed: 0, CurrentHealthy: 1, DesiredHealthy: 1, ExpectedPods: 1}
	if err := cl.Status().Update(ctx, pdb); err != nil {
		t.Fatal(err)
	}
	startAgent(t, agent.Options{NodeName: s.node, HostRoot: hosttest.NewRoot(t, nil)})
	zero := int64(0)
	refused := refusedEvictions(t)
	create(t, newTask("stale-drain-1", s.node, v1alpha1.ExecutionAuto,
		v1alpha1.Command{Drain: &v1alpha1.DrainCommand{Timeout: &metav1.Duration{Duration: 2 * time.Second}, GracePeriodSeconds: &zero}},
	))
	timeOutDrainOnceRefused(t, refused, 2*time.Second)
	task := waitTask(t, "stale-drain-1", phaseIs(v1alpha1.TaskFailed))
	if c := drained(t, task); c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonDrainFailed ||
		!strings.HasPrefix(c.Message, v1alpha1.DrainKey("drain", 1)+": ") || !strings.Contains(c.Message, "PodDisruptionBudget stale-drain/db-pdb") {
		t.Fatalf("after the refused drain: Drained %+v, want False for the first run, naming the budget", c)
	}
	if msg := task.Status.Commands[0].Message; !strings.Contains(msg, "PodDisruptionBudget stale-drain/db-pdb") {
		t.Errorf("the failed drain's message %q does not name the budget", msg)
	}

	// The budget now allows the eviction; a person retries.
	if err := cl.Get(ctx, client.ObjectKeyFromObject(pdb), pdb); err != nil {
		t.Fatal(err)
	}
	pdb.Status.DisruptionsAllowed, pdb.Status.DesiredHealthy = 1, 0
	if err := cl.Status().Update(ctx, pdb); err != nil {
		t.Fatal(err)
	}
	gen := askRecovery(t, "stale-drain-1", v1alpha1.RecoveryRetry)
	task = waitTask(t, "stale-drain-1", func(tk *v1alpha1.NodeTask) bool {
		return tk.Status.RecoveredGeneration >= gen && (tk.Status.Phase == v1alpha1.TaskSucceeded || tk.Status.Phase == v1alpha1.TaskFailed)
	})
	if task.Status.Phase != v1alpha1.TaskSucceeded {
		t.Fatalf("the retried drain: %s: %s (it took the first run's outcome?)", task.Status.Phase, task.Status.Message)
	}
	if c := drained(t, task); c.Status != metav1.ConditionTrue || !strings.HasPrefix(c.Message, v1alpha1.DrainKey("drain", 2)+": ") {
		t.Errorf("after the retry: Drained %+v, want True for the second run", c)
	}
	if got := s.podsLeft(t); got != "" {
		t.Errorf("pods left after the retried drain: %s", got)
	}
}
