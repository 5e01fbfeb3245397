package nodetask_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/taskpolicy"
	"github.com/nodeops/nodeops/internal/testutil"
)

// drainTask creates a node, a pod on it that a ReplicaSet owns (and more pods), and a task of one
// command on it, whose run the fake agent records Running with the agent's drain request.
func drainTask(t *testing.T, name string, mode v1alpha1.ExecutionMode, cmd v1alpha1.Command, more ...*corev1.Pod) (pod *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	node := name + "-node"
	nodeObj := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
	if err := cl.Create(ctx, nodeObj); err != nil {
		t.Fatal(err)
	}
	// The namespace stays when the test ends (envtest runs no namespace controller to finish its
	// deletion); the next run of the test finds it.
	if err := cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	pod = &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: name,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web", UID: "uid-web", Controller: ptr.To(true)}}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "pause"}}},
	}
	for _, p := range append([]*corev1.Pod{pod}, more...) {
		if err := cl.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	task := &v1alpha1.NodeTask{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1alpha1.LabelNode: node}},
		Spec:       v1alpha1.NodeTaskSpec{NodeName: node, ExecutionMode: mode, Commands: []v1alpha1.Command{cmd}},
	}
	if err := cl.Create(ctx, task); err != nil {
		t.Fatal(err)
	}
	remove := []client.Object{task, nodeObj}
	for _, p := range append([]*corev1.Pod{pod}, more...) {
		remove = append(remove, p.DeepCopy())
	}
	testutil.RemoveAtEnd(t, cl, remove...)
	agent := testutil.FakeAgent{Client: cl}
	if err := agent.Write(ctx, name, func(tk *v1alpha1.NodeTask) {
		taskpolicy.Apply(&tk.Status, &tk.Spec, taskpolicy.Action{Kind: taskpolicy.ActStart}, metav1.NowMicro())
		tk.Status.Commands[0].Drain = &v1alpha1.DrainRequest{}
	}); err != nil {
		t.Fatal(err)
	}
	return pod
}

func waitDrained(t *testing.T, name string) *metav1.Condition {
	t.Helper()
	var c *metav1.Condition
	testutil.Eventually(t, 30*time.Second, "the Drained condition of "+name, func() error {
		if c = meta.FindStatusCondition(get(t, name).Status.Conditions, v1alpha1.ConditionDrained); c == nil {
			return fmt.Errorf("none yet")
		}
		return nil
	})
	return c
}

// The manager drains for a task whose running command drains and whose agent asks: it evicts the
// node's pods and answers, in one condition keyed to the run; in a DryRun it evicts nothing and
// reports the plan. A request on a command that does not drain by its spec is never acted on, so
// an agent cannot have its node drained unless its task says so (agents confined to their own node, rule 10).
func TestSafetyRule10_TheManagerDrainsOnlyWhatATaskAsks(t *testing.T) {
	ctx := context.Background()
	zero := int64(0)
	notDrain := drainTask(t, "asks-no-drain", v1alpha1.ExecutionAuto, v1alpha1.Command{Script: &v1alpha1.ScriptCommand{Inline: "true"}})
	dry := drainTask(t, "dry-drain", v1alpha1.ExecutionDryRun, v1alpha1.Command{Drain: &v1alpha1.DrainCommand{GracePeriodSeconds: &zero}})
	// The manager's own pod (managerPod) is on the node drained for real: the drain leaves it.
	self := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: managerPod.Name, Namespace: managerPod.Namespace,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "nodeops-manager", UID: "uid-manager", Controller: ptr.To(true)}}},
		Spec: corev1.PodSpec{NodeName: "real-drain-node", Containers: []corev1.Container{{Name: "manager", Image: "manager"}}},
	}
	evicted := drainTask(t, "real-drain", v1alpha1.ExecutionAuto, v1alpha1.Command{Drain: &v1alpha1.DrainCommand{GracePeriodSeconds: &zero}}, self)

	c := waitDrained(t, "real-drain")
	want := v1alpha1.DrainKey("drain", 1) + ": drained node real-drain-node: 1 pods evicted, 1 left\n" +
		"leaving real-drain/nodeops-manager-x (the manager's own pod, which drains)\nevicted real-drain/web"
	if c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonDrained || c.Message != want {
		t.Errorf("Drained %+v, want True with %q", c, want)
	}
	if err := cl.Get(ctx, client.ObjectKeyFromObject(evicted), &corev1.Pod{}); !apierrors.IsNotFound(err) {
		t.Errorf("the drained node's pod: %v, want it gone", err)
	}
	if err := cl.Get(ctx, client.ObjectKeyFromObject(self), &corev1.Pod{}); err != nil {
		t.Errorf("the manager's own pod after its drain: %v", err)
	}

	c = waitDrained(t, "dry-drain")
	if c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "1 pods evicted") || !strings.Contains(c.Message, "evicted dry-drain/web") {
		t.Errorf("dry-run Drained %+v, want True with the plan", c)
	}
	if err := cl.Get(ctx, client.ObjectKeyFromObject(dry), &corev1.Pod{}); err != nil {
		t.Errorf("a dry-run drain evicted its pod: %v", err)
	}

	if c := meta.FindStatusCondition(get(t, "asks-no-drain").Status.Conditions, v1alpha1.ConditionDrained); c != nil {
		t.Errorf("a script's request was answered: %+v", c)
	}
	if err := cl.Get(ctx, client.ObjectKeyFromObject(notDrain), &corev1.Pod{}); err != nil {
		t.Errorf("a request on a command that does not drain evicted: %v", err)
	}
}
