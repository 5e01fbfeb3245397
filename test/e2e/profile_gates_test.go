package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/nodeprofile"
	"github.com/nodeops/nodeops/internal/testutil"
	"github.com/nodeops/nodeops/test/e2e/framework"
)

// TestProfileGates is issue 27's gates on a NodeProfile on nodeops-local: the real
// controller-manager, scheduler and kwok run a Deployment whose pod first fits no node, and the
// profile's install on worker-1 waits (WaitingForGate) until the Deployment is available, the
// API server's records showing the task created after the Deployment's Available condition turned
// true; then an approval gate times out on worker-2, Blocked says so, and
// `kubectl nodeops skip nodeprofile/NAME --gate` releases it.
func TestProfileGates(t *testing.T) {
	t.Parallel()
	l := framework.StartLocal(t, "--control-planes=1", "--workers=2")
	l.WaitNodesReady(t, 3, 5*time.Minute)
	ctx := context.Background()

	one := int32(1)
	labels := map[string]string{"app": "profile-gate-storage"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "profile-storage"},
		Spec: appsv1.DeploymentSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
				// No node carries this label yet: the pod stays Pending, the Deployment unavailable.
				NodeSelector: map[string]string{"nodeops.test/profile-storage": "yes"},
				Tolerations:  []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
				Containers:   []corev1.Container{{Name: "osd", Image: "registry.local/osd:1"}}}}},
	}
	if err := l.Client.Create(ctx, dep); err != nil {
		t.Fatal(err)
	}
	prof := &v1alpha1.NodeProfile{ObjectMeta: metav1.ObjectMeta{Name: "gated"}, Spec: v1alpha1.NodeProfileSpec{
		Trigger: &v1alpha1.ProfileTrigger{Annotation: "nodeops.test/gated=true"},
		Install: []v1alpha1.Command{{Wait: &v1alpha1.WaitCommand{}}},
		Gates: []v1alpha1.Gate{{Name: "storage", Timeout: &metav1.Duration{Duration: 10 * time.Minute},
			CEL: &v1alpha1.CELGate{APIVersion: "apps/v1", Kind: "Deployment", Namespace: "default", Name: dep.Name,
				Expression: "has(self.status.availableReplicas) && self.status.availableReplicas >= self.spec.replicas"}}},
	}}
	framework.Create(t, l, prof)
	tasks := func(ctx context.Context) ([]v1alpha1.NodeTask, error) {
		var list v1alpha1.NodeTaskList
		err := l.Client.List(ctx, &list, client.MatchingLabels{v1alpha1.LabelProfile: prof.Name})
		return list.Items, err
	}
	reason := func(typ, want, has string) {
		t.Helper()
		testutil.EventuallyEvery(t, 2*time.Minute, framework.PollInterval, fmt.Sprintf("profile %s %s", typ, want), func(ctx context.Context) error {
			p := &v1alpha1.NodeProfile{}
			if err := l.Client.Get(ctx, client.ObjectKey{Name: prof.Name}, p); err != nil {
				return err
			}
			for _, c := range p.Status.Conditions {
				if c.Type == typ && c.Reason == want && strings.Contains(c.Message, has) {
					return nil
				}
			}
			return fmt.Errorf("conditions %+v", p.Status.Conditions)
		})
	}

	t.Run("a CEL gate on a Deployment holds the install until the Deployment is available", func(t *testing.T) {
		l.MustKubectl(t, "annotate", "node", "worker-1", "nodeops.test/gated=true")
		reason(v1alpha1.ConditionProvisioning, nodeprofile.ReasonWaitingForGate, "gate storage")
		if got, err := tasks(ctx); err != nil || len(got) != 0 {
			t.Fatalf("tasks while the gate held: %d (%v)", len(got), err)
		}
		var nodes corev1.NodeList
		if err := l.Client.List(ctx, &nodes, client.HasLabels{"node-role.kubernetes.io/control-plane"}); err != nil || len(nodes.Items) == 0 {
			t.Fatalf("control planes: %v (%d)", err, len(nodes.Items))
		}
		node := nodes.Items[0]
		node.Labels["nodeops.test/profile-storage"] = "yes"
		if err := l.Client.Update(ctx, &node); err != nil {
			t.Fatal(err)
		}
		framework.WaitForProfileLabel(t, l, prof.Name, "worker-1", true)
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
		got, err := tasks(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, task := range got {
			// Both records have whole-second resolution: created in the same second counts as after.
			if task.CreationTimestamp.Time.Before(available) {
				t.Errorf("task %s created at %s, before the Deployment was Available at %s", task.Name, task.CreationTimestamp.UTC(), available.UTC())
			}
		}
	})

	t.Run("a gate that times out blocks the profile and skip releases it", func(t *testing.T) {
		p := &v1alpha1.NodeProfile{}
		if err := l.Client.Get(ctx, client.ObjectKey{Name: prof.Name}, p); err != nil {
			t.Fatal(err)
		}
		p.Spec.Gates = append(p.Spec.Gates, v1alpha1.Gate{Name: "sign-off", Timeout: &metav1.Duration{Duration: 5 * time.Second}, Approval: &v1alpha1.ApprovalGate{}})
		if err := l.Client.Update(ctx, p); err != nil {
			t.Fatal(err)
		}
		l.MustKubectl(t, "annotate", "node", "worker-2", "nodeops.test/gated=true")
		reason(v1alpha1.ConditionBlocked, nodeprofile.ReasonGateTimedOut, "waiting for approval")
		if framework.ProfileLabelled(t, l, prof.Name, "worker-2") {
			t.Fatalf("worker-2 provisioned past a gate that timed out")
		}
		out, err := exec.Command(filepath.Join(l.BinDir, "kubectl-nodeops"), "skip", "nodeprofile/"+prof.Name, "--gate", "sign-off", "--kubeconfig", l.Kubeconfig).CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl nodeops skip: %v\n%s", err, out)
		}
		framework.WaitForProfileLabel(t, l, prof.Name, "worker-2", true)
		framework.WaitForProfileCondition(t, l, prof.Name, v1alpha1.ConditionBlocked, metav1.ConditionFalse)
	})
}
