package framework

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/testutil"
)

// OperationTimeout bounds an operation of a few commands on a node or three (WaitForOperation's
// default); kubeadm's take longer and say so.
const OperationTimeout = 3 * time.Minute

// Create creates obj. A NodeOperation is aborted by the test's cleanup when the test failed, so that
// a failed scenario does not hold its nodes for the next one.
func Create(t testing.TB, l *Local, obj client.Object) {
	t.Helper()
	if err := l.Client.Create(context.Background(), obj); err != nil {
		t.Fatalf("creating %s: %v", obj.GetName(), err)
	}
	if _, ok := obj.(*v1alpha1.NodeOperation); ok {
		t.Cleanup(func() {
			if t.Failed() {
				_ = l.Client.Patch(context.Background(), obj, client.RawPatch(client.Merge.Type(), []byte(`{"spec":{"abort":true}}`)))
			}
		})
	}
}

// WaitForOperationInput is what WaitForOperation waits for.
type WaitForOperationInput struct {
	Name  string
	Phase v1alpha1.OperationPhase
	// Timeout is OperationTimeout when zero.
	Timeout time.Duration
	// FailIfBlocked fails at once when the operation is Blocked, for scenarios in which no command
	// is meant to fail; otherwise a Blocked operation is waited on (an abort may be on its way).
	FailIfBlocked bool
}

// WaitForOperation waits until the operation is in in.Phase and returns it. An operation that
// finishes in another phase fails the test at once, naming its failed commands and their messages.
func WaitForOperation(t testing.TB, l *Local, in WaitForOperationInput) *v1alpha1.NodeOperation {
	t.Helper()
	timeout := in.Timeout
	if timeout == 0 {
		timeout = OperationTimeout
	}
	op := &v1alpha1.NodeOperation{}
	var wrong string
	testutil.EventuallyEvery(t, timeout, PollInterval, "NodeOperation "+in.Name+" "+string(in.Phase), func(ctx context.Context) error {
		if err := l.Client.Get(ctx, client.ObjectKey{Name: in.Name}, op); err != nil {
			return err
		}
		switch p := op.Status.Phase; {
		case p == in.Phase:
			return nil
		case p.Finished() || in.FailIfBlocked && p == v1alpha1.OperationBlocked:
			wrong = string(p)
			return nil
		}
		return fmt.Errorf("phase %q, groups %+v", op.Status.Phase, op.Status.Groups)
	})
	if wrong != "" {
		var why []string
		for _, task := range OperationTasks(t, l, in.Name) {
			for _, c := range task.Status.Commands {
				if c.Phase == v1alpha1.CommandFailed {
					why = append(why, fmt.Sprintf("%s: %s failed: %s\n%s", task.Name, c.Name, c.Message, c.OutputTail))
				}
			}
		}
		t.Fatalf("NodeOperation %s ended %s, want %s; conditions %+v\n%s", in.Name, wrong, in.Phase, op.Status.Conditions, strings.Join(why, "\n"))
	}
	return op
}

// RunOperation creates op and waits until it is in phase want.
func RunOperation(t testing.TB, l *Local, op *v1alpha1.NodeOperation, want v1alpha1.OperationPhase) {
	t.Helper()
	Create(t, l, op)
	WaitForOperation(t, l, WaitForOperationInput{Name: op.Name, Phase: want})
}

// RunOperationWatched creates op, waits for it as in says (in.Name is op's) and returns it with
// every event of its tasks from before its creation on, for checks of order and concurrency.
func RunOperationWatched(t testing.TB, l *Local, op *v1alpha1.NodeOperation, in WaitForOperationInput) (*v1alpha1.NodeOperation, []TaskEvent) {
	t.Helper()
	w := WatchTasks(t, l, client.MatchingLabels{v1alpha1.LabelOperation: op.Name})
	Create(t, l, op)
	in.Name = op.Name
	done := WaitForOperation(t, l, in)
	return done, w.Stop(t)
}

// AbortOperation ends a blocked operation and waits until it is Aborted, so its nodes are free for
// the next scenario.
func AbortOperation(t testing.TB, l *Local, name string) {
	t.Helper()
	RequestAbort(t, l, name)
	WaitForOperation(t, l, WaitForOperationInput{Name: name, Phase: v1alpha1.OperationAborted})
}

// RequestAbort sets an operation's spec.abort, as `kubectl nodeops abort` does, without waiting.
func RequestAbort(t testing.TB, l *Local, name string) {
	t.Helper()
	op := &v1alpha1.NodeOperation{}
	if err := l.Client.Get(context.Background(), client.ObjectKey{Name: name}, op); err != nil {
		t.Fatal(err)
	}
	base := op.DeepCopy()
	op.Spec.Abort = true
	if err := l.Client.Patch(context.Background(), op, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
}

// OperationTasks lists the tasks of an operation.
func OperationTasks(t testing.TB, l *Local, op string) []v1alpha1.NodeTask {
	t.Helper()
	var tasks v1alpha1.NodeTaskList
	if err := l.Client.List(context.Background(), &tasks, client.MatchingLabels{v1alpha1.LabelOperation: op}); err != nil {
		t.Fatal(err)
	}
	return tasks.Items
}

// GetTask reads a NodeTask.
func GetTask(t testing.TB, l *Local, name string) *v1alpha1.NodeTask {
	t.Helper()
	task := &v1alpha1.NodeTask{}
	if err := l.Client.Get(context.Background(), client.ObjectKey{Name: name}, task); err != nil {
		t.Fatalf("reading NodeTask %s: %v", name, err)
	}
	return task
}

// WaitForTask waits until the one task of an operation on a single node satisfies cond, and returns it.
func WaitForTask(t testing.TB, l *Local, op string, cond func(*v1alpha1.NodeTask) bool) *v1alpha1.NodeTask {
	t.Helper()
	var found *v1alpha1.NodeTask
	testutil.EventuallyEvery(t, OperationTimeout, PollInterval, "the task of "+op, func(ctx context.Context) error {
		tasks := &v1alpha1.NodeTaskList{}
		if err := l.Client.List(ctx, tasks, client.MatchingLabels{v1alpha1.LabelOperation: op}); err != nil {
			return err
		}
		if len(tasks.Items) != 1 {
			return fmt.Errorf("%d tasks", len(tasks.Items))
		}
		if !cond(&tasks.Items[0]) {
			return fmt.Errorf("status %+v", tasks.Items[0].Status)
		}
		found = &tasks.Items[0]
		return nil
	})
	return found
}

// WaitForFile waits until the file at path holds exactly want.
func WaitForFile(t testing.TB, path, want string) {
	t.Helper()
	testutil.EventuallyEvery(t, 2*time.Minute, PollInterval, path+" = "+want, func(context.Context) error {
		got, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if string(got) != want {
			return fmt.Errorf("content %q", got)
		}
		return nil
	})
}

// KillAgent kills a local node's agent with SIGKILL; nodeops-local starts it again, as a kubelet
// restarts a crashed pod.
func KillAgent(t testing.TB, l *Local, node string) {
	t.Helper()
	KillProcess(t, l, "agent-"+node)
}
