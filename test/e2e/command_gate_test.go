package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/nodeoperation"
	"github.com/nodeops/nodeops/internal/testutil"
	"github.com/nodeops/nodeops/test/e2e/framework"
)

// TestCommandGateHoldsUntilTheHostSaysSo is issue 27's command gate on nodeops-local: a gate
// `test -f /var/tmp/resync-done` runs on worker-1 by the real agent, as a gate-check NodeTask;
// the operation waits (WaitingForGate, the script's exit code in its message) until the test
// creates the file in worker-1's host root, and the API server's own records show the node's task
// created only after a check succeeded.
func TestCommandGateHoldsUntilTheHostSaysSo(t *testing.T) {
	t.Parallel()
	start := time.Now()
	l := framework.StartLocal(t, "--control-planes=1", "--workers=2")
	l.WaitNodesReady(t, 3, 5*time.Minute)
	ctx := context.Background()
	t.Logf("cluster up in %s", time.Since(start).Round(time.Second))

	done := filepath.Join(l.NodeRoot("worker-1"), "var/tmp/resync-done")
	if err := os.Remove(done); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	op := customOp("command-gate", onNode("worker-1"), v1alpha1.Command{Wait: &v1alpha1.WaitCommand{}})
	op.Spec.Gates = []v1alpha1.Gate{{Name: "resync", Timeout: &metav1.Duration{Duration: 10 * time.Minute},
		Command: &v1alpha1.CommandGate{Script: "test -f /var/tmp/resync-done || { echo 'md0: resync not done'; exit 4; }"}}}
	framework.Create(t, l, op)

	testutil.EventuallyEvery(t, 2*time.Minute, framework.PollInterval, "the gate holds with the script's exit code", func(ctx context.Context) error {
		if err := l.Client.Get(ctx, client.ObjectKey{Name: op.Name}, op); err != nil {
			return err
		}
		for _, c := range op.Status.Conditions {
			if c.Type == v1alpha1.ConditionProgressing && c.Reason == nodeoperation.ReasonWaitingForGate &&
				strings.Contains(c.Message, "script exited 4 on node worker-1: md0: resync not done") {
				return nil
			}
		}
		return fmt.Errorf("conditions %+v", op.Status.Conditions)
	})
	if tasks := framework.OperationTasks(t, l, op.Name); len(tasks) != 0 {
		t.Fatalf("task %s created while the gate held", tasks[0].Name)
	}
	t.Logf("held by the gate after %s; creating the file on worker-1", time.Since(start).Round(time.Second))
	if err := os.MkdirAll(filepath.Dir(done), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(done, nil, 0o644); err != nil {
		t.Fatal(err)
	}

	got := framework.WaitForOperation(t, l, framework.WaitForOperationInput{Name: op.Name, Phase: v1alpha1.OperationSucceeded, FailIfBlocked: true, Timeout: 3 * time.Minute})
	var checks v1alpha1.NodeTaskList
	if err := l.Client.List(ctx, &checks, client.MatchingLabels{v1alpha1.LabelGateCheck: "resync"}); err != nil {
		t.Fatal(err)
	}
	var passed time.Time
	for i := range checks.Items {
		c := &checks.Items[i]
		if !v1alpha1.IsGateCheck(c) || c.Spec.NodeName != "worker-1" {
			t.Errorf("check %s: a gate check %v, on %s", c.Name, v1alpha1.IsGateCheck(c), c.Spec.NodeName)
		}
		if c.Status.Phase == v1alpha1.TaskSucceeded && c.Status.CompletionTime != nil {
			passed = c.Status.CompletionTime.Time
		}
	}
	if len(checks.Items) > 2 || passed.IsZero() {
		t.Errorf("%d checks kept, a succeeded one ended at %v; want at most two, the last succeeded", len(checks.Items), passed)
	}
	for _, task := range framework.OperationTasks(t, l, op.Name) {
		// Whole-second creation time against a microsecond completion: created in that second counts as after.
		if task.CreationTimestamp.Time.Before(passed.Truncate(time.Second)) {
			t.Errorf("task %s created at %s, before the check passed at %s", task.Name, task.CreationTimestamp.UTC(), passed.UTC())
		}
	}
	for _, g := range got.Status.Gates {
		if g.Name == "resync" && (g.State != v1alpha1.GatePassed || g.Message != "script exited 0 on node worker-1") {
			t.Errorf("gate resync ended %s: %s", g.State, g.Message)
		}
	}
	t.Logf("done in %s", time.Since(start).Round(time.Second))
}
