package clustertarget

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// TestWindowsHoldGeneration: a ClusterTarget generates operations only inside its maintenance
// windows, looks again when the next opens, and the operation it generates carries the windows
// and delays so that a run the close interrupts waits inside the operation.
func TestWindowsHoldGeneration(t *testing.T) {
	// now is 10:00 UTC.
	withWindow := func(start, end, zone string) func(*v1alpha1.ClusterTarget) {
		return func(ct *v1alpha1.ClusterTarget) {
			ct.Spec.Windows = []v1alpha1.MaintenanceWindow{{Start: start, End: end, TimeZone: zone}}
			ct.Spec.PostNodeDelay = &metav1.Duration{Duration: 2 * time.Minute}
		}
	}
	tests := []struct {
		name, create, phase, reason, message string
		stalled                              bool
		ct                                   *v1alpha1.ClusterTarget
		recheck                              time.Time
	}{
		{name: "inside the window", ct: target("v1.37.2", withWindow("09:00", "11:00", "")),
			create: "cluster-upgrade-v1.37.2-1", phase: "Progressing", reason: ReasonOperationCreated},
		{name: "outside the window", ct: target("v1.37.2", withWindow("22:00", "02:00", "Europe/Berlin")),
			phase: "Waiting", reason: ReasonWaitingForWindow, message: "would generate NodeOperation cluster-upgrade-v1.37.2-1 (", recheck: time.Date(2026, 12, 1, 21, 0, 0, 0, time.UTC)},
		{name: "a zone the manager does not know stalls", ct: target("v1.37.2", withWindow("22:00", "02:00", "Mars/Olympus")),
			phase: "Waiting", reason: ReasonInvalidWindows, message: `spec.windows[0].timeZone: unknown time zone "Mars/Olympus"`, stalled: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := input{ct: tt.ct, clusterVersion: "v1.37.0", now: now, ops: map[string]opView{}}
			d := decide(&in)
			got := ""
			if d.create != nil {
				got = d.create.Name
			}
			c := meta.FindStatusCondition(d.status.Conditions, v1alpha1.ConditionUpToDate)
			if got != tt.create || string(d.status.Phase) != tt.phase || c.Reason != tt.reason || !strings.Contains(c.Message, tt.message) {
				t.Fatalf("created %q, phase %s, %s: %s; want %q, %s, %s containing %q", got, d.status.Phase, c.Reason, c.Message, tt.create, tt.phase, tt.reason, tt.message)
			}
			if stalled := meta.IsStatusConditionTrue(d.status.Conditions, v1alpha1.ConditionStalled); stalled != tt.stalled {
				t.Errorf("Stalled %v, want %v", stalled, tt.stalled)
			}
			if !d.recheck.Equal(tt.recheck) {
				t.Errorf("recheck %v, want %v", d.recheck, tt.recheck)
			}
			if d.create != nil {
				op := Operation(tt.ct, d.create)
				if len(op.Spec.Windows) != 1 || op.Spec.PostNodeDelay == nil || op.Spec.PostNodeDelay.Duration != 2*time.Minute {
					t.Errorf("generated operation's scheduling %+v, want the target's", op.Spec.Scheduling)
				}
			}
		})
	}
}

// TestGeneratedOperationCarriesTheTargetsGates: the gates of a ClusterTarget, an Alertmanager
// silence and an approval among them, reach each operation it generates unchanged.
func TestGeneratedOperationCarriesTheTargetsGates(t *testing.T) {
	gates := []v1alpha1.Gate{
		{Name: "no-pages", Timeout: &metav1.Duration{Duration: time.Hour}, Alertmanager: &v1alpha1.AlertmanagerGate{URL: "http://am:9093", Matchers: []string{"severity=critical"},
			Silence: &v1alpha1.AlertmanagerSilence{Matchers: []string{"instance={{node}}"}, MaxDuration: &metav1.Duration{Duration: 2 * time.Hour}}}},
		{Name: "change-board", Approval: &v1alpha1.ApprovalGate{}},
	}
	ct := target("v1.37.2", func(ct *v1alpha1.ClusterTarget) { ct.Spec.Gates = gates })
	d := decide(&input{ct: ct, clusterVersion: "v1.37.0", now: now, ops: map[string]opView{}})
	if d.create == nil {
		t.Fatal("no operation generated")
	}
	op := Operation(ct, d.create)
	if !equality.Semantic.DeepEqual(op.Spec.Gates, gates) {
		t.Fatalf("generated operation's gates %+v, want the target's %+v", op.Spec.Gates, gates)
	}
	op.Spec.Gates[0].Alertmanager.Silence.Matchers[0] = "changed"
	if ct.Spec.Gates[0].Alertmanager.Silence.Matchers[0] != "instance={{node}}" {
		t.Error("the generated operation shares the target's gates instead of copying them")
	}
}
