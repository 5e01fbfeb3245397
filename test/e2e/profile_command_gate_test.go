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
	"github.com/nodeops/nodeops/internal/controller/nodeprofile"
	"github.com/nodeops/nodeops/internal/testutil"
	"github.com/nodeops/nodeops/test/e2e/framework"
)

// TestProfileCommandGateHoldsUntilTheHostSaysSo is issue 27's command gate on a NodeProfile on
// nodeops-local: the real agent runs the profile's gate check on worker-1, whose script fails
// until a file exists on that node's root; the profile holds (WaitingForGate, with the script's
// exit code and output) and creates no install task, then installs and labels worker-1 once the
// script exits 0, the install created after the check succeeded.
func TestProfileCommandGateHoldsUntilTheHostSaysSo(t *testing.T) {
	t.Parallel()
	start := time.Now()
	l := framework.StartLocal(t, "--control-planes=1", "--workers=1")
	l.WaitNodesReady(t, 2, 5*time.Minute)
	ctx := context.Background()
	t.Logf("cluster up in %s", time.Since(start).Round(time.Second))

	done := filepath.Join(l.NodeRoot("worker-1"), "var/tmp/profile-resync-done")
	if err := os.Remove(done); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	prof := &v1alpha1.NodeProfile{ObjectMeta: metav1.ObjectMeta{Name: "command-gated"}, Spec: v1alpha1.NodeProfileSpec{
		Trigger: &v1alpha1.ProfileTrigger{Annotation: "nodeops.test/command-gated=true"},
		Install: []v1alpha1.Command{{Wait: &v1alpha1.WaitCommand{}}},
		Gates: []v1alpha1.Gate{{Name: "resync", Timeout: &metav1.Duration{Duration: 10 * time.Minute},
			Command: &v1alpha1.CommandGate{Script: "test -f /var/tmp/profile-resync-done || { echo 'md0: resync not done'; exit 4; }"}}},
	}}
	framework.Create(t, l, prof)
	l.MustKubectl(t, "annotate", "node", "worker-1", "nodeops.test/command-gated=true")
	tasks := func(ctx context.Context) ([]v1alpha1.NodeTask, error) {
		var list v1alpha1.NodeTaskList
		err := l.Client.List(ctx, &list, client.MatchingLabels{v1alpha1.LabelProfile: prof.Name})
		return list.Items, err
	}

	testutil.EventuallyEvery(t, 3*time.Minute, framework.PollInterval, "the gate holds with the script's exit code", func(ctx context.Context) error {
		p := &v1alpha1.NodeProfile{}
		if err := l.Client.Get(ctx, client.ObjectKey{Name: prof.Name}, p); err != nil {
			return err
		}
		for _, c := range p.Status.Conditions {
			if c.Type == v1alpha1.ConditionProvisioning && c.Reason == nodeprofile.ReasonWaitingForGate &&
				strings.Contains(c.Message, "script exited 4 on node worker-1: md0: resync not done") {
				return nil
			}
		}
		return fmt.Errorf("conditions %+v", p.Status.Conditions)
	})
	if got, err := tasks(ctx); err != nil || len(got) != 0 {
		t.Fatalf("install tasks while the gate held: %d (%v)", len(got), err)
	}
	t.Logf("held by the gate after %s; creating the file on worker-1", time.Since(start).Round(time.Second))
	if err := os.MkdirAll(filepath.Dir(done), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(done, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	framework.WaitForProfileLabel(t, l, prof.Name, "worker-1", true)

	var checks v1alpha1.NodeTaskList
	if err := l.Client.List(ctx, &checks, client.MatchingLabels{v1alpha1.LabelGateCheck: "resync"}); err != nil {
		t.Fatal(err)
	}
	var passed time.Time
	for i := range checks.Items {
		c := &checks.Items[i]
		if ref := metav1.GetControllerOf(c); !v1alpha1.IsGateCheck(c) || c.Spec.NodeName != "worker-1" || ref == nil || ref.Kind != "NodeProfile" {
			t.Errorf("check %s: a gate check %v, on %s, controller %+v", c.Name, v1alpha1.IsGateCheck(c), c.Spec.NodeName, ref)
		}
		if c.Status.Phase == v1alpha1.TaskSucceeded && c.Status.CompletionTime != nil {
			passed = c.Status.CompletionTime.Time
		}
	}
	if len(checks.Items) > 2 || passed.IsZero() {
		t.Errorf("%d checks kept, a succeeded one ended at %v; want at most two, the last succeeded", len(checks.Items), passed)
	}
	got, err := tasks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range got {
		// Whole-second creation time against a microsecond completion: created in that second counts as after.
		if task.CreationTimestamp.Time.Before(passed.Truncate(time.Second)) {
			t.Errorf("task %s created at %s, before the check passed at %s", task.Name, task.CreationTimestamp.UTC(), passed.UTC())
		}
	}
	t.Logf("done in %s", time.Since(start).Round(time.Second))
}
