package commands

import (
	"context"
	"errors"
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
	// identityReadWait bounds the reads of a static pod's run before its restart.
	identityReadWait = 30 * time.Second
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
	// One source for the whole restart, so that a run is always compared with one named the same way.
	fromKubelet, err := kubeletServesPods(ctx, env)
	if err != nil {
		return Result{}, err
	}
	if fromKubelet {
		env.printf("following the static pods through the kubelet's Pods API (%s)\n", host.KubeletPodsSocket)
	}
	for _, round := range restartRounds(components) {
		pods := make([]host.StaticPod, len(round))
		for i, comp := range round {
			pods[i] = host.StaticPod{Component: comp, Mirror: &mirrorPod{env: env, comp: comp, fromKubelet: fromKubelet}}
		}
		if err := env.Host.StaticPods.Restart(ctx, env.out(), pods...); err != nil {
			return Result{}, err
		}
	}
	how := "their mirror pods"
	if fromKubelet {
		how = "the kubelet's Pods API"
	}
	return Result{Message: fmt.Sprintf("restarted static pods %v, followed through %s", components, how)}, nil
}

// kubeletServesPods asks the kubelet whether it serves its Pods API, again while it has just started
// and cannot say yet (at most host's grace of a few seconds).
func kubeletServesPods(ctx context.Context, env *Env) (bool, error) {
	var last error
	for {
		serves, err := env.Host.KubeletPods.Serves()
		if err == nil {
			return serves, nil
		}
		if last == nil || err.Error() != last.Error() {
			env.printf("waiting: %v\n", err)
		}
		last = err
		if serr := clock.Sleep(ctx, kubeletPodsPoll(env)); serr != nil {
			return false, fmt.Errorf("%w: %w", serr, err)
		}
	}
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

// mirrorPod is host.MirrorPod for a component of this node: read from the kubelet's Pods API where
// the kubelet serves it, else as its mirror pod through the cluster.
type mirrorPod struct {
	env         *Env
	comp        string
	fromKubelet bool
}

func (m *mirrorPod) Identity(ctx context.Context) (string, error) {
	// A read that fails is made again for a while: an error is no answer, and a run named "" would
	// let the old run pass for the new one.
	ctx, cancel := context.WithTimeout(ctx, identityReadWait)
	defer cancel()
	for {
		id, err := m.identity(ctx)
		if err == nil {
			return id, nil
		}
		if serr := clock.Sleep(ctx, kubeletPodsPoll(m.env)); serr != nil {
			return "", fmt.Errorf("%w (asked again for %s)", err, identityReadWait)
		}
	}
}

// identity reads the current run once: "" when the kubelet runs no such pod or it has no mirror pod.
func (m *mirrorPod) identity(ctx context.Context) (string, error) {
	name := m.comp + "-" + m.env.NodeName
	if m.fromKubelet {
		pod, err := m.env.Host.KubeletPods.Pod(ctx, "kube-system", name)
		if err != nil || pod == nil {
			return "", err
		}
		return string(podIdentity(pod)), nil
	}
	pod, err := readMirrorPod(ctx, m.env, m.comp)
	if err != nil || pod == nil {
		return "", err
	}
	return string(podIdentity(pod)), nil
}

// readMirrorPod reads comp's mirror pod once, nil when there is none. A read answered by an API
// server whose etcd is away hangs until the API server gives up (about 30 s on the real node): each
// read is bounded, so that a wait tells sooner that the component went.
func readMirrorPod(ctx context.Context, env *Env, comp string) (*corev1.Pod, error) {
	name := comp + "-" + env.NodeName
	pod := &corev1.Pod{}
	readCtx, cancel := context.WithTimeout(ctx, mirrorPodReadTimeout)
	defer cancel()
	if err := env.Client.Get(readCtx, client.ObjectKey{Namespace: "kube-system", Name: name}, pod); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("mirror pod kube-system/%s: %w", name, err)
	}
	return pod, nil
}

func (m *mirrorPod) WaitGone(ctx context.Context, before string) error {
	defer m.env.waiting(v1alpha1.WaitMirrorPodGone)()
	// Without etcd or the API server of this node the API may be unreachable: that is the sign they
	// went away (on a single control plane nothing else answers).
	apiDownMeansGone := m.comp == "etcd" || m.comp == "kube-apiserver"
	return waitMirrorPod(ctx, m.env, m.comp, m.fromKubelet, func(id types.UID, exists bool, _ func() bool) bool { return !exists || string(id) != before }, staticPodGoneWait, apiDownMeansGone)
}

func (m *mirrorPod) WaitBack(ctx context.Context, before string) error {
	defer m.env.waiting(v1alpha1.WaitMirrorPodBack)()
	return waitMirrorPod(ctx, m.env, m.comp, m.fromKubelet, func(id types.UID, exists bool, ready func() bool) bool {
		return exists && string(id) != before && ready()
	}, staticPodBackWait, false)
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

// waitMirrorPod waits until done says yes about the static pod (its identity, whether it exists and,
// when it does, is Ready): as the kubelet's Pods API tells with fromKubelet, else as its mirror pod.
func waitMirrorPod(ctx context.Context, env *Env, comp string, fromKubelet bool, done func(uid types.UID, exists bool, ready func() bool) bool, timeout time.Duration, apiDownMeansGone bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if fromKubelet {
		return waitKubeletPod(ctx, env, comp, done)
	}
	for {
		pod, err := readMirrorPod(ctx, env, comp)
		switch {
		case err == nil && pod == nil:
			if done("", false, nil) {
				return nil
			}
		case err == nil:
			if done(podIdentity(pod), true, func() bool { return podReady(pod) }) {
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

// waitKubeletPod is waitMirrorPod read from the kubelet's Pods API: the kubelet's status of its own
// pod, current the moment the kubelet changes it, with no API server or mirror pod in between (a
// mirror pod lags its containers by up to two minutes after the API server restarted). A kubelet
// that cannot answer yet is asked again; one that never does fails the wait at its bound.
func waitKubeletPod(ctx context.Context, env *Env, comp string, done func(uid types.UID, exists bool, ready func() bool) bool) error {
	name := comp + "-" + env.NodeName
	var why string // the last answer that was not yet the one waited for, said when it changes
	say := func(s string) {
		if s != why && s != "" {
			env.printf("waiting: %s\n", s)
		}
		why = s
	}
	for {
		pod, err := env.Host.KubeletPods.Pod(ctx, "kube-system", name)
		switch {
		case err != nil:
			say(err.Error())
		case pod == nil:
			if done("", false, nil) {
				return nil
			}
			say("the kubelet runs no pod kube-system/" + name)
		default:
			notServing := ""
			if done(podIdentity(pod), true, func() bool {
				err := kubeletPodServes(ctx, env, pod)
				if err != nil {
					notServing = err.Error()
				}
				return err == nil
			}) {
				return nil
			}
			say(notServing)
		}
		if err := clock.Sleep(ctx, kubeletPodsPoll(env)); err != nil {
			if why != "" {
				return fmt.Errorf("static pod kube-system/%s as the kubelet runs it: %w (last: %s)", name, err, why)
			}
			return fmt.Errorf("static pod kube-system/%s as the kubelet runs it: %w", name, err)
		}
	}
}

// kubeletPodServes: the kubelet says the pod is Ready, or, before its next probe, the pod's own
// startup and readiness probes pass when run now (host.KubeletPods.ServingNow); else why not.
func kubeletPodServes(ctx context.Context, env *Env, pod *corev1.Pod) error {
	if podReady(pod) {
		return nil
	}
	err := env.Host.KubeletPods.ServingNow(ctx, pod)
	switch {
	case err == nil:
		env.printf("%s serves: its probes pass, run now (the kubelet has not yet marked it Ready)\n", pod.Name)
		return nil
	case errors.Is(err, host.ErrNoHTTPProbe):
		return fmt.Errorf("kube-system/%s is not Ready", pod.Name)
	default:
		return fmt.Errorf("kube-system/%s is not Ready: %w", pod.Name, err)
	}
}

// kubeletPodsPoll is how often the kubelet's Pods API is asked: a local call of a few milliseconds,
// so a short interval costs the node nothing and ends a wait within a quarter second of the change.
func kubeletPodsPoll(env *Env) time.Duration { return min(env.poll(), 250*time.Millisecond) }

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
