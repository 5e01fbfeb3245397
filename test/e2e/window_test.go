package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/nodeoperation"
	"github.com/nodeops/nodeops/internal/testutil"
	"github.com/nodeops/nodeops/test/e2e/framework"
)

// TestWindowHoldsTheFirstTaskOnLocalCluster is issue 27's maintenance window on nodeops-local, with
// the real manager and agent: an operation created before its window opens says WaitingForWindow and
// when the window opens, and the API server's own record of the first task's creation is not before
// the opening. Windows have minute resolution, so the window opens at the next whole minute at least
// 15 seconds away (15 to 75 seconds after the create).
func TestWindowHoldsTheFirstTaskOnLocalCluster(t *testing.T) {
	t.Parallel()
	l := framework.StartLocal(t, "--control-planes=1", "--workers=1")
	l.WaitNodesReady(t, 2, 5*time.Minute)

	now := time.Now().UTC()
	opens := now.Truncate(time.Minute).Add(time.Minute)
	if opens.Sub(now) < 15*time.Second {
		opens = opens.Add(time.Minute)
	}
	op := customOp("window", onNode("worker-1"), v1alpha1.Command{Wait: &v1alpha1.WaitCommand{}})
	op.Spec.Windows = []v1alpha1.MaintenanceWindow{{Start: opens.Format("15:04"), End: opens.Add(30 * time.Minute).Format("15:04"), TimeZone: "UTC"}}
	framework.Create(t, l, op)

	testutil.EventuallyEvery(t, time.Until(opens), framework.PollInterval, "the operation waiting for its window", func(ctx context.Context) error {
		if err := l.Client.Get(ctx, client.ObjectKey{Name: op.Name}, op); err != nil {
			return err
		}
		c := meta.FindStatusCondition(op.Status.Conditions, v1alpha1.ConditionProgressing)
		if c == nil || c.Reason != nodeoperation.ReasonWaitingForWindow {
			return fmt.Errorf("Progressing %+v", c)
		}
		if op.Status.NextStart == nil || !op.Status.NextStart.Time.Equal(opens) {
			return fmt.Errorf("nextStart %v, want %s", op.Status.NextStart, opens)
		}
		return nil
	})
	if tasks := framework.OperationTasks(t, l, op.Name); len(tasks) != 0 && time.Now().Before(opens) {
		t.Fatalf("task %s created at %s, before the window opens at %s", tasks[0].Name, tasks[0].CreationTimestamp.UTC(), opens)
	}

	framework.WaitForOperation(t, l, framework.WaitForOperationInput{Name: op.Name, Phase: v1alpha1.OperationSucceeded, FailIfBlocked: true, Timeout: time.Until(opens) + 3*time.Minute})
	tasks := framework.OperationTasks(t, l, op.Name)
	if len(tasks) != 1 {
		t.Fatalf("%d tasks, want the one on worker-1", len(tasks))
	}
	if created := tasks[0].CreationTimestamp.Time; created.Before(opens) {
		t.Errorf("task %s created at %s, before the window opened at %s", tasks[0].Name, created.UTC(), opens)
	}
	t.Logf("window opened %s; the task was created %s after", opens.Format(time.TimeOnly), tasks[0].CreationTimestamp.Sub(opens).Round(time.Millisecond))
}
