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
	"github.com/nodeops/nodeops/internal/alerting"
	"github.com/nodeops/nodeops/internal/testutil"
	"github.com/nodeops/nodeops/internal/testutil/monitoring"
	"github.com/nodeops/nodeops/test/e2e/framework"
)

// TestAlertingGates: a real Alertmanager with a firing alert, and a real Prometheus whose query
// returns a series, each hold an operation before its node; resolving the alert, or the metric
// dropping, releases it. Measured from the operation's own records: the gate's status while it
// holds, no NodeTask then, and the task created only after the release.
func TestAlertingGates(t *testing.T) {
	t.Parallel()
	l := framework.StartLocal(t, "--control-planes=1", "--workers=1")
	l.WaitNodesReady(t, 2, 3*time.Minute)

	t.Run("a firing alert holds the operation; resolving it releases it", func(t *testing.T) {
		am := monitoring.Alertmanager(t)
		ctx := t.Context()
		alert := map[string]string{"alertname": "NodeopsE2EBlocker", "cluster": "nodeops-local"}
		if err := am.PostAlert(ctx, alert, time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		matchers := []string{"alertname=NodeopsE2EBlocker"}
		waitLines(t, "the alert fires", func(ctx context.Context) ([]string, error) {
			return alerting.Alertmanager{URL: am.URL}.Firing(ctx, matchers)
		}, 1)

		op := customOp("gate-alertmanager", onNode("worker-1"), script("true", true))
		op.Spec.Gates = []v1alpha1.Gate{{Name: "no-alerts", Alertmanager: &v1alpha1.AlertmanagerGate{URL: am.URL, Matchers: matchers}}}
		holdsThenReleases(t, l, op, "no-alerts", "NodeopsE2EBlocker", func() {
			if err := am.PostAlert(ctx, alert, time.Now().Add(-time.Second)); err != nil {
				t.Fatal(err)
			}
		})
	})

	t.Run("the silence nodeops creates exists while the node is worked on and is expired after", func(t *testing.T) {
		am := monitoring.Alertmanager(t)
		ctx := t.Context()
		// The node's script waits for a file in its root: the test reads the silence while the
		// task is certainly running, then lets it end.
		const release = "/var/tmp/e2e-silence-release"
		op := customOp("gate-silence", onNode("worker-1"), script(fmt.Sprintf("while [ ! -f %s ]; do sleep 0.2; done", release), true))
		op.Spec.Gates = []v1alpha1.Gate{{Name: "no-alerts", Alertmanager: &v1alpha1.AlertmanagerGate{URL: am.URL, Matchers: []string{"alertname=NodeopsE2EBlocker"},
			Silence: &v1alpha1.AlertmanagerSilence{Matchers: []string{"instance={{node}}"}, MaxDuration: &metav1.Duration{Duration: time.Hour}, Comment: "e2e works on {{node}}"}}}}
		framework.Create(t, l, op)

		var rec v1alpha1.SilenceStatus
		testutil.EventuallyEvery(t, framework.OperationTimeout, framework.PollInterval, "the task's script running", func(ctx context.Context) error {
			got := &v1alpha1.NodeOperation{}
			if err := l.Client.Get(ctx, client.ObjectKey{Name: op.Name}, got); err != nil {
				return err
			}
			if len(got.Status.Silences) != 1 {
				return fmt.Errorf("status.silences: %+v", got.Status.Silences)
			}
			rec = got.Status.Silences[0]
			for _, task := range framework.OperationTasks(t, l, op.Name) {
				if len(task.Status.Commands) > 0 && task.Status.Commands[0].Phase == v1alpha1.CommandRunning {
					return nil
				}
			}
			return fmt.Errorf("no script running yet")
		})
		if rec.Node != "worker-1" || rec.Gate != "no-alerts" || rec.ID == "" {
			t.Fatalf("status.silences[0] = %+v", rec)
		}
		sil, err := am.SilenceByID(ctx, rec.ID)
		if err != nil {
			t.Fatal(err)
		}
		if sil.Status.State != "active" || len(sil.Matchers) != 1 || sil.Matchers[0].Name != "instance" || sil.Matchers[0].Value != "worker-1" ||
			!strings.Contains(sil.Comment, "e2e works on worker-1") || sil.EndsAt.After(time.Now().Add(time.Hour)) {
			t.Fatalf("silence %s while worker-1 is worked on: %+v", rec.ID, sil)
		}
		// Still running: the silence was read while the node was worked on.
		for _, task := range framework.OperationTasks(t, l, op.Name) {
			if task.Status.Phase != v1alpha1.TaskRunning {
				t.Fatalf("task %s is %s: the silence was not read while it ran", task.Name, task.Status.Phase)
			}
		}
		t.Logf("silence %s active while worker-1 is worked on: %s until %s", rec.ID, sil.Comment, sil.EndsAt.UTC().Format(time.RFC3339))

		path := filepath.Join(l.NodeRoot("worker-1"), release)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		done := framework.WaitForOperation(t, l, framework.WaitForOperationInput{Name: op.Name, Phase: v1alpha1.OperationSucceeded, FailIfBlocked: true})
		if len(done.Status.Silences) != 0 {
			t.Errorf("status.silences after the operation: %+v", done.Status.Silences)
		}
		sil, err = am.SilenceByID(ctx, rec.ID)
		if err != nil {
			t.Fatal(err)
		}
		if sil.Status.State != "expired" {
			t.Fatalf("silence %s after the node's task ended: %s, want expired", rec.ID, sil.Status.State)
		}
		all, err := am.Silences(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, other := range all {
			if other.Status.State != "expired" {
				t.Errorf("silence %s still %s after the operation (%s)", other.ID, other.Status.State, other.Comment)
			}
		}
	})

	t.Run("a query returning a series holds the operation; none releases it", func(t *testing.T) {
		target := monitoring.NewTarget(t, "nodeops_e2e_blocker")
		target.Set(1)
		prom := monitoring.Prometheus(t, target.Addr)
		const query = "nodeops_e2e_blocker > 0"
		waitLines(t, "the query returns the series", func(ctx context.Context) ([]string, error) {
			return alerting.Prometheus{URL: prom.URL}.Series(ctx, query)
		}, 1)

		op := customOp("gate-prometheus", onNode("worker-1"), script("true", true))
		op.Spec.Gates = []v1alpha1.Gate{{Name: "no-blocker", Prometheus: &v1alpha1.PrometheusGate{URL: prom.URL, Query: query}}}
		holdsThenReleases(t, l, op, "no-blocker", "nodeops_e2e_blocker", func() { target.Set(0) })
	})
}

// holdsThenReleases creates op, waits until its gate holds it (the gate's status Waiting with a
// message containing want, and no NodeTask), calls release, and checks from the records that the
// gate passed and the task was created only after the release.
func holdsThenReleases(t *testing.T, l *framework.Local, op *v1alpha1.NodeOperation, gate, want string, release func()) {
	t.Helper()
	framework.Create(t, l, op)
	testutil.EventuallyEvery(t, framework.OperationTimeout, framework.PollInterval, "gate "+gate+" holds "+op.Name, func(ctx context.Context) error {
		got := &v1alpha1.NodeOperation{}
		if err := l.Client.Get(ctx, client.ObjectKey{Name: op.Name}, got); err != nil {
			return err
		}
		g := gateStatus(got, gate)
		if g == nil || g.State != v1alpha1.GateWaiting || !strings.Contains(g.Message, want) {
			return fmt.Errorf("gate %s: %+v", gate, g)
		}
		return nil
	})
	// The gate's record says it held; a task existing now would have started past it.
	if tasks := framework.OperationTasks(t, l, op.Name); len(tasks) != 0 {
		t.Fatalf("gate %s holds, yet %d task(s) exist: %s", gate, len(tasks), tasks[0].Name)
	}
	released := metav1.NewTime(time.Now().Truncate(time.Second))
	release()
	done := framework.WaitForOperation(t, l, framework.WaitForOperationInput{Name: op.Name, Phase: v1alpha1.OperationSucceeded, FailIfBlocked: true})
	g := gateStatus(done, gate)
	if g == nil || g.State != v1alpha1.GatePassed || g.Since.Before(&released) {
		t.Errorf("gate %s after the release: %+v, want Passed since %s or later", gate, g, released.UTC().Format(time.RFC3339))
	}
	tasks := framework.OperationTasks(t, l, op.Name)
	if len(tasks) != 1 || tasks[0].CreationTimestamp.Before(&released) {
		t.Fatalf("tasks %v: want one, created at %s or later", tasks, released.UTC().Format(time.RFC3339))
	}
	t.Logf("gate %s: released at %s, passed at %s, task created at %s", gate, released.UTC().Format(time.RFC3339),
		g.Since.UTC().Format(time.RFC3339), tasks[0].CreationTimestamp.UTC().Format(time.RFC3339))
}

func gateStatus(op *v1alpha1.NodeOperation, name string) *v1alpha1.GateStatus {
	for i := range op.Status.Gates {
		if op.Status.Gates[i].Name == name {
			return &op.Status.Gates[i]
		}
	}
	return nil
}

// waitLines waits until list returns n lines.
func waitLines(t *testing.T, what string, list func(context.Context) ([]string, error), n int) {
	t.Helper()
	testutil.EventuallyEvery(t, time.Minute, 200*time.Millisecond, what, func(ctx context.Context) error {
		lines, err := list(ctx)
		if err != nil {
			return err
		}
		if len(lines) != n {
			return fmt.Errorf("%d lines, want %d: %q", len(lines), n, lines)
		}
		return nil
	})
}
