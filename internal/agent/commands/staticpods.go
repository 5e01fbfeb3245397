package commands

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/clock"
	"github.com/nodeops/nodeops/internal/host"
)

const (
	staticPodGoneWait = 2 * time.Minute
	staticPodBackWait = 5 * time.Minute
	// mirrorPodReadTimeout bounds each read of a mirror pod while a restart waits for it.
	mirrorPodReadTimeout = 5 * time.Second
)

var controlPlaneComponents = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}

// runRestartStaticPods restarts each component with the host's static pods: where a kubelet runs the
// manifest is moved out and back while the mirror pod goes and comes back Ready; on local nodes the
// restart is recorded in the local service table instead.
func runRestartStaticPods(ctx context.Context, env *Env, c *v1alpha1.RestartStaticPodsCommand) (Result, error) {
	components := c.Components
	if len(components) == 0 {
		for _, comp := range controlPlaneComponents {
			if env.Host.Files.Exists(host.Manifest(host.ManifestsDir, comp)) || env.Host.Files.Exists(host.Manifest(host.MovedManifestsDir, comp)) {
				components = append(components, comp)
			}
		}
	}
	for _, round := range restartRounds(components) {
		pods := make([]host.StaticPod, len(round))
		for i, comp := range round {
			pods[i] = host.StaticPod{Component: comp, Mirror: &mirrorPod{env: env, comp: comp}}
		}
		if err := env.Host.StaticPods.Restart(ctx, env.out(), pods...); err != nil {
			return Result{}, err
		}
	}
	return Result{Message: fmt.Sprintf("restarted static pods %v", components)}, nil
}

// restartRounds groups the components, in their order, into the restarts made together: the
// controller-manager and the scheduler side by side (each is a client of the API server alone and
// takes 20 to 25 s to come back on a real node, so together the restart waits for the slower, not
// both), etcd and the API server each alone (the API server needs etcd, and every other component
// needs the API server). Each round serves again before the next starts, and the command ends only
// when every component serves (rule 13).
func restartRounds(components []string) [][]string {
	clientOnly := func(comp string) bool { return comp == "kube-controller-manager" || comp == "kube-scheduler" }
	var rounds [][]string
	for _, comp := range components {
		if n := len(rounds); n > 0 && clientOnly(comp) && clientOnly(rounds[n-1][0]) {
			rounds[n-1] = append(rounds[n-1], comp)
			continue
		}
		rounds = append(rounds, []string{comp})
	}
	return rounds
}

// mirrorPod is host.MirrorPod for a component of this node, read through the cluster.
type mirrorPod struct {
	env  *Env
	comp string
}

func (m *mirrorPod) Identity(ctx context.Context) string {
	return string(mirrorPodIdentity(ctx, m.env, m.comp))
}

func (m *mirrorPod) WaitGone(ctx context.Context, before string) error {
	defer m.env.waiting(v1alpha1.WaitMirrorPodGone)()
	// Without etcd or the API server of this node the API may be unreachable: that is the sign they
	// went away (on a single control plane nothing else answers).
	apiDownMeansGone := m.comp == "etcd" || m.comp == "kube-apiserver"
	return waitMirrorPod(ctx, m.env, m.comp, func(id types.UID, exists, _ bool) bool { return !exists || string(id) != before }, staticPodGoneWait, apiDownMeansGone)
}

func (m *mirrorPod) WaitBack(ctx context.Context, before string) error {
	defer m.env.waiting(v1alpha1.WaitMirrorPodBack)()
	return waitMirrorPod(ctx, m.env, m.comp, func(id types.UID, exists, ready bool) bool { return exists && ready && string(id) != before }, staticPodBackWait, false)
}

func mirrorPodIdentity(ctx context.Context, env *Env, comp string) types.UID {
	pod := &corev1.Pod{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: comp + "-" + env.NodeName}, pod); err != nil {
		return ""
	}
	return podIdentity(pod)
}

// podIdentity names one run of a static pod: the mirror pod's UID and its containers' IDs. The UID
// alone is not enough: when the kubelet cannot reach the API server while the pod is away (etcd or
// the API server of a single control plane), it keeps the mirror pod, and only the containers change.
func podIdentity(pod *corev1.Pod) types.UID {
	id := string(pod.UID)
	for _, cs := range pod.Status.ContainerStatuses {
		id += "/" + cs.ContainerID
	}
	return types.UID(id)
}

// waitMirrorPod waits until done says yes about the mirror pod (its UID, whether it exists and, when
// it does, is Ready).
func waitMirrorPod(ctx context.Context, env *Env, comp string, done func(uid types.UID, exists, ready bool) bool, timeout time.Duration, apiDownMeansGone bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		pod := &corev1.Pod{}
		// A read answered by an API server whose etcd is away hangs until the API server gives up
		// (about 30 s on the real node): a short bound tells sooner that the component went.
		readCtx, readCancel := context.WithTimeout(ctx, mirrorPodReadTimeout)
		err := env.Client.Get(readCtx, client.ObjectKey{Namespace: "kube-system", Name: comp + "-" + env.NodeName}, pod)
		readCancel()
		switch {
		case apierrors.IsNotFound(err):
			if done("", false, false) {
				return nil
			}
		case err == nil:
			if done(podIdentity(pod), true, podReady(pod)) {
				return nil
			}
		case apiDownMeansGone && ctx.Err() == nil:
			env.printf("API server unreachable after moving the %s manifest out: it went away (%v)\n", comp, err)
			return nil
		}
		if err := clock.Sleep(ctx, env.poll()); err != nil {
			return fmt.Errorf("mirror pod kube-system/%s-%s: %w", comp, env.NodeName, err)
		}
	}
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
