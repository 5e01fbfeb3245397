package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/localcluster"
	"github.com/nodeops/nodeops/internal/testutil"
	"github.com/nodeops/nodeops/test/e2e/framework"
)

// TestLeaderFailover runs two managers electing a leader (issue 16, "Two managers") and kills the
// leader with SIGKILL while an operation is mid-way: the other takes the Lease once it expires,
// the operation finishes, no node gets two tasks and at no moment are more nodes held than
// maxUnavailable allows (one task per node and unavailable nodes count against maxUnavailable, rules 1 and 2).
func TestLeaderFailover(t *testing.T) {
	t.Parallel()
	l := framework.StartLocal(t, "--control-planes=1", "--workers=3", "--managers=2")
	l.WaitNodesReady(t, 4, 3*time.Minute)
	workers := []string{"worker-1", "worker-2", "worker-3"}
	among := map[string]bool{}
	for _, w := range workers {
		among[w] = true
	}

	var leaderID, leader string
	testutil.EventuallyEvery(t, time.Minute, framework.PollInterval, "a manager holds the Lease", func(ctx context.Context) error {
		var err error
		leaderID, leader, err = framework.ManagerLeader(ctx, l)
		return err
	})
	t.Logf("%s leads (%s)", leader, leaderID)

	// Each node's script records that it ran, then waits for a gate in its root: the operation
	// stays mid-way, its first node held, until the test opens the gates.
	const ran, gate = "/var/tmp/e2e-failover-ran", "/var/tmp/e2e-failover-gate"
	one := intstr.FromInt32(1)
	op := customOp("failover",
		&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: metav1.LabelSelectorOpIn, Values: workers}}},
		script(fmt.Sprintf("mkdir -p /var/tmp && echo \"$NODEOPS_NODE_NAME\" >> %s; while [ ! -f %s ]; do sleep 0.2; done", ran, gate), false))
	op.Spec.MaxUnavailable = &one
	w := framework.WatchTasks(t, l, map[string]string{v1alpha1.LabelOperation: op.Name})
	framework.Create(t, l, op)
	testutil.EventuallyEvery(t, 2*time.Minute, framework.PollInterval, "the first task's script running", func(context.Context) error {
		for _, task := range framework.OperationTasks(t, l, op.Name) {
			if len(task.Status.Commands) > 0 && task.Status.Commands[0].Phase == v1alpha1.CommandRunning {
				return nil
			}
		}
		return errors.New("no script running yet")
	})

	// The leader may have changed since; kill the one holding the Lease now.
	ctx := context.Background()
	leaderID, leader, err := framework.ManagerLeader(ctx, l)
	if err != nil {
		t.Fatal(err)
	}
	killed := framework.KillProcess(t, l, leader)
	killedAt := time.Now()
	t.Logf("killed %s (pid %d, %s) with SIGKILL mid-operation", leader, killed, leaderID)

	// A standby takes an expired Lease after lease duration plus up to two retry periods; the
	// deadline is a multiple of that, not a measure of it.
	var newID, newLeader string
	testutil.EventuallyEvery(t, 5*localcluster.ManagerLeaseDuration, 200*time.Millisecond, "another manager takes the Lease", func(ctx context.Context) error {
		id, p, err := framework.ManagerLeader(ctx, l)
		if err != nil {
			return err
		}
		if id == leaderID {
			return fmt.Errorf("still held by the killed %s", id)
		}
		newID, newLeader = id, p
		return nil
	})
	t.Logf("takeover %s after the kill (lease duration %s): %s holds the Lease (%s)",
		time.Since(killedAt).Round(100*time.Millisecond), localcluster.ManagerLeaseDuration, newLeader, newID)
	if err := syscall.Kill(killed, 0); err == nil {
		t.Errorf("the killed %s (pid %d) is still alive", leader, killed)
	}
	procs, err := l.Processes()
	if err != nil {
		t.Fatal(err)
	}
	// nodeops-local's supervisor restarts a killed child after a second, so the killed manager may
	// be back as a standby by now, with a new pid and a new identity; either manager may win.
	switch restarted := procs[leader] != killed; {
	case newLeader == leader:
		t.Logf("the supervisor restarted %s (pid %d) and the restarted process won the Lease", leader, procs[leader])
	case restarted:
		t.Logf("the supervisor restarted %s (pid %d) as a standby before %s took over", leader, procs[leader], newLeader)
	default:
		t.Logf("%s had not been restarted yet when %s took over", leader, newLeader)
	}

	for _, n := range workers {
		path := filepath.Join(l.NodeRoot(n), gate)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	framework.WaitForOperation(t, l, framework.WaitForOperationInput{Name: op.Name, Phase: v1alpha1.OperationSucceeded, Timeout: 2 * time.Minute, FailIfBlocked: true})
	events := w.Stop(t)

	if held, at := framework.MaxHeld(events, among); held > 1 {
		t.Errorf("%d nodes held at once, maxUnavailable is 1: %s", held, at)
	}
	tasksOf := map[string]map[string]bool{}
	for _, ev := range events {
		n := ev.Task.Spec.NodeName
		if tasksOf[n] == nil {
			tasksOf[n] = map[string]bool{}
		}
		tasksOf[n][ev.Task.Name] = true
	}
	for _, n := range workers {
		if len(tasksOf[n]) != 1 {
			t.Errorf("node %s got %d tasks (%v), want exactly one", n, len(tasksOf[n]), tasksOf[n])
		}
		got, err := os.ReadFile(filepath.Join(l.NodeRoot(n), ran))
		if err != nil || strings.TrimSpace(string(got)) != n {
			t.Errorf("node %s: %s is %q (%v), want the script to have run once", n, ran, got, err)
		}
	}
	if len(tasksOf) != len(workers) {
		t.Errorf("tasks on %v, want only the workers %v", framework.NodesOf(events), workers)
	}
}
