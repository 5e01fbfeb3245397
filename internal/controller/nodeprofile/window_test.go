package nodeprofile_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/nodeprofile"
	"github.com/nodeops/nodeops/internal/testutil"
)

// TestWindowHoldsProfileInstallsUntilItOpens: a profile whose node joins before its maintenance
// window says it waits and until when, and the API server's own record of the install task's
// creation is not before the opening. Windows have minute resolution, so the window opens at the
// next whole minute at least 15 seconds away.
func TestWindowHoldsProfileInstallsUntilItOpens(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	now := time.Now().UTC()
	opens := now.Truncate(time.Minute).Add(time.Minute)
	if opens.Sub(now) < 15*time.Second {
		opens = opens.Add(time.Minute)
	}
	closes := opens.Add(30 * time.Minute)
	makeNode(t, ctx, "window-1", "window", nil, kwasm)
	makeProfile(t, ctx, "window", "window", func(s *v1alpha1.NodeProfileSpec) {
		s.Windows = []v1alpha1.MaintenanceWindow{{Start: opens.Format("15:04"), End: closes.Format("15:04")}}
	})

	testutil.Eventually(t, 20*time.Second, "profile waiting for its window", func() error {
		p := getProfile(t, ctx, "window")
		c := condition(p, v1alpha1.ConditionProvisioning)
		if c.Reason != nodeprofile.ReasonWaitingForWindow || !strings.Contains(c.Message, "next opens at "+opens.Format(time.RFC3339)) {
			return fmt.Errorf("Provisioning %s: %s", c.Reason, c.Message)
		}
		if p.Status.NextStart == nil || !p.Status.NextStart.Time.Equal(opens) {
			return fmt.Errorf("nextStart %v, want %s", p.Status.NextStart, opens)
		}
		return nil
	})
	byNode, err := tasksOf(ctx, "window")
	if err != nil {
		t.Fatal(err)
	}
	if len(byNode["window-1"]) > 0 {
		t.Fatalf("task %v exists while the profile waits for its window", names(byNode["window-1"]))
	}
	var task *v1alpha1.NodeTask
	testutil.Eventually(t, time.Until(opens)+30*time.Second, "the install task once the window opened", func() error {
		byNode, err := tasksOf(ctx, "window")
		if err != nil {
			return err
		}
		if len(byNode["window-1"]) == 0 {
			return fmt.Errorf("no task yet")
		}
		task = &byNode["window-1"][0]
		return nil
	})
	if task.CreationTimestamp.Time.Before(opens) {
		t.Errorf("task %s created at %s, before the window opened at %s", task.Name, task.CreationTimestamp.UTC(), opens)
	}
	agentRun(t, ctx, task.Name)
	agentSucceed(t, ctx, task.Name)
	waitCondition(t, ctx, "window", v1alpha1.ConditionReady, "True", "all 1 node(s) provisioned")
	if p := getProfile(t, ctx, "window"); p.Status.NextStart != nil {
		t.Errorf("nextStart %v left after the window opened", p.Status.NextStart)
	}
}
