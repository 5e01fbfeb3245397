package cli

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodeopsv1 "github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/objname"
	"github.com/nodeops/nodeops/internal/testutil"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

// One API server for the package; tests play the manager and the agents by writing statuses.
var (
	k8s        client.WithWatch
	kubeconfig string // a kubeconfig file for the envtest API server, for the binary in tmux
)

// fixedNow is the clock of every test that compares output.
var fixedNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		// `go test ./internal/cli` right after `make tools` finds the binaries without being told.
		_ = os.Setenv("KUBEBUILDER_ASSETS", filepath.Join("..", "..", "bin"))
	}
	env, err := testutil.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	// The CLI's own scheme, as the binary has it, not testutil's wider one.
	s, err := NewScheme()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if k8s, err = client.NewWithWatch(env.Config, client.Options{Scheme: s}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir, err := os.MkdirTemp("", "nodeops-cli-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if kubeconfig, err = env.WriteKubeconfig(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// syncBuffer is written by a running command while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func testOptions(out, errOut *syncBuffer, stdin string) *Options {
	o := NewOptions(genericiooptions.IOStreams{In: strings.NewReader(stdin), Out: out, ErrOut: errOut})
	o.NewClient = func() (Client, error) { return k8s, nil }
	o.Now = func() time.Time { return fixedNow }
	o.Terminal = func() (bool, int, int) { return false, 0, 0 }
	return o
}

// run runs the CLI like a user would, against the test API server.
func run(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut syncBuffer
	code = Run(testOptions(&out, &errOut, ""), args)
	return out.String(), errOut.String(), code
}

func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, code := run(t, args...)
	if code != 0 {
		t.Fatalf("kubectl nodeops %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading %s (run with -update to create it): %v", path, err)
	}
	if got != string(want) {
		t.Errorf("output differs from %s (run 'go test ./internal/cli -run %s -update' if the change is intended)\n--- got:\n%s\n--- want:\n%s", path, t.Name(), got, want)
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

func createNode(t *testing.T, name string, labels map[string]string, ready bool) {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if err := k8s.Create(ctx(t), n); err != nil {
		t.Fatalf("creating node %s: %v", name, err)
	}
	st := corev1.ConditionTrue
	if !ready {
		st = corev1.ConditionFalse
	}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: st, Reason: "Test",
		LastHeartbeatTime: metav1.NewTime(fixedNow), LastTransitionTime: metav1.NewTime(fixedNow)}}
	if err := k8s.Status().Update(ctx(t), n); err != nil {
		t.Fatalf("setting node %s status: %v", name, err)
	}
}

func createOperation(t *testing.T, name string, spec nodeopsv1.NodeOperationSpec) *nodeopsv1.NodeOperation {
	t.Helper()
	if spec.ExecutionMode == "" {
		spec.ExecutionMode = nodeopsv1.ExecutionAuto
	}
	op := &nodeopsv1.NodeOperation{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
	if err := k8s.Create(ctx(t), op); err != nil {
		t.Fatalf("creating nodeoperation %s: %v", name, err)
	}
	deleteAtEnd(t, op)
	return op
}

// deleteAtEnd deletes obj when the test ends, so that a test run again (-count=2) can make it
// again: nothing here collects garbage.
func deleteAtEnd(t *testing.T, obj client.Object) {
	t.Cleanup(func() {
		if err := k8s.Delete(context.Background(), obj); client.IgnoreNotFound(err) != nil {
			t.Errorf("deleting %T %s: %v", obj, obj.GetName(), err)
		}
	})
}

// setOperationStatus plays the manager.
func setOperationStatus(t *testing.T, name string, mutate func(*nodeopsv1.NodeOperationStatus)) {
	t.Helper()
	op := &nodeopsv1.NodeOperation{}
	if err := k8s.Get(ctx(t), client.ObjectKey{Name: name}, op); err != nil {
		t.Fatal(err)
	}
	mutate(&op.Status)
	if err := k8s.Status().Update(ctx(t), op); err != nil {
		t.Fatalf("updating status of nodeoperation %s: %v", name, err)
	}
}

// createTask plays the manager creating a node's task.
func createTask(t *testing.T, op *nodeopsv1.NodeOperation, group, node string, cmds ...nodeopsv1.Command) *nodeopsv1.NodeTask {
	t.Helper()
	task := &nodeopsv1.NodeTask{
		ObjectMeta: metav1.ObjectMeta{Name: objname.TaskName(op.Name, group, node), Labels: map[string]string{
			nodeopsv1.LabelOperation: op.Name, nodeopsv1.LabelNode: node, nodeopsv1.LabelGroup: group}},
		Spec: nodeopsv1.NodeTaskSpec{NodeName: node, Operation: op.Name, Group: group, Commands: cmds,
			ExecutionMode: op.Spec.ExecutionMode},
	}
	if err := k8s.Create(ctx(t), task); err != nil {
		t.Fatalf("creating nodetask %s: %v", task.Name, err)
	}
	deleteAtEnd(t, task)
	return task
}

// setTaskStatus plays the agent.
func setTaskStatus(t *testing.T, name string, mutate func(*nodeopsv1.NodeTaskStatus)) {
	t.Helper()
	task := getTask(t, name)
	mutate(&task.Status)
	if err := k8s.Status().Update(ctx(t), task); err != nil {
		t.Fatalf("updating status of nodetask %s: %v", name, err)
	}
}

func getTask(t *testing.T, name string) *nodeopsv1.NodeTask {
	t.Helper()
	task := &nodeopsv1.NodeTask{}
	if err := k8s.Get(ctx(t), client.ObjectKey{Name: name}, task); err != nil {
		t.Fatal(err)
	}
	return task
}

func getOp(t *testing.T, name string) *nodeopsv1.NodeOperation {
	t.Helper()
	op := &nodeopsv1.NodeOperation{}
	if err := k8s.Get(ctx(t), client.ObjectKey{Name: name}, op); err != nil {
		t.Fatal(err)
	}
	return op
}

func at(d time.Duration) *metav1.Time { t := metav1.NewTime(fixedNow.Add(d)); return &t }

func microAt(d time.Duration) *metav1.MicroTime { t := metav1.NewMicroTime(fixedNow.Add(d)); return &t }

func exit(n int32) *int32 { return &n }

func cond(typ string, status metav1.ConditionStatus, reason, msg string) metav1.Condition {
	return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg, LastTransitionTime: metav1.NewTime(fixedNow)}
}

func script(name, inline string) nodeopsv1.Command {
	return nodeopsv1.Command{Name: name, Script: &nodeopsv1.ScriptCommand{Inline: inline}}
}
