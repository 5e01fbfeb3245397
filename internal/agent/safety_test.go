package agent_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent"
	"github.com/nodeops/nodeops/internal/host/hosttest"
	"github.com/nodeops/nodeops/internal/testutil"
)

// stopWithin stops an agent and fails the test when it has not returned within d.
func stopWithin(t *testing.T, stop func(), d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() { stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("the agent did not stop within %s", d)
	}
}

// every command has a timeout (rule 12): a stopping agent (SIGTERM, a DaemonSet rollout) lets the running
// command finish within its grace period, records its result, and starts nothing more.
func TestSafetyRule12_StopLetsTheRunningCommandFinish(t *testing.T) {
	root := hosttest.NewRoot(t, nil)
	o := agent.Options{NodeName: "graceful-1", HostRoot: root, ShutdownGracePeriod: time.Minute}
	stop := startAgent(t, o)
	create(t, newTask("graceful-1", "graceful-1", v1alpha1.ExecutionAuto,
		script("touch /started; sleep 2; echo done > /done", false), script("touch /next", false)))
	testutil.Eventually(t, 60*time.Second, "the first command to start", fileIn(root, "/started"))
	waitTask(t, "graceful-1", func(tk *v1alpha1.NodeTask) bool {
		return len(tk.Status.Commands) == 2 && tk.Status.Commands[0].Phase == v1alpha1.CommandRunning
	})
	stopWithin(t, stop, 30*time.Second)

	if got := hosttest.ReadFile(t, root, "/done"); got != "done\n" {
		t.Errorf("the running command was cut short: /done holds %q", got)
	}
	if fileExists(root, "/next") {
		t.Errorf("the next command started after the agent was told to stop")
	}
	task := waitTask(t, "graceful-1", func(*v1alpha1.NodeTask) bool { return true })
	c0, c1 := task.Status.Commands[0], task.Status.Commands[1]
	if c0.Phase != v1alpha1.CommandSucceeded || c0.ExitCode == nil || *c0.ExitCode != 0 || c0.CompletionTime == nil {
		t.Errorf("the finished command's result was not recorded: %+v", c0)
	}
	if c1.Phase != v1alpha1.CommandPending || c1.Attempt != 0 || task.Status.Phase != v1alpha1.TaskRunning {
		t.Errorf("after the stop: task %s, next command %+v", task.Status.Phase, c1)
	}

	// A new agent goes on from there: the finished command is not run again.
	startAgent(t, o)
	task = waitTask(t, "graceful-1", phaseIs(v1alpha1.TaskSucceeded))
	if !fileExists(root, "/next") || task.Status.Commands[0].Attempt != 1 {
		t.Errorf("after a restart: %+v", task.Status)
	}
}

// every command has a timeout and intent recorded before action (rules 12 and 4): when the grace period runs out the command is stopped as
// before, left Running, and a restarted agent treats it as interrupted.
func TestSafetyRule12_StopAfterTheGracePeriodInterrupts(t *testing.T) {
	root := hosttest.NewRoot(t, nil)
	o := agent.Options{NodeName: "graceful-2", HostRoot: root, ShutdownGracePeriod: 500 * time.Millisecond}
	stop := startAgent(t, o)
	create(t, newTask("graceful-2", "graceful-2", v1alpha1.ExecutionAuto, script("touch /started; sleep 60; touch /done", false)))
	testutil.Eventually(t, 60*time.Second, "the command to start", fileIn(root, "/started"))
	waitTask(t, "graceful-2", func(tk *v1alpha1.NodeTask) bool {
		return len(tk.Status.Commands) == 1 && tk.Status.Commands[0].Phase == v1alpha1.CommandRunning
	})
	stopWithin(t, stop, 30*time.Second)
	if fileExists(root, "/done") {
		t.Fatal("the command ran to its end")
	}
	startAgent(t, o)
	task := waitTask(t, "graceful-2", phaseIs(v1alpha1.TaskFailed))
	if task.Status.Reason != v1alpha1.ReasonInterrupted || !strings.Contains(task.Status.Commands[0].Message, "interrupted") {
		t.Errorf("reason %q, command %+v", task.Status.Reason, task.Status.Commands[0])
	}
}

// every command has a timeout (rule 12): a command that sets no timeout still has one, its kind's default;
// here a download from a server that never answers, with the default made short.
func TestSafetyRule12_CommandWithoutTimeoutFailsAtItsKindsDefault(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	root := hosttest.NewRoot(t, nil)
	var asked []string
	var mu sync.Mutex
	startAgent(t, agent.Options{NodeName: "timeout-1", HostRoot: root, DefaultTimeout: func(k v1alpha1.CommandKind) time.Duration {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, k.KindName())
		return 300 * time.Millisecond
	}})
	create(t, newTask("timeout-1", "timeout-1", v1alpha1.ExecutionAuto,
		v1alpha1.Command{InstallFile: &v1alpha1.InstallFileCommand{URL: srv.URL + "/never", InsecureHTTP: true, SHA256: strings.Repeat("0", 64), Path: "/opt/f"}}))
	task := waitTask(t, "timeout-1", phaseIs(v1alpha1.TaskFailed))
	if msg := task.Status.Commands[0].Message; !strings.Contains(msg, "timed out after 300ms") {
		t.Errorf("message %q does not say the command timed out after its default", msg)
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(asked, ",") != "installFile" {
		t.Errorf("default timeouts asked for %v, want installFile's", asked)
	}
}

// drain honours PodDisruptionBudgets (rule 6): drain is as careful as kubectl drain. It never evicts the agent's
// own pod (in Job mode a Job's pod, which nothing else spares: the drain would end the agent running
// it), and refuses, naming each, pods no controller owns unless force and pods with emptyDir data
// unless deleteEmptyDirData.
func TestSafetyRule6_DrainSparesTheAgentAndRefusesWhatWouldNotComeBack(t *testing.T) {
	ctx := context.Background()
	const ns, nodeName = "drain-safety", "drain-safety-1"
	create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	create(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}})
	owned := func(kind string) []metav1.OwnerReference {
		return []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: kind, Name: "owner", UID: "uid-owner", Controller: ptr.To(true)}}
	}
	mkPod := func(name string, mut func(*corev1.Pod)) {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec:       corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "c", Image: "pause"}}},
		}
		mut(pod)
		create(t, pod)
	}
	mkPod("web", func(p *corev1.Pod) { p.OwnerReferences = owned("ReplicaSet") })
	mkPod("bare", func(*corev1.Pod) {})
	mkPod("cache", func(p *corev1.Pod) {
		p.OwnerReferences = owned("ReplicaSet")
		p.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	})
	// The agent's own pod, known by name (agent Jobs and the DaemonSet set POD_NAME and POD_NAMESPACE).
	mkPod("agent-pod", func(p *corev1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "nodeops-agent-x", UID: "uid-job", Controller: ptr.To(true)}}
	})
	// Another agent's pod on the node, known by its namespace and its Job (a Job's pod from before this one).
	if err := cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: agent.DefaultLeaseNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	mkPod("agent-other", func(p *corev1.Pod) {
		p.Namespace = agent.DefaultLeaseNamespace
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "nodeops-agent-y", UID: "uid-job-2", Controller: ptr.To(true)}}
	})
	// A tenant's pod labelled as an agent is no agent: a label exempts nothing from a drain.
	mkPod("agent-labelled", func(p *corev1.Pod) {
		p.Labels = map[string]string{"app.kubernetes.io/name": "nodeops-agent"}
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "nodeops-agent-y", UID: "uid-job-3", Controller: ptr.To(true)}}
	})
	podsLeft := func() string {
		pods := &corev1.PodList{}
		if err := cl.List(ctx, pods, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, p := range pods.Items {
			names = append(names, p.Name)
		}
		sort.Strings(names)
		return strings.Join(names, ",")
	}

	root := hosttest.NewRoot(t, nil)
	startAgent(t, agent.Options{NodeName: nodeName, HostRoot: root, PodName: "agent-pod", PodNamespace: ns})
	zero := int64(0)
	create(t, newTask("drain-safety-1", nodeName, v1alpha1.ExecutionAuto, v1alpha1.Command{Drain: &v1alpha1.DrainCommand{GracePeriodSeconds: &zero}}))
	task := waitTask(t, "drain-safety-1", phaseIs(v1alpha1.TaskFailed))
	msg := task.Status.Commands[0].Message
	for _, want := range []string{
		"refusing to evict drain-safety/bare (no controller; set force: true to evict it, it will not come back)",
		"refusing to evict drain-safety/cache (uses emptyDir; set deleteEmptyDirData: true to evict it, its emptyDir data will be lost)",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("drain message %q does not say %q", msg, want)
		}
	}
	if strings.Contains(msg, "agent") || strings.Contains(msg, "web") {
		t.Errorf("drain message %q names a pod it may evict or must spare", msg)
	}
	if got := podsLeft(); got != "agent-labelled,agent-pod,bare,cache,web" {
		t.Errorf("a refused drain evicted pods: left %s", got)
	}

	create(t, newTask("drain-safety-2", nodeName, v1alpha1.ExecutionAuto,
		v1alpha1.Command{Drain: &v1alpha1.DrainCommand{GracePeriodSeconds: &zero, Force: true, DeleteEmptyDirData: true}}))
	task = waitTask(t, "drain-safety-2", func(tk *v1alpha1.NodeTask) bool { return !tk.EffectivePhase().Unfinished() })
	if task.Status.Phase != v1alpha1.TaskSucceeded {
		t.Fatalf("forced drain: %s: %s", task.Status.Phase, task.Status.Message)
	}
	if got := podsLeft(); got != "agent-pod" {
		t.Errorf("after a forced drain pods left %s, want the agent's only", got)
	}
	if err := cl.Get(ctx, client.ObjectKey{Namespace: agent.DefaultLeaseNamespace, Name: "agent-other"}, &corev1.Pod{}); err != nil {
		t.Errorf("the other agent's pod after a forced drain: %v", err)
	}
	out := task.Status.Commands[0].OutputTail
	for _, want := range []string{"leaving drain-safety/agent-pod (the agent's own pod)", "leaving " + agent.DefaultLeaseNamespace + "/agent-other (a nodeops agent)"} {
		if !strings.Contains(out, want) {
			t.Errorf("drain output does not say %q:\n%s", want, out)
		}
	}
}
