package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent/commands"
	"github.com/nodeops/nodeops/internal/controller/agentjob"
	"github.com/nodeops/nodeops/internal/localcluster"
	"github.com/nodeops/nodeops/internal/testutil"
	"github.com/nodeops/nodeops/test/e2e/framework"
)

// TestSafetyRule6_JobModeWorkerUpgradeFinishes upgrades a cluster whose agents run as the manager's
// Jobs (--agent-mode=Job; nodeops-local plays the kubelet of their pods and binds each agent's token
// to its pod): worker-1's drain, made by the manager while the agent in the Job's pod waits on it,
// must leave that pod, or the task that drains would stop with it (drain honours PodDisruptionBudgets, rule 6).
// The worker is cordoned, drained, upgraded and uncordoned, and its agent's Job completes. Then
// an agent Job's pod deleted mid-command stops its agent as a kubelet would.
func TestSafetyRule6_JobModeWorkerUpgradeFinishes(t *testing.T) {
	t.Parallel()
	l := framework.StartLocal(t, "--control-planes=1", "--workers=1", "--agent-mode=Job")
	l.WaitNodesReady(t, 2, 3*time.Minute)
	ctx := context.Background()
	const node, version = "worker-1", "v1.37.2"
	ns := localcluster.SystemNamespace

	procs, err := l.Processes()
	if err != nil {
		t.Fatal(err)
	}
	for name := range procs {
		if strings.HasPrefix(name, "agent") {
			t.Errorf("nodeops-local runs %s before any Job asked for an agent", name)
		}
	}

	// A workload for the drain to evict.
	app := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "e2e-jobmode"}}
	framework.Create(t, l, app)
	labels := map[string]string{"app": "drained"}
	framework.Create(t, l, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "drained", Namespace: app.Name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}},
			},
		},
	})
	testutil.EventuallyEvery(t, 2*time.Minute, framework.PollInterval, "the pod of drained running on "+node, func(ctx context.Context) error {
		var pods corev1.PodList
		if err := l.Client.List(ctx, &pods, client.InNamespace(app.Name), client.MatchingLabels(labels)); err != nil {
			return err
		}
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning {
				return nil
			}
		}
		return fmt.Errorf("%d pods, none Running", len(pods.Items))
	})

	pods := framework.WatchAgentPods(t, l)
	op := &v1alpha1.NodeOperation{
		ObjectMeta: metav1.ObjectMeta{Name: "jobmode-upgrade"},
		Spec: v1alpha1.NodeOperationSpec{Upgrade: &v1alpha1.UpgradeOperation{
			KubernetesVersion:     version,
			BinarySource:          &v1alpha1.BinarySource{BaseURL: l.BinarySourceURL(t), InsecureHTTP: true},
			IgnorePreflightErrors: framework.LocalPreflightIgnores,
			// Short, so that a drain held up by the agent's own pod fails the test soon.
			Drain: &v1alpha1.DrainCommand{IgnoreDaemonSets: ptr.To(true), Timeout: &metav1.Duration{Duration: 90 * time.Second}},
		}},
	}
	_, events := framework.RunOperationWatched(t, l, op, framework.WaitForKubeadmOperation(v1alpha1.OperationSucceeded))

	// The drain's Running record carries the request, naming the agent's pod; its result does not.
	var task *v1alpha1.NodeTask
	var asked string
	for _, ev := range events {
		if ev.Task.Spec.NodeName != node {
			continue
		}
		task = ev.Task
		for i, c := range ev.Task.Status.Commands {
			if c.Phase == v1alpha1.CommandRunning && c.Drain != nil && ev.Task.Spec.Commands[i].Drain != nil {
				asked = c.Drain.AgentPod
			}
		}
	}
	if task == nil {
		t.Fatalf("no task of %s on %s", op.Name, node)
	}
	task = framework.GetTask(t, l, task.Name)
	podNS, podName, _ := strings.Cut(asked, "/")
	if podNS != ns || !strings.HasPrefix(podName, agentjob.JobName(node)+"-") {
		t.Fatalf("the drain was asked for by pod %q, not by a pod of Job %s/%s", asked, ns, agentjob.JobName(node))
	}
	i := slices.IndexFunc(task.Spec.Commands, func(c v1alpha1.Command) bool { return c.Drain != nil })
	drain := task.Status.Commands[i]
	if own := "leaving " + asked + " (the agent's own pod)"; !strings.Contains(drain.OutputTail, own) {
		t.Errorf("the drain does not say %q:\n%s", own, drain.OutputTail)
	}
	if !strings.Contains(drain.OutputTail, "evicted "+app.Name+"/drained-") {
		t.Errorf("the drain evicted no pod of drained:\n%s", drain.OutputTail)
	}

	t.Run("the agent ran in its Job's pod, with a token bound to that pod", func(t *testing.T) {
		// It has exited (--exit-when-idle); nodeops-local's log of it starts with its command line.
		log := framework.ReadFile(t, filepath.Join(l.Dir, "logs", "agent-"+podName+".log"))
		started, _, _ := strings.Cut(log, "\n")
		for _, arg := range []string{" --host-root=" + l.NodeRoot(node) + " ", " --exit-when-idle ", " --kubeconfig=" + localcluster.CredentialsKubeconfig(l.Dir, "agent-"+podName) + " "} {
			if !strings.Contains(started, arg) {
				t.Errorf("the agent of %s ran without %q: %s", podName, arg, started)
			}
		}
		_, cs := framework.AsAgentPod(t, l, podName)
		u := framework.WhoAmI(t, cs)
		if got := u.Extra["authentication.kubernetes.io/pod-name"]; !slices.Equal(got, []string{podName}) {
			t.Errorf("the agent's token is bound to pod %v, want %s", got, podName)
		}
		if got := u.Extra["authentication.kubernetes.io/node-name"]; !slices.Equal(got, []string{node}) {
			t.Errorf("the agent's token carries node %v", got)
		}
	})

	t.Run("the agent's Job pod was never evicted and its Job completed", func(t *testing.T) {
		testutil.EventuallyEvery(t, 2*time.Minute, framework.PollInterval, "Job "+agentjob.JobName(node)+" Complete", func(ctx context.Context) error {
			job := &batchv1.Job{}
			if err := l.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: agentjob.JobName(node)}, job); err != nil {
				return err
			}
			for _, c := range job.Status.Conditions {
				if c.Type == batchv1.JobComplete && c.Status == corev1.ConditionTrue {
					if job.Status.Failed != 0 {
						return fmt.Errorf("complete with %d failed pods", job.Status.Failed)
					}
					return nil
				}
			}
			return fmt.Errorf("succeeded %d, failed %d, conditions %+v", job.Status.Succeeded, job.Status.Failed, job.Status.Conditions)
		})
		pod := &corev1.Pod{}
		if err := l.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: podName}, pod); err != nil {
			t.Fatalf("the pod whose agent drained: %v", err)
		}
		if cs := pod.Status.ContainerStatuses; pod.Status.Phase != corev1.PodSucceeded || len(cs) != 1 || cs[0].State.Terminated == nil || cs[0].State.Terminated.ExitCode != 0 {
			t.Errorf("pod %s: phase %s, containers %+v", podName, pod.Status.Phase, cs)
		}
		if d := framework.Disruptions(pods.Stop(t), node); len(d) > 0 {
			t.Errorf("agent pods on %s were disrupted:\n%s", node, strings.Join(d, "\n"))
		}
	})

	t.Run("the worker runs the new kubelet and is uncordoned", func(t *testing.T) {
		if v, err := localcluster.KubeletVersion(ctx, l.NodeRoot(node)); err != nil || v != version {
			t.Errorf("%s's kubelet binary is %q (%v)", node, v, err)
		}
		n := getNode(t, l, node)
		if n.Status.NodeInfo.KubeletVersion != version {
			t.Errorf("%s reports kubelet %s", node, n.Status.NodeInfo.KubeletVersion)
		}
		if n.Spec.Unschedulable || n.Annotations[commands.AnnotationWasUnschedulable] != "" {
			t.Errorf("%s after the upgrade: unschedulable %v, annotations %v", node, n.Spec.Unschedulable, n.Annotations)
		}
		for _, c := range task.Status.Commands {
			if c.Phase != v1alpha1.CommandSucceeded {
				t.Errorf("%s: %s is %s: %s", task.Name, c.Name, c.Phase, c.Message)
			}
		}
	})

	// As a kubelet does: SIGTERM, and the agent finishes its running command before it exits
	// (every command has a timeout, rule 12); the Job then makes a new pod, whose agent finds nothing left and exits.
	t.Run("deleting an agent Job's pod stops its agent once its running command finished", func(t *testing.T) {
		op := customOp("jobmode-deleted-pod", onNode(node), v1alpha1.Command{Script: &v1alpha1.ScriptCommand{Inline: "sleep 8; echo slept"}})
		framework.Create(t, l, op)
		framework.WaitForTask(t, l, op.Name, func(tk *v1alpha1.NodeTask) bool {
			return len(tk.Status.Commands) == 1 && tk.Status.Commands[0].Phase == v1alpha1.CommandRunning
		})
		var running *corev1.Pod
		testutil.EventuallyEvery(t, time.Minute, framework.PollInterval, "a Running agent pod on "+node, func(ctx context.Context) error {
			var list corev1.PodList
			if err := l.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{localcluster.AgentLabel: localcluster.AgentLabelValue}); err != nil {
				return err
			}
			for i, p := range list.Items {
				if p.Spec.NodeName == node && p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
					running = &list.Items[i]
					return nil
				}
			}
			return fmt.Errorf("%d agent pods, none Running on %s", len(list.Items), node)
		})
		if err := l.Client.Delete(ctx, running); err != nil {
			t.Fatal(err)
		}
		framework.WaitForOperation(t, l, framework.WaitForOperationInput{Name: op.Name, Phase: v1alpha1.OperationSucceeded, FailIfBlocked: true})
		task := framework.OperationTasks(t, l, op.Name)[0]
		if c := task.Status.Commands[0]; c.Phase != v1alpha1.CommandSucceeded || !strings.Contains(c.OutputTail, "slept") {
			t.Errorf("the script: %s %q", c.Phase, c.OutputTail)
		}
		testutil.EventuallyEvery(t, time.Minute, framework.PollInterval, "pod "+running.Name+" removed", func(ctx context.Context) error {
			err := l.Client.Get(ctx, client.ObjectKeyFromObject(running), &corev1.Pod{})
			if err == nil {
				return fmt.Errorf("still there")
			}
			return client.IgnoreNotFound(err)
		})
		if log := framework.ReadFile(t, filepath.Join(l.Dir, "logs", "agent-"+running.Name+".log")); !strings.Contains(log, "stopping: the running command ended and its result is recorded") {
			t.Errorf("the agent of the deleted pod did not finish its command before it stopped:\n%s", log)
		}
	})
}
