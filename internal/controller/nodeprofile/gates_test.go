package nodeprofile_test

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
	"github.com/nodeops/nodeops/internal/controller/nodeprofile"
	"github.com/nodeops/nodeops/internal/testutil"
)

func gateOf(p *v1alpha1.NodeProfile, name string) *v1alpha1.GateStatus {
	for i := range p.Status.Gates {
		if p.Status.Gates[i].Name == name {
			return &p.Status.Gates[i]
		}
	}
	return nil
}

// waitReason waits until the profile's condition typ has reason and returns the profile.
func waitReason(t *testing.T, ctx context.Context, profile, typ, reason string) *v1alpha1.NodeProfile {
	t.Helper()
	var p *v1alpha1.NodeProfile
	testutil.Eventually(t, wait, fmt.Sprintf("%s %s reason %s", profile, typ, reason), func() error {
		p = getProfile(t, ctx, profile)
		if c := condition(p, typ); c.Reason != reason {
			return fmt.Errorf("%s is %s %s: %s", typ, c.Status, c.Reason, c.Message)
		}
		return nil
	})
	return p
}

// noTask fails when the profile has any task now, or at any look within hold.
func noTask(t *testing.T, ctx context.Context, profile, why string, hold ...time.Duration) {
	t.Helper()
	end := time.Now()
	if len(hold) > 0 {
		end = end.Add(hold[0])
	}
	for {
		byNode, err := tasksOf(ctx, profile)
		if err != nil {
			t.Fatal(err)
		}
		for node, tasks := range byNode {
			t.Fatalf("%s: task %v exists on %s", why, names(tasks), node)
		}
		if !time.Now().Before(end) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A CEL gate on a Deployment holds the profile's install until the Deployment's status, set
// through the status subresource as its controller would, says it is available; then it starts.
func TestCELGateHoldsProfileInstallsUntilTheDeploymentIsAvailable(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	one := int32(1)
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "pgate-storage"},
		Spec: appsv1.DeploymentSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "pgate"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "pgate"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}},
	}
	must(t, env.client.Create(ctx, dep))
	t.Cleanup(func() { _ = env.client.Delete(context.Background(), dep) })
	makeNode(t, ctx, "pgate-1", "pgate", nil, kwasm)
	makeProfile(t, ctx, "pgate", "pgate", func(s *v1alpha1.NodeProfileSpec) {
		s.Gates = []v1alpha1.Gate{{Name: "storage-available", CEL: &v1alpha1.CELGate{APIVersion: "apps/v1", Kind: "Deployment", Namespace: "default", Name: dep.Name,
			Expression: "has(self.status.availableReplicas) && self.status.availableReplicas >= self.spec.replicas"}}}
	})

	p := waitReason(t, ctx, "pgate", v1alpha1.ConditionProvisioning, nodeprofile.ReasonWaitingForGate)
	if c := condition(p, v1alpha1.ConditionProvisioning); !strings.Contains(c.Message, "storage-available") || !strings.Contains(c.Message, "false on Deployment default/"+dep.Name) {
		t.Errorf("message does not name the gate and what it saw: %s", c.Message)
	}
	if g := gateOf(p, "storage-available"); g == nil || g.State != v1alpha1.GateWaiting || g.LastChecked.IsZero() {
		t.Errorf("status.gates: %+v", p.Status.Gates)
	}
	noTask(t, ctx, "pgate", "the gate holds")
	// Checked every 300 ms, a gate whose result stays the same writes nothing.
	rv := p.ResourceVersion
	noTask(t, ctx, "pgate", "the gate still holds", 2*time.Second)
	if p2 := getProfile(t, ctx, "pgate"); p2.ResourceVersion != rv {
		t.Errorf("the profile was written while its gate held with the same result: %+v", p2.Status.Gates)
	}

	must(t, env.client.Get(ctx, client.ObjectKeyFromObject(dep), dep))
	dep.Status.Replicas, dep.Status.AvailableReplicas, dep.Status.ReadyReplicas = 1, 1, 1
	must(t, env.client.Status().Update(ctx, dep))
	task := waitTask(t, ctx, "pgate", "pgate-1", nodeprofile.ActionInstall)
	agentRun(t, ctx, task.Name)
	agentSucceed(t, ctx, task.Name)
	waitCondition(t, ctx, "pgate", v1alpha1.ConditionReady, metav1.ConditionTrue, "all 1 node(s) provisioned")
	if g := gateOf(getProfile(t, ctx, "pgate"), "storage-available"); g == nil || g.State != v1alpha1.GatePassed {
		t.Errorf("status.gates after the gate passed: %+v", getProfile(t, ctx, "pgate").Status.Gates)
	}
}

// A gate that has not passed for its timeout blocks the profile (condition Blocked, the gate's
// own message, a Warning event); approving then changes nothing, and skip releases it.
func TestProfileGateTimeoutIsReportedAndSkipReleasesIt(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	makeNode(t, ctx, "ptimeout-1", "ptimeout", nil, kwasm)
	makeProfile(t, ctx, "ptimeout", "ptimeout", func(s *v1alpha1.NodeProfileSpec) {
		s.Gates = []v1alpha1.Gate{{Name: "sign-off", Timeout: &metav1.Duration{Duration: 2 * time.Second}, Approval: &v1alpha1.ApprovalGate{}}}
	})
	c := waitCondition(t, ctx, "ptimeout", v1alpha1.ConditionBlocked, metav1.ConditionTrue, "waiting for approval: kubectl nodeops approve nodeprofile/ptimeout --gate sign-off",
		"skip nodeprofile/ptimeout --gate sign-off")
	if c.Reason != nodeprofile.ReasonGateTimedOut {
		t.Errorf("Blocked reason %s", c.Reason)
	}
	if g := gateOf(getProfile(t, ctx, "ptimeout"), "sign-off"); g == nil || g.State != v1alpha1.GateTimedOut {
		t.Errorf("status.gates: %+v", getProfile(t, ctx, "ptimeout").Status.Gates)
	}
	testutil.Eventually(t, wait, "a GateTimedOut event", func() error {
		var events corev1.EventList
		if err := env.client.List(ctx, &events); err != nil {
			return err
		}
		for _, e := range events.Items {
			if e.InvolvedObject.Name == "ptimeout" && e.Reason == nodeprofile.ReasonGateTimedOut && strings.Contains(e.Message, "waiting for approval") {
				return nil
			}
		}
		return fmt.Errorf("none among %d events", len(events.Items))
	})
	noTask(t, ctx, "ptimeout", "the gate timed out")

	// Approving after the timeout is not enough: a timed-out gate waits for a person's retry or skip.
	updateProfile(t, ctx, "ptimeout", func(p *v1alpha1.NodeProfile) {
		p.Annotations = map[string]string{v1alpha1.AnnotationApproveGatePrefix + "sign-off": "true"}
	})
	noTask(t, ctx, "ptimeout", "approved after the timeout, before a retry or skip", 2*time.Second)

	updateProfile(t, ctx, "ptimeout", func(p *v1alpha1.NodeProfile) {
		p.Annotations[v1alpha1.AnnotationSkipGatePrefix+"sign-off"] = "true"
	})
	task := waitTask(t, ctx, "ptimeout", "ptimeout-1", nodeprofile.ActionInstall)
	waitCondition(t, ctx, "ptimeout", v1alpha1.ConditionBlocked, metav1.ConditionFalse)
	if g := gateOf(getProfile(t, ctx, "ptimeout"), "sign-off"); g == nil || g.State != v1alpha1.GateSkipped {
		t.Errorf("status.gates after skip: %+v", getProfile(t, ctx, "ptimeout").Status.Gates)
	}
	agentRun(t, ctx, task.Name)
	agentSucceed(t, ctx, task.Name)
	waitCondition(t, ctx, "ptimeout", v1alpha1.ConditionReady, metav1.ConditionTrue)
}

// a gate that cannot be evaluated blocks (rule 14), on a profile too: an expression that
// compiles but fails on its object (a field the ConfigMap does not have) holds, says why, then
// blocks the profile; no install ever starts.
func TestSafetyRule14_ProfileGateThatCannotBeEvaluatedHolds(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "prule14-health"}, Data: map[string]string{"other": "x"}}
	must(t, env.client.Create(ctx, cm))
	t.Cleanup(func() { _ = env.client.Delete(context.Background(), cm) })
	makeNode(t, ctx, "prule14-1", "prule14", nil, kwasm)
	makeProfile(t, ctx, "prule14", "prule14", func(s *v1alpha1.NodeProfileSpec) {
		s.Gates = []v1alpha1.Gate{{Name: "healthy", Timeout: &metav1.Duration{Duration: 3 * time.Second}, CEL: &v1alpha1.CELGate{APIVersion: "v1", Kind: "ConfigMap", Namespace: "default", Name: cm.Name,
			Expression: "self.data.healthy == 'true'"}}}
	})
	p := waitReason(t, ctx, "prule14", v1alpha1.ConditionProvisioning, nodeprofile.ReasonWaitingForGate)
	if c := condition(p, v1alpha1.ConditionProvisioning); !strings.Contains(c.Message, "cannot evaluate the expression") {
		t.Errorf("message: %s", c.Message)
	}
	noTask(t, ctx, "prule14", "past a gate that cannot be evaluated")
	c := waitCondition(t, ctx, "prule14", v1alpha1.ConditionBlocked, metav1.ConditionTrue, "cannot evaluate the expression")
	if c.Reason != nodeprofile.ReasonGateTimedOut {
		t.Errorf("Blocked reason %s", c.Reason)
	}
	noTask(t, ctx, "prule14", "past a gate that cannot be evaluated, timed out")
}
