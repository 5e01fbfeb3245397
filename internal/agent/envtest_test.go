package agent_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent"
	"github.com/nodeops/nodeops/internal/agent/commands"
	"github.com/nodeops/nodeops/internal/controller/nodetask"
	"github.com/nodeops/nodeops/internal/host"
	"github.com/nodeops/nodeops/internal/host/hosttest"
	"github.com/nodeops/nodeops/internal/nodelock"
	"github.com/nodeops/nodeops/internal/secretholder"
	"github.com/nodeops/nodeops/internal/taskpolicy"
	"github.com/nodeops/nodeops/internal/testutil"
)

// One API server for the package; each test uses its own node names.
var (
	cfg *rest.Config
	cl  client.WithWatch
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	logf.SetLogger(testutil.Logger())
	// The agent only needs NodeTasks.
	env, err := testutil.Start("nodetasks")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	cfg, cl = env.Config, env.Client
	// The agent's namespace: its pod commands' pods are there.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: agent.DefaultLeaseNamespace}}
	if err := cl.Create(context.Background(), ns); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	stop, err := startDrainController(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer stop()
	return m.Run()
}

// drainClock measures the drains' timeouts: it stands still, so that a drain times out only when a
// test has seen what it must report (timeOutDrainOnceRefused), however slowly the API server answers.
var drainClock = clocktesting.NewFakeClock(time.Now())

// refusedEvictions is the API server's count of the evictions a disruption budget refused (429).
func refusedEvictions(t *testing.T) int64 {
	t.Helper()
	n, err := testutil.APIServerRequests(context.Background(), cfg, "pods/eviction", "429")
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// timeOutDrainOnceRefused waits until the API server refused an eviction since it counted before,
// then moves the drains' clock past timeout: the drain has seen the budget's refusal when it times out.
func timeOutDrainOnceRefused(t *testing.T, before int64, timeout time.Duration) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, "an eviction refused by a disruption budget", func() error {
		if n := refusedEvictions(t); n <= before {
			return fmt.Errorf("%d refused evictions, as before the drain", n)
		}
		return nil
	})
	drainClock.Step(timeout)
}

// startDrainController runs the manager's drain and secret holder controllers for every test: the
// agent asks the one to drain (agents confined to their own node, rule 10) and reads its scripts' Secrets through
// the other's pods, as with the manager beside it in a cluster.
func startDrainController(cfg *rest.Config) (stop func(), err error) {
	scheme, err := testutil.NewScheme()
	if err != nil {
		return nil, err
	}
	return testutil.StartManager(cfg, scheme, func(mgr manager.Manager, _ *nodelock.Table) error {
		if err := nodetask.SetupDrainWithManager(mgr, nodetask.DrainOptions{Poll: 100 * time.Millisecond, Clock: drainClock}); err != nil {
			return err
		}
		// The secret holder pods of scripts' Secrets, which secretVolumes plays the kubelet for.
		return nodetask.SetupSecretHoldersWithManager(mgr, nodetask.SecretHolderOptions{Options: secretholder.Options{Image: "ghcr.io/nodeops/agent:test"}})
	})
}

// startAgent runs an agent for one node (or, with a prefix, a noop agent) until stopped.
func startAgent(t *testing.T, o agent.Options) (stop func()) {
	t.Helper()
	return startAgentWith(t, cfg, o)
}

func startAgentWith(t *testing.T, cfg *rest.Config, o agent.Options) (stop func()) {
	t.Helper()
	if o.ServiceManager == "" {
		o.ServiceManager = host.ServiceManagerLocal
	}
	if o.Poll == 0 {
		o.Poll = 100 * time.Millisecond
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := agent.Run(ctx, cfg, o); err != nil && ctx.Err() == nil {
			t.Errorf("agent: %v", err)
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(func() {
		stop()
		if o.NodeName != "" {
			forceDeletePods(t, o.NodeName)
		}
	})
	return stop
}

// forceDeletePods deletes at once the pods the agent made in nodeops-system for node (its pod
// commands' and its tasks' secret holders): no kubelet here ends a pod's graceful deletion, and a
// pod left under the node's fixed name would make the test run again (-count=2) wait for it.
func forceDeletePods(t *testing.T, node string) {
	ctx := context.Background()
	var pods corev1.PodList
	if err := cl.List(ctx, &pods, client.InNamespace(agent.DefaultLeaseNamespace)); err != nil {
		t.Errorf("list pods of node %s: %v", node, err)
		return
	}
	for i := range pods.Items {
		if pods.Items[i].Spec.NodeName != node {
			continue
		}
		if err := cl.Delete(ctx, &pods.Items[i], client.GracePeriodSeconds(0)); client.IgnoreNotFound(err) != nil {
			t.Errorf("delete pod %s: %v", pods.Items[i].Name, err)
		}
	}
}

// ownedByOperation makes the task one of the NodeOperation op's, as the manager creates it.
func ownedByOperation(t *v1alpha1.NodeTask, op string) *v1alpha1.NodeTask {
	yes := true
	t.Spec.Operation = op
	t.OwnerReferences = []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "NodeOperation", Name: op, UID: types.UID("uid-" + op), Controller: &yes}}
	return t
}

func newTask(name, node string, mode v1alpha1.ExecutionMode, cmds ...v1alpha1.Command) *v1alpha1.NodeTask {
	return &v1alpha1.NodeTask{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1alpha1.LabelNode: node}},
		Spec:       v1alpha1.NodeTaskSpec{NodeName: node, Operation: "op-" + name, Commands: cmds, ExecutionMode: mode},
	}
}

func script(s string, idempotent bool) v1alpha1.Command {
	return v1alpha1.Command{Script: &v1alpha1.ScriptCommand{Inline: s, Idempotent: idempotent}}
}

// create makes obj and deletes it when the test ends, so that a test run again (-count=2) starts
// from nothing; a namespace, which nothing here finishes deleting, is kept and used again.
func create(t *testing.T, obj client.Object) {
	t.Helper()
	err := cl.Create(context.Background(), obj)
	_, isNamespace := obj.(*corev1.Namespace)
	if isNamespace && apierrors.IsAlreadyExists(err) {
		return
	}
	if err != nil {
		t.Fatalf("creating %s: %v", obj.GetName(), err)
	}
	if isNamespace {
		return
	}
	t.Cleanup(func() {
		if err := cl.Delete(context.Background(), obj, client.GracePeriodSeconds(0)); client.IgnoreNotFound(err) != nil {
			t.Errorf("deleting %T %s: %v", obj, obj.GetName(), err)
		}
	})
}

// waitTask waits until cond holds for the task, failing with its last state after the deadline.
func waitTask(t *testing.T, name string, cond func(*v1alpha1.NodeTask) bool) *v1alpha1.NodeTask {
	t.Helper()
	task := &v1alpha1.NodeTask{}
	testutil.Eventually(t, 60*time.Second, "task "+name, func() error {
		if err := cl.Get(context.Background(), client.ObjectKey{Name: name}, task); err != nil {
			return err
		}
		if !cond(task) {
			return fmt.Errorf("condition not met; last spec %+v, status %+v", task.Spec, task.Status)
		}
		return nil
	})
	return task
}

func phaseIs(p v1alpha1.TaskPhase) func(*v1alpha1.NodeTask) bool {
	return func(t *v1alpha1.NodeTask) bool { return t.Status.Phase == p }
}

func TestOneCommandTaskCostsTwoStatusWrites(t *testing.T) {
	_, task, modified := runCountingWrites(t, "writes-1", script("echo hello from $NODEOPS_NODE_NAME", false))
	if modified != 2 {
		t.Errorf("the agent made %d writes for a one-command task with a non-idempotent command, want 2", modified)
	}
	c := task.Status.Commands[0]
	if c.Phase != v1alpha1.CommandSucceeded || c.ExitCode == nil || *c.ExitCode != 0 || c.Attempt != 1 ||
		!strings.Contains(c.OutputTail, "hello from writes-1") || c.StartTime == nil || c.CompletionTime == nil {
		t.Errorf("command status %+v", c)
	}
	if task.Status.Progress != "1/1" || task.Status.StartTime == nil || task.Status.CompletionTime == nil {
		t.Errorf("task status %+v", task.Status)
	}
}

// runCountingWrites runs a one-command task on a new node named node until it succeeds and counts
// the writes to it: every write is one watch event, so it counts them up to the final one, then a
// little more to see that nothing follows. It returns the node's root, the task and the count.
func runCountingWrites(t *testing.T, node string, cmd v1alpha1.Command) (string, *v1alpha1.NodeTask, int) {
	t.Helper()
	root := hosttest.NewRoot(t, nil)
	startAgent(t, agent.Options{NodeName: node, HostRoot: root})
	w, err := cl.Watch(context.Background(), &v1alpha1.NodeTaskList{}, client.MatchingLabels{v1alpha1.LabelNode: node})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	create(t, newTask(node, node, v1alpha1.ExecutionAuto, cmd))
	task := waitTask(t, node, phaseIs(v1alpha1.TaskSucceeded))
	modified := 0
	timeout := time.After(3 * time.Second)
	for {
		select {
		case ev := <-w.ResultChan():
			if ev.Type == watch.Modified {
				modified++
			}
		case <-timeout:
			return root, task, modified
		}
	}
}

func TestQuickIdempotentCommandCostsOneStatusWrite(t *testing.T) {
	root, task, modified := runCountingWrites(t, "writes-2", script("echo quick >> /ran", true))
	if modified != 1 {
		t.Errorf("the agent made %d writes for a quick idempotent command, want 1 (no separate Running record)", modified)
	}
	c := task.Status.Commands[0]
	if c.Phase != v1alpha1.CommandSucceeded || c.Attempt != 1 || c.StartTime == nil || c.CompletionTime == nil ||
		task.Status.StartTime == nil || task.Status.CompletionTime == nil || task.Status.Progress != "1/1" {
		t.Errorf("status %+v", task.Status)
	}
	if got := hosttest.ReadFile(t, root, "/ran"); got != "quick\n" {
		t.Errorf("the command ran %q, want once", got)
	}
}

func TestLongIdempotentCommandIsRecordedRunning(t *testing.T) {
	root := hosttest.NewRoot(t, nil)
	startAgent(t, agent.Options{NodeName: "long-1", HostRoot: root})
	create(t, newTask("long-1", "long-1", v1alpha1.ExecutionAuto,
		script("touch /started; while [ ! -f /release ]; do sleep 1; done", true)))
	testutil.Eventually(t, 60*time.Second, "the command to start", fileIn(root, "/started"))
	// It runs until released, so its Running record must appear meanwhile.
	running := waitTask(t, "long-1", func(tk *v1alpha1.NodeTask) bool {
		return tk.Status.Phase == v1alpha1.TaskRunning && len(tk.Status.Commands) == 1 && tk.Status.Commands[0].Phase == v1alpha1.CommandRunning
	})
	if running.Status.StartTime == nil || running.Status.Commands[0].Attempt != 1 {
		t.Errorf("running status %+v", running.Status)
	}
	if err := os.WriteFile(filepath.Join(root, "release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	done := waitTask(t, "long-1", phaseIs(v1alpha1.TaskSucceeded))
	if !done.Status.StartTime.Equal(running.Status.StartTime) {
		t.Errorf("start time moved from %v to %v", running.Status.StartTime, done.Status.StartTime)
	}
}

func TestFailedCommandFailsTaskAndRetries(t *testing.T) {
	root := hosttest.NewRoot(t, nil)
	startAgent(t, agent.Options{NodeName: "fail-1", HostRoot: root})
	retried := script("echo run >> /runs; [ $(cat /runs | wc -l) -ge 2 ]", false)
	retried.Retries = 2
	create(t, newTask("fail-1", "fail-1", v1alpha1.ExecutionAuto, retried, script("echo out; exit 4", false), script("touch /never", false)))
	task := waitTask(t, "fail-1", phaseIs(v1alpha1.TaskFailed))
	if got := hosttest.ReadFile(t, root, "/runs"); got != "run\nrun\n" {
		t.Errorf("the retried command ran %q, want twice", got)
	}
	c0, c1 := task.Status.Commands[0], task.Status.Commands[1]
	if c0.Phase != v1alpha1.CommandSucceeded || c0.Attempt != 2 {
		t.Errorf("retried command %+v", c0)
	}
	if c1.Phase != v1alpha1.CommandFailed || *c1.ExitCode != 4 || !strings.Contains(c1.OutputTail, "out") {
		t.Errorf("failed command %+v", c1)
	}
	if task.Status.Reason != v1alpha1.ReasonCommandFailed || !strings.Contains(task.Status.Message, "command 2/3 (script)") {
		t.Errorf("task reason %q message %q", task.Status.Reason, task.Status.Message)
	}
	if hosttest.ReadFile(t, root, "/never") != "" || task.Status.Commands[2].Phase != v1alpha1.CommandPending {
		t.Errorf("a command after the failure ran")
	}
}

func TestSafetyRule4_RestartNeverRerunsFinishedAndFailsInterruptedNonIdempotent(t *testing.T) {
	root := hosttest.NewRoot(t, nil)
	stop := startAgent(t, agent.Options{NodeName: "restart-1", HostRoot: root})
	create(t, newTask("restart-1", "restart-1", v1alpha1.ExecutionAuto,
		script("echo first >> /ran", false), script("echo second >> /ran; sleep 60", false), script("echo third >> /ran", false)))
	waitTask(t, "restart-1", func(tk *v1alpha1.NodeTask) bool {
		return len(tk.Status.Commands) == 3 && tk.Status.Commands[1].Phase == v1alpha1.CommandRunning
	})
	testutil.Eventually(t, 60*time.Second, "both commands to start", fileHolds(t, root, "/ran", "first\nsecond\n"))
	stop()
	startAgent(t, agent.Options{NodeName: "restart-1", HostRoot: root})
	task := waitTask(t, "restart-1", phaseIs(v1alpha1.TaskFailed))
	if task.Status.Reason != v1alpha1.ReasonInterrupted || task.Status.Commands[1].Phase != v1alpha1.CommandFailed {
		t.Errorf("reason %q, command 1 %+v", task.Status.Reason, task.Status.Commands[1])
	}
	if got := hosttest.ReadFile(t, root, "/ran"); got != "first\nsecond\n" {
		t.Errorf("commands ran %q; finished and interrupted ones must not run again", got)
	}
}

func TestSafetyRule4_RestartRerunsInterruptedIdempotent(t *testing.T) {
	root := hosttest.NewRoot(t, nil)
	stop := startAgent(t, agent.Options{NodeName: "restart-2", HostRoot: root})
	create(t, newTask("restart-2", "restart-2", v1alpha1.ExecutionAuto,
		script("echo first >> /ran", false),
		script("echo second >> /ran; [ -f /marker ] && exit 0; touch /marker; sleep 60", true)))
	testutil.Eventually(t, 60*time.Second, "the second command to start", fileIn(root, "/marker"))
	waitTask(t, "restart-2", func(tk *v1alpha1.NodeTask) bool {
		return len(tk.Status.Commands) == 2 && tk.Status.Commands[1].Phase == v1alpha1.CommandRunning
	})
	stop()
	startAgent(t, agent.Options{NodeName: "restart-2", HostRoot: root})
	task := waitTask(t, "restart-2", phaseIs(v1alpha1.TaskSucceeded))
	if got := hosttest.ReadFile(t, root, "/ran"); got != "first\nsecond\nsecond\n" {
		t.Errorf("commands ran %q; the idempotent one should run again, the finished one not", got)
	}
	if a := task.Status.Commands[1].Attempt; a != 2 {
		t.Errorf("attempt of the re-run command = %d, want 2", a)
	}
}

func fileExists(root, p string) bool {
	_, err := os.Stat(filepath.Join(root, p))
	return err == nil
}

// fileIn is a condition for testutil.Eventually: file p exists under root.
func fileIn(root, p string) func() error {
	return func() error {
		_, err := os.Stat(filepath.Join(root, p))
		return err
	}
}

// fileHolds is a condition for testutil.Eventually: file p under root holds want.
func fileHolds(t *testing.T, root, p, want string) func() error {
	return func() error {
		if got := hosttest.ReadFile(t, root, p); got != want {
			return fmt.Errorf("%s holds %q, want %q", p, got, want)
		}
		return nil
	}
}

func TestControlledModeWaitsForApprovals(t *testing.T) {
	root := hosttest.NewRoot(t, nil)
	startAgent(t, agent.Options{NodeName: "controlled-1", HostRoot: root})
	create(t, newTask("controlled-1", "controlled-1", v1alpha1.ExecutionControlled, script("echo 1 >> /ran", false), script("echo 2 >> /ran", false)))
	waitTask(t, "controlled-1", func(tk *v1alpha1.NodeTask) bool {
		return len(tk.Status.Commands) == 2 && tk.Status.Commands[0].Phase == v1alpha1.CommandAwaitingApproval
	})
	if hosttest.ReadFile(t, root, "/ran") != "" {
		t.Fatal("a command ran before it was approved")
	}
	approve := func(n int32) {
		task := &v1alpha1.NodeTask{}
		if err := cl.Get(context.Background(), client.ObjectKey{Name: "controlled-1"}, task); err != nil {
			t.Fatal(err)
		}
		base := task.DeepCopy()
		task.Spec.ApprovedCommands = n
		if err := cl.Patch(context.Background(), task, client.MergeFrom(base)); err != nil {
			t.Fatal(err)
		}
	}
	approve(1)
	waitTask(t, "controlled-1", func(tk *v1alpha1.NodeTask) bool {
		return tk.Status.Commands[0].Phase == v1alpha1.CommandSucceeded && tk.Status.Commands[1].Phase == v1alpha1.CommandAwaitingApproval
	})
	if got := hosttest.ReadFile(t, root, "/ran"); got != "1\n" {
		t.Fatalf("ran %q after approving one command", got)
	}
	approve(2)
	waitTask(t, "controlled-1", phaseIs(v1alpha1.TaskSucceeded))
	if got := hosttest.ReadFile(t, root, "/ran"); got != "1\n2\n" {
		t.Fatalf("ran %q", got)
	}
}

func TestPauseAndAbort(t *testing.T) {
	root := hosttest.NewRoot(t, nil)
	startAgent(t, agent.Options{NodeName: "abort-1", HostRoot: root})
	task := newTask("abort-1", "abort-1", v1alpha1.ExecutionAuto, script("touch /ran", false))
	task.Spec.Paused = true
	create(t, task)
	// Nothing runs until the agent shows it saw the paused spec and left it alone.
	testutil.ConsistentlyUntilObserved(t, 10*time.Second, "a paused task", func() error {
		if fileExists(root, "/ran") {
			return errors.New("it ran a command")
		}
		return nil
	}, observed("abort-1", task.Generation))
	base := task.DeepCopy()
	task.Spec.Abort = true
	if err := cl.Patch(context.Background(), task, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
	waitTask(t, "abort-1", phaseIs(v1alpha1.TaskAborted))
	if fileExists(root, "/ran") {
		t.Fatal("an aborted task ran a command")
	}
}

func TestDryRunChangesNothing(t *testing.T) {
	cfgToml, err := os.ReadFile("../containerdtoml/testdata/containerd/v2-default.toml")
	if err != nil {
		t.Fatal(err)
	}
	root := hosttest.NewRoot(t, map[string]string{"/etc/containerd/config.toml": string(cfgToml)})
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "dryrun-1"}}
	create(t, node)
	startAgent(t, agent.Options{NodeName: "dryrun-1", HostRoot: root})
	create(t, newTask("dryrun-1", "dryrun-1", v1alpha1.ExecutionDryRun,
		script("touch /ran", false),
		v1alpha1.Command{Cordon: &v1alpha1.CordonCommand{}},
		v1alpha1.Command{ContainerdRuntime: &v1alpha1.ContainerdRuntimeCommand{Name: "wasmedge", RuntimeType: "io.containerd.wasmedge.v1"}},
		v1alpha1.Command{RestartService: &v1alpha1.RestartServiceCommand{Name: "kubelet"}},
		v1alpha1.Command{Drain: &v1alpha1.DrainCommand{}},
	))
	task := waitTask(t, "dryrun-1", phaseIs(v1alpha1.TaskSucceeded))
	for _, c := range task.Status.Commands {
		if !strings.HasPrefix(c.Message, "dry run") {
			t.Errorf("command %s: message %q does not say dry run", c.Name, c.Message)
		}
	}
	if fileExists(root, "/ran") || fileExists(root, host.LocalServiceLog) || hosttest.ReadFile(t, root, "/etc/containerd/config.toml") != string(cfgToml) {
		t.Error("dry run changed the host root")
	}
	if err := cl.Get(context.Background(), client.ObjectKey{Name: "dryrun-1"}, node); err != nil {
		t.Fatal(err)
	}
	if node.Spec.Unschedulable || node.Annotations[commands.AnnotationWasUnschedulable] != "" {
		t.Errorf("dry run changed the node: %+v", node.Spec)
	}
}

func TestSafetyRule6_DrainHonoursPDBAndUncordonRestores(t *testing.T) {
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "drain-test"}}
	create(t, ns)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "drain-1"}}
	create(t, node)
	yes := true
	mkPod := func(name string, labels map[string]string, owner string) {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns.Name, Labels: labels},
			Spec:       corev1.PodSpec{NodeName: node.Name, Containers: []corev1.Container{{Name: "c", Image: "pause"}}},
		}
		if owner != "" {
			pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: owner, Name: "owner", UID: types.UID("uid-" + name), Controller: &yes}}
		}
		create(t, pod)
		pod.Status.Phase = corev1.PodRunning
		pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		if err := cl.Status().Update(ctx, pod); err != nil {
			t.Fatal(err)
		}
	}
	mkPod("web", map[string]string{"app": "web"}, "ReplicaSet")
	mkPod("db", map[string]string{"app": "db"}, "StatefulSet")
	mkPod("logs", map[string]string{"app": "logs"}, "DaemonSet")
	minAvailable := intstr.FromInt32(1)
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "db-pdb", Namespace: ns.Name},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: &minAvailable, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}},
	}
	create(t, pdb)
	// What the disruption controller (not part of envtest) would report: the one db pod is needed.
	pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, DisruptionsAllowed: 0, CurrentHealthy: 1, DesiredHealthy: 1, ExpectedPods: 1}
	if err := cl.Status().Update(ctx, pdb); err != nil {
		t.Fatal(err)
	}

	root := hosttest.NewRoot(t, nil)
	startAgent(t, agent.Options{NodeName: node.Name, HostRoot: root})
	zero := int64(0)
	refused := refusedEvictions(t)
	create(t, ownedByOperation(newTask("drain-1", node.Name, v1alpha1.ExecutionAuto,
		v1alpha1.Command{Cordon: &v1alpha1.CordonCommand{}},
		v1alpha1.Command{Drain: &v1alpha1.DrainCommand{Timeout: &metav1.Duration{Duration: 3 * time.Second}, GracePeriodSeconds: &zero}},
	), "drain"))
	timeOutDrainOnceRefused(t, refused, 3*time.Second)
	task := waitTask(t, "drain-1", phaseIs(v1alpha1.TaskFailed))
	msg := task.Status.Commands[1].Message
	for _, want := range []string{"timed out", "drain-test/db", "PodDisruptionBudget drain-test/db-pdb"} {
		if !strings.Contains(msg, want) {
			t.Errorf("drain message %q does not say %q; output:\n%s", msg, want, task.Status.Commands[1].OutputTail)
		}
	}
	pods := &corev1.PodList{}
	if err := cl.List(ctx, pods, client.InNamespace(ns.Name)); err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, p := range pods.Items {
		left = append(left, p.Name)
	}
	if strings.Join(left, ",") != "db,logs" {
		t.Errorf("pods left %v, want db (PDB) and logs (DaemonSet)", left)
	}
	if err := cl.Get(ctx, client.ObjectKey{Name: node.Name}, node); err != nil {
		t.Fatal(err)
	}
	if rec, ok := taskpolicy.ParseCordonRecord(node); !node.Spec.Unschedulable || !ok || rec.WasUnschedulable {
		t.Errorf("after cordon: unschedulable=%v annotations=%v", node.Spec.Unschedulable, node.Annotations)
	}

	// A later task of the same operation restores the cordon (a later group's uncordon).
	create(t, ownedByOperation(newTask("uncordon-1", node.Name, v1alpha1.ExecutionAuto, v1alpha1.Command{Uncordon: &v1alpha1.UncordonCommand{}}), "drain"))
	waitTask(t, "uncordon-1", phaseIs(v1alpha1.TaskSucceeded))
	if err := cl.Get(ctx, client.ObjectKey{Name: node.Name}, node); err != nil {
		t.Fatal(err)
	}
	if node.Spec.Unschedulable || node.Annotations[commands.AnnotationWasUnschedulable] != "" {
		t.Errorf("after uncordon: unschedulable=%v annotations=%v", node.Spec.Unschedulable, node.Annotations)
	}

	// A node that was already unschedulable stays so through cordon and uncordon.
	base := node.DeepCopy()
	node.Spec.Unschedulable = true
	if err := cl.Patch(ctx, node, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
	create(t, newTask("cordon-2", node.Name, v1alpha1.ExecutionAuto, v1alpha1.Command{Cordon: &v1alpha1.CordonCommand{}}, v1alpha1.Command{Uncordon: &v1alpha1.UncordonCommand{}}))
	waitTask(t, "cordon-2", phaseIs(v1alpha1.TaskSucceeded))
	if err := cl.Get(ctx, client.ObjectKey{Name: node.Name}, node); err != nil {
		t.Fatal(err)
	}
	if !node.Spec.Unschedulable {
		t.Errorf("uncordon made a node schedulable that was unschedulable before cordon")
	}
}

func TestNoopHostServesManyNodes(t *testing.T) {
	startAgent(t, agent.Options{NodePrefix: "sim-", Noop: true, Workers: 16})
	const n = 50
	for i := range n {
		name := fmt.Sprintf("sim-%03d", i)
		create(t, newTask(name, name, v1alpha1.ExecutionAuto, script("rm -rf /", false), v1alpha1.Command{Cordon: &v1alpha1.CordonCommand{}}))
	}
	// A task of a node the agent does not serve stays untouched.
	create(t, newTask("other-1", "other-1", v1alpha1.ExecutionAuto, script("true", false)))
	for i := range n {
		task := waitTask(t, fmt.Sprintf("sim-%03d", i), phaseIs(v1alpha1.TaskSucceeded))
		if !strings.Contains(task.Status.Commands[0].Message, "noop host") {
			t.Fatalf("message %q", task.Status.Commands[0].Message)
		}
	}
	other := &v1alpha1.NodeTask{}
	if err := cl.Get(context.Background(), client.ObjectKey{Name: "other-1"}, other); err != nil {
		t.Fatal(err)
	}
	if other.Status.Phase != "" {
		t.Errorf("the sim agent touched another node's task: %+v", other.Status)
	}
	if err := cl.Delete(context.Background(), other); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
}

// startNodeTaskController runs the manager's NodeTask controller, which clears a recoveryMode
// once the agent acted on it, so that a second retry can be asked for as the CLI asks. It marks a
// task whose node is missing NodeDeleted (a lost agent fails its task in bounded time, rule 9), so the tasks' nodes are created first.
func startNodeTaskController(t *testing.T, nodes ...string) {
	t.Helper()
	for _, n := range nodes {
		create(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})
	}
	scheme, err := testutil.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nodetask.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// askRecovery sets spec.recoveryMode as `kubectl nodeops retry` and `skip` do (a merge patch of
// the spec) and returns the generation that asks for it.
func askRecovery(t *testing.T, name string, mode v1alpha1.RecoveryMode) int64 {
	t.Helper()
	task := &v1alpha1.NodeTask{}
	if err := cl.Get(context.Background(), client.ObjectKey{Name: name}, task); err != nil {
		t.Fatal(err)
	}
	if task.Spec.RecoveryMode != "" {
		t.Fatalf("task %s still carries recoveryMode %s", name, task.Spec.RecoveryMode)
	}
	base := task.DeepCopy()
	task.Spec.RecoveryMode = mode
	if err := cl.Patch(context.Background(), task, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
	return task.Generation
}

// recovered: the agent acted on generation gen's request and the manager cleared it.
func recovered(gen int64, cond func(*v1alpha1.NodeTask) bool) func(*v1alpha1.NodeTask) bool {
	return func(tk *v1alpha1.NodeTask) bool {
		return tk.Status.RecoveredGeneration >= gen && tk.Spec.RecoveryMode == "" && cond(tk)
	}
}

// A failed command stops the task until a person asks; Retry runs it again (a new attempt), Skip
// goes on after it; a request on a task that has not failed is recorded and changes nothing.
func TestRetryAndSkip(t *testing.T) {
	startNodeTaskController(t, "recover-1")
	root := hosttest.NewRoot(t, nil)
	startAgent(t, agent.Options{NodeName: "recover-1", HostRoot: root})
	create(t, newTask("recover-1", "recover-1", v1alpha1.ExecutionAuto,
		script("echo a >> /ran; [ -f /fixed ]", false), script("echo b >> /ran; exit 5", false), script("echo c >> /ran", false)))
	task := waitTask(t, "recover-1", phaseIs(v1alpha1.TaskFailed))
	if task.Status.Commands[0].Phase != v1alpha1.CommandFailed || task.Status.Attempt != 1 || hosttest.ReadFile(t, root, "/ran") != "a\n" {
		t.Fatalf("before any recovery: %+v", task.Status)
	}
	// The agent decided to stop in the write that recorded the failure: nothing runs from then on.
	testutil.ConsistentlyUntilObserved(t, 10*time.Second, "a failed task left alone until a person asks", func() error {
		if got := hosttest.ReadFile(t, root, "/ran"); got != "a\n" {
			return fmt.Errorf("a failed command ran again on its own: %q", got)
		}
		return nil
	}, observed("recover-1", task.Generation))

	// Retry, still broken: the command runs once more and fails again.
	gen := askRecovery(t, "recover-1", v1alpha1.RecoveryRetry)
	task = waitTask(t, "recover-1", recovered(gen, func(tk *v1alpha1.NodeTask) bool {
		return tk.Status.Phase == v1alpha1.TaskFailed && tk.Status.Commands[0].Attempt == 2
	}))
	if c := task.Status.Commands[0]; c.Phase != v1alpha1.CommandFailed || task.Status.Attempt != 2 || task.Status.Reason != v1alpha1.ReasonCommandFailed {
		t.Errorf("after the first retry: %+v", task.Status)
	}
	if got := hosttest.ReadFile(t, root, "/ran"); got != "a\na\n" {
		t.Errorf("after the first retry the commands ran %q", got)
	}

	// Retry, fixed: the command succeeds and the next one fails.
	if err := os.WriteFile(filepath.Join(root, "fixed"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	gen = askRecovery(t, "recover-1", v1alpha1.RecoveryRetry)
	task = waitTask(t, "recover-1", recovered(gen, func(tk *v1alpha1.NodeTask) bool {
		return tk.Status.Phase == v1alpha1.TaskFailed && tk.Status.Commands[1].Phase == v1alpha1.CommandFailed
	}))
	if c := task.Status.Commands[0]; c.Phase != v1alpha1.CommandSucceeded || c.Attempt != 3 || task.Status.Attempt != 3 || task.Status.CurrentCommand != 1 {
		t.Errorf("after the second retry: %+v", task.Status)
	}
	if got := hosttest.ReadFile(t, root, "/ran"); got != "a\na\na\nb\n" {
		t.Errorf("after the second retry the commands ran %q", got)
	}

	// Skip: the failed command is Skipped and the task goes on to succeed.
	gen = askRecovery(t, "recover-1", v1alpha1.RecoverySkip)
	task = waitTask(t, "recover-1", recovered(gen, phaseIs(v1alpha1.TaskSucceeded)))
	if c := task.Status.Commands[1]; c.Phase != v1alpha1.CommandSkipped || c.Attempt != 1 || c.CompletionTime == nil {
		t.Errorf("skipped command %+v", c)
	}
	if task.Status.Commands[2].Phase != v1alpha1.CommandSucceeded || task.Status.Progress != "3/3" || task.Status.Attempt != 4 ||
		task.Status.Reason != "" || task.Status.Message != "" || task.Status.CompletionTime == nil {
		t.Errorf("after skip: %+v", task.Status)
	}
	if got := hosttest.ReadFile(t, root, "/ran"); got != "a\na\na\nb\nc\n" {
		t.Errorf("after skip the commands ran %q", got)
	}

	// A retry of a task that succeeded is recorded as seen and ignored.
	before := task.Status.DeepCopy()
	gen = askRecovery(t, "recover-1", v1alpha1.RecoveryRetry)
	task = waitTask(t, "recover-1", recovered(gen, phaseIs(v1alpha1.TaskSucceeded)))
	before.RecoveredGeneration = task.Status.RecoveredGeneration
	before.ObservedGeneration = gen // the write that recorded the request was decided on it
	if !equality.Semantic.DeepEqual(*before, task.Status) {
		t.Errorf("an ignored retry changed the status from %+v to %+v", *before, task.Status)
	}
	if got := hosttest.ReadFile(t, root, "/ran"); got != "a\na\na\nb\nc\n" {
		t.Errorf("an ignored retry ran commands: %q", got)
	}
}

// Skipping the last command ends the task Succeeded without running anything.
func TestSkipLastCommand(t *testing.T) {
	startNodeTaskController(t, "recover-2")
	root := hosttest.NewRoot(t, nil)
	startAgent(t, agent.Options{NodeName: "recover-2", HostRoot: root})
	create(t, newTask("recover-2", "recover-2", v1alpha1.ExecutionAuto, script("echo a >> /ran", true), script("echo b >> /ran; exit 1", true)))
	waitTask(t, "recover-2", phaseIs(v1alpha1.TaskFailed))
	gen := askRecovery(t, "recover-2", v1alpha1.RecoverySkip)
	task := waitTask(t, "recover-2", recovered(gen, phaseIs(v1alpha1.TaskSucceeded)))
	if task.Status.Commands[1].Phase != v1alpha1.CommandSkipped || task.Status.Progress != "2/2" || task.Status.CurrentCommand != 2 || task.Status.CompletionTime == nil {
		t.Errorf("after skip: %+v", task.Status)
	}
	if got := hosttest.ReadFile(t, root, "/ran"); got != "a\nb\n" {
		t.Errorf("commands ran %q", got)
	}
}

// retryCountingWrites fails a one-command task on a new node, asks for a retry with the command
// fixed, and counts the writes to the task from the request to its success (the request is one).
func retryCountingWrites(t *testing.T, node string, idempotent bool) int {
	t.Helper()
	root := hosttest.NewRoot(t, nil)
	startAgent(t, agent.Options{NodeName: node, HostRoot: root})
	create(t, newTask(node, node, v1alpha1.ExecutionAuto, script("echo run >> /ran; [ -f /fixed ]", idempotent)))
	waitTask(t, node, phaseIs(v1alpha1.TaskFailed))
	if err := os.WriteFile(filepath.Join(root, "fixed"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := cl.Watch(context.Background(), &v1alpha1.NodeTaskList{}, client.MatchingLabels{v1alpha1.LabelNode: node})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	<-w.ResultChan() // the task as it is, Added
	gen := askRecovery(t, node, v1alpha1.RecoveryRetry)
	task := waitTask(t, node, phaseIs(v1alpha1.TaskSucceeded))
	if task.Status.RecoveredGeneration != gen || task.Status.Attempt != 2 || task.Status.Commands[0].Attempt != 2 || hosttest.ReadFile(t, root, "/ran") != "run\nrun\n" {
		t.Errorf("after retry: %+v", task.Status)
	}
	modified := 0
	timeout := time.After(3 * time.Second)
	for {
		select {
		case ev := <-w.ResultChan():
			if ev.Type == watch.Modified {
				modified++
			}
		case <-timeout:
			return modified
		}
	}
}

// A retry costs no write of its own: it rides on the retried command's Running record, or, for a
// quick idempotent command run before its record, on the result.
func TestRetryCostsNoExtraStatusWrite(t *testing.T) {
	if n := retryCountingWrites(t, "retry-writes-1", false); n != 1+2 {
		t.Errorf("a retried non-idempotent command cost %d writes, want 3 (the request, recovery with Running, result)", n)
	}
	if n := retryCountingWrites(t, "retry-writes-2", true); n != 1+1 {
		t.Errorf("a retried quick idempotent command cost %d writes, want 2 (the request, recovery with the result)", n)
	}
}

// A lost agent fails its task in bounded time (rule 9): the manager's AgentLost condition survives the agent's writes, which are made
// from its own copy of the status (here the result of a command running when the mark was set).
func TestSafetyRule9_AgentKeepsTheManagersCondition(t *testing.T) {
	root := hosttest.NewRoot(t, nil)
	startAgent(t, agent.Options{NodeName: "keep-1", HostRoot: root})
	create(t, newTask("keep-1", "keep-1", v1alpha1.ExecutionAuto,
		script("touch /started; while [ ! -f /release ]; do sleep 1; done", true)))
	running := waitTask(t, "keep-1", func(tk *v1alpha1.NodeTask) bool { return tk.Status.Phase == v1alpha1.TaskRunning })
	meta.SetStatusCondition(&running.Status.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionAgentLost, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAgentLost, Message: "set by the test, as the manager",
	})
	if err := cl.Status().Update(context.Background(), running); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	done := waitTask(t, "keep-1", phaseIs(v1alpha1.TaskSucceeded))
	if done.Lost() == nil {
		t.Errorf("the agent's write dropped the manager's AgentLost condition: %+v", done.Status)
	}
}

// observed is nil once the agent has shown, in status.observedGeneration, that it decided on
// generation gen of task's spec.
func observed(task string, gen int64) func() error {
	return func() error {
		tk := &v1alpha1.NodeTask{}
		if err := cl.Get(context.Background(), client.ObjectKey{Name: task}, tk); err != nil {
			return err
		}
		if tk.Status.ObservedGeneration < gen {
			return fmt.Errorf("status.observedGeneration %d, want %d", tk.Status.ObservedGeneration, gen)
		}
		return nil
	}
}
