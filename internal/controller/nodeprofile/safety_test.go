package nodeprofile_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/nodeprofile"
	"github.com/nodeops/nodeops/internal/testutil"
)

// noTaskOn fails when, for d, node gets a task of profile.
func noTaskOn(t *testing.T, ctx context.Context, profile, node, why string, d time.Duration) {
	t.Helper()
	testutil.Consistently(t, d, "no task of "+profile+" on "+node, func() error {
		byNode, err := tasksOf(ctx, profile)
		if err != nil {
			t.Fatal(err)
		}
		if got := byNode[node]; len(got) > 0 {
			return fmt.Errorf("task %s started on %s %s", got[0].Name, node, why)
		}
		return nil
	})
}

// untilObserved checks that check holds from now until the profile's controller has observed a
// new generation of it (a maxUnavailable of 1 made 2, or back, which no test here depends on once its
// nodes are provisioned): the controller reconciles one profile at a time, so everything it would
// have done on what it saw before is done by then, however slowly it runs.
func untilObserved(t *testing.T, ctx context.Context, profile, what string, check func() error) {
	t.Helper()
	if err := check(); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	var gen int64
	updateProfile(t, ctx, profile, func(p *v1alpha1.NodeProfile) {
		mu := intstr.FromInt32(2)
		if p.Spec.MaxUnavailable != nil && p.Spec.MaxUnavailable.IntValue() == 2 {
			mu = intstr.FromInt32(1)
		}
		p.Spec.MaxUnavailable = &mu
		gen = p.Generation + 1
	})
	observed, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	testutil.ConsistentlyUntil(t, observed, what, func() error {
		if err := check(); err != nil {
			return err
		}
		if p := getProfile(t, ctx, profile); p.Status.ObservedGeneration >= gen {
			cancel()
		}
		return nil
	})
	if p := getProfile(t, ctx, profile); p.Status.ObservedGeneration < gen {
		t.Fatalf("%s: the controller did not observe generation %d in %s", what, gen, wait)
	}
}

// retryTask sets spec.recoveryMode Retry, as `kubectl nodeops retry` does, and then records the
// task Pending again, as the manager's NodeTask controller (not running in this suite) does.
func retryTask(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	var task v1alpha1.NodeTask
	if err := env.client.Get(ctx, client.ObjectKey{Name: name}, &task); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(task.DeepCopy())
	task.Spec.RecoveryMode = v1alpha1.RecoveryRetry
	if err := env.client.Patch(ctx, &task, patch); err != nil {
		t.Fatalf("retry %s: %v", name, err)
	}
	must(t, agent().Write(ctx, name, func(task *v1alpha1.NodeTask) {
		task.Status.Phase, task.Status.Reason, task.Status.Message = v1alpha1.TaskPending, "", ""
		task.Status.RecoveredGeneration = task.Generation
		for i := range task.Status.Commands {
			if task.Status.Commands[i].Phase == v1alpha1.CommandFailed {
				task.Status.Commands[i].Phase = v1alpha1.CommandPending
			}
		}
	}))
}

// a failure blocks until a person decides (rule 3): a failed install stops new installs on other nodes, even with
// room under maxUnavailable, until the failed task is retried (or skipped, or the node leaves).
func TestSafetyRule3_FailedInstallStopsOtherInstalls(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	for _, n := range []string{"r3-1", "r3-2", "r3-3"} {
		makeNode(t, ctx, n, "r3", nil, kwasm)
	}
	makeProfile(t, ctx, "r3", "r3", func(s *v1alpha1.NodeProfileSpec) { s.MaxUnavailable = ptrIntOrString(2) })
	first := waitTask(t, ctx, "r3", "r3-1", nodeprofile.ActionInstall)
	second := waitTask(t, ctx, "r3", "r3-2", nodeprofile.ActionInstall)
	agentRun(t, ctx, first.Name)
	agentFail(t, ctx, first.Name, "sha256 mismatch")
	agentRun(t, ctx, second.Name)
	agentSucceed(t, ctx, second.Name)
	waitLabel(t, ctx, "r3", "r3-2", true, strings.TrimPrefix(second.Spec.Group, "install-"))
	waitCondition(t, ctx, "r3", v1alpha1.ConditionProvisioning, metav1.ConditionTrue, "blocked by the failed task "+first.Name, "r3-1")
	noTaskOn(t, ctx, "r3", "r3-3", "while the install on r3-1 has failed and nobody chose", 2*time.Second)

	retryTask(t, ctx, first.Name)
	third := waitTask(t, ctx, "r3", "r3-3", nodeprofile.ActionInstall)
	for _, name := range []string{first.Name, third.Name} {
		agentRun(t, ctx, name)
		agentSucceed(t, ctx, name)
	}
	waitCondition(t, ctx, "r3", v1alpha1.ConditionReady, metav1.ConditionTrue, "all 3")
}

// nothing deleted automatically (rule 7): the profile keeps the tasks it supersedes (an install replaced
// after a spec change, an install followed by an uninstall) until ttlSecondsAfterFinished; the
// node's latest task stays whatever the TTL says.
func TestSafetyRule7_ProfileKeepsSupersededTasks(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	makeNode(t, ctx, "keep-1", "keep", nil, kwasm)
	makeProfile(t, ctx, "keep", "keep", nil)
	first := provision(t, ctx, "keep", "keep-1")
	updateProfile(t, ctx, "keep", func(p *v1alpha1.NodeProfile) { p.Spec.Install[0].InstallFile.SHA256 = strings.Repeat("c", 64) })
	second := provision(t, ctx, "keep", "keep-1")
	patchNode(t, ctx, "keep-1", `{"metadata":{"annotations":{"kwasm.sh/kwasm-node":null}}}`)
	un := waitTask(t, ctx, "keep", "keep-1", nodeprofile.ActionUninstall)
	agentRun(t, ctx, un.Name)
	agentSucceed(t, ctx, un.Name)
	waitLabel(t, ctx, "keep", "keep-1", false, "")
	waitCondition(t, ctx, "keep", v1alpha1.ConditionReady, metav1.ConditionTrue)
	want := sorted(first.Name+"(Succeeded)", second.Name+"(Succeeded)", un.Name+"(Succeeded)")
	// The profile would delete them in the reconcile that saw the uninstall end, which is over
	// once the controller observed a later generation.
	untilObserved(t, ctx, "keep", "every superseded task kept", func() error {
		byNode, err := tasksOf(ctx, "keep")
		if err != nil {
			return err
		}
		if got := sorted(names(byNode["keep-1"])...); strings.Join(got, " ") != strings.Join(want, " ") {
			return fmt.Errorf("tasks %v, want every one kept: %v", got, want)
		}
		return nil
	})

	// With a TTL the superseded ones go; the latest stays.
	updateProfile(t, ctx, "keep", func(p *v1alpha1.NodeProfile) { p.Spec.TTLSecondsAfterFinished = ptrInt32(1) })
	testutil.Eventually(t, wait, "superseded tasks deleted after the TTL", func() error {
		byNode, err := tasksOf(ctx, "keep")
		if err != nil {
			return err
		}
		if got := names(byNode["keep-1"]); len(got) != 1 || got[0] != un.Name+"(Succeeded)" {
			return fmt.Errorf("tasks %v", got)
		}
		return nil
	})
}

// unavailable nodes count against maxUnavailable and budgets are cluster-wide (rules 2 and 11): a node an administrator cordoned, or a NotReady one,
// counts against the profile's maxUnavailable: at 1, nothing starts until it is back. (NotReady
// was counted before; the cordon was not.)
func TestSafetyRule11_ProfileCountsUnavailableNodes(t *testing.T) {
	needEnv(t)
	for _, tt := range []struct {
		name string
		down func(t *testing.T, ctx context.Context, node string, down bool)
	}{
		{"cordoned", setUnschedulable},
		{"notready", setNotReady},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			p, n1, n2 := "down-"+tt.name, "down-"+tt.name+"-1", "down-"+tt.name+"-2"
			makeNode(t, ctx, n1, p, nil, kwasm)
			makeNode(t, ctx, n2, p, nil, kwasm)
			tt.down(t, ctx, n1, true)
			makeProfile(t, ctx, p, p, nil)
			waitCondition(t, ctx, p, v1alpha1.ConditionProvisioning, metav1.ConditionTrue, "2 waiting")
			noTaskOn(t, ctx, p, n2, "while "+n1+" is "+tt.name+" at maxUnavailable 1", 2*time.Second)
			noTaskOn(t, ctx, p, n1, "while it is "+tt.name, 0)
			tt.down(t, ctx, n1, false)
			provision(t, ctx, p, n1)
			provision(t, ctx, p, n2)
		})
	}
}

func setNotReady(t *testing.T, ctx context.Context, node string, notReady bool) {
	t.Helper()
	must(t, testutil.SetNodeReady(ctx, env.client, node, !notReady))
}

func setUnschedulable(t *testing.T, ctx context.Context, node string, cordoned bool) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var n corev1.Node
		if err := env.client.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
			return err
		}
		n.Spec.Unschedulable = cordoned
		return env.client.Update(ctx, &n)
	})
	if err != nil {
		t.Fatalf("cordon %s=%v: %v", node, cordoned, err)
	}
}

func ptrInt32(v int32) *int32 { return &v }
