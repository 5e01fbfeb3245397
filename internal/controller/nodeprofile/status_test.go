package nodeprofile

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

func TestComputeStatus(t *testing.T) {
	type cond struct {
		status metav1.ConditionStatus
		reason string
	}
	tests := []struct {
		name         string
		in           StatusInput
		ready        cond
		provisioning cond
		degraded     cond
		counts       v1alpha1.ProfileNodeCounts
		messageHas   []string // in Degraded's message
	}{
		{name: "no nodes", in: StatusInput{},
			ready: cond{"True", ReasonNoNodes}, provisioning: cond{"False", ReasonIdle}, degraded: cond{"False", ReasonNoFailures}},
		{name: "all provisioned", in: StatusInput{Decision: decision{
			Nodes:  []NodeResult{{Node: "a", State: StateProvisioned}, {Node: "b", State: StateProvisioned}},
			Counts: v1alpha1.ProfileNodeCounts{Matched: 2, Provisioned: 2},
		}}, ready: cond{"True", ReasonProvisioned}, provisioning: cond{"False", ReasonIdle}, degraded: cond{"False", ReasonNoFailures},
			counts: v1alpha1.ProfileNodeCounts{Matched: 2, Provisioned: 2}},
		{name: "waiting and just started", in: StatusInput{Started: 1, Decision: decision{
			Nodes:  []NodeResult{{Node: "a", State: StateProvisioned}, {Node: "b", State: StateWaitingInstall}},
			Counts: v1alpha1.ProfileNodeCounts{Matched: 2, Provisioned: 1},
		}}, ready: cond{"False", ReasonInProgress}, provisioning: cond{"True", ReasonInProgress}, degraded: cond{"False", ReasonNoFailures},
			counts: v1alpha1.ProfileNodeCounts{Matched: 2, Provisioned: 1, Provisioning: 1}},
		{name: "outside the windows: waiting nodes say so", in: StatusInput{Window: "outside the maintenance windows (daily 22:00-04:00 UTC): next opens at 2026-12-02T22:00:00Z", Decision: decision{
			Nodes:  []NodeResult{{Node: "a", State: StateProvisioned}, {Node: "b", State: StateWaitingInstall}},
			Counts: v1alpha1.ProfileNodeCounts{Matched: 2, Provisioned: 1},
		}}, ready: cond{"False", ReasonInProgress}, provisioning: cond{"True", ReasonWaitingForWindow}, degraded: cond{"False", ReasonNoFailures},
			counts: v1alpha1.ProfileNodeCounts{Matched: 2, Provisioned: 1}},
		{name: "a node leaving keeps it from Ready", in: StatusInput{Decision: decision{
			Nodes:  []NodeResult{{Node: "a", State: StateProvisioned}, {Node: "b", State: StateUninstalling}},
			Counts: v1alpha1.ProfileNodeCounts{Matched: 1, Provisioned: 1, Provisioning: 1},
		}}, ready: cond{"False", ReasonInProgress}, provisioning: cond{"True", ReasonInProgress}, degraded: cond{"False", ReasonNoFailures},
			counts: v1alpha1.ProfileNodeCounts{Matched: 1, Provisioned: 1, Provisioning: 1}},
		{name: "failed node named with its command's message", in: StatusInput{Decision: decision{
			Nodes: []NodeResult{
				{Node: "worker-1", State: StateInstallFailed, Task: "t1", Message: "command wasmedge failed: sha256 mismatch"},
				{Node: "worker-2", State: StateProvisioned},
			},
			Counts: v1alpha1.ProfileNodeCounts{Matched: 2, Provisioned: 1, Failed: 1},
		}}, ready: cond{"False", ReasonNodesFailed}, provisioning: cond{"False", ReasonIdle}, degraded: cond{"True", ReasonNodesFailed},
			counts:     v1alpha1.ProfileNodeCounts{Matched: 2, Provisioned: 1, Failed: 1},
			messageHas: []string{"worker-1", "install failed", "sha256 mismatch"}},
		{name: "RuntimeClass conflict", in: StatusInput{Problems: []string{"RuntimeClass spin exists and is not owned by this profile"}},
			ready: cond{"True", ReasonNoNodes}, provisioning: cond{"False", ReasonIdle}, degraded: cond{"True", ReasonRuntimeClassConflict},
			messageHas: []string{"RuntimeClass spin"}},
		{name: "deleting", in: StatusInput{Deleting: true, Decision: decision{Nodes: []NodeResult{{Node: "a", State: StateUninstalling}}, Counts: v1alpha1.ProfileNodeCounts{Provisioning: 1}}},
			ready: cond{"False", ReasonDeleting}, provisioning: cond{"True", ReasonInProgress}, degraded: cond{"False", ReasonNoFailures},
			counts: v1alpha1.ProfileNodeCounts{Provisioning: 1}},
		{name: "invalid spec", in: StatusInput{Invalid: "spec.nodeSelector: bad"},
			ready: cond{"False", ReasonInvalidSpec}, provisioning: cond{"False", ReasonInvalidSpec}, degraded: cond{"True", ReasonInvalidSpec},
			messageHas: []string{"spec.nodeSelector: bad"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			counts, conds, failures := ComputeStatus(tt.in)
			if counts != tt.counts {
				t.Errorf("counts = %+v, want %+v", counts, tt.counts)
			}
			got := map[string]metav1.Condition{}
			for _, c := range conds {
				if c.Reason == "" || c.Message == "" {
					t.Errorf("condition %s without reason or message", c.Type)
				}
				got[c.Type] = c
			}
			for typ, want := range map[string]cond{v1alpha1.ConditionReady: tt.ready, v1alpha1.ConditionProvisioning: tt.provisioning, v1alpha1.ConditionDegraded: tt.degraded} {
				if c := got[typ]; c.Status != want.status || c.Reason != want.reason {
					t.Errorf("%s = %s/%s, want %s/%s (%s)", typ, c.Status, c.Reason, want.status, want.reason, c.Message)
				}
			}
			for _, s := range tt.messageHas {
				if !strings.Contains(got[v1alpha1.ConditionDegraded].Message, s) {
					t.Errorf("Degraded message %q lacks %q", got[v1alpha1.ConditionDegraded].Message, s)
				}
			}
			if int32(len(failures)) != counts.Failed {
				t.Errorf("%d failures listed for %d failed", len(failures), counts.Failed)
			}
		})
	}
}

func TestComputeStatusBoundsFailures(t *testing.T) {
	var d decision
	for i := range 150 {
		d.Nodes = append(d.Nodes, NodeResult{Node: strings.Repeat("n", 3) + string(rune('a'+i%26)), State: StateInstallFailed, Message: "x"})
		d.Counts.Failed++
	}
	_, conds, failures := ComputeStatus(StatusInput{Decision: d})
	if len(failures) != maxFailures {
		t.Errorf("%d failures, want at most %d", len(failures), maxFailures)
	}
	for _, c := range conds {
		if c.Type == v1alpha1.ConditionDegraded && !strings.Contains(c.Message, "and 140 more") {
			t.Errorf("Degraded message does not say how many more: %s", c.Message)
		}
	}
}
