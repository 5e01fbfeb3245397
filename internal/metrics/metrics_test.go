package metrics_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/metrics"
	"github.com/nodeops/nodeops/internal/testutil"
)

// The collectors read a real API server; no controller runs, so each test writes the objects'
// status as the manager and the agents would.
var env *testutil.Env

func TestMain(m *testing.M) {
	var err error
	env, err = testutil.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(code)
}

// A group's budget counts what unavailable nodes count against maxUnavailable and budgets are cluster-wide (rules 2 and 11) count (docs/design.md): its nodes held by
// any unfinished task, failed ones included, NotReady or cordoned by anyone; a node whose task
// succeeded is available again.
func TestGroupBudgetCountsEveryUnavailableNode(t *testing.T) {
	ctx := context.Background()
	sel := map[string]string{"nodeops.test/budget": "true"}
	node(t, "budget-done", sel, true, false)
	node(t, "budget-running", sel, true, false)
	node(t, "budget-failed", sel, true, false)
	node(t, "budget-notready", sel, false, false)
	node(t, "budget-cordoned", sel, true, true)
	node(t, "budget-other", sel, true, false) // held by a profile's task
	node(t, "budget-free", sel, true, false)
	node(t, "budget-unselected", nil, false, true)

	two := intstr.FromString("30%")
	op := operation(t, "budget", &metav1.LabelSelector{MatchLabels: sel}, &two)
	setOperationStatus(t, op, v1alpha1.OperationRunning, v1alpha1.GroupRunning)
	agent := testutil.FakeAgent{Client: env.Client}
	for _, n := range []string{"budget-done", "budget-running", "budget-failed", "budget-other"} {
		task(t, "budget-"+n, n)
	}
	if err := agent.RunAll(ctx, "budget-budget-done"); err != nil {
		t.Fatal(err)
	}
	if err := agent.Begin(ctx, "budget-budget-running", 0); err != nil {
		t.Fatal(err)
	}
	if err := agent.Begin(ctx, "budget-budget-failed", 0); err != nil {
		t.Fatal(err)
	}
	if err := agent.End(ctx, "budget-budget-failed", 0, false, "exit status 1"); err != nil {
		t.Fatal(err)
	}

	got := gather(t, metrics.NewManager(env.Client))
	labels := `{group="all",operation="budget"}`
	// running, failed, notready, cordoned, other: 5 of 7 selected nodes; 30% of 7 is 2.
	for k, want := range map[string]float64{
		metrics.GroupUnavailableNodes + labels: 5,
		metrics.GroupMaxUnavailable + labels:   2,
	} {
		if got[k] != want {
			t.Errorf("%s = %v, want %v", k, got[k], want)
		}
	}
}

// nodeops_commands_failed_total counts each failed run of a command the manager sees once, by kind
// and reason: it never goes down when a failed task is deleted, goes up on each new failure (a
// retried command's second failure included), and leaves out what had failed before the manager
// started. The failure reason of a task whose agent was lost is the manager's (AgentLost), though
// the agent left its command Running.
func TestCommandsFailedOnlyGrows(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	agent := testutil.FakeAgent{Client: env.Client}
	fail := func(name string) {
		t.Helper()
		if err := agent.Begin(ctx, name, 0); err != nil {
			t.Fatal(err)
		}
		if err := agent.End(ctx, name, 0, false, "exit status 1"); err != nil {
			t.Fatal(err)
		}
	}
	task(t, "counted-before", "counted-node-0")
	fail("counted-before")

	c, err := cache.New(env.Config, cache.Options{Scheme: env.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.NewManager(c)
	if err := m.Start(ctx, c); err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		t.Fatal("cache did not sync")
	}
	failed := metrics.CommandsFailed + `{kind="wait",reason="CommandFailed"}`
	lost := metrics.CommandsFailed + `{kind="wait",reason="AgentLost"}`
	expect := func(what string, want map[string]float64) {
		t.Helper()
		testutil.Eventually(t, 30*time.Second, what, func() error {
			got := gather(t, m)
			for k, v := range want {
				if g, ok := got[k]; v < 0 && ok || v >= 0 && g != v {
					return fmt.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
				}
			}
			return nil
		})
	}
	expect("a failure from before the start is not counted", map[string]float64{failed: -1, lost: -1})

	task(t, "counted-1", "counted-node-1")
	fail("counted-1")
	expect("a new failure is counted", map[string]float64{failed: 1})

	if err := env.Client.Delete(ctx, &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: "counted-1"}}); err != nil {
		t.Fatal(err)
	}
	task(t, "counted-2", "counted-node-2")
	testutil.Eventually(t, 30*time.Second, "the cache sees counted-1 deleted and counted-2 created", func() error {
		var tk v1alpha1.NodeTask
		if err := c.Get(ctx, client.ObjectKey{Name: "counted-1"}, &tk); err == nil {
			return fmt.Errorf("counted-1 is still cached")
		}
		return c.Get(ctx, client.ObjectKey{Name: "counted-2"}, &tk)
	})
	expect("deleting the failed task does not lower the count", map[string]float64{failed: 1})

	fail("counted-2")
	expect("a second failure is counted", map[string]float64{failed: 2})
	if err := env.Client.Patch(ctx, &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: "counted-2"}},
		client.RawPatch(types.MergePatchType, []byte(`{"spec":{"recoveryMode":"Retry"}}`))); err != nil {
		t.Fatal(err)
	}
	if err := agent.Recover(ctx, "counted-2"); err != nil {
		t.Fatal(err)
	}
	fail("counted-2")
	expect("the retried command's second failure is counted", map[string]float64{failed: 3})

	task(t, "lost-task", "lost-node")
	if err := agent.Begin(ctx, "lost-task", 0); err != nil {
		t.Fatal(err)
	}
	if err := agent.Write(ctx, "lost-task", func(t *v1alpha1.NodeTask) {
		meta.SetStatusCondition(&t.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionAgentLost, Status: metav1.ConditionTrue,
			Reason: v1alpha1.ReasonAgentLost, Message: "no heartbeat for 1m"})
	}); err != nil {
		t.Fatal(err)
	}
	expect("a lost agent's running command is counted as AgentLost", map[string]float64{failed: 3, lost: 1})
}

// Blocked-since is the Blocked condition's transition; the certificate expiry is the
// ClusterTarget's observation.
func TestBlockedSinceAndCertificates(t *testing.T) {
	ctx := context.Background()
	blockedAt := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	op := operation(t, "blocked", nil, nil)
	op.Status.Phase = v1alpha1.OperationBlocked
	op.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionBlocked, Status: metav1.ConditionTrue, Reason: "TaskFailed",
		Message: "test", LastTransitionTime: metav1.NewTime(blockedAt)}}
	if err := env.Client.Status().Update(ctx, op); err != nil {
		t.Fatal(err)
	}

	expiry := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	ct := &v1alpha1.ClusterTarget{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ClusterTargetName},
		Spec: v1alpha1.ClusterTargetSpec{KubernetesVersion: "v1.37.2"}}
	if err := env.Client.Create(ctx, ct); err != nil {
		t.Fatal(err)
	}
	testutil.RemoveAtEnd(t, env.Client, ct)
	ct.Status.Certificates = []v1alpha1.ObservedCertificates{{Node: "cp-1", Certificates: []v1alpha1.CertificateExpiry{
		{Name: "apiserver", NotAfter: metav1.NewTime(expiry)}}}}
	if err := env.Client.Status().Update(ctx, ct); err != nil {
		t.Fatal(err)
	}

	got := gather(t, metrics.NewManager(env.Client))
	for k, want := range map[string]float64{
		metrics.OperationBlockedSince + `{operation="blocked"}`:             float64(blockedAt.Unix()),
		metrics.CertificateExpiry + `{certificate="apiserver",node="cp-1"}`: float64(expiry.Unix()),
	} {
		if v, ok := got[k]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", k, v, ok, want)
		}
	}
}

// A succeeded command's time is split into the time its work ran and the time it waited for each
// thing, by kind: a static pod restart of 40 s that waited 25 s for the mirror pod to go and 10 s
// for it to come back ran 5 s.
func TestCommandTimeSplitsRunFromWaits(t *testing.T) {
	ctx := context.Background()
	tk := &v1alpha1.NodeTask{
		ObjectMeta: metav1.ObjectMeta{Name: "phases-1", Labels: map[string]string{v1alpha1.LabelNode: "phases"}},
		Spec:       v1alpha1.NodeTaskSpec{NodeName: "phases", Commands: []v1alpha1.Command{{RestartStaticPods: &v1alpha1.RestartStaticPodsCommand{}}}},
	}
	if err := env.Client.Create(ctx, tk); err != nil {
		t.Fatal(err)
	}
	// The metrics count every task in the cluster: a task left here would be counted by the next run.
	testutil.RemoveAtEnd(t, env.Client, tk)
	start := metav1.NewMicroTime(time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC))
	end := metav1.NewMicroTime(start.Add(40 * time.Second))
	tk.Status = v1alpha1.NodeTaskStatus{Phase: v1alpha1.TaskSucceeded, Commands: []v1alpha1.CommandStatus{{
		Name: "restartStaticPods", Phase: v1alpha1.CommandSucceeded, Attempt: 1, StartTime: &start, CompletionTime: &end,
		Waits: []v1alpha1.CommandWait{
			{For: v1alpha1.WaitMirrorPodGone, Duration: metav1.Duration{Duration: 25 * time.Second}},
			{For: v1alpha1.WaitMirrorPodBack, Duration: metav1.Duration{Duration: 10 * time.Second}},
		},
	}}}
	if err := env.Client.Status().Update(ctx, tk); err != nil {
		t.Fatal(err)
	}
	got := gather(t, metrics.NewManager(env.Client))
	for k, want := range map[string]float64{
		metrics.CommandDuration + `_sum{kind="restartStaticPods"}`:                            40,
		metrics.CommandPhaseDuration + `_sum{kind="restartStaticPods",phase="Run"}`:           5,
		metrics.CommandPhaseDuration + `_sum{kind="restartStaticPods",phase="MirrorPodGone"}`: 25,
		metrics.CommandPhaseDuration + `_sum{kind="restartStaticPods",phase="MirrorPodBack"}`: 10,
		metrics.CommandPhaseDuration + `_count{kind="restartStaticPods",phase="Run"}`:         1,
	} {
		if v, ok := got[k]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", k, v, ok, want)
		}
	}
}

// The agent reports only its own nodes' commands, by kind and result, and when the last ended.
func TestAgentReportsItsNodesCommands(t *testing.T) {
	ctx := context.Background()
	agent := testutil.FakeAgent{Client: env.Client}
	task(t, "agent-mine-1", "agent-mine")
	task(t, "agent-mine-2", "agent-mine")
	task(t, "agent-theirs", "agent-theirs")
	for _, n := range []string{"agent-mine-1", "agent-theirs"} {
		if err := agent.RunAll(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	if err := agent.Begin(ctx, "agent-mine-2", 0); err != nil {
		t.Fatal(err)
	}
	if err := agent.End(ctx, "agent-mine-2", 0, false, "exit status 1"); err != nil {
		t.Fatal(err)
	}
	var mine v1alpha1.NodeTask
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "agent-mine-2"}, &mine); err != nil {
		t.Fatal(err)
	}

	got := gather(t, metrics.NewAgent(env.Client, func(n string) bool { return n == "agent-mine" }))
	for k, want := range map[string]float64{
		metrics.AgentCommands + `{kind="wait",result="Succeeded"}`: 1,
		metrics.AgentCommands + `{kind="wait",result="Failed"}`:    1,
		metrics.AgentLastResult + `{kind="wait",result="Failed"}`:  float64(mine.Status.Commands[0].CompletionTime.UnixNano()) / 1e9,
	} {
		if v, ok := got[k]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v; all: %v", k, v, ok, want, got)
		}
	}
}

func node(t *testing.T, name string, labels map[string]string, ready, cordoned bool) {
	t.Helper()
	ctx := context.Background()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: corev1.NodeSpec{Unschedulable: cordoned}}
	if err := testutil.CreateNode(ctx, env.Client, n, ready); err != nil {
		t.Fatal(err)
	}
	testutil.RemoveAtEnd(t, env.Client, n)
}

func operation(t *testing.T, name string, sel *metav1.LabelSelector, maxUnavailable *intstr.IntOrString) *v1alpha1.NodeOperation {
	t.Helper()
	op := &v1alpha1.NodeOperation{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.NodeOperationSpec{
		NodeSelector: sel, MaxUnavailable: maxUnavailable,
		Custom: &v1alpha1.CustomOperation{Groups: []v1alpha1.Group{{Name: "all", Commands: []v1alpha1.Command{{Wait: &v1alpha1.WaitCommand{}}}}}},
	}}
	if err := env.Client.Create(context.Background(), op); err != nil {
		t.Fatal(err)
	}
	testutil.RemoveAtEnd(t, env.Client, op)
	return op
}

func setOperationStatus(t *testing.T, op *v1alpha1.NodeOperation, phase v1alpha1.OperationPhase, group v1alpha1.GroupPhase) {
	t.Helper()
	op.Status.Phase = phase
	op.Status.Groups = []v1alpha1.GroupStatus{{Name: "all", Phase: group}}
	if err := env.Client.Status().Update(context.Background(), op); err != nil {
		t.Fatal(err)
	}
}

func task(t *testing.T, name, node string) {
	t.Helper()
	tk := &v1alpha1.NodeTask{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1alpha1.LabelNode: node}},
		Spec:       v1alpha1.NodeTaskSpec{NodeName: node, Commands: []v1alpha1.Command{{Wait: &v1alpha1.WaitCommand{}}}},
	}
	if err := env.Client.Create(context.Background(), tk); err != nil {
		t.Fatal(err)
	}
	testutil.RemoveAtEnd(t, env.Client, tk)
}

// gather collects c through a registry that checks it as strictly as Prometheus' client can,
// into "name{label="value",...}" -> value (histograms as _count).
func gather(t *testing.T, c prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	declared := map[string]metrics.Series{}
	for _, s := range append(metrics.ManagerSeries(), metrics.AgentSeries()...) {
		declared[s.Name] = s
	}
	out := map[string]float64{}
	for _, f := range families {
		// The metrics reference is generated from the declared series: a family must be what it says.
		if s, ok := declared[f.GetName()]; !ok || s.Type != f.GetType() {
			t.Errorf("%s is exported as a %v but declared as %+v", f.GetName(), f.GetType(), s)
		}
		for _, m := range f.GetMetric() {
			var parts []string
			for _, l := range m.GetLabel() {
				parts = append(parts, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			sort.Strings(parts)
			k := f.GetName()
			if len(parts) > 0 {
				k += "{" + strings.Join(parts, ",") + "}"
			}
			switch f.GetType() {
			case dto.MetricType_HISTOGRAM:
				out[f.GetName()+"_count"+strings.TrimPrefix(k, f.GetName())] = float64(m.GetHistogram().GetSampleCount())
				out[f.GetName()+"_sum"+strings.TrimPrefix(k, f.GetName())] = m.GetHistogram().GetSampleSum()
			case dto.MetricType_COUNTER:
				out[k] = m.GetCounter().GetValue()
			default:
				out[k] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// Gates that hold or block an unfinished operation are counted by gate name and state, each with
// when it began; a gate that passed is not.
func TestGatesWaitingAndTimedOut(t *testing.T) {
	ctx := context.Background()
	since := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	op := operation(t, "gated", nil, nil)
	op.Status.Phase = v1alpha1.OperationRunning
	op.Status.Gates = []v1alpha1.GateStatus{
		{Group: "workers", Name: "storage", State: v1alpha1.GateWaiting, Since: metav1.NewTime(since), LastChecked: metav1.NewTime(since)},
		{Group: "control-planes", Name: "storage", State: v1alpha1.GatePassed, Since: metav1.NewTime(since), LastChecked: metav1.NewTime(since)},
		{Group: "workers", Name: "alerts", State: v1alpha1.GateTimedOut, Since: metav1.NewTime(since), LastChecked: metav1.NewTime(since)},
	}
	if err := env.Client.Status().Update(ctx, op); err != nil {
		t.Fatal(err)
	}
	got := gather(t, metrics.NewManager(env.Client))
	for k, want := range map[string]float64{
		metrics.Gates + `{gate="storage",state="Waiting"}`:                                       1,
		metrics.Gates + `{gate="alerts",state="TimedOut"}`:                                       1,
		metrics.GateSince + `{gate="storage",group="workers",operation="gated",state="Waiting"}`: float64(since.Unix()),
		metrics.GateSince + `{gate="alerts",group="workers",operation="gated",state="TimedOut"}`: float64(since.Unix()),
	} {
		if v, ok := got[k]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", k, v, ok, want)
		}
	}
	if _, ok := got[metrics.GateSince+`{gate="storage",group="control-planes",operation="gated",state="Passed"}`]; ok {
		t.Errorf("a gate that passed is reported")
	}
}
