package agent_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent"
	"github.com/nodeops/nodeops/internal/host/hosttest"
	"github.com/nodeops/nodeops/internal/plan"
	"github.com/nodeops/nodeops/internal/testutil"
)

// journaled is a non-idempotent command that appends "start <name>" and, a while later,
// "end <name>" to /journal in the node's host root.
func journaled(name string) v1alpha1.Command {
	return journaledFor(name, 2)
}

func journaledFor(name string, seconds int) v1alpha1.Command {
	return script(fmt.Sprintf("echo 'start %s' >> /journal; sleep %d; echo 'end %s' >> /journal", name, seconds, name), false)
}

// checkJournal fails unless every start in the journal is followed by its own end before the
// next start: at no moment did two commands run on the node.
func checkJournal(t *testing.T, journal string, want int) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(journal), "\n")
	if len(lines) != 2*want {
		t.Fatalf("journal has %d lines, want %d (each command once):\n%s", len(lines), 2*want, journal)
	}
	for i := 0; i < len(lines); i += 2 {
		name, ok := strings.CutPrefix(lines[i], "start ")
		if !ok || lines[i+1] != "end "+name {
			t.Fatalf("two commands ran on the node at once:\n%s", journal)
		}
	}
}

// watchMessages records every status.message the tasks of node show, as a user watching them would.
func watchMessages(t *testing.T, node string) func() []string {
	t.Helper()
	w, err := cl.Watch(context.Background(), &v1alpha1.NodeTaskList{}, client.MatchingLabels{v1alpha1.LabelNode: node})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if tk, ok := ev.Object.(*v1alpha1.NodeTask); ok && tk.Status.Message != "" {
				mu.Lock()
				seen = append(seen, tk.Name+" "+string(tk.Status.Phase)+": "+tk.Status.Message)
				mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { w.Stop(); <-done })
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}
}

func nodeLease(t *testing.T, node string) *coordinationv1.Lease {
	t.Helper()
	l := &coordinationv1.Lease{}
	key := client.ObjectKey{Namespace: agent.DefaultLeaseNamespace, Name: plan.NodeLeaseName(node)}
	if err := cl.Get(context.Background(), key, l); err != nil {
		t.Fatalf("the lease of node %s: %v", node, err)
	}
	return l
}

// holdNode makes the node's Lease name holder, renewed at renewed, as another agent would have.
func holdNode(t *testing.T, node, holder string, renewed time.Time, duration time.Duration) {
	t.Helper()
	create(t, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: agent.DefaultLeaseNamespace, Name: plan.NodeLeaseName(node)},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(holder),
			LeaseDurationSeconds: ptr.To(int32(duration.Seconds())),
			AcquireTime:          ptr.To(metav1.NewMicroTime(renewed)),
			RenewTime:            ptr.To(metav1.NewMicroTime(renewed)),
		},
	})
}

// TestSafetyRule8_TwoAgentsAndTwoTasksOnOneNodeNeverOverlap: two agents serve the same node (a
// DaemonSet pod and a Job's, or a rollout) and two tasks for it were created directly (two managers,
// or a hand-made task): the journal the commands keep shows one at a time, and both finish.
func TestSafetyRule8_TwoAgentsAndTwoTasksOnOneNodeNeverOverlap(t *testing.T) {
	const node = "excl-1"
	root := hosttest.NewRoot(t, nil)
	messages := watchMessages(t, node)
	startAgent(t, agent.Options{NodeName: node, HostRoot: root})
	startAgent(t, agent.Options{NodeName: node, HostRoot: root})
	create(t, newTask("excl-1-a", node, v1alpha1.ExecutionAuto, journaled("a1"), journaled("a2")))
	create(t, newTask("excl-1-b", node, v1alpha1.ExecutionAuto, journaled("b1")))
	for _, name := range []string{"excl-1-a", "excl-1-b"} {
		task := waitTask(t, name, func(tk *v1alpha1.NodeTask) bool {
			return !tk.EffectivePhase().Unfinished() || tk.Status.Phase == v1alpha1.TaskFailed
		})
		if task.Status.Phase != v1alpha1.TaskSucceeded {
			t.Errorf("task %s ended %s: %s", name, task.Status.Phase, task.Status.Message)
		}
	}
	checkJournal(t, hosttest.ReadFile(t, root, "/journal"), 3)
	busy := false
	for _, m := range messages() {
		busy = busy || strings.Contains(m, "Pending: node busy: held by task excl-1-")
	}
	if !busy {
		t.Errorf("the task that waited never said so; messages seen: %q", messages())
	}
}

// TestSafetyRule8_NodeHeldByAnUnfinishedTaskWaitsThenTheFinishedHolderIsTakenOver: while the
// node's Lease names a task that has not finished, a new task stays Pending saying which task holds
// the node; once that task finished, the Lease is taken over without its holder releasing it.
func TestSafetyRule8_NodeHeldByAnUnfinishedTaskWaitsThenTheFinishedHolderIsTakenOver(t *testing.T) {
	const node = "excl-2"
	root := hosttest.NewRoot(t, nil)
	// The holder runs on the node as far as the API shows (another agent's, paused between commands).
	holder := newTask("excl-2-holder", node, v1alpha1.ExecutionAuto, script("true", true))
	holder.Spec.Paused = true
	create(t, holder)
	holder.Status.Phase = v1alpha1.TaskRunning
	if err := cl.Status().Update(context.Background(), holder); err != nil {
		t.Fatal(err)
	}
	holdNode(t, node, holder.Name, time.Now(), time.Hour)
	startAgent(t, agent.Options{NodeName: node, HostRoot: root})
	create(t, newTask("excl-2-t", node, v1alpha1.ExecutionAuto, script("echo ran >> /ran", false)))
	waitTask(t, "excl-2-t", func(tk *v1alpha1.NodeTask) bool {
		return tk.EffectivePhase() == v1alpha1.TaskPending && tk.Status.Message == "node busy: held by task excl-2-holder"
	})
	if got := hosttest.ReadFile(t, root, "/ran"); got != "" {
		t.Fatalf("the command ran while another task held the node: %q", got)
	}
	holder.Status.Phase = v1alpha1.TaskSucceeded
	if err := cl.Status().Update(context.Background(), holder); err != nil {
		t.Fatal(err)
	}
	task := waitTask(t, "excl-2-t", phaseIs(v1alpha1.TaskSucceeded))
	if task.Status.Message != "" {
		t.Errorf("the finished task still says %q", task.Status.Message)
	}
	if got := hosttest.ReadFile(t, root, "/ran"); got != "ran\n" {
		t.Errorf("the command ran %q, want once", got)
	}
	if l := nodeLease(t, node); ptr.Deref(l.Spec.HolderIdentity, "") != "excl-2-t" {
		t.Errorf("the node's lease names %q, want excl-2-t", ptr.Deref(l.Spec.HolderIdentity, ""))
	}
}

// TestSafetyRule8_LeaseTakenSinceTheAgentsLastWriteIsNotOverwritten: the agent takes a node's
// Lease it wrote last without reading it first; when another agent took it since for a task still
// running, the API server refuses that write, and the next task waits for the holder.
func TestSafetyRule8_LeaseTakenSinceTheAgentsLastWriteIsNotOverwritten(t *testing.T) {
	const node = "excl-8"
	root := hosttest.NewRoot(t, nil)
	startAgent(t, agent.Options{NodeName: node, HostRoot: root})
	create(t, newTask("excl-8-first", node, v1alpha1.ExecutionAuto, script("true", true)))
	waitTask(t, "excl-8-first", phaseIs(v1alpha1.TaskSucceeded))
	// Another agent (a rollout's) takes the node for a task of its own, running between commands.
	holder := newTask("excl-8-holder", node, v1alpha1.ExecutionAuto, script("true", true))
	holder.Spec.Paused = true
	create(t, holder)
	// Read again on a conflict, as that agent would: this one records that it saw the paused task.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := cl.Get(context.Background(), client.ObjectKeyFromObject(holder), holder); err != nil {
			return err
		}
		holder.Status.Phase = v1alpha1.TaskRunning
		return cl.Status().Update(context.Background(), holder)
	}); err != nil {
		t.Fatal(err)
	}
	l := nodeLease(t, node)
	l.Spec.HolderIdentity = ptr.To(holder.Name)
	l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now()))
	l.Spec.LeaseDurationSeconds = ptr.To(int32(3600))
	if err := cl.Update(context.Background(), l); err != nil {
		t.Fatal(err)
	}
	create(t, newTask("excl-8-next", node, v1alpha1.ExecutionAuto, script("echo ran >> /ran", false)))
	waitTask(t, "excl-8-next", func(tk *v1alpha1.NodeTask) bool {
		return tk.EffectivePhase() == v1alpha1.TaskPending && tk.Status.Message == "node busy: held by task excl-8-holder"
	})
	if got := hosttest.ReadFile(t, root, "/ran"); got != "" {
		t.Fatalf("the command ran while another task held the node: %q", got)
	}
	if l := nodeLease(t, node); ptr.Deref(l.Spec.HolderIdentity, "") != holder.Name {
		t.Errorf("the node's lease names %q, want %s", ptr.Deref(l.Spec.HolderIdentity, ""), holder.Name)
	}
}

// TestSafetyRule8_ExpiredLeaseOfADeadAgentIsTakenOver: the agent holding the node's Lease for an
// unfinished task stopped renewing it; once it expired, the next task takes the node.
func TestSafetyRule8_ExpiredLeaseOfADeadAgentIsTakenOver(t *testing.T) {
	const node = "excl-3"
	root := hosttest.NewRoot(t, nil)
	holder := newTask("excl-3-dead", node, v1alpha1.ExecutionAuto, script("true", true))
	holder.Spec.Paused = true
	create(t, holder)
	holder.Status.Phase = v1alpha1.TaskRunning
	if err := cl.Status().Update(context.Background(), holder); err != nil {
		t.Fatal(err)
	}
	holdNode(t, node, holder.Name, time.Now(), 3*time.Second)
	messages := watchMessages(t, node)
	startAgent(t, agent.Options{NodeName: node, HostRoot: root})
	create(t, newTask("excl-3-t", node, v1alpha1.ExecutionAuto, script("echo ran >> /ran", false)))
	waitTask(t, "excl-3-t", phaseIs(v1alpha1.TaskSucceeded))
	l := nodeLease(t, node)
	if ptr.Deref(l.Spec.HolderIdentity, "") != "excl-3-t" || ptr.Deref(l.Spec.LeaseTransitions, 0) != 1 {
		t.Errorf("the node's lease names %q after %d transitions, want excl-3-t after 1", ptr.Deref(l.Spec.HolderIdentity, ""), ptr.Deref(l.Spec.LeaseTransitions, 0))
	}
	if !l.Spec.AcquireTime.After(holder.CreationTimestamp.Add(3 * time.Second)) {
		t.Errorf("the lease was taken at %s, before the dead agent's expired", l.Spec.AcquireTime)
	}
	if m := messages(); len(m) == 0 || !strings.Contains(m[0], "node busy: held by task excl-3-dead") {
		t.Errorf("the task did not wait for the lease to expire; messages seen: %q", m)
	}
}

// TestSafetyRule8_LongCommandKeepsTheNode: a command that runs for several lease durations keeps
// the node, as its agent renews the Lease with the heartbeat; a second agent's task waits for it.
func TestSafetyRule8_LongCommandKeepsTheNode(t *testing.T) {
	const node = "excl-5"
	root := hosttest.NewRoot(t, nil)
	o := agent.Options{NodeName: node, HostRoot: root, Heartbeat: 200 * time.Millisecond, LeaseDuration: time.Second}
	startAgent(t, o)
	create(t, newTask("excl-5-long", node, v1alpha1.ExecutionAuto, journaledFor("long", 5)))
	testutil.Eventually(t, 30*time.Second, "the long command to start", fileIn(root, "/journal"))
	startAgent(t, o)
	create(t, newTask("excl-5-next", node, v1alpha1.ExecutionAuto, journaledFor("next", 0)))
	for _, name := range []string{"excl-5-long", "excl-5-next"} {
		waitTask(t, name, phaseIs(v1alpha1.TaskSucceeded))
	}
	checkJournal(t, hosttest.ReadFile(t, root, "/journal"), 2)
}

// runningAsLeftBy makes a task whose idempotent command is recorded Running, and the node's Lease
// naming it, renewed now by the agent in pod, as an agent that died mid-command leaves them.
func runningAsLeftBy(t *testing.T, node, name, pod string, duration time.Duration) *coordinationv1.Lease {
	t.Helper()
	task := newTask(name, node, v1alpha1.ExecutionAuto, script("echo ran >> /ran", true))
	create(t, task)
	started := metav1.NewMicroTime(time.Now())
	task.Status = v1alpha1.NodeTaskStatus{Phase: v1alpha1.TaskRunning, Progress: "0/1", Attempt: 1, StartTime: &started, AgentHeartbeat: &started,
		Commands: []v1alpha1.CommandStatus{{Name: "script", Phase: v1alpha1.CommandRunning, Attempt: 1, StartTime: &started}}}
	if err := cl.Status().Update(context.Background(), task); err != nil {
		t.Fatal(err)
	}
	holdNode(t, node, name, started.Time, duration)
	l := nodeLease(t, node)
	l.Annotations = map[string]string{agent.AnnotationLeaseAgent: pod}
	if err := cl.Update(context.Background(), l); err != nil {
		t.Fatal(err)
	}
	return l
}

// TestSafetyRule8_AnotherAgentsRunningTaskIsNotTakenOver: a second agent on the node (a rollout's
// new pod) finds a task recorded Running whose Lease another pod's agent still renews: it does not
// run the command again until that Lease expired.
func TestSafetyRule8_AnotherAgentsRunningTaskIsNotTakenOver(t *testing.T) {
	const node = "excl-6"
	root := hosttest.NewRoot(t, nil)
	l := runningAsLeftBy(t, node, "excl-6", "agent-old", 3*time.Second)
	startAgent(t, agent.Options{NodeName: node, HostRoot: root, Identity: "agent-new"})
	task := waitTask(t, "excl-6", phaseIs(v1alpha1.TaskSucceeded))
	expiry := l.Spec.RenewTime.Add(3 * time.Second)
	if c := task.Status.Commands[0]; c.Attempt != 2 || c.StartTime == nil || c.StartTime.Time.Before(expiry) {
		t.Errorf("the command ran again (attempt %d) at %v, before the other agent's lease expired at %v", c.Attempt, c.StartTime, expiry)
	}
	if got := hosttest.ReadFile(t, root, "/ran"); got != "ran\n" {
		t.Errorf("the command ran %q, want once", got)
	}
}

// TestRestartedAgentInItsPodResumesAtOnce: the Lease that the same pod's agent wrote before its
// container restarted does not hold the restarted agent back (it would wait for an hour here).
func TestRestartedAgentInItsPodResumesAtOnce(t *testing.T) {
	const node = "excl-7"
	root := hosttest.NewRoot(t, nil)
	runningAsLeftBy(t, node, "excl-7", "agent-1", time.Hour)
	startAgent(t, agent.Options{NodeName: node, HostRoot: root, Identity: "agent-1"})
	task := waitTask(t, "excl-7", phaseIs(v1alpha1.TaskSucceeded))
	if c := task.Status.Commands[0]; c.Attempt != 2 {
		t.Errorf("command attempt %d, want 2 (re-run after the restart)", c.Attempt)
	}
	if l := nodeLease(t, node); l.Annotations[agent.AnnotationLeaseAgent] != "agent-1" || ptr.Deref(l.Spec.HolderIdentity, "") != "excl-7" {
		t.Errorf("lease %v holder %q", l.Annotations, ptr.Deref(l.Spec.HolderIdentity, ""))
	}
}

// TestSafetyRule8_OneCommandTaskCostsOneLeaseWrite: the node's Lease costs a one-command task one
// write (its take); nothing releases it (docs/design.md, write budget).
func TestSafetyRule8_OneCommandTaskCostsOneLeaseWrite(t *testing.T) {
	const node = "excl-4"
	w, err := cl.Watch(context.Background(), &coordinationv1.LeaseList{}, client.InNamespace(agent.DefaultLeaseNamespace))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	runCountingWrites(t, node, script("echo once", false))
	writes := 0
	for quiet := false; !quiet; {
		select {
		case ev := <-w.ResultChan():
			if l, ok := ev.Object.(*coordinationv1.Lease); ok && l.Name == plan.NodeLeaseName(node) && (ev.Type == watch.Added || ev.Type == watch.Modified) {
				writes++
			}
		case <-time.After(time.Second):
			quiet = true
		}
	}
	if writes != 1 {
		t.Errorf("the node's lease was written %d times for a one-command task, want 1", writes)
	}
}
