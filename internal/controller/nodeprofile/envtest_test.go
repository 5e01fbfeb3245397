package nodeprofile_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/nodeprofile"
	"github.com/nodeops/nodeops/internal/nodelock"
	"github.com/nodeops/nodeops/internal/testutil"
)

// One API server and one manager for the package (docs/design.md, test layers); each test uses its own
// nodes, selected by a label of its own, and its own profiles.
var (
	env struct {
		cfg    *rest.Config
		client client.WithWatch // straight to the API server, no cache
		scheme *runtime.Scheme
		// managerClient reads from the manager's cache; locks is its node lock table: a second
		// reconciler beside the manager's, on a cache made to lag, shares both.
		managerClient client.Client
		locks         *nodelock.Table
	}
)

// started holds the shared environment once a test needed it; pure tests run without it.
var started struct {
	once sync.Once
	err  error
	stop func()
}

func TestMain(m *testing.M) {
	code := m.Run()
	if started.stop != nil {
		started.stop()
	}
	os.Exit(code)
}

// needEnv starts the package's API server and manager on first use; every envtest test calls it
// first, and fails (never skips) when they cannot start.
func needEnv(t *testing.T) {
	t.Helper()
	started.once.Do(func() { started.stop, started.err = startEnv() })
	if started.err != nil {
		t.Fatal(started.err)
	}
}

func startEnv() (stop func(), err error) {
	logf.SetLogger(testutil.Logger())
	// Only the kinds this controller uses, so that it is tested on its own.
	te, err := testutil.Start("nodeprofiles", "nodetasks")
	if err != nil {
		return nil, err
	}
	stopEnv := func() {
		if err := te.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	cfg, scheme := te.Config, te.Scheme
	env.cfg, env.client, env.scheme = cfg, te.Client, scheme

	stopManager, err := testutil.StartManager(cfg, scheme, func(mgr manager.Manager, locks *nodelock.Table) error {
		env.managerClient, env.locks = mgr.GetClient(), locks
		r := nodeprofile.New(mgr.GetClient(), locks, mgr.GetEventRecorder("nodeprofile-controller"))
		r.StatusInterval = 200 * time.Millisecond
		r.RetryAfter = time.Second
		r.GateRecheck = 300 * time.Millisecond
		return r.SetupWithManager(mgr)
	})
	if err != nil {
		stopEnv()
		return nil, err
	}
	return func() {
		stopManager()
		stopEnv()
	}, nil
}

const wait = 30 * time.Second

// makeNode creates a Ready node carrying the test's label, plus labels and annotations.
func makeNode(t *testing.T, ctx context.Context, name, testLabel string, labels, annotations map[string]string) {
	t.Helper()
	if err := createNode(t, ctx, name, testLabel, labels, annotations); err != nil {
		t.Fatal(err)
	}
}

// createNode is makeNode for goroutines other than the test's.
func createNode(t *testing.T, ctx context.Context, name, testLabel string, labels, annotations map[string]string) error {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"test": testLabel}, Annotations: annotations}}
	for k, v := range labels {
		n.Labels[k] = v
	}
	t.Cleanup(func() {
		_ = env.client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
	})
	return testutil.CreateNode(ctx, env.client, n, true)
}

func getNode(t *testing.T, ctx context.Context, name string) *corev1.Node {
	t.Helper()
	n := &corev1.Node{}
	if err := env.client.Get(ctx, client.ObjectKey{Name: name}, n); err != nil {
		t.Fatalf("get node %s: %v", name, err)
	}
	return n
}

func patchNode(t *testing.T, ctx context.Context, name, patch string) {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := env.client.Patch(ctx, n, client.RawPatch("application/merge-patch+json", []byte(patch))); err != nil {
		t.Fatalf("patch node %s: %v", name, err)
	}
}

// makeProfile creates a profile restricted to the test's nodes, removing it (finalizer and all) afterwards.
func makeProfile(t *testing.T, ctx context.Context, name, testLabel string, mutate func(*v1alpha1.NodeProfileSpec)) *v1alpha1.NodeProfile {
	t.Helper()
	p := &v1alpha1.NodeProfile{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.NodeProfileSpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"test": testLabel}},
			Trigger:      &v1alpha1.ProfileTrigger{Annotation: "kwasm.sh/kwasm-node=true"},
			Install: []v1alpha1.Command{
				{Name: "shim", InstallFile: &v1alpha1.InstallFileCommand{URL: "https://shims.example/shim", SHA256: strings.Repeat("a", 64), Path: "/usr/local/bin/shim", Mode: "0755"}},
				{Name: "handler", ContainerdRuntime: &v1alpha1.ContainerdRuntimeCommand{Name: "wasmedge", RuntimeType: "io.containerd.wasmedge.v1"}},
			},
			Uninstall: []v1alpha1.Command{
				{Name: "handler", ContainerdRuntime: &v1alpha1.ContainerdRuntimeCommand{Name: "wasmedge", Remove: true}},
			},
		},
	}
	if mutate != nil {
		mutate(&p.Spec)
	}
	if err := env.client.Create(ctx, p); err != nil {
		t.Fatalf("create profile %s: %v", name, err)
	}
	t.Cleanup(func() { forceDelete(context.Background(), name) })
	return p
}

// forceDelete removes a profile without waiting for uninstalls no agent will run, and its tasks,
// which no garbage collector removes here: a test run again (-count=2) starts from nothing.

// A task left behind would hold its node's lock against the next run's tasks on a node of the same name.
func forceDelete(ctx context.Context, name string) {
	p := &v1alpha1.NodeProfile{}
	if err := env.client.Get(ctx, client.ObjectKey{Name: name}, p); err == nil {
		_ = env.client.Delete(ctx, p)
		_ = env.client.Patch(ctx, p, client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"finalizers":null}}`)))
	}
	// Once the profile is gone the controller creates nothing more for it; a reconcile still under
	// way may yet, so the tasks are deleted until three looks in a row find none.
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	none := 0
	_ = testutil.Poll(ctx, 50*time.Millisecond, func(ctx context.Context) error {
		if err := env.client.Get(ctx, client.ObjectKey{Name: name}, &v1alpha1.NodeProfile{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("profile %s still there (%w)", name, err)
		}
		var tasks v1alpha1.NodeTaskList
		if err := env.client.List(ctx, &tasks, client.MatchingLabels{v1alpha1.LabelProfile: name}); err != nil {
			return err
		}
		for i := range tasks.Items {
			task := &tasks.Items[i]
			if len(task.Finalizers) > 0 {
				_ = env.client.Patch(ctx, task, client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"finalizers":null}}`)))
			}
			_ = env.client.Delete(ctx, task)
		}
		if len(tasks.Items) > 0 {
			none = 0
		} else {
			none++
		}
		if none < 3 {
			return fmt.Errorf("tasks of %s deleted %d looks in a row", name, none)
		}
		return nil
	})
}

func getProfile(t *testing.T, ctx context.Context, name string) *v1alpha1.NodeProfile {
	t.Helper()
	p := &v1alpha1.NodeProfile{}
	if err := env.client.Get(ctx, client.ObjectKey{Name: name}, p); err != nil {
		t.Fatalf("get profile %s: %v", name, err)
	}
	return p
}

// updateProfile changes the profile as a person would, reading it again when the controller's own
// write (status, finalizer) got there first.
func updateProfile(t *testing.T, ctx context.Context, name string, mutate func(*v1alpha1.NodeProfile)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p := getProfile(t, ctx, name)
		mutate(p)
		return env.client.Update(ctx, p)
	})
	if err != nil {
		t.Fatalf("update profile %s: %v", name, err)
	}
}

// tasksOf lists the profile's tasks straight from the API server, by node.
func tasksOf(ctx context.Context, profile string) (map[string][]v1alpha1.NodeTask, error) {
	var list v1alpha1.NodeTaskList
	if err := env.client.List(ctx, &list, client.MatchingLabels{v1alpha1.LabelProfile: profile}); err != nil {
		return nil, fmt.Errorf("list tasks: %w", err)
	}
	out := map[string][]v1alpha1.NodeTask{}
	for _, t := range list.Items {
		out[t.Spec.NodeName] = append(out[t.Spec.NodeName], t)
	}
	return out, nil
}

// waitTask waits for the one task of profile on node whose group starts with action and returns it.
func waitTask(t *testing.T, ctx context.Context, profile, node string, action nodeprofile.Action) *v1alpha1.NodeTask {
	t.Helper()
	var found *v1alpha1.NodeTask
	testutil.Eventually(t, wait, fmt.Sprintf("%s task for %s", action, node), func() error {
		byNode, err := tasksOf(ctx, profile)
		if err != nil {
			return err
		}
		for i := range byNode[node] {
			task := &byNode[node][i]
			if strings.HasPrefix(task.Spec.Group, string(action)+"-") && task.EffectivePhase().Unfinished() && !task.Spec.Abort {
				found = task
				return nil
			}
		}
		return fmt.Errorf("tasks: %v", names(byNode[node]))
	})
	return found
}

// follow calls f with every event of the objects list selects, from now until ctx ends, resuming
// from the last resourceVersion seen whenever the API server closes the watch (it drops watchers
// that fall behind on a loaded machine), so that no event is missed. It returns an error when
// events may have been missed (the resume point expired).
func follow(ctx context.Context, list client.ObjectList, selector client.MatchingLabels, f func(watch.Event)) <-chan error {
	done := make(chan error, 1)
	go func() {
		rv := ""
		for ctx.Err() == nil {
			opts := []client.ListOption{selector}
			if rv != "" {
				opts = append(opts, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
			}
			w, err := env.client.Watch(ctx, list, opts...)
			if err != nil {
				if ctx.Err() == nil {
					done <- fmt.Errorf("watch: %w", err)
				}
				close(done)
				return
			}
			for ev := range w.ResultChan() {
				if ev.Type == watch.Error {
					if ctx.Err() == nil {
						done <- fmt.Errorf("watch error: %w", apierrors.FromObject(ev.Object))
					}
					close(done)
					w.Stop()
					return
				}
				if o, ok := ev.Object.(client.Object); ok {
					rv = o.GetResourceVersion()
				}
				f(ev)
			}
		}
		close(done)
	}()
	return done
}

func names(tasks []v1alpha1.NodeTask) []string {
	var out []string
	for _, t := range tasks {
		out = append(out, fmt.Sprintf("%s(%s)", t.Name, t.EffectivePhase()))
	}
	return out
}

// The node agent is played by testutil.FakeAgent: each call one status write, as the agent makes it.

func agent() testutil.FakeAgent { return testutil.FakeAgent{Client: env.client} }

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// agentRun records the task's first command Running.
func agentRun(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	must(t, agent().Begin(ctx, name, 0))
}

// agentSucceed records every command, and the task, Succeeded.
func agentSucceed(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	must(t, agent().Succeed(ctx, name))
}

// agentFail records the task's first command Failed with message.
func agentFail(t *testing.T, ctx context.Context, name, message string) {
	t.Helper()
	must(t, agent().End(ctx, name, 0, false, message))
}

// agentAbort ends a task the manager asked to abort, as the agent does.
func agentAbort(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	must(t, agent().Abort(ctx, name))
}

func condition(p *v1alpha1.NodeProfile, typ string) metav1.Condition {
	if c := meta.FindStatusCondition(p.Status.Conditions, typ); c != nil {
		return *c
	}
	return metav1.Condition{Type: typ, Status: metav1.ConditionUnknown}
}

func waitCondition(t *testing.T, ctx context.Context, profile, typ string, status metav1.ConditionStatus, messageHas ...string) metav1.Condition {
	t.Helper()
	var c metav1.Condition
	testutil.Eventually(t, wait, fmt.Sprintf("%s %s=%s", profile, typ, status), func() error {
		c = condition(getProfile(t, ctx, profile), typ)
		if c.Status != status {
			return fmt.Errorf("%s is %s (%s: %s)", typ, c.Status, c.Reason, c.Message)
		}
		for _, s := range messageHas {
			if !strings.Contains(c.Message, s) {
				return fmt.Errorf("%s message %q lacks %q", typ, c.Message, s)
			}
		}
		return nil
	})
	return c
}

func waitLabel(t *testing.T, ctx context.Context, profile, node string, want bool, hash string) {
	t.Helper()
	testutil.Eventually(t, wait, fmt.Sprintf("node %s labelled=%v", node, want), func() error {
		n := getNode(t, ctx, node)
		label := n.Labels[nodeprofile.ProvisionedLabel(profile)]
		annotation := n.Annotations[nodeprofile.HashAnnotation(profile)]
		if want && (label != v1alpha1.ProvisionedValue || annotation != hash) {
			return fmt.Errorf("label %q, hash annotation %q (want %q)", label, annotation, hash)
		}
		if !want && (label != "" || annotation != "") {
			return fmt.Errorf("still labelled %q, hash annotation %q", label, annotation)
		}
		return nil
	})
}
