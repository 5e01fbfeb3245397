package agent_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent"
	"github.com/nodeops/nodeops/internal/agent/commands"
	"github.com/nodeops/nodeops/internal/host/hosttest"
	"github.com/nodeops/nodeops/internal/objname"
	"github.com/nodeops/nodeops/internal/testutil"
)

// Envtest runs no kubelet: these tests play the kubelet's one part the pod command relies on, the
// pod status it writes (testutil.EndPod, testutil.PodWaiting); nothing runs the image. Without a
// kubelet the API server cannot serve the pod's log either, so the tail says it is unavailable; the
// real-node test proves the log tail.

func podCommand() v1alpha1.Command {
	return v1alpha1.Command{Pod: &v1alpha1.PodCommand{Image: "ghcr.io/kwasm/kwasm-node-installer:v0.3.1", MountHostRoot: true,
		Privileged: true, Env: []v1alpha1.PodEnvVar{{Name: "NODE_ROOT", Value: "/host"}}}}
}

// installerServiceAccount creates what the pod command's pods run as (config/agent), which the API
// server's ServiceAccount admission wants to exist; TestAgentWorksWithItsDeploymentRBAC may have made it.
func installerServiceAccount(t *testing.T) {
	t.Helper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: commands.InstallerServiceAccount, Namespace: agent.DefaultLeaseNamespace}}
	if err := cl.Create(context.Background(), sa); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

func podKey(node string) client.ObjectKey {
	return client.ObjectKey{Namespace: agent.DefaultLeaseNamespace, Name: objname.InstallerPodName(node)}
}

// podGone: the pod is deleted, or (a kubelet finishing the deletion of a pod that had not ended) being deleted.
func podGone(t *testing.T, key client.ObjectKey) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, "pod "+key.String()+" deleted", func() error {
		pod := &corev1.Pod{}
		err := cl.Get(context.Background(), key, pod)
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return err
		case pod.DeletionTimestamp != nil:
			return nil
		}
		return fmt.Errorf("pod %s is still there (%s)", key, pod.Status.Phase)
	})
}

// TestPodCommandRecordsTheExitCode: the pod runs on the task's node as the token-less installer
// account; its container's exit code is the command's, a non-zero one fails the task naming it, and
// the pod is deleted either way.
func TestPodCommandRecordsTheExitCode(t *testing.T) {
	installerServiceAccount(t)
	for _, tt := range []struct {
		node  string
		code  int32
		phase v1alpha1.TaskPhase
	}{
		{"pod-exit-0", 0, v1alpha1.TaskSucceeded},
		{"pod-exit-3", 3, v1alpha1.TaskFailed},
	} {
		t.Run(tt.node, func(t *testing.T) {
			startAgent(t, agent.Options{NodeName: tt.node, HostRoot: hosttest.NewRoot(t, nil)})
			create(t, newTask(tt.node, tt.node, v1alpha1.ExecutionAuto, podCommand()))
			pod := testutil.WaitPod(t, cl, podKey(tt.node))
			if pod.Spec.NodeName != tt.node || pod.Labels[v1alpha1.LabelTask] != tt.node || pod.Labels[v1alpha1.LabelNode] != tt.node ||
				pod.Spec.ServiceAccountName != commands.InstallerServiceAccount || *pod.Spec.AutomountServiceAccountToken {
				t.Errorf("pod on node %q, labels %v, serviceAccount %q", pod.Spec.NodeName, pod.Labels, pod.Spec.ServiceAccountName)
			}
			testutil.EndPod(t, cl, pod, tt.code)
			task := waitTask(t, tt.node, phaseIs(tt.phase))
			c := task.Status.Commands[0]
			if c.ExitCode == nil || *c.ExitCode != tt.code {
				t.Errorf("exitCode %v, want %d", c.ExitCode, tt.code)
			}
			if !strings.Contains(c.OutputTail, "the log of pod "+pod.Namespace+"/"+pod.Name+" is unavailable") {
				t.Errorf("outputTail %q does not say the log was unavailable", c.OutputTail)
			}
			if tt.code != 0 {
				want := fmt.Sprintf("exited with code %d, reason Error", tt.code)
				if task.Status.Reason != v1alpha1.ReasonCommandFailed || !strings.Contains(task.Status.Message, want) || !strings.Contains(c.Message, want) {
					t.Errorf("reason %q message %q, command message %q; want %q", task.Status.Reason, task.Status.Message, c.Message, want)
				}
			}
			podGone(t, podKey(tt.node))
		})
	}
}

// TestPodCommandFailsOnAnImageThatCannotBePulled: a pull that keeps failing fails the command with
// the kubelet's reason, well before the pod's timeout (10m here), and the pod is deleted.
func TestPodCommandFailsOnAnImageThatCannotBePulled(t *testing.T) {
	installerServiceAccount(t)
	node := "pod-pull-1"
	startAgent(t, agent.Options{NodeName: node, HostRoot: hosttest.NewRoot(t, nil), ImagePullGrace: time.Second})
	create(t, newTask(node, node, v1alpha1.ExecutionAuto, podCommand()))
	pod := testutil.WaitPod(t, cl, podKey(node))
	testutil.PodWaiting(t, cl, pod, "ErrImagePull", "failed to pull and unpack image: not found")
	task := waitTask(t, node, phaseIs(v1alpha1.TaskFailed))
	if want := "cannot be pulled: ErrImagePull"; !strings.Contains(task.Status.Message, want) || !strings.Contains(task.Status.Message, "not found") {
		t.Errorf("message %q, want it to say %q and the kubelet's message", task.Status.Message, want)
	}
	podGone(t, podKey(node))
}

// TestPodCommandTimesOut: a pod that does not end within the command's pod timeout is deleted (here
// gracefully, as it may still run: its kubelet would stop it) and the command fails saying so.
func TestPodCommandTimesOut(t *testing.T) {
	installerServiceAccount(t)
	node := "pod-timeout-1"
	startAgent(t, agent.Options{NodeName: node, HostRoot: hosttest.NewRoot(t, nil)})
	create(t, newTask(node, node, v1alpha1.ExecutionAuto, v1alpha1.Command{Pod: &v1alpha1.PodCommand{Image: "busybox",
		Timeout: &metav1.Duration{Duration: 2 * time.Second}}}))
	testutil.WaitPod(t, cl, podKey(node))
	task := waitTask(t, node, phaseIs(v1alpha1.TaskFailed))
	if want := "did not end within 2s (Pending); it was deleted"; !strings.Contains(task.Status.Message, want) {
		t.Errorf("message %q, want it to say %q", task.Status.Message, want)
	}
	podGone(t, podKey(node))
}

// TestPodCommandRestartedAgentFindsItsPod (intent recorded before action, rule 4): a pod command is not
// idempotent, so an agent stopped while its pod runs leaves the pod, and the agent that follows fails
// the command Interrupted instead of running it again; a person's retry waits for that same pod
// instead of starting a second one.
func TestPodCommandRestartedAgentFindsItsPod(t *testing.T) {
	installerServiceAccount(t)
	node := "pod-restart-1"
	root := hosttest.NewRoot(t, nil)
	o := agent.Options{NodeName: node, HostRoot: root, Identity: "agent-" + node}
	stop := startAgent(t, o)
	create(t, newTask(node, node, v1alpha1.ExecutionAuto, podCommand()))
	first := testutil.WaitPod(t, cl, podKey(node))
	waitTask(t, node, func(tk *v1alpha1.NodeTask) bool {
		return len(tk.Status.Commands) == 1 && tk.Status.Commands[0].Phase == v1alpha1.CommandRunning
	})
	stop()

	startAgent(t, o)
	task := waitTask(t, node, phaseIs(v1alpha1.TaskFailed))
	if task.Status.Reason != v1alpha1.ReasonInterrupted {
		t.Errorf("reason %q, want %s", task.Status.Reason, v1alpha1.ReasonInterrupted)
	}
	onePod := func(what string) {
		t.Helper()
		pods := &corev1.PodList{}
		if err := cl.List(context.Background(), pods, client.InNamespace(first.Namespace), client.MatchingLabels{v1alpha1.LabelTask: node}); err != nil {
			t.Fatal(err)
		}
		if len(pods.Items) != 1 || pods.Items[0].UID != first.UID {
			t.Fatalf("%s: %d pods of the task, want only the first (uid %s)", what, len(pods.Items), first.UID)
		}
	}
	onePod("after the restart")

	gen := askRecovery(t, node, v1alpha1.RecoveryRetry)
	waitTask(t, node, func(tk *v1alpha1.NodeTask) bool {
		return tk.Status.RecoveredGeneration >= gen && tk.Status.Commands[0].Phase == v1alpha1.CommandRunning
	})
	onePod("retried")
	testutil.EndPod(t, cl, first, 0)
	task = waitTask(t, node, phaseIs(v1alpha1.TaskSucceeded))
	if c := task.Status.Commands[0]; !strings.Contains(c.OutputTail, "found pod") || c.ExitCode == nil || *c.ExitCode != 0 {
		t.Errorf("the retried command: exitCode %v, outputTail %q", c.ExitCode, c.OutputTail)
	}
	podGone(t, podKey(node))
}

// TestPodCommandDryRunCreatesNoPod: a DryRun reports the pod it would create and creates none.
func TestPodCommandDryRunCreatesNoPod(t *testing.T) {
	installerServiceAccount(t)
	node := "pod-dry-1"
	startAgent(t, agent.Options{NodeName: node, HostRoot: hosttest.NewRoot(t, nil)})
	create(t, newTask(node, node, v1alpha1.ExecutionDryRun, podCommand()))
	task := waitTask(t, node, phaseIs(v1alpha1.TaskSucceeded))
	c := task.Status.Commands[0]
	if !strings.HasPrefix(c.Message, "dry run: would run pod") || !strings.Contains(c.OutputTail, "would create pod") ||
		!strings.Contains(c.OutputTail, "kwasm-node-installer") || !strings.Contains(c.OutputTail, "nodeName: "+node) {
		t.Errorf("message %q, outputTail %q", c.Message, c.OutputTail)
	}
	err := cl.Get(context.Background(), podKey(node), &corev1.Pod{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("a DryRun's pod: %v, want NotFound", err)
	}
}

// TestPodCommandReplacesAnEarlierTasksPod: the node's one installer pod name (issue 24, point 4)
// taken by the pod of an earlier task on the same node, left by an agent that stopped, is deleted and
// this command's pod made in its place: the earlier task no longer holds the node (safety rule 1).
func TestPodCommandReplacesAnEarlierTasksPod(t *testing.T) {
	installerServiceAccount(t)
	ctx := context.Background()
	node := "pod-leftover-1"
	old := commands.InstallerPod(agent.DefaultLeaseNamespace, node, "an-earlier-task", 0, &v1alpha1.PodCommand{Image: "busybox"})
	if err := cl.Create(ctx, old); err != nil {
		t.Fatal(err)
	}
	startAgent(t, agent.Options{NodeName: node, HostRoot: hosttest.NewRoot(t, nil)})
	create(t, newTask(node, node, v1alpha1.ExecutionAuto, podCommand()))
	// No kubelet here: once the agent asked for the old pod's deletion, finish it as the kubelet would.
	testutil.Eventually(t, 30*time.Second, "the earlier task's pod being deleted", func() error {
		pod := &corev1.Pod{}
		if err := cl.Get(ctx, podKey(node), pod); err != nil {
			return err
		}
		if pod.UID != old.UID || pod.DeletionTimestamp == nil {
			return fmt.Errorf("pod %s (uid %s) not being deleted", pod.Name, pod.UID)
		}
		return cl.Delete(ctx, pod, client.GracePeriodSeconds(0))
	})
	var mine *corev1.Pod
	testutil.Eventually(t, 30*time.Second, "this task's pod", func() error {
		pod := &corev1.Pod{}
		if err := cl.Get(ctx, podKey(node), pod); err != nil {
			return err
		}
		if pod.Labels[v1alpha1.LabelTask] != node {
			return fmt.Errorf("pod of task %q", pod.Labels[v1alpha1.LabelTask])
		}
		mine = pod
		return nil
	})
	testutil.EndPod(t, cl, mine, 0)
	if task := waitTask(t, node, func(tk *v1alpha1.NodeTask) bool { return !tk.EffectivePhase().Unfinished() }); task.Status.Phase != v1alpha1.TaskSucceeded {
		t.Errorf("task %s: %s", task.Status.Phase, task.Status.Message)
	}
	podGone(t, podKey(node))
}
