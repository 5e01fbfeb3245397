package agent_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

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

// docs/design.md, safety rule 12: a stopping agent (SIGTERM, a DaemonSet rollout) lets the running
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

// docs/design.md, safety rules 12 and 4: when the grace period runs out the command is stopped as
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

// docs/design.md, safety rule 12: a command that sets no timeout still has one, its kind's default;
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
		v1alpha1.Command{InstallFile: &v1alpha1.InstallFileCommand{URL: srv.URL + "/never", SHA256: strings.Repeat("0", 64), Path: "/opt/f"}}))
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
