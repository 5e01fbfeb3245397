package agent_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent"
	"github.com/nodeops/nodeops/internal/host/hosttest"
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

// holdNode takes the node's lock under root for task, as another live agent on the node would
// (its own open file: the kernel tells it from the agent's), naming the task in the file; release
// frees it, as that agent's finished write or its death would.
func holdNode(t *testing.T, root, task string) (release func()) {
	t.Helper()
	path := filepath.Join(root, agent.NodeLockFile)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = f.Close()
		t.Fatalf("locking %s as another agent: %v", path, err)
	}
	if err := f.Truncate(0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(task + "\nanother-agent\n"); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(func() { _ = f.Close() }) }
	t.Cleanup(release)
	return release
}

// leftBy names task in the node's lock file with the lock free, as an agent that died while it
// held the node for task leaves it.
func leftBy(t *testing.T, root, task string) {
	t.Helper()
	holdNode(t, root, task)()
}

// lockHolder is the task the node's lock file under root names.
func lockHolder(t *testing.T, root string) string {
	t.Helper()
	task, _, _ := strings.Cut(hosttest.ReadFile(t, root, "/"+agent.NodeLockFile), "\n")
	return task
}

// markRunning records task Running, paused between commands, as its agent would have.
func markRunning(t *testing.T, task *v1alpha1.NodeTask) {
	t.Helper()
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := cl.Get(context.Background(), client.ObjectKeyFromObject(task), task); err != nil {
			return err
		}
		task.Status.Phase = v1alpha1.TaskRunning
		return cl.Status().Update(context.Background(), task)
	}); err != nil {
		t.Fatal(err)
	}
}

// setStatus changes task's status as read now (a finished phase, the manager's AgentLost mark);
// an error fails the test without stopping it, so that it may run from a timer.
func setStatus(t *testing.T, task *v1alpha1.NodeTask, set func(*v1alpha1.NodeTaskStatus)) {
	t.Helper()
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := cl.Get(context.Background(), client.ObjectKeyFromObject(task), task); err != nil {
			return err
		}
		set(&task.Status)
		return cl.Status().Update(context.Background(), task)
	}); err != nil {
		t.Errorf("changing the status of task %s: %v", task.Name, err)
	}
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

// TestSafetyRule8_NodeHeldByAnUnfinishedTaskWaitsThenTheFinishedHolderIsTakenOver: the node's
// lock file names a task that has not finished (its agent died between two commands, so the lock
// itself is free): a new task stays Pending saying which task holds the node; once that task
// finished, the node is taken without its holder releasing it.
func TestSafetyRule8_NodeHeldByAnUnfinishedTaskWaitsThenTheFinishedHolderIsTakenOver(t *testing.T) {
	const node = "excl-2"
	root := hosttest.NewRoot(t, nil)
	// The holder runs on the node as far as the API shows (paused between commands).
	holder := newTask("excl-2-holder", node, v1alpha1.ExecutionAuto, script("true", true))
	holder.Spec.Paused = true
	create(t, holder)
	markRunning(t, holder)
	leftBy(t, root, holder.Name)
	startAgent(t, agent.Options{NodeName: node, HostRoot: root})
	create(t, newTask("excl-2-t", node, v1alpha1.ExecutionAuto, script("echo ran >> /ran", false)))
	waitTask(t, "excl-2-t", func(tk *v1alpha1.NodeTask) bool {
		return tk.EffectivePhase() == v1alpha1.TaskPending && tk.Status.Message == "node busy: held by task excl-2-holder"
	})
	if got := hosttest.ReadFile(t, root, "/ran"); got != "" {
		t.Fatalf("the command ran while another task held the node: %q", got)
	}
	setStatus(t, holder, func(st *v1alpha1.NodeTaskStatus) { st.Phase = v1alpha1.TaskSucceeded })
	task := waitTask(t, "excl-2-t", phaseIs(v1alpha1.TaskSucceeded))
	if task.Status.Message != "" {
		t.Errorf("the finished task still says %q", task.Status.Message)
	}
	if got := hosttest.ReadFile(t, root, "/ran"); got != "ran\n" {
		t.Errorf("the command ran %q, want once", got)
	}
	if got := lockHolder(t, root); got != "excl-2-t" {
		t.Errorf("the node's lock file names %q, want excl-2-t", got)
	}
}

// TestSafetyRule8_NodeLockedByAnotherAgentIsNotTaken: another agent on the node (a rollout's, a
// Job's) holds the node's lock for a task the API already shows finished (it has written the result
// and not yet let go): the agent's next task waits, saying which task holds the node, and its
// command runs only once the other agent let the lock go. What the API shows does not decide; the
// kernel's lock does.
func TestSafetyRule8_NodeLockedByAnotherAgentIsNotTaken(t *testing.T) {
	const node = "excl-8"
	root := hosttest.NewRoot(t, nil)
	startAgent(t, agent.Options{NodeName: node, HostRoot: root})
	create(t, newTask("excl-8-first", node, v1alpha1.ExecutionAuto, script("true", true)))
	waitTask(t, "excl-8-first", phaseIs(v1alpha1.TaskSucceeded))
	holder := newTask("excl-8-holder", node, v1alpha1.ExecutionAuto, script("true", true))
	holder.Spec.Paused = true
	create(t, holder)
	release := holdNode(t, root, holder.Name)
	setStatus(t, holder, func(st *v1alpha1.NodeTaskStatus) { st.Phase = v1alpha1.TaskSucceeded })
	create(t, newTask("excl-8-next", node, v1alpha1.ExecutionAuto, script("echo ran >> /ran", false)))
	waitTask(t, "excl-8-next", func(tk *v1alpha1.NodeTask) bool {
		return tk.EffectivePhase() == v1alpha1.TaskPending && tk.Status.Message == "node busy: held by task excl-8-holder"
	})
	if got := hosttest.ReadFile(t, root, "/ran"); got != "" {
		t.Fatalf("the command ran while another agent held the node: %q", got)
	}
	released := time.Now()
	release()
	task := waitTask(t, "excl-8-next", phaseIs(v1alpha1.TaskSucceeded))
	if c := task.Status.Commands[0]; c.StartTime == nil || c.StartTime.Time.Before(released.Truncate(time.Second)) {
		t.Errorf("the command started at %v, before the other agent let the node go at %v", c.StartTime, released)
	}
	if got := lockHolder(t, root); got != "excl-8-next" {
		t.Errorf("the node's lock file names %q, want excl-8-next", got)
	}
}

// TestSafetyRule8_LockOfADeadAgentIsTakenOnceItsTaskIsLost: the agent holding the node for an
// unfinished task dies (the kernel frees its lock); the node stays its task's until the manager
// marks that task AgentLost (rule 9), and then the next task takes it at once, with no expiry.
func TestSafetyRule8_LockOfADeadAgentIsTakenOnceItsTaskIsLost(t *testing.T) {
	const node = "excl-3"
	root := hosttest.NewRoot(t, nil)
	holder := newTask("excl-3-dead", node, v1alpha1.ExecutionAuto, script("true", true))
	holder.Spec.Paused = true
	create(t, holder)
	markRunning(t, holder)
	die := holdNode(t, root, holder.Name)
	messages := watchMessages(t, node)
	startAgent(t, agent.Options{NodeName: node, HostRoot: root})
	create(t, newTask("excl-3-t", node, v1alpha1.ExecutionAuto, script("echo ran >> /ran", false)))
	waitTask(t, "excl-3-t", func(tk *v1alpha1.NodeTask) bool {
		return tk.EffectivePhase() == v1alpha1.TaskPending && tk.Status.Message == "node busy: held by task excl-3-dead"
	})
	die()
	// The manager marks the task lost some time after its agent's death (it waits out the
	// heartbeats); the agent looks again every second meanwhile, and must keep waiting.
	var mu sync.Mutex
	var lost time.Time
	time.AfterFunc(3*time.Second, func() {
		mu.Lock()
		defer mu.Unlock()
		lost = time.Now()
		setStatus(t, holder, func(st *v1alpha1.NodeTaskStatus) {
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{
				Type: v1alpha1.ConditionAgentLost, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAgentLost, Message: "set by the test, as the manager",
			})
		})
	})
	task := waitTask(t, "excl-3-t", phaseIs(v1alpha1.TaskSucceeded))
	mu.Lock()
	defer mu.Unlock()
	if c := task.Status.Commands[0]; c.StartTime == nil || lost.IsZero() || c.StartTime.Time.Before(lost.Truncate(time.Second)) {
		t.Errorf("the command started at %v, before the dead agent's task was marked lost at %v", c.StartTime, lost)
	}
	if got := lockHolder(t, root); got != "excl-3-t" {
		t.Errorf("the node's lock file names %q, want excl-3-t", got)
	}
	if m := messages(); len(m) == 0 || !strings.Contains(m[0], "node busy: held by task excl-3-dead") {
		t.Errorf("the task did not wait for the dead agent's task; messages seen: %q", m)
	}
}

// TestSafetyRule8_LongCommandKeepsTheNode: a command that runs for several heartbeats keeps the
// node; a second agent's task waits for it.
func TestSafetyRule8_LongCommandKeepsTheNode(t *testing.T) {
	const node = "excl-5"
	root := hosttest.NewRoot(t, nil)
	o := agent.Options{NodeName: node, HostRoot: root, Heartbeat: 200 * time.Millisecond}
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

// runningAsLeft makes a task whose idempotent command is recorded Running, as an agent running it
// (or one that died running it) leaves it.
func runningAsLeft(t *testing.T, node, name string) {
	t.Helper()
	task := newTask(name, node, v1alpha1.ExecutionAuto, script("echo ran >> /ran", true))
	create(t, task)
	started := metav1.NewMicroTime(time.Now())
	task.Status = v1alpha1.NodeTaskStatus{Phase: v1alpha1.TaskRunning, Progress: "0/1", Attempt: 1, StartTime: &started, AgentHeartbeat: &started,
		Commands: []v1alpha1.CommandStatus{{Name: "script", Phase: v1alpha1.CommandRunning, Attempt: 1, StartTime: &started}}}
	if err := cl.Status().Update(context.Background(), task); err != nil {
		t.Fatal(err)
	}
}

// TestSafetyRule8_AnotherAgentsRunningTaskIsNotTakenOver: a second agent on the node (a rollout's
// new pod) finds a task recorded Running whose command another agent still runs (it holds the
// node's lock for it): it does not run the command again until that agent let the lock go.
func TestSafetyRule8_AnotherAgentsRunningTaskIsNotTakenOver(t *testing.T) {
	const node = "excl-6"
	root := hosttest.NewRoot(t, nil)
	runningAsLeft(t, node, "excl-6")
	release := holdNode(t, root, "excl-6")
	var mu sync.Mutex
	var released time.Time
	time.AfterFunc(3*time.Second, func() {
		mu.Lock()
		defer mu.Unlock()
		released = time.Now()
		release()
	})
	startAgent(t, agent.Options{NodeName: node, HostRoot: root})
	task := waitTask(t, "excl-6", phaseIs(v1alpha1.TaskSucceeded))
	mu.Lock()
	defer mu.Unlock()
	if c := task.Status.Commands[0]; c.Attempt != 2 || c.StartTime == nil || released.IsZero() || c.StartTime.Time.Before(released.Truncate(time.Second)) {
		t.Errorf("the command ran again (attempt %d) at %v, before the other agent let the node go at %v", c.Attempt, c.StartTime, released)
	}
	if got := hosttest.ReadFile(t, root, "/ran"); got != "ran\n" {
		t.Errorf("the command ran %q, want once", got)
	}
}

// TestRestartedAgentInItsPodResumesAtOnce: the lock file that the agent wrote before it died (its
// container restarted) names the task it ran; the lock itself died with it, so the restarted
// agent resumes the task at once.
func TestRestartedAgentInItsPodResumesAtOnce(t *testing.T) {
	const node = "excl-7"
	root := hosttest.NewRoot(t, nil)
	runningAsLeft(t, node, "excl-7")
	leftBy(t, root, "excl-7")
	startAgent(t, agent.Options{NodeName: node, HostRoot: root, Identity: "agent-1"})
	task := waitTask(t, "excl-7", phaseIs(v1alpha1.TaskSucceeded))
	if c := task.Status.Commands[0]; c.Attempt != 2 {
		t.Errorf("command attempt %d, want 2 (re-run after the restart)", c.Attempt)
	}
	if got := lockHolder(t, root); got != "excl-7" {
		t.Errorf("the node's lock file names %q, want excl-7", got)
	}
}

// TestSafetyRule8_OneCommandTaskWritesNoLease: the node's hold costs a one-command task no API
// write (docs/design.md, write budget): the lock is on the node, and the task's one status write is
// the agent's only one.
func TestSafetyRule8_OneCommandTaskWritesNoLease(t *testing.T) {
	const node = "excl-4"
	w, err := cl.Watch(context.Background(), &coordinationv1.LeaseList{}, client.InNamespace(agent.DefaultLeaseNamespace))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	root, _, modified := runCountingWrites(t, node, script("echo once", true))
	if modified != 1 {
		t.Errorf("the agent wrote the task %d times, want 1", modified)
	}
	for quiet := false; !quiet; {
		select {
		case ev := <-w.ResultChan():
			if l, ok := ev.Object.(*coordinationv1.Lease); ok && (ev.Type == watch.Added || ev.Type == watch.Modified) {
				t.Errorf("a Lease was written for a one-command task: %s %s", ev.Type, l.Name)
			}
		case <-time.After(time.Second):
			quiet = true
		}
	}
	if got := lockHolder(t, root); got != node {
		t.Errorf("the node's lock file names %q, want %s", got, node)
	}
}
