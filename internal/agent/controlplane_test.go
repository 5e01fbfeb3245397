package agent_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent"
	"github.com/nodeops/nodeops/internal/host/hosttest"
)

// A control plane is done only when it is healthy again (docs/design.md, safety rule 13): the
// agent's waitNodeReady with controlPlane fails, naming the component, while a kube-* mirror pod
// runs the old image or is not Ready, and completes once they run the new version and are Ready.
// On a waitNodeReady that only looks at the node, the first two tasks would succeed at once.
func TestSafetyRule13_WaitNodeReadyWaitsForTheControlPlaneAtTheNewVersion(t *testing.T) {
	ctx := context.Background()
	const node, from, to = "cp-health-1", "v1.36.3", "v1.37.2"
	components := []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}
	files := map[string]string{}
	for _, comp := range components {
		files["/etc/kubernetes/manifests/"+comp+".yaml"] = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: " + comp + "\n"
	}
	root := hosttest.NewRoot(t, files)
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
	create(t, n)
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}
	if err := cl.Status().Update(ctx, n); err != nil {
		t.Fatal(err)
	}
	// setPods makes the mirror pods what a kubelet would report: each component's image (etcd keeps
	// its own version) and Ready or not.
	setPods := func(version string, ready bool) {
		t.Helper()
		for _, comp := range components {
			image := "registry.k8s.io/" + comp + ":" + version
			if comp == "etcd" {
				image = "registry.k8s.io/etcd:3.6.5-0"
			}
			pod := &corev1.Pod{}
			key := client.ObjectKey{Namespace: "kube-system", Name: comp + "-" + node}
			if err := cl.Get(ctx, key, pod); err != nil {
				pod = &corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace},
					Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: comp, Image: image}}},
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
	healthy := func(timeout time.Duration) v1alpha1.Command {
		return v1alpha1.Command{WaitNodeReady: &v1alpha1.WaitNodeReadyCommand{
			Timeout: &metav1.Duration{Duration: timeout}, ControlPlane: &v1alpha1.ControlPlaneHealth{Version: to}}}
	}
	startAgent(t, agent.Options{NodeName: node, HostRoot: root})

	setPods(from, true)
	create(t, newTask("cp-health-old", node, v1alpha1.ExecutionAuto, healthy(2*time.Second)))
	task := waitTask(t, "cp-health-old", phaseIs(v1alpha1.TaskFailed))
	if msg := task.Status.Commands[0].Message; !strings.Contains(msg, "kube-apiserver:"+from) || !strings.Contains(msg, "not "+to) {
		t.Errorf("with the old images the wait failed with %q, want it to name kube-apiserver's image %s", msg, from)
	}

	setPods(to, false)
	create(t, newTask("cp-health-unready", node, v1alpha1.ExecutionAuto, healthy(2*time.Second)))
	task = waitTask(t, "cp-health-unready", phaseIs(v1alpha1.TaskFailed))
	if msg := task.Status.Commands[0].Message; !strings.Contains(msg, "kube-system/kube-apiserver-"+node+" is not Ready") {
		t.Errorf("with the new images not Ready the wait failed with %q, want it to name kube-apiserver not Ready", msg)
	}

	setPods(from, false)
	create(t, newTask("cp-health-back", node, v1alpha1.ExecutionAuto, healthy(time.Minute)))
	waitTask(t, "cp-health-back", func(tk *v1alpha1.NodeTask) bool {
		return len(tk.Status.Commands) == 1 && tk.Status.Commands[0].Phase == v1alpha1.CommandRunning
	})
	setPods(to, true)
	task = waitTask(t, "cp-health-back", phaseIs(v1alpha1.TaskSucceeded))
	if msg := task.Status.Commands[0].Message; !strings.Contains(msg, "control plane healthy at "+to) {
		t.Errorf("the wait succeeded with %q", msg)
	}
}
