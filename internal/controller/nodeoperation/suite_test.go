package nodeoperation_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/nodeoperation"
	"github.com/nodeops/nodeops/internal/controller/nodetask"
	"github.com/nodeops/nodeops/internal/nodelock"
	"github.com/nodeops/nodeops/internal/objname"
	"github.com/nodeops/nodeops/internal/testutil"
)

// One API server and one manager for the package; each test has its own nodes, selected by a
// label of its own, and its own operations.
var (
	env *testutil.Env
	// managerWrites counts every request the manager makes that is not a read.
	managerWrites writeCounter
	// clock is the controller's clock: the real one, unless a test holds it to open the status
	// throttle's windows itself.
	clock testClock
	// managerLocks and managerClient are the manager's node lock table and its cached client, for
	// a test that reconciles beside it.
	managerLocks  *nodelock.Table
	managerClient client.Client
)

const testLabel = "nodeops.test/id"

// statusInterval is the controller's StatusInterval here: count-only status writes at most this often.
const statusInterval = 200 * time.Millisecond

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	logf.SetLogger(testutil.Logger())
	var err error
	env, err = testutil.Start("nodeoperations", "nodetasks")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}()
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = 800, 1600
	cfg.Wrap(managerWrites.wrap)
	stop, err := testutil.StartManager(cfg, env.Scheme, func(mgr manager.Manager, locks *nodelock.Table) error {
		managerLocks, managerClient = locks, mgr.GetClient()
		r := nodeoperation.New(mgr.GetClient(), mgr.GetAPIReader(), locks, mgr.GetEventRecorder("nodeoperation-controller"))
		r.StatusInterval = statusInterval
		r.WaitRecheck = time.Second
		r.GateRecheck = 300 * time.Millisecond
		r.Now = clock.Now
		r.PreflightAnswer = preflightAnswer
		if err := r.SetupWithManager(mgr); err != nil {
			return err
		}
		return nodetask.SetupWithManager(mgr)
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	stop()
	return code
}

// writeCounter counts non-read requests, in total, creates of NodeTasks, and status writes by operation.
type writeCounter struct {
	total, taskCreates atomic.Int64
	mu                 sync.Mutex
	status             map[string]int
}

func (w *writeCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		if req.Method != http.MethodGet && req.Method != http.MethodHead {
			w.total.Add(1)
			if req.Method == http.MethodPost && strings.HasSuffix(req.URL.Path, "/nodetasks") {
				w.taskCreates.Add(1)
			}
			if rest, ok := strings.CutSuffix(req.URL.Path, "/status"); ok && strings.Contains(rest, "/nodeoperations/") {
				w.mu.Lock()
				if w.status == nil {
					w.status = map[string]int{}
				}
				w.status[rest[strings.LastIndex(rest, "/")+1:]]++
				w.mu.Unlock()
			}
		}
		return rt.RoundTrip(req)
	})
}

// statusWrites is how many status writes of operation op the manager made.
func (w *writeCounter) statusWrites(op string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.status[op]
}

// testClock is the real clock until held: then it stands still, moving only by advance.
type testClock struct {
	mu   sync.Mutex
	held *time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held != nil {
		return *c.held
	}
	return time.Now()
}

// hold stops the clock until the test ends.
func (c *testClock) hold(t *testing.T) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	c.held = &now
	t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.held = nil
	})
}

// advance moves a held clock on by d.
func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	next := c.held.Add(d)
	c.held = &next
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

var ids atomic.Int64

// fixture is one test's nodes and operations.
type fixture struct {
	t   *testing.T
	ctx context.Context
	id  string
	c   client.WithWatch
}

func newFixture(t *testing.T) *fixture {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return &fixture{t: t, ctx: ctx, id: fmt.Sprintf("t%d", ids.Add(1)), c: env.Client}
}

// nodes creates Ready nodes named <id>-<name> with the fixture's label plus labels.
func (f *fixture) nodes(labels map[string]string, names ...string) []string {
	f.t.Helper()
	return f.nodesReady(true, labels, names...)
}

// nodesReady is nodes, Ready or not from their first status on: a node made Ready and then set
// NotReady may still be Ready in the manager's cache when an operation created next is planned.
func (f *fixture) nodesReady(ready bool, labels map[string]string, names ...string) []string {
	f.t.Helper()
	var out []string
	for _, name := range names {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: f.id + "-" + name, Labels: map[string]string{testLabel: f.id}}}
		for k, v := range labels {
			n.Labels[k] = v
		}
		f.must(testutil.CreateNode(f.ctx, f.c, n, ready))
		// Gone when the test ends: a cluster health gate judges every control plane in the cluster,
		// so another test's node (or this test's, run again with -count=2) would hold it.
		testutil.RemoveAtEnd(f.t, f.c, n.DeepCopy())
		out = append(out, n.Name)
	}
	return out
}

func (f *fixture) setReady(node string, ready bool) {
	f.t.Helper()
	f.must(testutil.SetNodeReady(f.ctx, f.c, node, ready))
}

// selector selects the fixture's nodes, plus labels.
func (f *fixture) selector(labels map[string]string) *metav1.LabelSelector {
	m := map[string]string{testLabel: f.id}
	for k, v := range labels {
		m[k] = v
	}
	return &metav1.LabelSelector{MatchLabels: m}
}

func intOrStr(s string) *intstr.IntOrString {
	v := intstr.Parse(s)
	return &v
}

func script(name string) v1alpha1.Command {
	return v1alpha1.Command{Name: name, Script: &v1alpha1.ScriptCommand{Inline: "true"}}
}

func waitCmd() v1alpha1.Command { return v1alpha1.Command{Wait: &v1alpha1.WaitCommand{}} }

// operation creates a custom operation over the fixture's nodes.
func (f *fixture) operation(name string, mutate func(*v1alpha1.NodeOperation), groups ...v1alpha1.Group) *v1alpha1.NodeOperation {
	f.t.Helper()
	op := &v1alpha1.NodeOperation{
		ObjectMeta: metav1.ObjectMeta{Name: f.id + "-" + name},
		Spec: v1alpha1.NodeOperationSpec{
			NodeSelector: f.selector(nil),
			Custom:       &v1alpha1.CustomOperation{Groups: groups},
		},
	}
	if mutate != nil {
		mutate(op)
	}
	if err := f.c.Create(f.ctx, op); err != nil {
		f.t.Fatalf("create operation: %v", err)
	}
	return op
}

func (f *fixture) get(name string) *v1alpha1.NodeOperation {
	f.t.Helper()
	var op v1alpha1.NodeOperation
	if err := f.c.Get(f.ctx, client.ObjectKey{Name: name}, &op); err != nil {
		f.t.Fatalf("get operation %s: %v", name, err)
	}
	return &op
}

func (f *fixture) update(name string, mutate func(*v1alpha1.NodeOperation)) {
	f.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var op v1alpha1.NodeOperation
		if err := f.c.Get(f.ctx, client.ObjectKey{Name: name}, &op); err != nil {
			return err
		}
		mutate(&op)
		return f.c.Update(f.ctx, &op)
	})
	if err != nil {
		f.t.Fatalf("update operation %s: %v", name, err)
	}
}

// tasks lists the operation's tasks from the API server.
func (f *fixture) tasks(op string) []v1alpha1.NodeTask {
	f.t.Helper()
	var list v1alpha1.NodeTaskList
	if err := f.c.List(f.ctx, &list, client.MatchingLabels{v1alpha1.LabelOperation: objname.LabelValue(op)}); err != nil {
		f.t.Fatalf("list tasks: %v", err)
	}
	return list.Items
}

func (f *fixture) task(name string) *v1alpha1.NodeTask {
	f.t.Helper()
	var t v1alpha1.NodeTask
	if err := f.c.Get(f.ctx, client.ObjectKey{Name: name}, &t); err != nil {
		f.t.Fatalf("get task %s: %v", name, err)
	}
	return &t
}

// waitPhase waits for the operation's phase.
func (f *fixture) waitPhase(name string, phase v1alpha1.OperationPhase) *v1alpha1.NodeOperation {
	f.t.Helper()
	var op *v1alpha1.NodeOperation
	testutil.Eventually(f.t, 30*time.Second, fmt.Sprintf("operation %s %s", name, phase), func() error {
		op = f.get(name)
		if op.Status.Phase != phase {
			return fmt.Errorf("phase %q, conditions %+v", op.Status.Phase, op.Status.Conditions)
		}
		return nil
	})
	return op
}

// waitTasks waits until the operation has n tasks, and returns them.
func (f *fixture) waitTasks(op string, n int) []v1alpha1.NodeTask {
	f.t.Helper()
	var tasks []v1alpha1.NodeTask
	testutil.Eventually(f.t, 30*time.Second, fmt.Sprintf("%d tasks of %s", n, op), func() error {
		tasks = f.tasks(op)
		if len(tasks) != n {
			return fmt.Errorf("%d tasks", len(tasks))
		}
		return nil
	})
	return tasks
}

func condition(op *v1alpha1.NodeOperation, t string) metav1.Condition {
	if c := meta.FindStatusCondition(op.Status.Conditions, t); c != nil {
		return *c
	}
	return metav1.Condition{}
}

// The test agent is testutil.FakeAgent: each call one status write, as the agent makes it.

func (f *fixture) agent() testutil.FakeAgent { return testutil.FakeAgent{Client: f.c} }

func (f *fixture) must(err error) {
	f.t.Helper()
	if err != nil {
		f.t.Fatal(err)
	}
}

// begin records command i Running: one write.
func (f *fixture) begin(task string, i int) { f.t.Helper(); f.must(f.agent().Begin(f.ctx, task, i)) }

// end records command i's result, merged with the next command's Running record or the task's end: one write.
func (f *fixture) end(task string, i int, ok bool, message string) {
	f.t.Helper()
	f.must(f.agent().End(f.ctx, task, i, ok, message))
}

// runAll runs every command of the task successfully: 1 + len(commands) writes.
func (f *fixture) runAll(task string) { f.t.Helper(); f.must(f.agent().RunAll(f.ctx, task)) }

// abortTask ends a task told to abort, as the agent does.
func (f *fixture) abortTask(task string) { f.t.Helper(); f.must(f.agent().Abort(f.ctx, task)) }

// playAgents plays the agent for the operations' tasks, beginning or finishing one at random each
// step, until every operation Succeeded (a minute at most); each, when set, runs before every step.
func (f *fixture) playAgents(rng *rand.Rand, each func(step int), ops ...string) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.ctx, 60*time.Second)
	defer cancel()
	step := 0
	err := f.agent().Play(ctx, rng, testutil.Play{
		Tasks: func() ([]v1alpha1.NodeTask, error) {
			var tasks []v1alpha1.NodeTask
			for _, op := range ops {
				tasks = append(tasks, f.tasks(op)...)
			}
			if each != nil {
				each(step)
			}
			step++
			return tasks, nil
		},
		Done: func(open []v1alpha1.NodeTask) bool {
			done := len(open) == 0
			for _, op := range ops {
				done = done && f.get(op).Status.Phase == v1alpha1.OperationSucceeded
			}
			return done
		},
	})
	// Out of time, the caller's checks of the operations say what is left.
	if err != nil && ctx.Err() == nil {
		f.t.Fatal(err)
	}
}
