package commands

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/clock"
	"github.com/nodeops/nodeops/internal/host"
	"github.com/nodeops/nodeops/internal/objname"
	"github.com/nodeops/nodeops/internal/transient"
)

const (
	// InstallerServiceAccount runs the pod command's pods: it has no RBAC and mounts no token
	// (config/agent), and admission lets an agent create pods only as it (config/admission).
	InstallerServiceAccount = "nodeops-installer"
	// InstallerContainer is the one container of a pod command's pod.
	InstallerContainer = "installer"
	// HostRootMount is where mountHostRoot puts the host's /, as KWasm's installer expects it.
	HostRootMount = "/host"
	// DefaultImagePullGrace is how long a pod's image may keep failing to pull before the command
	// fails: the kubelet retries a pull, and a registry's moment of trouble should not fail an install.
	DefaultImagePullGrace = time.Minute
	// podLogLines is how many of the pod's last log lines are read; status keeps the last 4 KiB.
	podLogLines = 400
	// podLogLimit bounds what is read of the log however long its lines.
	podLogLimit = 1 << 20
	// LabelCommand holds the index of the command whose pod it is, so a restarted agent knows its own.
	LabelCommand = "nodeops.io/command"
)

// InstallerPod is the pod that command index of task runs on node, in namespace (the agent's):
// named by objname.InstallerPodName (one per node) so a restarted agent finds it, bound to the node,
// tolerating every taint (it must reach control planes, as the agent does), never restarted, with
// no token, and with exactly the labels admission lets an agent's pod carry (config/admission).
func InstallerPod(namespace, node, task string, index int, c *v1alpha1.PodCommand) *corev1.Pod {
	ctr := corev1.Container{
		Name:            InstallerContainer,
		Image:           c.Image,
		ImagePullPolicy: c.ImagePullPolicy,
		Command:         c.Command,
		Args:            c.Args,
		// A container that writes no termination message still says why it failed.
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
	for _, e := range c.Env {
		ctr.Env = append(ctr.Env, corev1.EnvVar{Name: e.Name, Value: e.Value})
	}
	if c.Privileged {
		ctr.SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      objname.InstallerPodName(node),
			Namespace: namespace,
			Labels: map[string]string{
				v1alpha1.LabelNode:          objname.LabelValue(node),
				v1alpha1.LabelTask:          objname.LabelValue(task),
				LabelCommand:                strconv.Itoa(index),
				"app.kubernetes.io/name":    InstallerServiceAccount,
				"app.kubernetes.io/part-of": "nodeops",
			},
		},
		Spec: corev1.PodSpec{
			NodeName: node,
			// The name holds the node's, dots included; a hostname is one DNS label.
			Hostname:                     "installer",
			RestartPolicy:                corev1.RestartPolicyNever,
			ServiceAccountName:           InstallerServiceAccount,
			AutomountServiceAccountToken: ptr.To(false),
			EnableServiceLinks:           ptr.To(false),
			HostPID:                      c.HostPID,
			Tolerations:                  []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers:                   []corev1.Container{ctr},
		},
	}
	if c.MountHostRoot {
		pod.Spec.Volumes = []corev1.Volume{{Name: "host", VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: "/", Type: ptr.To(corev1.HostPathDirectory)}}}}
		pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "host", MountPath: HostRootMount,
			MountPropagation: ptr.To(corev1.MountPropagationHostToContainer)}}
	}
	return pod
}

// runPod creates the command's pod, waits for it to end and records its exit code and log tail,
// then deletes it. A pod left by an interrupted run (the same name) is waited for, never doubled.
// On timeout, or an image that keeps failing to pull, the pod is deleted and the command fails;
// when the agent stops, the pod is left for the agent that follows (intent recorded before action, rule 4).
func runPod(ctx context.Context, env *Env, c *v1alpha1.PodCommand) (Result, error) {
	if env.Client == nil {
		return Result{}, fmt.Errorf("running a pod: this agent has no cluster client")
	}
	want := InstallerPod(env.Namespace, env.NodeName, env.Task, env.CommandIndex, c)
	ref := want.Namespace + "/" + want.Name
	if env.DryRun {
		// The client is a dry-run one: the API server admits the pod as it would, and stores nothing.
		if b, err := yaml.Marshal(want); err == nil {
			env.printf("would create pod %s on node %s:\n%s", ref, env.NodeName, b)
		}
		if err := env.Client.Create(ctx, want); err != nil && !apierrors.IsAlreadyExists(err) {
			return Result{}, fmt.Errorf("pod %s would be refused: %w", ref, err)
		}
		return Result{Message: fmt.Sprintf("would run pod %s (image %s) on node %s", ref, c.Image, env.NodeName)}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, c.PodTimeout())
	defer cancel()
	pod, err := ensurePod(ctx, env, want)
	if err == nil {
		pod, err = waitPodEnd(ctx, env, pod, c.Image)
	}
	if err != nil {
		if ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			// The agent is stopping: the pod goes on, recorded Running; the agent that follows finds it.
			return Result{}, err
		}
		if pod == nil {
			return Result{}, err // gone already
		}
		deletePod(env, pod)
		if ctx.Err() != nil {
			return Result{}, fmt.Errorf("pod %s did not end within %s (%s); it was deleted", ref, c.PodTimeout(), podState(pod))
		}
		return Result{}, err
	}
	code, reason, message := podExit(pod)
	writePodLog(ctx, env, pod)
	deletePod(env, pod)
	if pod.Status.Phase == corev1.PodSucceeded {
		return Result{Message: fmt.Sprintf("pod %s (image %s) exited with code 0", ref, c.Image)}, nil
	}
	ee := &host.ExitError{Program: "pod " + ref + " (image " + c.Image + ")", Code: code}
	if code < 0 {
		return Result{}, fmt.Errorf("pod %s (image %s) failed: %s", ref, c.Image, strings.TrimSpace(reason+" "+message))
	}
	return Result{}, fmt.Errorf("%w, reason %s%s", ee, reason, messageText(message))
}

// ensurePod creates the pod, or finds the one an interrupted run of the same command created.
func ensurePod(ctx context.Context, env *Env, want *corev1.Pod) (*corev1.Pod, error) {
	ref := want.Namespace + "/" + want.Name
	for {
		pod := want.DeepCopy()
		err := transient.Retry(ctx, func() error { return env.Client.Create(ctx, pod) })
		if err == nil {
			env.printf("created pod %s on node %s\n", ref, env.NodeName)
			return pod, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("creating pod %s: %w", ref, err)
		}
		found := &corev1.Pod{}
		if err := transient.Retry(ctx, func() error { return env.Client.Get(ctx, client.ObjectKeyFromObject(want), found) }); err != nil {
			if apierrors.IsNotFound(err) {
				continue // deleted meanwhile: create it
			}
			return nil, fmt.Errorf("reading pod %s: %w", ref, err)
		}
		if found.Spec.NodeName != want.Spec.NodeName {
			return nil, fmt.Errorf("pod %s exists and is not this node's (node %q)", ref, found.Spec.NodeName)
		}
		mine := found.Labels[v1alpha1.LabelTask] == want.Labels[v1alpha1.LabelTask] && found.Labels[LabelCommand] == want.Labels[LabelCommand]
		if !mine && found.DeletionTimestamp == nil {
			// The pod of an earlier command or task on this node, left by an agent that stopped: this
			// task holds the node now (safety rule 1), so that pod's command is over.
			env.printf("deleting pod %s, left by %s's command %s\n", ref, found.Labels[v1alpha1.LabelTask], found.Labels[LabelCommand])
			if err := transient.Retry(ctx, func() error {
				return client.IgnoreNotFound(env.Client.Delete(ctx, found, client.Preconditions{UID: &found.UID}))
			}); err != nil {
				return nil, fmt.Errorf("deleting pod %s, left by task %s: %w", ref, found.Labels[v1alpha1.LabelTask], err)
			}
		} else if found.DeletionTimestamp == nil {
			env.printf("found pod %s, created by an earlier run of this command (interrupted, or not deleted): waiting for it instead of starting another\n", ref)
			return found, nil
		}
		// An earlier run's pod on its way out: wait until it is gone, then create this run's.
		if err := clock.Sleep(ctx, env.poll()); err != nil {
			return nil, fmt.Errorf("waiting for the earlier pod %s to be deleted: %w", ref, err)
		}
	}
}

// pullFailures are the waiting reasons of a container whose image the kubelet cannot pull; the
// permanent ones fail at once, the others once they last ImagePullGrace.
var pullFailures = map[string]bool{"ErrImagePull": false, "ImagePullBackOff": false, "RegistryUnavailable": false,
	"InvalidImageName": true, "ErrImageNeverPull": true}

// waitPodEnd polls the pod until it Succeeded or Failed. It returns the pod as last read and an
// error when the pod cannot end: deleted by someone, its image not pulled, or ctx ended.
func waitPodEnd(ctx context.Context, env *Env, pod *corev1.Pod, image string) (*corev1.Pod, error) {
	ref := pod.Namespace + "/" + pod.Name
	grace := env.ImagePullGrace
	if grace <= 0 {
		grace = DefaultImagePullGrace
	}
	var pullFailingSince time.Time
	lastPhase := corev1.PodPhase("")
	for {
		cur := &corev1.Pod{}
		err := transient.Retry(ctx, func() error { return env.Client.Get(ctx, client.ObjectKeyFromObject(pod), cur) })
		switch {
		case apierrors.IsNotFound(err):
			return nil, fmt.Errorf("pod %s was deleted before it ended", ref)
		case err != nil && ctx.Err() == nil:
			return pod, fmt.Errorf("reading pod %s: %w", ref, err)
		case err == nil:
			if cur.UID != pod.UID {
				return nil, fmt.Errorf("pod %s was deleted and another created in its place before it ended", ref)
			}
			pod = cur
			if pod.Status.Phase != lastPhase {
				env.printf("pod %s is %s\n", ref, pod.Status.Phase)
				lastPhase = pod.Status.Phase
			}
			if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
				return pod, nil
			}
			w := waiting(pod)
			permanent, pull := false, false
			if w != nil {
				permanent, pull = pullFailures[w.Reason]
			}
			switch {
			case !pull:
				pullFailingSince = time.Time{}
			case permanent:
				return pod, fmt.Errorf("image %s cannot be pulled: %s%s", image, w.Reason, messageText(w.Message))
			case pullFailingSince.IsZero():
				pullFailingSince = time.Now()
			case time.Since(pullFailingSince) >= grace:
				return pod, fmt.Errorf("image %s cannot be pulled: %s for %s%s", image, w.Reason, grace, messageText(w.Message))
			}
		}
		if err := clock.Sleep(ctx, env.poll()); err != nil {
			return pod, fmt.Errorf("waiting for pod %s (%s) to end: %w", ref, podState(pod), err)
		}
	}
}

// waiting is the installer container's waiting state, nil when it is not waiting.
func waiting(pod *corev1.Pod) *corev1.ContainerStateWaiting {
	for _, s := range pod.Status.ContainerStatuses {
		if s.Name == InstallerContainer {
			return s.State.Waiting
		}
	}
	return nil
}

// podExit is the installer container's exit code, reason and message; code -1 when it never ran
// (the pod failed as a whole: evicted, rejected by the kubelet).
func podExit(pod *corev1.Pod) (code int, reason, message string) {
	for _, s := range pod.Status.ContainerStatuses {
		if s.Name == InstallerContainer && s.State.Terminated != nil {
			t := s.State.Terminated
			return int(t.ExitCode), t.Reason, strings.TrimSpace(t.Message)
		}
	}
	return -1, pod.Status.Reason, pod.Status.Message
}

// podState says in a few words where the pod is, for a timeout's message.
func podState(pod *corev1.Pod) string {
	if w := waiting(pod); w != nil && w.Reason != "" {
		return fmt.Sprintf("%s, container waiting: %s", orPending(pod.Status.Phase), w.Reason)
	}
	return string(orPending(pod.Status.Phase))
}

func orPending(p corev1.PodPhase) corev1.PodPhase {
	if p == "" {
		return corev1.PodPending
	}
	return p
}

func messageText(m string) string {
	if m == "" {
		return ""
	}
	return ": " + firstLineOf(m)
}

func firstLineOf(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}

// writePodLog copies the end of the pod's log (pods/log, served by the node's kubelet) to the
// command's output, whose tail status keeps, redacted. Without a kubelet to serve it (or an API
// connection) the output says the log is unavailable; the exit code is recorded all the same.
func writePodLog(ctx context.Context, env *Env, pod *corev1.Pod) {
	if env.API == nil {
		env.printf("the log of pod %s/%s is unavailable: this agent has no API connection to read it\n", pod.Namespace, pod.Name)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	stream, err := env.API.Get().AbsPath("/api/v1/namespaces", pod.Namespace, "pods", pod.Name, "log").
		Param("container", InstallerContainer).Param("tailLines", fmt.Sprint(podLogLines)).
		Param("limitBytes", fmt.Sprint(podLogLimit)).Stream(ctx)
	if err != nil {
		env.printf("the log of pod %s/%s is unavailable: %v\n", pod.Namespace, pod.Name, err)
		return
	}
	defer func() { _ = stream.Close() }()
	env.printf("--- log of pod %s/%s ---\n", pod.Namespace, pod.Name)
	if _, err := io.Copy(env.out(), io.LimitReader(stream, podLogLimit)); err != nil {
		env.printf("\nreading the log of pod %s/%s: %v\n", pod.Namespace, pod.Name, err)
	}
	env.printf("--- end of log ---\n")
}

// deletePod deletes the command's pod, even once the command's context ended: an ended pod at once
// (nothing runs in it), a running one gracefully, so its kubelet stops it. A pod this cannot delete
// stays; the next run of the command finds it by name (ensurePod).
func deletePod(env *Env, pod *corev1.Pod) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var opts []client.DeleteOption
	if pod.UID != "" {
		opts = append(opts, client.Preconditions{UID: &pod.UID})
	}
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		opts = append(opts, client.GracePeriodSeconds(0))
	}
	err := transient.Retry(ctx, func() error { return env.Client.Delete(ctx, pod, opts...) })
	switch {
	case err == nil:
		env.printf("deleted pod %s/%s\n", pod.Namespace, pod.Name)
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
	default:
		env.printf("could not delete pod %s/%s (the next run of this command waits for it): %v\n", pod.Namespace, pod.Name, err)
	}
}
