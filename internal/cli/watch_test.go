package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	nodeopsv1 "github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/testutil"
)

// startWatch runs `watch NAME` in the background (not on a terminal) and returns its output and exit code.
func startWatch(t *testing.T, args ...string) (*syncBuffer, <-chan int) {
	t.Helper()
	out, errOut := &syncBuffer{}, &syncBuffer{}
	o := testOptions(out, errOut, "")
	done := make(chan int, 1)
	go func() {
		code := Run(o, args)
		if s := errOut.String(); s != "" {
			fmt.Fprintf(out, "STDERR: %s", s)
		}
		done <- code
	}()
	return out, done
}

func waitExit(t *testing.T, out *syncBuffer, done <-chan int) int {
	t.Helper()
	select {
	case code := <-done:
		return code
	case <-time.After(30 * time.Second):
		t.Fatalf("watch did not end; output so far:\n%s", out.String())
	}
	return -1
}

func waitOutput(t *testing.T, out *syncBuffer, want string) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, fmt.Sprintf("%q in the watch output", want), func() error {
		if got := out.String(); !strings.Contains(got, want) {
			return fmt.Errorf("output so far:\n%s", got)
		}
		return nil
	})
}

func TestWatchExitCodes(t *testing.T) {
	tests := []struct {
		name     string
		final    nodeopsv1.OperationPhase
		task     nodeopsv1.TaskPhase
		cond     metav1.Condition
		wantCode int
		want     []string
	}{
		{"succeeded", nodeopsv1.OperationSucceeded, nodeopsv1.TaskSucceeded,
			cond(nodeopsv1.ConditionSucceeded, metav1.ConditionTrue, "AllGroupsSucceeded", "1 of 1 nodes succeeded"), CodeSucceeded,
			[]string{"nodeoperation watch-succeeded Succeeded after 2m0s (1/1 nodes): AllGroupsSucceeded: 1 of 1 nodes succeeded"}},
		{"blocked", nodeopsv1.OperationBlocked, nodeopsv1.TaskFailed,
			cond(nodeopsv1.ConditionBlocked, metav1.ConditionTrue, "CommandFailed", "node n-1: command step failed: exit status 7"), CodeBlocked,
			[]string{"nodeoperation watch-blocked Blocked (0/1 nodes): CommandFailed: node n-1: command step failed: exit status 7",
				"failed: node n-1, command step, exit 7: command step failed: exit status 7",
				"next: kubectl nodeops describe watch-blocked, then retry, skip or abort it"}},
		{"blocked-held", nodeopsv1.OperationBlocked, nodeopsv1.TaskSucceeded,
			cond(nodeopsv1.ConditionBlocked, metav1.ConditionTrue, nodeopsv1.ReasonNodeHeldByFailedTask, "nothing of this operation can run: node n-2 is held by NodeTask x of NodeProfile/p"), CodeBlocked,
			[]string{"nodeoperation watch-blocked-held Blocked (0/1 nodes): NodeHeldByFailedTask: nothing of this operation can run: node n-2 is held by NodeTask x of NodeProfile/p",
				"next: retry or skip the other owner's task named above, or kubectl nodeops abort watch-blocked-held"}},
		{"aborted", nodeopsv1.OperationAborted, nodeopsv1.TaskAborted,
			cond(nodeopsv1.ConditionProgressing, metav1.ConditionFalse, "Aborted", "aborted by a person"), CodeAborted,
			[]string{"nodeoperation watch-aborted Aborted after 2m0s (0/1 nodes): Aborted: aborted by a person"}},
		{"failed", nodeopsv1.OperationFailed, nodeopsv1.TaskFailed,
			cond(nodeopsv1.ConditionFailed, metav1.ConditionTrue, "NodeGone", "node n-1 was deleted"), CodeFailed,
			[]string{"nodeoperation watch-failed Failed after 2m0s (0/1 nodes): NodeGone: node n-1 was deleted"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := "watch-" + tt.name
			op := createOperation(t, name, nodeopsv1.NodeOperationSpec{Custom: &nodeopsv1.CustomOperation{Groups: []nodeopsv1.Group{
				{Name: "main", Commands: []nodeopsv1.Command{script("step", "true")}}}}})
			out, done := startWatch(t, "watch", name)
			waitOutput(t, out, name+": Pending")

			task := createTask(t, op, "main", "n-1", op.Spec.Custom.Groups[0].Commands...)
			setOperationStatus(t, name, func(s *nodeopsv1.NodeOperationStatus) {
				s.Phase, s.Progress, s.StartTime = nodeopsv1.OperationRunning, "0/1 nodes", at(-2*time.Minute)
				s.Groups = []nodeopsv1.GroupStatus{{Name: "main", Phase: nodeopsv1.GroupRunning, Nodes: nodeopsv1.NodeCounts{Total: 1, Running: 1}}}
			})
			setTaskStatus(t, task.Name, func(s *nodeopsv1.NodeTaskStatus) {
				s.Phase, s.Progress, s.Attempt = nodeopsv1.TaskRunning, "0/1", 1
				s.Commands = []nodeopsv1.CommandStatus{{Name: "step", Phase: nodeopsv1.CommandRunning, Attempt: 1, StartTime: microAt(-time.Minute)}}
			})
			waitOutput(t, out, "group main: Running, 0/1 done, 1 running")
			waitOutput(t, out, "node n-1 (main): Running 0/1 step")

			setTaskStatus(t, task.Name, func(s *nodeopsv1.NodeTaskStatus) {
				s.Phase = tt.task
				c := &s.Commands[0]
				c.CompletionTime = microAt(0)
				switch tt.task {
				case nodeopsv1.TaskSucceeded:
					s.Progress, c.Phase, c.ExitCode = "1/1", nodeopsv1.CommandSucceeded, exit(0)
				case nodeopsv1.TaskFailed:
					s.Reason, s.Message = nodeopsv1.ReasonCommandFailed, "command step failed: exit status 7"
					c.Phase, c.ExitCode, c.Message = nodeopsv1.CommandFailed, exit(7), "exit status 7"
				}
			})
			setOperationStatus(t, name, func(s *nodeopsv1.NodeOperationStatus) {
				s.Phase = tt.final
				s.Conditions = []metav1.Condition{tt.cond}
				g := &s.Groups[0]
				g.Nodes.Running = 0
				switch tt.final {
				case nodeopsv1.OperationSucceeded:
					s.Progress, g.Phase, g.Nodes.Succeeded = "1/1 nodes", nodeopsv1.GroupSucceeded, 1
				case nodeopsv1.OperationBlocked:
					g.Phase, g.Nodes.Failed = nodeopsv1.GroupBlocked, 1
				case nodeopsv1.OperationAborted:
					g.Phase = nodeopsv1.GroupAborted
				}
				if tt.final.Finished() {
					s.CompletionTime = at(0)
				}
			})
			code := waitExit(t, out, done)
			got := out.String()
			if code != tt.wantCode {
				t.Errorf("exit code %d, want %d; output:\n%s", code, tt.wantCode, got)
			}
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("output lacks %q:\n%s", w, got)
				}
			}
		})
	}
}

// A Blocked operation whose failed task already carries a Retry is about to move on: watch keeps going.
func TestWatchWaitsOutRequestedRecovery(t *testing.T) {
	name := "watch-recovering"
	op := createOperation(t, name, nodeopsv1.NodeOperationSpec{Custom: &nodeopsv1.CustomOperation{Groups: []nodeopsv1.Group{
		{Name: "main", Commands: []nodeopsv1.Command{script("step", "true")}}}}})
	task := createTask(t, op, "main", "n-1", op.Spec.Custom.Groups[0].Commands...)
	setTaskStatus(t, task.Name, func(s *nodeopsv1.NodeTaskStatus) {
		s.Phase, s.Progress, s.Reason, s.Message = nodeopsv1.TaskFailed, "0/1", nodeopsv1.ReasonCommandFailed, "boom"
		s.Commands = []nodeopsv1.CommandStatus{{Name: "step", Phase: nodeopsv1.CommandFailed, Attempt: 1, ExitCode: exit(1)}}
	})
	mustRun(t, "retry", name)
	if got := getTask(t, task.Name).Spec.RecoveryMode; got != nodeopsv1.RecoveryRetry {
		t.Fatalf("recoveryMode = %q after retry", got)
	}

	out, done := startWatch(t, "watch", name)
	waitOutput(t, out, "node n-1 (main): Failed at step: boom (Retry requested)")
	setOperationStatus(t, name, func(s *nodeopsv1.NodeOperationStatus) {
		s.Phase = nodeopsv1.OperationBlocked
		s.Conditions = []metav1.Condition{cond(nodeopsv1.ConditionBlocked, metav1.ConditionTrue, "CommandFailed", "node n-1: boom")}
	})
	waitOutput(t, out, name+": Blocked")

	// The manager recovers the task; the operation's status still says Blocked for a moment.
	recovered := getTask(t, task.Name)
	setTaskStatus(t, task.Name, func(s *nodeopsv1.NodeTaskStatus) {
		s.Phase, s.Reason, s.Message, s.Attempt = nodeopsv1.TaskPending, "", "", 2
		s.RecoveredGeneration = recovered.Generation
		s.Commands[0].Phase, s.Commands[0].ExitCode = nodeopsv1.CommandPending, nil
	})
	if err := patchTask(ctx(t), k8s, recovered, func(t *nodeopsv1.NodeTask) { t.Spec.RecoveryMode = "" }); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, out, "node n-1 (main): Pending")
	// The agent runs it again.
	setTaskStatus(t, task.Name, func(s *nodeopsv1.NodeTaskStatus) {
		s.Phase, s.Progress = nodeopsv1.TaskSucceeded, "1/1"
		s.Commands[0].Phase, s.Commands[0].Attempt, s.Commands[0].ExitCode = nodeopsv1.CommandSucceeded, 2, exit(0)
	})
	waitOutput(t, out, "node n-1 (main): Succeeded")
	setOperationStatus(t, name, func(s *nodeopsv1.NodeOperationStatus) {
		s.Phase, s.Progress = nodeopsv1.OperationSucceeded, "1/1 nodes"
		s.Conditions = []metav1.Condition{cond(nodeopsv1.ConditionSucceeded, metav1.ConditionTrue, "AllGroupsSucceeded", "done")}
	})
	if code := waitExit(t, out, done); code != CodeSucceeded {
		t.Errorf("exit code %d, want 0; output:\n%s", code, out)
	}
}

func TestWatchMissingOperation(t *testing.T) {
	_, errOut, code := run(t, "watch", "no-such-operation")
	if code != CodeError || !strings.Contains(errOut, `nodeoperation "no-such-operation" not found`) {
		t.Errorf("exit %d, stderr %q", code, errOut)
	}
}

// lossyClient is the test API server behind a connection that can drop: cut ends every open watch
// and makes every list fail with an error, as a refused connection or a starting API server does,
// until restore.
type lossyClient struct {
	client.WithWatch
	mu      sync.Mutex
	failing error
	watches []watch.Interface
}

func newLossyClient() *lossyClient {
	l := &lossyClient{}
	l.WithWatch = interceptor.NewClient(k8s, interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if err := l.failure(); err != nil {
				return err
			}
			return c.List(ctx, list, opts...)
		},
		Watch: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) (watch.Interface, error) {
			w, err := c.Watch(ctx, list, opts...)
			if err == nil {
				l.mu.Lock()
				l.watches = append(l.watches, w)
				l.mu.Unlock()
			}
			return w, err
		},
	})
	return l
}

func (l *lossyClient) failure() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.failing
}

func (l *lossyClient) cut(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failing = err
	for _, w := range l.watches {
		w.Stop()
	}
	l.watches = nil
}

func (l *lossyClient) restore() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failing = nil
}

// The API server of a single control plane restarts during its upgrade: watch rides it out.
func TestWatchSurvivesTheAPIServerGoingAway(t *testing.T) {
	name := "watch-reconnects"
	op := createOperation(t, name, nodeopsv1.NodeOperationSpec{Custom: &nodeopsv1.CustomOperation{Groups: []nodeopsv1.Group{
		{Name: "main", Commands: []nodeopsv1.Command{script("step", "true")}}}}})
	task := createTask(t, op, "main", "n-1", op.Spec.Custom.Groups[0].Commands...)
	lossy := newLossyClient()
	out, errOut := &syncBuffer{}, &syncBuffer{}
	o := testOptions(out, errOut, "")
	o.NewClient = func() (Client, error) { return lossy, nil }
	done := make(chan int, 1)
	go func() { done <- Run(o, []string{"watch", name}) }()
	waitOutput(t, out, name+": Pending")

	lossy.cut(&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})
	testutil.Eventually(t, 30*time.Second, "the watch to report the lost API server", func() error {
		if got := errOut.String(); !strings.Contains(got, "watch: lost the API server") || !strings.Contains(got, "connection refused") {
			return fmt.Errorf("stderr so far:\n%s", got)
		}
		return nil
	})
	// Starting again, the API server refuses until its authorizer is ready.
	lossy.cut(apierrors.NewForbidden(schema.GroupResource{Group: "nodeops.io", Resource: "nodeoperations"}, "", errors.New("RBAC not ready")))
	testutil.Eventually(t, 30*time.Second, "the watch to report the refusal", func() error {
		if got := errOut.String(); !strings.Contains(got, "watch: the API server is not back yet") || !strings.Contains(got, "forbidden") {
			return fmt.Errorf("stderr so far:\n%s", got)
		}
		return nil
	})
	// What happens while it is away is seen once it is back.
	setTaskStatus(t, task.Name, func(s *nodeopsv1.NodeTaskStatus) {
		s.Phase, s.Progress, s.Attempt = nodeopsv1.TaskSucceeded, "1/1", 1
		s.Commands = []nodeopsv1.CommandStatus{{Name: "step", Phase: nodeopsv1.CommandSucceeded, Attempt: 1, ExitCode: exit(0)}}
	})
	setOperationStatus(t, name, func(s *nodeopsv1.NodeOperationStatus) {
		s.Phase, s.Progress, s.StartTime, s.CompletionTime = nodeopsv1.OperationSucceeded, "1/1 nodes", at(-time.Minute), at(0)
		s.Conditions = []metav1.Condition{cond(nodeopsv1.ConditionSucceeded, metav1.ConditionTrue, "AllGroupsSucceeded", "1 of 1 nodes succeeded")}
	})
	select {
	case code := <-done:
		t.Fatalf("watch ended with exit code %d while the API server was away; stderr:\n%s", code, errOut)
	case <-time.After(2 * time.Second):
	}
	lossy.restore()
	if code := waitExit(t, out, done); code != CodeSucceeded {
		t.Errorf("exit code %d, want 0; output:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if !strings.Contains(errOut.String(), "watch: the API server answers again") {
		t.Errorf("stderr lacks the reconnect note:\n%s", errOut)
	}
}

// A watch that lost the API server tries again at each quarter-second tick for the first half
// minute (a control plane's restart), so the operation's end shows within a quarter second of the
// API server's return; a longer absence is asked every second.
func TestWatchTriesAgainEveryTickWhileAControlPlaneRestarts(t *testing.T) {
	for _, tc := range []struct {
		lostFor, sinceTry time.Duration
		want              bool
	}{
		{lostFor: time.Second, sinceTry: 250 * time.Millisecond, want: true},
		{lostFor: 29 * time.Second, sinceTry: 240 * time.Millisecond, want: true},
		{lostFor: 30 * time.Second, sinceTry: 250 * time.Millisecond, want: false},
		{lostFor: 5 * time.Minute, sinceTry: 999 * time.Millisecond, want: false},
		{lostFor: 5 * time.Minute, sinceTry: time.Second, want: true},
	} {
		if got := retryDue(tc.lostFor, tc.sinceTry); got != tc.want {
			t.Errorf("lost %s ago, tried %s ago: try again %t, want %t", tc.lostFor, tc.sinceTry, got, tc.want)
		}
	}
}
