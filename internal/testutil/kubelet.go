package testutil

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Envtest and nodeops-local run no kubelet that runs pods. These helpers play the one part of a
// kubelet the pod command relies on: writing a pod's status as a kubelet would. Nothing runs.

// WaitPod waits until the pod exists and returns it.
func WaitPod(t testing.TB, c client.Client, key client.ObjectKey) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{}
	Eventually(t, 60*time.Second, "pod "+key.String(), func() error {
		return c.Get(context.Background(), key, pod)
	})
	return pod
}

// EndPod writes the status a kubelet writes when the pod's one container exited with code:
// phase Succeeded for 0, else Failed with reason Error.
func EndPod(t testing.TB, c client.Client, pod *corev1.Pod, code int32) {
	t.Helper()
	phase, reason := corev1.PodSucceeded, "Completed"
	if code != 0 {
		phase, reason = corev1.PodFailed, "Error"
	}
	now := metav1.Now()
	setPodStatus(t, c, pod, phase, corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		ExitCode: code, Reason: reason, StartedAt: now, FinishedAt: now}})
}

// PodWaiting writes the status of a pod whose container waits for reason, such as ErrImagePull.
func PodWaiting(t testing.TB, c client.Client, pod *corev1.Pod, reason, message string) {
	t.Helper()
	setPodStatus(t, c, pod, corev1.PodPending, corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: message}})
}

func setPodStatus(t testing.TB, c client.Client, pod *corev1.Pod, phase corev1.PodPhase, state corev1.ContainerState) {
	t.Helper()
	Eventually(t, 30*time.Second, "status of pod "+pod.Name, func() error {
		cur := &corev1.Pod{}
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(pod), cur); err != nil {
			return err
		}
		if len(cur.Spec.Containers) == 0 {
			return fmt.Errorf("pod %s has no container", pod.Name)
		}
		ctr := cur.Spec.Containers[0]
		cur.Status.Phase = phase
		cur.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: ctr.Name, Image: ctr.Image, State: state}}
		// A pod's status is its kubelet's, which this stands in for; statuswrite writes nodeops' kinds.
		return c.Status().Update(context.Background(), cur)
	})
}
