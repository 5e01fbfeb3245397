package metrics

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// Each gate record counts once per entry into Waiting (a wait) or TimedOut (a failure, by reason),
// however often the status is seen again; records already there at the start count nothing.
func TestGateWaitsAndFailuresCountEachEntryOnce(t *testing.T) {
	g := newGateCounts()
	t0 := metav1.NewTime(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(time.Minute))
	t2 := metav1.NewTime(t0.Add(2 * time.Minute))
	op := func(uid string, gates ...v1alpha1.GateStatus) *v1alpha1.NodeOperation {
		o := &v1alpha1.NodeOperation{}
		o.UID = types.UID("u-" + uid)
		o.Status.Gates = gates
		return o
	}
	rec := func(name string, state v1alpha1.GateState, since metav1.Time, msg string) v1alpha1.GateStatus {
		return v1alpha1.GateStatus{Group: "g", Name: name, State: state, Since: since, Message: msg}
	}
	g.observe(op("old", rec("am", v1alpha1.GateWaiting, t0, "1 alert firing")), false)
	g.observe(op("a", rec("am", v1alpha1.GateWaiting, t0, "1 alert firing")), true)
	g.observe(op("a", rec("am", v1alpha1.GateWaiting, t0, "2 alerts firing")), true) // same wait, new message
	g.observe(op("a", rec("am", v1alpha1.GateTimedOut, t1, "2 alerts firing")), true)
	g.observe(op("a", rec("am", v1alpha1.GateWaiting, t2, "retried")), true)
	g.observe(op("b", rec("prom", v1alpha1.GateTimedOut, t0, "cannot query Prometheus http://x: unreachable")), true)
	g.observe(op("b", rec("prom", v1alpha1.GatePassed, t1, "query returned no series")), true)
	waits, failed := g.snapshot()
	if waits["am"] != 2 || len(waits) != 1 {
		t.Errorf("waits %v, want am=2 (the record from before the start not counted)", waits)
	}
	want := map[[2]string]float64{{"am", GateFailureHeld}: 1, {"prom", GateFailureUnevaluable}: 1}
	if len(failed) != len(want) {
		t.Errorf("failures %v, want %v", failed, want)
	}
	for k, v := range want {
		if failed[k] != v {
			t.Errorf("failures %v, want %v", failed, want)
		}
	}
}
