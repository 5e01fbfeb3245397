package nodeoperation_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/nodeoperation"
	"github.com/nodeops/nodeops/internal/testutil"
)

// Each node gets a silence before its task exists, recorded in status; it is expired once the
// node's task ended, before the next node starts; the finished operation records none.
func TestAlertmanagerSilenceHeldWhileTheNodeIsWorkedOn(t *testing.T) {
	f := newFixture(t)
	nodes := f.nodes(nil, "n1", "n2")
	am := testutil.NewFakeAlertmanager(t)
	op := f.operation("silence", func(o *v1alpha1.NodeOperation) {
		o.Spec.Gates = []v1alpha1.Gate{{Name: "am", Alertmanager: &v1alpha1.AlertmanagerGate{URL: am.URL,
			Silence: &v1alpha1.AlertmanagerSilence{Matchers: []string{"instance={{node}}"}, MaxDuration: &metav1.Duration{Duration: time.Hour}}}}}
	}, v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{script("a")}})

	for i, node := range nodes {
		task := f.waitTasks(op.Name, i+1)[i]
		if task.Spec.NodeName != node {
			t.Fatalf("task %d on %s, want %s", i, task.Spec.NodeName, node)
		}
		got := f.get(op.Name)
		if len(got.Status.Silences) != 1 || got.Status.Silences[0].Node != node || got.Status.Silences[0].ID == "" {
			t.Fatalf("status.silences while %s is worked on: %+v", node, got.Status.Silences)
		}
		id := got.Status.Silences[0].ID
		if s := am.States()[id]; s != "active instance="+node {
			t.Fatalf("silence %s while %s is worked on: %q", id, node, s)
		}
		f.runAll(task.Name)
		testutil.Eventually(t, 20*time.Second, "silence "+id+" expired", func() error {
			if s := am.States()[id]; !strings.HasPrefix(s, "expired") {
				return fmt.Errorf("silence %s: %s", id, s)
			}
			return nil
		})
	}
	got := f.waitPhase(op.Name, v1alpha1.OperationSucceeded)
	if len(got.Status.Silences) != 0 {
		t.Errorf("status.silences of the finished operation: %+v", got.Status.Silences)
	}
	if st := am.States(); len(st) != 2 {
		t.Errorf("silences made: %v, want one per node", st)
	}
}

// a gate that cannot be evaluated blocks (rule 14): an Alertmanager that refuses the silence of
// the node about to start holds the gate with the reason, then blocks; no task is created.
func TestSafetyRule14_UnreachableAlertmanagerSilenceBlocks(t *testing.T) {
	f := newFixture(t)
	f.nodes(nil, "n1")
	am := testutil.NewFakeAlertmanager(t)
	am.Refuse(true)
	op := f.operation("silencedown", func(o *v1alpha1.NodeOperation) {
		o.Spec.Gates = []v1alpha1.Gate{{Name: "am", Timeout: seconds(3), Alertmanager: &v1alpha1.AlertmanagerGate{URL: am.URL,
			Silence: &v1alpha1.AlertmanagerSilence{Matchers: []string{"instance={{node}}"}}}}}
	}, v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{script("a")}})
	got := f.waitReason(op.Name, v1alpha1.ConditionProgressing, nodeoperation.ReasonWaitingForGate)
	if c := condition(got, v1alpha1.ConditionProgressing); !strings.Contains(c.Message, "cannot create the silence for node") {
		t.Errorf("message: %s", c.Message)
	}
	got = f.waitReason(op.Name, v1alpha1.ConditionBlocked, nodeoperation.ReasonGateTimedOut)
	if c := condition(got, v1alpha1.ConditionBlocked); !strings.Contains(c.Message, "cannot create the silence") {
		t.Errorf("Blocked message: %s", c.Message)
	}
	if tasks := f.tasks(op.Name); len(tasks) != 0 {
		t.Errorf("%d tasks created without their node's silence", len(tasks))
	}
}
