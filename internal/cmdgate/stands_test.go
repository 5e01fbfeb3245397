package cmdgate

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// A passed check stands for passedFor after it ended, not counting the time the node spent on the
// owner's other gates' checks since: two gates whose scripts take two minutes each both pass,
// where each answer used to expire while the other gate's check ran, so that the gates took turns
// for ever and the node never started.
func TestAPassStandsWhileTheNodesOtherChecksRun(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 7, 0, 0, 0, time.UTC)
	check := func(gateName, node string, start, end time.Duration) *v1alpha1.NodeTask {
		c := &v1alpha1.NodeTask{Spec: v1alpha1.NodeTaskSpec{NodeName: node, Group: "workers", GateCheck: gateName}}
		c.Status.StartTime = &metav1.MicroTime{Time: t0.Add(start)}
		if end >= 0 {
			c.Status.CompletionTime = &metav1.MicroTime{Time: t0.Add(end)}
		}
		return c
	}
	const running = -1
	a := check("a", "n1", 0, 2*time.Minute)
	cases := []struct {
		name   string
		others []*v1alpha1.NodeTask
		now    time.Duration
		stands bool
	}{
		{"fresh, nothing else ran", nil, 2*time.Minute + 30*time.Second, true},
		{"stale, nothing else ran", nil, 3*time.Minute + time.Second, false},
		{"gate b's check ran two minutes on the node since", []*v1alpha1.NodeTask{check("b", "n1", 2*time.Minute+5*time.Second, 4*time.Minute+5*time.Second)}, 4*time.Minute + 10*time.Second, true},
		{"gate b's check is still running", []*v1alpha1.NodeTask{check("b", "n1", 2*time.Minute+5*time.Second, running)}, 5 * time.Minute, true},
		{"idle for over a minute besides b's run", []*v1alpha1.NodeTask{check("b", "n1", 2*time.Minute+5*time.Second, 4*time.Minute+5*time.Second)}, 5*time.Minute + 10*time.Second, false},
		{"b's check ran before a's ended: only the time after counts", []*v1alpha1.NodeTask{check("b", "n1", -time.Minute, 2*time.Minute+10*time.Second)}, 3*time.Minute + 15*time.Second, false},
		{"b's check ran on another node", []*v1alpha1.NodeTask{check("b", "n2", 2*time.Minute+5*time.Second, 4*time.Minute+5*time.Second)}, 4*time.Minute + 10*time.Second, false},
		{"an older check of gate a itself does not count", []*v1alpha1.NodeTask{check("a", "n1", 2*time.Minute+5*time.Second, 4*time.Minute+5*time.Second)}, 4*time.Minute + 10*time.Second, false},
	}
	for _, c := range cases {
		l := &Look{Checks: append([]*v1alpha1.NodeTask{a}, c.others...), Now: t0.Add(c.now), Recheck: 10 * time.Second}
		if got := l.passStands(a); got != c.stands {
			t.Errorf("%s: passStands = %t, want %t", c.name, got, c.stands)
		}
	}
}
