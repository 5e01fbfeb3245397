package drain

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

func TestPlanDrain(t *testing.T) {
	no := false
	ctrl := func(kind string) []metav1.OwnerReference {
		yes := true
		return []metav1.OwnerReference{{Kind: kind, Name: "x", Controller: &yes, APIVersion: "apps/v1", UID: "u"}}
	}
	pod := func(name string, mut func(*corev1.Pod)) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{"app": name}}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
		if mut != nil {
			mut(&p)
		}
		return p
	}
	pods := []corev1.Pod{
		pod("web", func(p *corev1.Pod) { p.OwnerReferences = ctrl("ReplicaSet") }),
		pod("ds", func(p *corev1.Pod) { p.OwnerReferences = ctrl("DaemonSet") }),
		pod("mirror", func(p *corev1.Pod) { p.Annotations = map[string]string{mirrorPodAnnotation: "h"} }),
		pod("cache", func(p *corev1.Pod) {
			p.OwnerReferences = ctrl("ReplicaSet")
			p.Spec.Volumes = []corev1.Volume{{Name: "c", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		}),
	}
	names := func(ps []corev1.Pod) (out []string) {
		for _, p := range ps {
			out = append(out, p.Name)
		}
		return out
	}
	spared := Spared{Agent: types.NamespacedName{Namespace: "ns", Name: "agent"}, Manager: types.NamespacedName{Namespace: "ns", Name: "manager"}}
	withAgents := append(slices.Clone(pods),
		pod("agent", func(p *corev1.Pod) { p.OwnerReferences = ctrl("Job") }),
		pod("agent-2", func(p *corev1.Pod) {
			p.Namespace = "nodeops-system"
			p.OwnerReferences = []metav1.OwnerReference{{Kind: "Job", APIVersion: "batch/v1", Name: "nodeops-agent-n1", Controller: ptr.To(true), UID: "j"}}
		}),
		pod("manager", func(p *corev1.Pod) { p.OwnerReferences = ctrl("ReplicaSet") }),
		// A task's secret holder (internal/secretholder), which its scripts read their Secrets through.
		pod("holder", func(p *corev1.Pod) {
			p.Namespace = "nodeops-system"
			p.OwnerReferences = []metav1.OwnerReference{{Kind: "NodeTask", APIVersion: "nodeops.io/v1alpha1", Name: "t", Controller: ptr.To(true), UID: "t"}}
			p.Labels = map[string]string{"app.kubernetes.io/name": "nodeops-secret-holder"}
		}),
		pod("bare", nil),
		pod("bare-done", func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }),
	)
	tests := []struct {
		name        string
		pods        []corev1.Pod
		d           v1alpha1.DrainCommand
		evict       string
		left, refus int
	}{
		{name: "emptyDir refused by default", d: v1alpha1.DrainCommand{}, evict: "web", left: 2, refus: 1},
		{name: "emptyDir data deleted when asked", d: v1alpha1.DrainCommand{DeleteEmptyDirData: true}, evict: "web,cache", left: 2},
		{name: "DaemonSet refused when not ignored", d: v1alpha1.DrainCommand{IgnoreDaemonSets: &no, DeleteEmptyDirData: true}, evict: "web,cache", left: 1, refus: 1},
		{name: "pod selector", d: v1alpha1.DrainCommand{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}, evict: "web"},
		// drain honours PodDisruptionBudgets (rule 6).
		{name: "agents left, a pod without a controller refused", pods: withAgents, d: v1alpha1.DrainCommand{DeleteEmptyDirData: true}, evict: "web,cache,bare-done", left: 6, refus: 1},
		{name: "a pod without a controller evicted with force", pods: withAgents, d: v1alpha1.DrainCommand{DeleteEmptyDirData: true, Force: true}, evict: "web,cache,bare,bare-done", left: 6},
		{name: "force does not evict emptyDir data", pods: withAgents, d: v1alpha1.DrainCommand{Force: true}, evict: "web,bare,bare-done", left: 6, refus: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.pods == nil {
				tt.pods = pods
			}
			p, err := PlanFor(tt.pods, &tt.d, spared)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(names(p.Evict), ","); got != tt.evict || len(p.Left) != tt.left || len(p.Refused) != tt.refus {
				t.Errorf("evict=%s left=%v refused=%v", got, p.Left, p.Refused)
			}
		})
	}
}

// TestPlanDrainKnowsNodeopsPodsByOwner: a tenant's pods labelled as nodeops' agent or secret holder are
// drained as any other; nodeops' own, in its namespace under its DaemonSet, an agent Job or a
// NodeTask, are left (issue 24, point 6).
func TestPlanDrainKnowsNodeopsPodsByOwner(t *testing.T) {
	owned := func(ns, name, apiVersion, kind, owner string, labels map[string]string) corev1.Pod {
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels, OwnerReferences: []metav1.OwnerReference{
			{APIVersion: apiVersion, Kind: kind, Name: owner, UID: types.UID(owner), Controller: ptr.To(true)}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	}
	agentLabels := map[string]string{"app.kubernetes.io/name": "nodeops-agent"}
	holderLabels := map[string]string{"app.kubernetes.io/name": "nodeops-secret-holder"}
	pods := []corev1.Pod{
		owned("tenant", "looks-like-agent", "apps/v1", "ReplicaSet", "web", agentLabels),
		owned("tenant", "looks-like-holder", "apps/v1", "ReplicaSet", "web", holderLabels),
		owned("tenant", "tenant-nodeops-agent", "apps/v1", "DaemonSet", "nodeops-agent", agentLabels),
		owned("nodeops-system", "agent-ds", "apps/v1", "DaemonSet", "nodeops-agent", nil),
		owned("nodeops-system", "agent-job", "batch/v1", "Job", "nodeops-agent-n1", nil),
		owned("nodeops-system", "holder", "nodeops.io/v1alpha1", "NodeTask", "t1", nil),
	}
	p, err := PlanFor(pods, &v1alpha1.DrainCommand{IgnoreDaemonSets: ptr.To(true)}, Spared{})
	if err != nil {
		t.Fatal(err)
	}
	var evicted []string
	for _, pod := range p.Evict {
		evicted = append(evicted, pod.Name)
	}
	if got, want := strings.Join(evicted, ","), "looks-like-agent,looks-like-holder"; got != want {
		t.Errorf("evicted %s, want %s (left %v)", got, want, p.Left)
	}
	for _, want := range []string{"tenant/tenant-nodeops-agent (DaemonSet)", "nodeops-system/agent-ds (a nodeops agent)",
		"nodeops-system/agent-job (a nodeops agent)", "nodeops-system/holder (a task's secret holder)"} {
		if !slices.Contains(p.Left, want) {
			t.Errorf("left %v, want %q among them", p.Left, want)
		}
	}
}
