package cli

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	nodeopsv1 "github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/testutil"
)

// TestLiveDisplayInTmux runs the real binary in a 120x40 tmux terminal and reads the screen.
func TestLiveDisplayInTmux(t *testing.T) {
	tmux, err := exec.LookPath("tmux")
	if err != nil {
		t.Fatal("tmux is required for the live display test (hack/install-deps.sh installs it)")
	}
	bin := filepath.Join(t.TempDir(), "kubectl-nodeops")
	// Built as `make build` builds it (cgo off, paths trimmed), whatever the test itself runs under (cgo
	// on for the race detector): the packages are then in the Go cache already, where another setting
	// compiled all of them again (475 s of a cold CI run).
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "github.com/nodeops/nodeops/cmd/kubectl-nodeops")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building kubectl-nodeops: %v\n%s", err, out)
	}

	// The binary reads the real clock, so times here are real too.
	start := time.Now()
	realAt := func(d time.Duration) *metav1.Time { t := metav1.NewTime(start.Add(d)); return &t }
	name := "watch-tty"
	work := []nodeopsv1.Command{script("cordon-it", "true"), script("upgrade-it", "true"), script("uncordon-it", "true")}
	op := createOperation(t, name, nodeopsv1.NodeOperationSpec{Custom: &nodeopsv1.CustomOperation{Groups: []nodeopsv1.Group{
		{Name: "first", Commands: work[:1]}, {Name: "workers", Commands: work}}}})

	socket := fmt.Sprintf("nodeops-cli-test-%d", os.Getpid())
	tm := func(args ...string) string {
		out, err := exec.Command(tmux, append([]string{"-L", socket}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("tmux %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	shell := fmt.Sprintf("%s watch %s --kubeconfig %s; echo EXIT=$?; sleep 600", bin, name, kubeconfig)
	tm("new-session", "-d", "-x", "120", "-y", "40", "-s", "cli", shell)
	t.Cleanup(func() { _ = exec.Command(tmux, "-L", socket, "kill-server").Run() })
	screen := func() string { return tm("capture-pane", "-p", "-t", "cli") }
	waitScreen := func(what string, ok func(string) bool) string {
		t.Helper()
		var s string
		testutil.EventuallyEvery(t, 30*time.Second, 100*time.Millisecond, what, func(context.Context) error {
			if s = screen(); !ok(s) {
				return fmt.Errorf("screen:\n%s", s)
			}
			return nil
		})
		return s
	}
	contains := func(subs ...string) func(string) bool {
		return func(s string) bool {
			for _, sub := range subs {
				if !strings.Contains(s, sub) {
					return false
				}
			}
			return true
		}
	}

	waitScreen("the header and the wait for planning", contains(name+" | custom (2 groups) | Auto | Pending", "waiting for the manager"))

	first := createTask(t, op, "first", "n-1", work[:1]...)
	tasks := map[string]string{}
	for _, n := range []string{"n-1", "n-2", "n-3", "n-4"} {
		tasks[n] = createTask(t, op, "workers", n, work...).Name
	}
	setTaskStatus(t, first.Name, func(s *nodeopsv1.NodeTaskStatus) {
		s.Phase, s.Progress = nodeopsv1.TaskSucceeded, "1/1"
	})
	running := func(n string, cmd int32, progress string) {
		setTaskStatus(t, tasks[n], func(s *nodeopsv1.NodeTaskStatus) {
			s.Phase, s.CurrentCommand, s.Progress = nodeopsv1.TaskRunning, cmd, progress
			s.Commands = nil
			for i := int32(0); i < cmd; i++ {
				s.Commands = append(s.Commands, nodeopsv1.CommandStatus{Name: work[i].Name, Phase: nodeopsv1.CommandSucceeded})
			}
			s.Commands = append(s.Commands, nodeopsv1.CommandStatus{Name: work[cmd].Name, Phase: nodeopsv1.CommandRunning, Attempt: 1, StartTime: &metav1.MicroTime{Time: start}})
		})
	}
	running("n-1", 1, "1/3")
	running("n-2", 0, "0/3")
	setOperationStatus(t, name, func(s *nodeopsv1.NodeOperationStatus) {
		s.Phase, s.Progress, s.StartTime = nodeopsv1.OperationRunning, "1/5 nodes", realAt(0)
		s.Groups = []nodeopsv1.GroupStatus{
			{Name: "first", Phase: nodeopsv1.GroupSucceeded, Nodes: nodeopsv1.NodeCounts{Total: 1, Succeeded: 1}},
			{Name: "workers", Phase: nodeopsv1.GroupRunning, Nodes: nodeopsv1.NodeCounts{Total: 4, Running: 2, Pending: 2}},
		}
	})
	s := waitScreen("bars and running nodes", contains("first", "[####", "1/1", "workers", "[>>>", "0/4", "(2 running)",
		"n-1", "upgrade-it", "n-2", "cordon-it"))
	if strings.Contains(s, "waiting for the manager") {
		t.Errorf("the old frame was not cleared:\n%s", s)
	}

	// n-1 finishes, n-3 starts: the frame is redrawn in place, not appended.
	setTaskStatus(t, tasks["n-1"], func(s *nodeopsv1.NodeTaskStatus) {
		s.Phase, s.Progress, s.CurrentCommand = nodeopsv1.TaskSucceeded, "3/3", 2
	})
	running("n-3", 0, "0/3")
	setOperationStatus(t, name, func(s *nodeopsv1.NodeOperationStatus) {
		s.Progress = "2/5 nodes"
		s.Groups[1].Nodes = nodeopsv1.NodeCounts{Total: 4, Succeeded: 1, Running: 2, Pending: 1}
	})
	s = waitScreen("the redrawn frame", func(s string) bool {
		return contains("2/5 nodes", "[##########>>>", "1/4", "n-3")(s) && !strings.Contains(s, "upgrade-it")
	})
	t.Logf("screen after a redraw:\n%s", strings.TrimRight(s, "\n"))
	if n := strings.Count(s, name+" | custom"); n != 1 {
		t.Errorf("header shown %d times; the display should redraw in place:\n%s", n, s)
	}
	if n := strings.Count(s, "2 workers "); n != 1 {
		t.Errorf("workers bar shown %d times:\n%s", n, s)
	}

	// The end: the last frame stays and the outcome follows it.
	for _, n := range []string{"n-2", "n-3", "n-4"} {
		setTaskStatus(t, tasks[n], func(s *nodeopsv1.NodeTaskStatus) { s.Phase, s.Progress = nodeopsv1.TaskSucceeded, "3/3" })
	}
	setOperationStatus(t, name, func(s *nodeopsv1.NodeOperationStatus) {
		s.Phase, s.Progress, s.CompletionTime = nodeopsv1.OperationSucceeded, "5/5 nodes", realAt(90*time.Second)
		s.Groups[1].Phase, s.Groups[1].Nodes = nodeopsv1.GroupSucceeded, nodeopsv1.NodeCounts{Total: 4, Succeeded: 4}
	})
	s = waitScreen("the outcome", contains("nodeoperation watch-tty Succeeded after 1m30s (5/5 nodes)", "EXIT=0"))
	if !strings.Contains(s, "4/4") || strings.Count(s, name+" | custom") != 1 {
		t.Errorf("final frame:\n%s", s)
	}
}
