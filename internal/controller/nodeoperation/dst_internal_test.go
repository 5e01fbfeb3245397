package nodeoperation

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/nodelock"
	"github.com/nodeops/nodeops/internal/plan"
)

// TestWindowsFollowTheWallClockAcrossDaylightSaving walks the manager's injected clock through the
// nights the clocks change, in Berlin (2026-03-29 02:00 CET -> 03:00 CEST; 2026-10-25 03:00 CEST
// -> 02:00 CET) and New York (2026-03-08 02:00 EST -> 03:00 EDT; 2026-11-01 02:00 EDT -> 01:00
// EST), and asks at each instant whether the first node starts and, if not, when the operation
// says it will. What an administrator expects: a window opens and closes when the local clock on
// the wall reads its start and end, so it is an hour shorter on the night the clocks go forward and
// an hour longer on the night they go back. The rule for a time the wall clock never or twice reads
// (docs/how-to/maintenance-windows.md): a start or end the clocks skip is the moment of the change;
// one they repeat is its first occurrence.
func TestWindowsFollowTheWallClockAcrossDaylightSaving(t *testing.T) {
	utc := func(s string) time.Time {
		v, err := time.Parse("2006-01-02 15:04", s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	window := func(start, end, zone string) []v1alpha1.MaintenanceWindow {
		return []v1alpha1.MaintenanceWindow{{Start: start, End: end, TimeZone: zone}}
	}
	const berlin, newYork = "Europe/Berlin", "America/New_York"
	tests := []struct {
		name    string
		windows []v1alpha1.MaintenanceWindow
		now     string    // UTC
		starts  bool      // the first node starts now
		next    time.Time // when the operation says it will start, when it does not
	}{
		// 01:00-04:00 in Berlin spans the skipped hour in March and the repeated hour in October.
		{"spring: a minute before 01:00 CET", window("01:00", "04:00", berlin), "2026-03-28 23:59", false, utc("2026-03-29 00:00")},
		{"spring: 01:00 CET opens", window("01:00", "04:00", berlin), "2026-03-29 00:00", true, time.Time{}},
		{"spring: 03:30 CEST, just after the gap, still open", window("01:00", "04:00", berlin), "2026-03-29 01:30", true, time.Time{}},
		{"spring: 03:59 CEST still open", window("01:00", "04:00", berlin), "2026-03-29 01:59", true, time.Time{}},
		{"spring: 04:00 CEST closes, two hours after it opened", window("01:00", "04:00", berlin), "2026-03-29 02:00", false, utc("2026-03-29 23:00")},
		{"fall: a minute before 01:00 CEST", window("01:00", "04:00", berlin), "2026-10-24 22:59", false, utc("2026-10-24 23:00")},
		{"fall: 02:30 CEST, the first pass of the repeated hour", window("01:00", "04:00", berlin), "2026-10-25 00:30", true, time.Time{}},
		{"fall: 02:30 CET, the second pass", window("01:00", "04:00", berlin), "2026-10-25 01:30", true, time.Time{}},
		{"fall: 03:59 CET still open", window("01:00", "04:00", berlin), "2026-10-25 02:59", true, time.Time{}},
		{"fall: 04:00 CET closes, four hours after it opened", window("01:00", "04:00", berlin), "2026-10-25 03:00", false, utc("2026-10-26 00:00")},

		// 02:30-03:30 in Berlin: its start is skipped in March and repeated in October.
		{"spring: a start the clocks skip waits for the change", window("02:30", "03:30", berlin), "2026-03-29 00:59", false, utc("2026-03-29 01:00")},
		{"spring: open at the change, 03:00 CEST", window("02:30", "03:30", berlin), "2026-03-29 01:00", true, time.Time{}},
		{"spring: closed at 03:30 CEST, half an hour later", window("02:30", "03:30", berlin), "2026-03-29 01:30", false, utc("2026-03-30 00:30")},
		{"fall: a start in the repeated hour opens at its first pass", window("02:30", "03:30", berlin), "2026-10-25 00:29", false, utc("2026-10-25 00:30")},
		{"fall: open through the second pass", window("02:30", "03:30", berlin), "2026-10-25 01:45", true, time.Time{}},
		{"fall: closed at 03:30 CET, two hours after it opened", window("02:30", "03:30", berlin), "2026-10-25 02:30", false, utc("2026-10-26 01:30")},

		// 01:30-02:30 in New York: its end is skipped in March; its start is repeated in November.
		{"spring: 01:30 EST opens", window("01:30", "02:30", newYork), "2026-03-08 06:30", true, time.Time{}},
		{"spring: an end the clocks skip closes at the change, 03:00 EDT", window("01:30", "02:30", newYork), "2026-03-08 07:00", false, utc("2026-03-09 05:30")},
		{"fall: 01:30 EDT, the first pass, opens", window("01:30", "02:30", newYork), "2026-11-01 05:30", true, time.Time{}},
		{"fall: 01:30 EST, the second pass, is still the same opening", window("01:30", "02:30", newYork), "2026-11-01 06:30", true, time.Time{}},
		{"fall: 02:29 EST still open", window("01:30", "02:30", newYork), "2026-11-01 07:29", true, time.Time{}},
		{"fall: 02:30 EST closes, two hours after it opened", window("01:30", "02:30", newYork), "2026-11-01 07:30", false, utc("2026-11-02 06:30")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			now := utc(tc.now)
			op := &v1alpha1.NodeOperation{}
			op.Name = "op"
			op.Spec.Windows = tc.windows
			groups := []plan.ResolvedGroup{resolved("a", 1, "n1")}
			op.Status.Groups = []v1alpha1.GroupStatus{{Name: "a", Phase: v1alpha1.GroupPending}}
			timing, err := timings(op, groups)
			if err != nil {
				t.Fatal(err)
			}
			in := &input{op: op, groups: groups, timing: timing, tasks: map[string]map[string]taskView{}, notReady: map[string]bool{},
				cordoned: map[string]bool{}, locks: nodelock.New().Snapshot(), now: metav1.NewTime(now)}
			got := decide(in)
			if starts := len(got.create) == 1; starts != tc.starts {
				t.Errorf("at %s UTC: first node starts = %v, want %v", tc.now, starts, tc.starts)
			}
			var next time.Time
			if got.status.NextStart != nil {
				next = got.status.NextStart.Time
			}
			if !next.Equal(tc.next) {
				t.Errorf("at %s UTC: nextStart = %s, want %s", tc.now, next.UTC(), tc.next.UTC())
			}
		})
	}
}
