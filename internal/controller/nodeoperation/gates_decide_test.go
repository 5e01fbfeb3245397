package nodeoperation

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/gate"
	"github.com/nodeops/nodeops/internal/nodelock"
	"github.com/nodeops/nodeops/internal/plan"
)

// TestDecideGates walks one gate through its states as reconciles see it: unchecked (hold and ask
// for a check), holding (since the first hold, unchanged records untouched), timed out (Blocked,
// and it stays so when the gate would pass), retried (a fresh wait), passing (nodes start).
func TestDecideGates(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	op := &v1alpha1.NodeOperation{}
	op.Name = "op"
	op.Spec.Gates = []v1alpha1.Gate{{Name: "g1", Timeout: &metav1.Duration{Duration: time.Minute}, Approval: &v1alpha1.ApprovalGate{}}}
	groups := []plan.ResolvedGroup{resolved("a", 1, "n1")}
	timing, err := timings(op, groups)
	if err != nil {
		t.Fatal(err)
	}
	step := func(at time.Time, res *gate.Result) decision {
		t.Helper()
		in := &input{op: op, groups: groups, timing: timing, tasks: map[string]map[string]taskView{}, notReady: map[string]bool{},
			cordoned: map[string]bool{}, locks: nodelock.New().Snapshot(), now: metav1.NewTime(at), gateRecheck: 10 * time.Second}
		if res != nil {
			in.gates = map[string]map[string]gate.Result{"a": {"g1": *res}}
		}
		d := decide(in)
		op.Status = d.status
		return d
	}
	reason := func(d decision) string {
		c := meta.FindStatusCondition(d.status.Conditions, v1alpha1.ConditionProgressing)
		if d.status.Phase == v1alpha1.OperationBlocked {
			c = meta.FindStatusCondition(d.status.Conditions, v1alpha1.ConditionBlocked)
		}
		return c.Reason + ": " + c.Message
	}
	holding := &gate.Result{Message: "waiting for approval"}

	if d := step(t0, nil); d.checkGates != "a" || len(d.create) != 0 {
		t.Fatalf("unchecked: checkGates %q, %d creates; want a check first and nothing started", d.checkGates, len(d.create))
	}
	d := step(t0, holding)
	if len(d.create) != 0 || !strings.HasPrefix(reason(d), ReasonWaitingForGate+": group a waits for gate g1") || !d.recheck.Equal(t0.Add(10*time.Second)) {
		t.Errorf("holding: %d creates, %s, recheck %s", len(d.create), reason(d), d.recheck)
	}
	first := op.Status.Gates[0]
	if first.State != v1alpha1.GateWaiting || !first.Since.Time.Equal(t0) {
		t.Errorf("holding: %+v", first)
	}
	step(t0.Add(30*time.Second), holding)
	if g := op.Status.Gates[0]; g != first {
		t.Errorf("an unchanged result changed the record (a write per check): %+v, was %+v", g, first)
	}
	d = step(t0.Add(time.Minute), holding)
	if d.status.Phase != v1alpha1.OperationBlocked || !strings.HasPrefix(reason(d), ReasonGateTimedOut+": gate g1 held group a for its timeout (1m0s): waiting for approval") {
		t.Errorf("timed out: %s %s", d.status.Phase, reason(d))
	}
	d = step(t0.Add(2*time.Minute), &gate.Result{Passed: true})
	if d.status.Phase != v1alpha1.OperationBlocked || len(d.create) != 0 {
		t.Errorf("a timed-out gate that would pass now: %s, %d creates; want Blocked until a person acts", d.status.Phase, len(d.create))
	}
	op.Annotations = map[string]string{v1alpha1.AnnotationRetryGatePrefix + "g1": "r1"}
	d = step(t0.Add(3*time.Minute), holding)
	if g := op.Status.Gates[0]; d.status.Phase != v1alpha1.OperationRunning || g.State != v1alpha1.GateWaiting || !g.Since.Time.Equal(t0.Add(3*time.Minute)) || g.Retried != "r1" {
		t.Errorf("retried: %s, %+v; want a fresh wait", d.status.Phase, g)
	}
	d = step(t0.Add(4*time.Minute), &gate.Result{Passed: true, Message: "approved"})
	if len(d.create) != 1 || op.Status.Gates[0].State != v1alpha1.GatePassed {
		t.Errorf("passing: %d creates, %+v", len(d.create), op.Status.Gates[0])
	}
}
