package nodeoperation_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/nodeoperation"
	"github.com/nodeops/nodeops/internal/testutil"
)

// TestWindowHoldsTheFirstTaskUntilItOpens: an operation created before its maintenance window
// says it waits and when, and the API server's own record of the first task's creation is not
// before the opening. Windows have minute resolution, so the window opens at the next whole
// minute at least 15 seconds away.
func TestWindowHoldsTheFirstTaskUntilItOpens(t *testing.T) {
	f := newFixture(t)
	f.nodes(nil, "n1", "n2")
	now := time.Now().UTC()
	opens := now.Truncate(time.Minute).Add(time.Minute)
	if opens.Sub(now) < 15*time.Second {
		opens = opens.Add(time.Minute)
	}
	closes := opens.Add(30 * time.Minute)
	op := f.operation("window", func(o *v1alpha1.NodeOperation) {
		o.Spec.Windows = []v1alpha1.MaintenanceWindow{{Start: opens.Format("15:04"), End: closes.Format("15:04")}}
		o.Spec.MaxUnavailable = intOrStr("2")
	}, v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{script("a")}})

	testutil.Eventually(t, 20*time.Second, "operation waiting for its window", func() error {
		got := f.get(op.Name)
		c := condition(got, v1alpha1.ConditionProgressing)
		if c.Reason != nodeoperation.ReasonWaitingForWindow {
			return fmt.Errorf("Progressing %s: %s", c.Reason, c.Message)
		}
		if got.Status.NextStart == nil || !got.Status.NextStart.Time.Equal(opens) {
			return fmt.Errorf("nextStart %v, want %s", got.Status.NextStart, opens)
		}
		return nil
	})
	deadline := time.Until(opens) + 30*time.Second
	var tasks []v1alpha1.NodeTask
	testutil.Eventually(t, deadline, "tasks once the window opened", func() error {
		if tasks = f.tasks(op.Name); len(tasks) != 2 {
			return fmt.Errorf("%d tasks", len(tasks))
		}
		return nil
	})
	for _, task := range tasks {
		if task.CreationTimestamp.Time.Before(opens) {
			t.Errorf("task %s created at %s, before the window opened at %s", task.Name, task.CreationTimestamp.UTC(), opens)
		}
	}
	testutil.Eventually(t, 20*time.Second, "Running inside the window", func() error {
		got := f.get(op.Name)
		if c := condition(got, v1alpha1.ConditionProgressing); c.Reason == nodeoperation.ReasonWaitingForWindow || got.Status.NextStart != nil {
			return fmt.Errorf("still waiting: %s, nextStart %v", c.Message, got.Status.NextStart)
		}
		return nil
	})
}
