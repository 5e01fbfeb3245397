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
)

const (
	manifestsDir = "/etc/kubernetes/manifests"
	// movedDir holds a manifest while it is out of the manifests directory; a re-run after an
	// interruption puts it back from here.
	movedDir          = "/etc/kubernetes/nodeops-moved"
	staticPodGoneWait = 2 * time.Minute
	staticPodBackWait = 5 * time.Minute
)

var controlPlaneComponents = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}

// recorder is the local service table: on local nodes no kubelet runs, so restarts are recorded.
type recorder interface {
	Record(what string) error
}

// runRestartStaticPods moves each manifest out of the manifests directory and back. Where a kubelet
// runs it waits for the mirror pod to go and come back Ready; on local nodes it records
// `restart static-pod/<component>` in the local service table instead.
func runRestartStaticPods(ctx context.Context, env *Env, c *v1alpha1.RestartStaticPodsCommand) (Result, error) {
	components := c.Components
	if len(components) == 0 {
		for _, comp := range controlPlaneComponents {
			if env.Host.Files.Exists(manifest(manifestsDir, comp)) || env.Host.Files.Exists(manifest(movedDir, comp)) {
				components = append(components, comp)
			}
		}
	}
	for _, comp := range components {
		live, moved := manifest(manifestsDir, comp), manifest(movedDir, comp)
		if env.Host.Files.Exists(moved) && !env.Host.Files.Exists(live) {
			// An interrupted run left it out: put it back before anything else.
			if !env.DryRun {
				if err := env.Host.Files.Rename(moved, live); err != nil {
					return Result{}, err
				}
			}
		}
		if !env.Host.Files.Exists(live) && !env.DryRun {
			return Result{}, fmt.Errorf("no static pod manifest %s", live)
		}
		if env.DryRun {
			env.printf("dry run: would restart static pod %s\n", comp)
			continue
		}
		var before types.UID
		if !env.Host.Local {
			before = mirrorPodIdentity(ctx, env, comp)
		}
		if err := env.Host.Files.Rename(live, moved); err != nil {
			return Result{}, err
		}
		waitErr := error(nil)
		if !env.Host.Local {
			// Without etcd or the API server of this node the API may be unreachable: that is the
			// sign they went away (on a single control plane nothing else answers).
			apiDownMeansGone := comp == "etcd" || comp == "kube-apiserver"
			waitErr = waitMirrorPod(ctx, env, comp, func(id types.UID, exists, _ bool) bool { return !exists || id != before }, staticPodGoneWait, apiDownMeansGone)
		}
		if err := env.Host.Files.Rename(moved, live); err != nil {
			return Result{}, err
		}
		if rec, ok := env.Host.Services.(recorder); ok && env.Host.Local {
			if err := rec.Record("restart static-pod/" + comp); err != nil {
				return Result{}, err
			}
			env.printf("static pod %s restarted (recorded in the local service table)\n", comp)
			continue
		}
		if waitErr != nil {
			env.printf("mirror pod of %s did not go away: %v\n", comp, waitErr)
		}
		if err := waitMirrorPod(ctx, env, comp, func(uid types.UID, exists, ready bool) bool { return exists && ready && uid != before }, staticPodBackWait, false); err != nil {
			return Result{}, fmt.Errorf("static pod %s did not come back: %w", comp, err)
		}
		env.printf("static pod %s restarted\n", comp)
	}
	return Result{Message: dryRunPrefix(env) + fmt.Sprintf("restarted static pods %v", components)}, nil
}

func manifest(dir, comp string) string { return dir + "/" + comp + ".yaml" }

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
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: comp + "-" + env.NodeName}, pod)
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
