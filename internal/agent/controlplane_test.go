package agent_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent"
	"github.com/nodeops/nodeops/internal/host/hosttest"
	"github.com/nodeops/nodeops/internal/testutil"
)

var controlPlaneComponents = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}

// controlPlaneNode is a Ready node with the static pod manifests of a kubeadm control plane on its
// host root; setPods reports its mirror pods as its kubelet would.
type controlPlaneNode struct {
	name, root string
}

func newControlPlaneNode(t *testing.T, name string) *controlPlaneNode {
	t.Helper()
	files := map[string]string{}
	for _, comp := range controlPlaneComponents {
		files["/etc/kubernetes/manifests/"+comp+".yaml"] = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: " + comp + "\n"
	}
	t.Cleanup(func() { _ = cl.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}) })
	if err := testutil.CreateNode(context.Background(), cl, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, true); err != nil {
		t.Fatal(err)
	}
	return &controlPlaneNode{name: name, root: hosttest.NewRoot(t, files)}
}

// setPods makes the mirror pods what a kubelet would report: each component's image (etcd keeps its
// own version) and Ready or not (etcd always Ready).
func (n *controlPlaneNode) setPods(t *testing.T, version string, ready bool) {
	t.Helper()
	ctx := context.Background()
	for _, comp := range controlPlaneComponents {
		image := "registry.k8s.io/" + comp + ":" + version
		if comp == "etcd" {
			image = "registry.k8s.io/etcd:3.6.5-0"
		}
		pod := &corev1.Pod{}
		key := client.ObjectKey{Namespace: "kube-system", Name: comp + "-" + n.name}
		if err := cl.Get(ctx, key, pod); err != nil {
			pod = &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace},
				Spec:       corev1.PodSpec{NodeName: n.name, Containers: []corev1.Container{{Name: comp, Image: image}}},
			}
			create(t, pod)
		} else {
			pod.Spec.Containers[0].Image = image // a container's image is mutable
			if err := cl.Update(ctx, pod); err != nil {
				t.Fatal(err)
			}
		}
		status := corev1.ConditionFalse
		if ready || comp == "etcd" {
			status = corev1.ConditionTrue
		}
		pod.Status.Phase = corev1.PodRunning
		pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: comp, Image: image, Ready: status == corev1.ConditionTrue}}
		if err := cl.Status().Update(ctx, pod); err != nil {
			t.Fatal(err)
		}
	}
}

// controlPlaneHealthy is the command every control-plane group of an upgrade to version ends with.
func controlPlaneHealthy(version string, timeout time.Duration) v1alpha1.Command {
	return v1alpha1.Command{WaitNodeReady: &v1alpha1.WaitNodeReadyCommand{
		Timeout: &metav1.Duration{Duration: timeout}, ControlPlane: &v1alpha1.ControlPlaneHealth{Version: version}}}
}

// finished: the task succeeded, failed or was aborted (a failed one is unfinished: it waits for a person).
func finished(tk *v1alpha1.NodeTask) bool {
	return tk.Status.Phase == v1alpha1.TaskFailed || !tk.EffectivePhase().Unfinished()
}

// A control plane is done only when it is healthy again (succeeded means served, rule 13): the
// agent's waitNodeReady with controlPlane fails, naming the component, while a kube-* mirror pod
// runs the old image or is not Ready, and completes once they run the new version and are Ready.
// On a waitNodeReady that only looks at the node, the first two tasks would succeed at once.
func TestSafetyRule13_WaitNodeReadyWaitsForTheControlPlaneAtTheNewVersion(t *testing.T) {
	const from, to = "v1.36.3", "v1.37.2"
	n := newControlPlaneNode(t, "cp-health-1")
	startAgent(t, agent.Options{NodeName: n.name, HostRoot: n.root})

	// The waits meant to fail get 10 s: long enough that their first look at the pods ends before
	// the timeout on a loaded machine (with 2 s the client's rate limiter alone could use it up, and
	// the message then names no pod), short enough to keep the test quick.
	n.setPods(t, from, true)
	create(t, newTask("cp-health-old", n.name, v1alpha1.ExecutionAuto, controlPlaneHealthy(to, 10*time.Second)))
	task := waitTask(t, "cp-health-old", phaseIs(v1alpha1.TaskFailed))
	if msg := task.Status.Commands[0].Message; !strings.Contains(msg, "kube-apiserver:"+from) || !strings.Contains(msg, "not "+to) {
		t.Errorf("with the old images the wait failed with %q, want it to name kube-apiserver's image %s", msg, from)
	}

	n.setPods(t, to, false)
	create(t, newTask("cp-health-unready", n.name, v1alpha1.ExecutionAuto, controlPlaneHealthy(to, 10*time.Second)))
	task = waitTask(t, "cp-health-unready", phaseIs(v1alpha1.TaskFailed))
	if msg := task.Status.Commands[0].Message; !strings.Contains(msg, "kube-system/kube-apiserver-"+n.name+" is not Ready") {
		t.Errorf("with the new images not Ready the wait failed with %q, want it to name kube-apiserver not Ready", msg)
	}

	n.setPods(t, from, false)
	create(t, newTask("cp-health-back", n.name, v1alpha1.ExecutionAuto, controlPlaneHealthy(to, time.Minute)))
	waitTask(t, "cp-health-back", func(tk *v1alpha1.NodeTask) bool {
		return len(tk.Status.Commands) == 1 && tk.Status.Commands[0].Phase == v1alpha1.CommandRunning
	})
	n.setPods(t, to, true)
	task = waitTask(t, "cp-health-back", phaseIs(v1alpha1.TaskSucceeded))
	if msg := task.Status.Commands[0].Message; !strings.Contains(msg, "control plane healthy at "+to) {
		t.Errorf("the wait succeeded with %q", msg)
	}
	// The time spent waiting for the control plane is recorded apart from the command's run time:
	// the wait is within the run (to the millisecond it is rounded to).
	c := task.Status.Commands[0]
	took := c.CompletionTime.Sub(c.StartTime.Time)
	if len(c.Waits) != 1 || c.Waits[0].For != v1alpha1.WaitControlPlaneHealthy || c.Waited() <= 0 || c.Waited() > took+time.Millisecond {
		t.Errorf("the wait took %s and recorded waits %+v, want it all waiting for ControlPlaneHealthy", took, c.Waits)
	}
}

// apiServerFaults is a fault proxy in front of the package's API server (test/faults' approach, one
// switch per fault): while notReady holds it answers /readyz as kube-apiserver does with etcd gone,
// and while forbidden holds it refuses the raw read of node that the agent makes to see its requests
// authorized, as an API server whose authorizer has not synced does. The agent's typed read of its
// node (protobuf, before any control-plane check) still passes: a real unsynced authorizer refuses
// that one too, and the task then waits naming that read, never reaching the check under test.
type apiServerFaults struct {
	node string

	mu                   sync.Mutex
	notReady, forbidden  bool
	readyzHits, readHits int
	forward              http.Handler
}

// startAPIServerFaults serves the proxy on loopback and returns a config reaching the API server
// through it (the proxy adds the administrator's credentials).
func startAPIServerFaults(t *testing.T, node string) (*apiServerFaults, *rest.Config) {
	t.Helper()
	forward, err := testutil.ForwardTo(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f := &apiServerFaults{node: node, forward: forward}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, &rest.Config{Host: srv.URL, QPS: cfg.QPS, Burst: cfg.Burst}
}

func (f *apiServerFaults) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	switch {
	case f.notReady && r.URL.Path == "/readyz":
		f.readyzHits++
		f.mu.Unlock()
		// No Retry-After: client-go would retry unseen.
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = fmt.Fprint(w, "[+]ping ok\n[-]etcd failed: reason withheld\nreadyz check failed\n")
		return
	case f.forbidden && r.Method == http.MethodGet && r.URL.Path == "/api/v1/nodes/"+f.node &&
		strings.HasPrefix(r.Header.Get("Accept"), "application/json"):
		f.readHits++
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_, _ = fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"nodes \"%s\" is forbidden: fault proxy: the authorizer has not synced","reason":"Forbidden","details":{"name":%q,"kind":"nodes"},"code":403}`, f.node, f.node)
		return
	}
	f.mu.Unlock()
	f.forward.ServeHTTP(w, r)
}

func (f *apiServerFaults) set(notReady, forbidden bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.notReady, f.forbidden = notReady, forbidden
}

// hits are the requests each fault has refused so far.
func (f *apiServerFaults) hits() (readyzHits, readHits int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.readyzHits, f.readHits
}

// The API server half of succeeded means served (rule 13): with the node Ready and every mirror pod Ready at the target
// version, waitNodeReady {controlPlane} still waits while the API server (reached through a fault
// proxy) answers /readyz 503, and then while it refuses the agent's read of its node; it fails at its
// timeout naming the check, and succeeds once both clear. Without the /readyz check, or without the
// authorized read, one of the short tasks would succeed.
func TestSafetyRule13_WaitNodeReadyWaitsForReadyzAndAnAuthorizedRead(t *testing.T) {
	const to = "v1.37.2"
	n := newControlPlaneNode(t, "cp-apiserver-1")
	n.setPods(t, to, true)
	faults, viaProxy := startAPIServerFaults(t, n.name)
	startAgentWith(t, viaProxy, agent.Options{NodeName: n.name, HostRoot: n.root})
	failsWith := func(name, want string) {
		t.Helper()
		create(t, newTask(name, n.name, v1alpha1.ExecutionAuto, controlPlaneHealthy(to, 3*time.Second)))
		task := waitTask(t, name, finished)
		msg := task.Status.Commands[0].Message
		if task.Status.Phase != v1alpha1.TaskFailed || !strings.Contains(msg, "not healthy after 3s") || !strings.Contains(msg, want) {
			t.Errorf("task %s ended %s with %q, want Failed at its timeout naming %q", name, task.Status.Phase, msg, want)
		}
	}

	faults.set(true, false)
	failsWith("cp-readyz-never", "kube-apiserver: /readyz: the server is currently unable to handle the request ([-]etcd failed: reason withheld)")
	faults.set(false, true)
	failsWith("cp-read-never", "does not authorize the agent to get node "+n.name)

	faults.set(true, true)
	create(t, newTask("cp-apiserver-back", n.name, v1alpha1.ExecutionAuto, controlPlaneHealthy(to, 2*time.Minute)))
	waitTask(t, "cp-apiserver-back", func(tk *v1alpha1.NodeTask) bool {
		return len(tk.Status.Commands) == 1 && tk.Status.Commands[0].Phase == v1alpha1.CommandRunning
	})
	// waitRefused: the agent asks again and is refused twice more, the task Running all along.
	waitRefused := func(what string, hits func() int) {
		t.Helper()
		since := hits()
		testutil.Eventually(t, 60*time.Second, what, func() error {
			task := &v1alpha1.NodeTask{}
			if err := cl.Get(context.Background(), client.ObjectKey{Name: "cp-apiserver-back"}, task); err != nil {
				return err
			}
			if task.Status.Phase != v1alpha1.TaskRunning {
				t.Fatalf("while %s the task ended %s: %s", what, task.Status.Phase, task.Status.Message)
			}
			if got := hits(); got < since+2 {
				return fmt.Errorf("%d refused since, want 2", got-since)
			}
			return nil
		})
	}
	waitRefused("/readyz answers 503", func() int { r, _ := faults.hits(); return r })
	faults.set(false, true)
	waitRefused("the read of the node is forbidden", func() int { _, r := faults.hits(); return r })
	faults.set(false, false)
	task := waitTask(t, "cp-apiserver-back", finished)
	c := task.Status.Commands[0]
	if task.Status.Phase != v1alpha1.TaskSucceeded || !strings.Contains(c.Message, "control plane healthy at "+to) {
		t.Fatalf("once both cleared the task ended %s with %q", task.Status.Phase, c.Message)
	}
	// What a person reading the finished task sees it waited for, in order.
	readyz := strings.Index(c.OutputTail, "waiting: kube-apiserver: /readyz")
	read := strings.Index(c.OutputTail, "waiting: kube-apiserver: does not authorize the agent to get node "+n.name)
	if readyz < 0 || read < readyz {
		t.Errorf("the output does not show the wait for /readyz and then for the read:\n%s", c.OutputTail)
	}
}
