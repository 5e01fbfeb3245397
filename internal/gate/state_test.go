package gate

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// Advance is the one state machine of gates, for operations and profiles alike: each row is a
// record, a person's annotations and this look's result, and the record that follows.
func TestAdvance(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(time.Minute))
	late := metav1.NewTime(t0.Add(31 * time.Minute))
	g := &v1alpha1.Gate{Name: "g", Approval: &v1alpha1.ApprovalGate{}}
	waiting := &v1alpha1.GateStatus{Name: "g", State: v1alpha1.GateWaiting, Message: "no", Since: t0, LastChecked: t0}
	timedOut := &v1alpha1.GateStatus{Name: "g", State: v1alpha1.GateTimedOut, Message: "no", Since: t0, LastChecked: t0}
	pass, fail := Result{Passed: true, Message: "yes"}, Result{Message: "no"}
	for _, tc := range []struct {
		name      string
		rec       *v1alpha1.GateStatus
		ann       map[string]string
		res       Result
		have      bool
		now       metav1.Time
		state     v1alpha1.GateState
		since     metav1.Time
		checked   metav1.Time
		unchecked bool
		due       bool
	}{
		{name: "first look passes", res: pass, have: true, now: t0, state: v1alpha1.GatePassed, since: t0, checked: t0},
		{name: "not checked holds", now: t0, state: v1alpha1.GateWaiting, since: t0, checked: t0, unchecked: true},
		{name: "still failing writes nothing new", rec: waiting, res: fail, have: true, now: t1, state: v1alpha1.GateWaiting, since: t0, checked: t0, due: true},
		{name: "failing past the timeout", rec: waiting, res: fail, have: true, now: late, state: v1alpha1.GateTimedOut, since: late, checked: late},
		{name: "timed out stays so though it passes", rec: timedOut, res: pass, have: true, now: t1, state: v1alpha1.GateTimedOut, since: t0, checked: t0},
		{name: "retry starts again", rec: timedOut, ann: map[string]string{v1alpha1.AnnotationRetryGatePrefix + "g": "1"}, res: fail, have: true, now: late, state: v1alpha1.GateWaiting, since: late, checked: late, due: true},
		{name: "skip passes", rec: timedOut, ann: map[string]string{v1alpha1.AnnotationSkipGatePrefix + "g": "true"}, now: t1, state: v1alpha1.GateSkipped, since: t1, checked: t0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := Advance(g, tc.rec, "", tc.ann, tc.res, tc.have, tc.now)
			if st.Next.State != tc.state || !st.Next.Since.Equal(&tc.since) || !st.Next.LastChecked.Equal(&tc.checked) || st.Unchecked != tc.unchecked || st.Due.IsZero() == tc.due {
				t.Errorf("got %+v unchecked=%v due=%v; want %s since %s checked %s unchecked=%v due=%v",
					st.Next, st.Unchecked, st.Due, tc.state, tc.since.UTC(), tc.checked.UTC(), tc.unchecked, tc.due)
			}
		})
	}
	if NeedsCheck(g, timedOut, nil) {
		t.Error("a timed-out gate nobody retried needs no check")
	}
	if !NeedsCheck(g, timedOut, map[string]string{v1alpha1.AnnotationRetryGatePrefix + "g": "1"}) {
		t.Error("a retried gate needs a check")
	}
	if (Subject{Kind: "NodeProfile", Name: "p"}).Ref() != "nodeprofile/p" || (Subject{Kind: "NodeOperation", Name: "o"}).Ref() != "o" {
		t.Error("Ref")
	}
}
