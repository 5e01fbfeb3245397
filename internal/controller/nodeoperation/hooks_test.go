package nodeoperation_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/cli"
	"github.com/nodeops/nodeops/internal/controller/nodeoperation"
	"github.com/nodeops/nodeops/internal/hook"
	"github.com/nodeops/nodeops/internal/objname"
	"github.com/nodeops/nodeops/internal/testutil"
)

func (f *fixture) hookNamespace() {
	f.t.Helper()
	err := f.c.Create(f.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: hook.Namespace}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		f.t.Fatal(err)
	}
}

// signingKey adds name=key to the signing Secret, creating it if need be.
func (f *fixture) signingKey(name string, key []byte) {
	f.t.Helper()
	f.must(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var s corev1.Secret
		err := f.c.Get(f.ctx, client.ObjectKey{Namespace: hook.Namespace, Name: v1alpha1.HookSigningSecret}, &s)
		if apierrors.IsNotFound(err) {
			s = corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: hook.Namespace, Name: v1alpha1.HookSigningSecret}, Data: map[string][]byte{name: key}}
			return f.c.Create(f.ctx, &s)
		}
		if err != nil {
			return err
		}
		if s.Data == nil {
			s.Data = map[string][]byte{}
		}
		s.Data[name] = key
		return f.c.Update(f.ctx, &s)
	}))
}

func jobHook(name string) v1alpha1.Hook {
	return v1alpha1.Hook{Name: name, Job: &v1alpha1.JobHook{Template: runtime.RawExtension{Raw: []byte(
		`{"spec":{"backoffLimit":0,"template":{"spec":{"containers":[{"name":"check","image":"busybox","command":["true"]}]}}}}`)}}}
}

// hookJobs are the operation's hook Jobs for node, from the API server.
func (f *fixture) hookJobs(op, node string) []batchv1.Job {
	f.t.Helper()
	var list batchv1.JobList
	f.must(f.c.List(f.ctx, &list, client.InNamespace(hook.Namespace), client.MatchingLabels{v1alpha1.LabelOperation: objname.LabelValue(op), v1alpha1.LabelNode: objname.LabelValue(node)}))
	return list.Items
}

// finishJob records a Job's end as the Job controller would (none runs here).
func (f *fixture) finishJob(j *batchv1.Job, ok bool) {
	f.t.Helper()
	now := metav1.Now()
	j.Status.StartTime = &now
	if ok {
		j.Status.CompletionTime = &now
		j.Status.Succeeded = 1
		j.Status.Conditions = []batchv1.JobCondition{
			{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, LastTransitionTime: now, LastProbeTime: now},
			{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastTransitionTime: now, LastProbeTime: now},
		}
	} else {
		j.Status.Failed = 1
		j.Status.Conditions = []batchv1.JobCondition{
			{Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded", Message: "Job has reached the specified backoff limit", LastTransitionTime: now, LastProbeTime: now},
			{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded", Message: "Job has reached the specified backoff limit", LastTransitionTime: now, LastProbeTime: now},
		}
	}
	f.must(f.c.Status().Update(f.ctx, j))
}

// waitJob waits for the one hook Job of node (attempt n counts the Jobs) and returns the newest.
func (f *fixture) waitJob(op, node string, n int) *batchv1.Job {
	f.t.Helper()
	var got *batchv1.Job
	testutil.Eventually(f.t, 30*time.Second, fmt.Sprintf("%d hook Jobs for %s", n, node), func() error {
		jobs := f.hookJobs(op, node)
		if len(jobs) != n {
			return fmt.Errorf("%d Jobs", len(jobs))
		}
		for i := range jobs {
			if len(jobs[i].Status.Conditions) == 0 {
				got = &jobs[i]
			}
		}
		if got == nil {
			return fmt.Errorf("no unfinished Job")
		}
		return nil
	})
	return got
}

// TestPreNodeJobHookFailureBlocksThatNodeOnly: a preNode Job hook runs before each node's task;
// the node whose Job fails gets no task and the operation goes Blocked naming the hook and the
// Job's reason, while the node whose Job succeeded gets its task and finishes; no other node
// starts a hook while one has failed; `kubectl nodeops retry --hook` makes a new Job, and its
// success lets the node go on.
func TestPreNodeJobHookFailureBlocksThatNodeOnly(t *testing.T) {
	f := newFixture(t)
	f.hookNamespace()
	nodes := f.nodes(nil, "a", "b", "c")
	op := f.operation("prehook", func(o *v1alpha1.NodeOperation) {
		o.Spec.MaxUnavailable = intOrStr("2")
		o.Spec.Hooks = &v1alpha1.Hooks{PreNode: []v1alpha1.Hook{jobHook("check")}}
	}, v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{script("s")}})

	ja, jb := f.waitJob(op.Name, nodes[0], 1), f.waitJob(op.Name, nodes[1], 1)
	if ja.Labels[v1alpha1.LabelHook] != "check" || !metav1.IsControlledBy(ja, f.get(op.Name)) {
		t.Fatalf("Job %s: labels %v, owners %v", ja.Name, ja.Labels, ja.OwnerReferences)
	}
	if len(f.tasks(op.Name)) != 0 {
		t.Fatalf("a task exists before its preNode hook succeeded")
	}
	f.finishJob(ja, false)
	f.finishJob(jb, true)

	blocked := f.waitPhase(op.Name, v1alpha1.OperationBlocked)
	c := condition(blocked, v1alpha1.ConditionBlocked)
	if c.Reason != nodeoperation.ReasonHookFailed || !strings.Contains(c.Message, "hook check (preNode, group g, node "+nodes[0]+")") || !strings.Contains(c.Message, "BackoffLimitExceeded") {
		t.Fatalf("blocked with %s: %q; want %s naming the hook, the node and the Job's reason", c.Reason, c.Message, nodeoperation.ReasonHookFailed)
	}
	// b's hook succeeded: its task runs and finishes; a's never exists; c's hook never starts.
	tasks := f.waitTasks(op.Name, 1)
	if tasks[0].Spec.NodeName != nodes[1] {
		t.Fatalf("task for %s, want %s", tasks[0].Spec.NodeName, nodes[1])
	}
	f.runAll(tasks[0].Name)
	testutil.Eventually(t, 30*time.Second, "b's success counted", func() error {
		got := f.get(op.Name)
		if got.Status.Groups[0].Nodes.Succeeded != 1 || got.Status.Phase != v1alpha1.OperationBlocked {
			return fmt.Errorf("phase %s, counts %+v", got.Status.Phase, got.Status.Groups[0].Nodes)
		}
		return nil
	})
	if n := len(f.tasks(op.Name)); n != 1 {
		t.Fatalf("%d tasks while a's hook has failed, want 1", n)
	}
	if jobs := f.hookJobs(op.Name, nodes[2]); len(jobs) != 0 {
		t.Fatalf("node %s started a hook while another had failed", nodes[2])
	}

	var out bytes.Buffer
	o := cli.NewOptions(genericiooptions.IOStreams{Out: &out, ErrOut: &out})
	o.NewClient = func() (cli.Client, error) { return f.c, nil }
	if code := cli.Run(o, []string{"retry", op.Name, "--hook", "check"}); code != 0 {
		t.Fatalf("kubectl nodeops retry --hook: exit %d: %s", code, out.String())
	}
	f.finishJob(f.waitJob(op.Name, nodes[0], 2), true)
	testutil.Eventually(t, 60*time.Second, "the operation to succeed", func() error {
		got := f.get(op.Name)
		if got.Status.Phase == v1alpha1.OperationSucceeded {
			return nil
		}
		for _, j := range f.hookJobs(op.Name, nodes[2]) {
			if len(j.Status.Conditions) == 0 {
				f.finishJob(&j, true)
			}
		}
		for _, task := range f.tasks(op.Name) {
			if task.Status.Phase == "" || task.Status.Phase == v1alpha1.TaskPending {
				f.runAll(task.Name)
			}
		}
		return fmt.Errorf("phase %s: %s", got.Status.Phase, condition(got, v1alpha1.ConditionProgressing).Message)
	})
	if got := f.get(op.Name); len(got.Status.Hooks) != 0 {
		t.Errorf("status keeps %d hook records after the operation succeeded: %+v", len(got.Status.Hooks), got.Status.Hooks)
	}
}

// receiver is an HTTP endpoint that records every CloudEvent it accepts, and refuses the first
// failFirst deliveries of each event.
type receiver struct {
	key       []byte
	failFirst int

	mu       sync.Mutex
	tries    map[string]int
	accepted []hook.Event
	bad      []string
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var ev hook.Event
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if err := json.Unmarshal(body, &ev); err != nil || !hook.Verify(rc.key, body, r.Header.Get(hook.Header)) || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/cloudevents+json") {
		rc.bad = append(rc.bad, string(body))
		http.Error(w, "bad event", http.StatusBadRequest)
		return
	}
	if rc.tries == nil {
		rc.tries = map[string]int{}
	}
	rc.tries[ev.ID]++
	if rc.tries[ev.ID] <= rc.failFirst {
		http.Error(w, "not now", http.StatusServiceUnavailable)
		return
	}
	rc.accepted = append(rc.accepted, ev)
}

func (rc *receiver) events() ([]hook.Event, []string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]hook.Event(nil), rc.accepted...), append([]string(nil), rc.bad...)
}

// TestHTTPHookDeliversEachEventOnceInOrder: an http hook at every point sends one CloudEvent per
// transition, signed with the Secret's key, in the order the transitions happen; a receiver that
// refuses each event's first two deliveries still accepts each exactly once, with the same id.
func TestHTTPHookDeliversEachEventOnceInOrder(t *testing.T) {
	f := newFixture(t)
	f.hookNamespace()
	key := []byte("s3cret-" + f.id)
	f.signingKey(f.id, key)
	rc := &receiver{key: key, failFirst: 2}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	h := []v1alpha1.Hook{{Name: "notify", HTTP: &v1alpha1.HTTPHook{URL: srv.URL, SigningKey: f.id}}}
	nodes := f.nodes(nil, "a", "b")
	op := f.operation("httphook", func(o *v1alpha1.NodeOperation) {
		o.Spec.Hooks = &v1alpha1.Hooks{PreOperation: h, PreNode: h, PostNode: h, PostOperation: h}
	}, v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{script("s")}})

	testutil.Eventually(t, 60*time.Second, "the operation to succeed", func() error {
		got := f.get(op.Name)
		if got.Status.Phase == v1alpha1.OperationSucceeded {
			return nil
		}
		for _, task := range f.tasks(op.Name) {
			if task.Status.Phase == "" || task.Status.Phase == v1alpha1.TaskPending {
				f.runAll(task.Name)
			}
		}
		return fmt.Errorf("phase %s: %s", got.Status.Phase, condition(got, v1alpha1.ConditionProgressing).Message)
	})
	got, bad := rc.events()
	if len(bad) > 0 {
		t.Fatalf("the receiver refused %d deliveries as unsigned or malformed: %v", len(bad), bad)
	}
	want := []string{
		hook.TypeOperationStarted + " " + op.Name,
		hook.TypeNodeStarted + " " + nodes[0], hook.TypeNodeSucceeded + " " + nodes[0],
		hook.TypeNodeStarted + " " + nodes[1], hook.TypeNodeSucceeded + " " + nodes[1],
		hook.TypeOperationSucceeded + " " + op.Name,
	}
	var seen []string
	ids := map[string]bool{}
	for _, ev := range got {
		seen = append(seen, ev.Type+" "+ev.Subject)
		if ids[ev.ID] {
			t.Errorf("event %s accepted twice", ev.ID)
		}
		ids[ev.ID] = true
		if ev.SpecVersion != "1.0" || ev.Source != hook.Source(op.Name) || ev.Time.IsZero() {
			t.Errorf("event %+v lacks CloudEvents attributes", ev)
		}
	}
	if strings.Join(seen, "\n") != strings.Join(want, "\n") {
		t.Fatalf("the receiver accepted, in order:\n%s\nwant:\n%s", strings.Join(seen, "\n"), strings.Join(want, "\n"))
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for id, n := range rc.tries {
		if n != 3 {
			t.Errorf("event %s delivered %d times, want 3 (two refused, one accepted)", id, n)
		}
	}
}

// TestSafetyRule14_AHookThatDoesNotAnswerBlocks: an http hook whose receiver never answers (a
// closed port) does not let the node start: at its timeout the operation is Blocked, reason
// HookFailed, saying why, and no task exists; the same for a Job the API server refuses.
func TestSafetyRule14_AHookThatDoesNotAnswerBlocks(t *testing.T) {
	f := newFixture(t)
	f.hookNamespace()
	f.signingKey(f.id, []byte("k"))
	closed := httptest.NewServer(http.NotFoundHandler())
	url := closed.URL
	closed.Close()
	f.nodes(nil, "a")
	silent := f.operation("silent", func(o *v1alpha1.NodeOperation) {
		o.Spec.Hooks = &v1alpha1.Hooks{PreNode: []v1alpha1.Hook{{Name: "tell", Timeout: &metav1.Duration{Duration: 2 * time.Second},
			HTTP: &v1alpha1.HTTPHook{URL: url, SigningKey: f.id}}}}
	}, v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{script("s")}})
	// A template the Job API refuses: a pod restartPolicy a Job may not have.
	refused := jobHook("bad")
	refused.Job.Template.Raw = []byte(`{"spec":{"template":{"spec":{"restartPolicy":"Always","containers":[{"name":"c","image":"busybox"}]}}}}`)
	bad := f.operation("refused", func(o *v1alpha1.NodeOperation) {
		o.Spec.Hooks = &v1alpha1.Hooks{PreOperation: []v1alpha1.Hook{refused}}
	}, v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{script("s")}})

	for _, tc := range []struct{ op, says string }{
		{silent.Name, "no result within its timeout (2s)"},
		{bad.Name, "cannot create Job"},
	} {
		got := f.waitPhase(tc.op, v1alpha1.OperationBlocked)
		c := condition(got, v1alpha1.ConditionBlocked)
		if c.Reason != nodeoperation.ReasonHookFailed || !strings.Contains(c.Message, tc.says) {
			t.Errorf("%s blocked with %s: %q; want %s saying %q", tc.op, c.Reason, c.Message, nodeoperation.ReasonHookFailed, tc.says)
		}
		if n := len(f.tasks(tc.op)); n != 0 {
			t.Errorf("%s has %d tasks though its hook never succeeded", tc.op, n)
		}
	}
}
