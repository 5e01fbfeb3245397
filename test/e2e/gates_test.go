package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/nodeoperation"
	"github.com/nodeops/nodeops/internal/testutil"
	"github.com/nodeops/nodeops/test/e2e/framework"
)

// TestCELGateHoldsAGroupUntilTheDeploymentIsAvailable is issue 27's CEL gate on nodeops-local: the
// real controller-manager, scheduler and kwok run a Deployment whose pods first fit no node; the
// second group waits (WaitingForGate) until the Deployment is available, and the API server's own
// records show its first task created after the Deployment's Available condition turned true.
func TestCELGateHoldsAGroupUntilTheDeploymentIsAvailable(t *testing.T) {
	t.Parallel()
	start := time.Now()
	l := framework.StartLocal(t, "--control-planes=1", "--workers=2")
	l.WaitNodesReady(t, 3, 5*time.Minute)
	ctx := context.Background()
	t.Logf("cluster up in %s", time.Since(start).Round(time.Second))

	one := int32(1)
	labels := map[string]string{"app": "gate-storage"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "storage"},
		Spec: appsv1.DeploymentSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
				// No node carries this label yet: the pod stays Pending, the Deployment unavailable.
				NodeSelector: map[string]string{"nodeops.test/storage": "yes"},
				Tolerations:  []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
				Containers:   []corev1.Container{{Name: "osd", Image: "registry.local/osd:1"}}}}},
	}
	if err := l.Client.Create(ctx, dep); err != nil {
		t.Fatal(err)
	}
	notCP := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "node-role.kubernetes.io/control-plane", Operator: metav1.LabelSelectorOpDoesNotExist}}}
	wait := []v1alpha1.Command{{Wait: &v1alpha1.WaitCommand{}}}
	op := &v1alpha1.NodeOperation{ObjectMeta: metav1.ObjectMeta{Name: "gated"}, Spec: v1alpha1.NodeOperationSpec{Custom: &v1alpha1.CustomOperation{Groups: []v1alpha1.Group{
		{Name: "first", NodeSelector: notCP, NodeFilter: v1alpha1.NodeFilterHead, Commands: wait},
		{Name: "rest", NodeSelector: notCP, NodeFilter: v1alpha1.NodeFilterTail, Commands: wait, Scheduling: v1alpha1.Scheduling{Gates: []v1alpha1.Gate{{
			Name: "storage", Timeout: &metav1.Duration{Duration: 10 * time.Minute},
			CEL: &v1alpha1.CELGate{APIVersion: "apps/v1", Kind: "Deployment", Namespace: "default", Name: "storage",
				Expression: "has(self.status.availableReplicas) && self.status.availableReplicas >= self.spec.replicas"}}}}},
	}}}}
	framework.Create(t, l, op)

	testutil.EventuallyEvery(t, 2*time.Minute, framework.PollInterval, "group rest waiting for gate storage", func(ctx context.Context) error {
		if err := l.Client.Get(ctx, client.ObjectKey{Name: op.Name}, op); err != nil {
			return err
		}
		for _, c := range op.Status.Conditions {
			if c.Type == v1alpha1.ConditionProgressing && c.Reason == nodeoperation.ReasonWaitingForGate && strings.Contains(c.Message, "gate storage") {
				return nil
			}
		}
		return fmt.Errorf("conditions %+v", op.Status.Conditions)
	})
	for _, task := range framework.OperationTasks(t, l, op.Name) {
		if task.Spec.Group == "rest" {
			t.Fatalf("task %s created while the gate held", task.Name)
		}
	}
	t.Logf("held by the gate after %s; letting the Deployment's pod fit a node", time.Since(start).Round(time.Second))

	var nodes corev1.NodeList
	if err := l.Client.List(ctx, &nodes, client.HasLabels{"node-role.kubernetes.io/control-plane"}); err != nil || len(nodes.Items) == 0 {
		t.Fatalf("control planes: %v (%d)", err, len(nodes.Items))
	}
	node := nodes.Items[0]
	node.Labels["nodeops.test/storage"] = "yes"
	if err := l.Client.Update(ctx, &node); err != nil {
		t.Fatal(err)
	}

	got := framework.WaitForOperation(t, l, framework.WaitForOperationInput{Name: op.Name, Phase: v1alpha1.OperationSucceeded, FailIfBlocked: true, Timeout: 3 * time.Minute})
	if err := l.Client.Get(ctx, client.ObjectKeyFromObject(dep), dep); err != nil {
		t.Fatal(err)
	}
	var available time.Time
	for _, c := range dep.Status.Conditions {
		if c.Type == appsv1.DeploymentAvailable && c.Status == corev1.ConditionTrue {
			available = c.LastTransitionTime.Time
		}
	}
	if available.IsZero() {
		t.Fatalf("Deployment not Available: %+v", dep.Status.Conditions)
	}
	for _, task := range framework.OperationTasks(t, l, op.Name) {
		// Both records have whole-second resolution: created in the same second counts as after.
		if task.Spec.Group == "rest" && task.CreationTimestamp.Time.Before(available) {
			t.Errorf("task %s created at %s, before the Deployment was Available at %s", task.Name, task.CreationTimestamp.UTC(), available.UTC())
		}
	}
	for _, g := range got.Status.Gates {
		if g.Name == "storage" && g.State != v1alpha1.GatePassed {
			t.Errorf("gate storage ended %s: %s", g.State, g.Message)
		}
	}
	t.Logf("done in %s", time.Since(start).Round(time.Second))
}
