package commands

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/clock"
	"github.com/nodeops/nodeops/internal/host"
)

const (
	// replacedPodsWait bounds how long a kubelet restart on a control plane waits for the new kubelet
	// to list its pods (it opens its Pods API 0.3 s after its start on the real node and lists once it
	// has read its manifests and the API server's pods). After that its own housekeeping stops the
	// pods it replaced, as it would have anyway.
	replacedPodsWait = 10 * time.Second
	// newPodsAPIWait: a kubelet with a Pods API opens it 0.3 s after its start on the real node; one
	// replacing a kubelet without, that has made no socket in this time, is taken to have none.
	newPodsAPIWait = 3 * time.Second
	// replacedPodGrace is the grace the kubelet's housekeeping gives an orphaned pod's containers.
	replacedPodGrace = time.Second
	// configHashAnnotation is the static pod's UID as the kubelet named it, on its mirror pod.
	configHashAnnotation = "kubernetes.io/config.hash"
)

func runRestartService(ctx context.Context, env *Env, s *v1alpha1.RestartServiceCommand) (Result, error) {
	var before map[string]string
	if s.Name == "kubelet" && !env.DryRun && env.Host.KubeletPods != nil {
		// Only a kubelet whose binary was replaced since it started (an upgrade) can come back
		// naming the static pods anew; where that cannot be told, the pods are looked at.
		if replaced, err := env.Host.KubeletPods.BinaryReplaced(); err != nil || replaced {
			before = staticPodUIDs(ctx, env)
		}
	}
	hadPodsAPI := env.Host.KubeletPods.Available()
	if err := env.Host.Services.Restart(ctx, s.Name); err != nil {
		return Result{}, err
	}
	msg := fmt.Sprintf("%s restarted with %s", s.Name, env.Host.Services.Name())
	if len(before) > 0 {
		msg += "; " + stopReplacedStaticPods(ctx, env, before, hadPodsAPI)
	}
	return Result{Message: msg}, nil
}

// staticPodUIDs are the UIDs the running kubelet gave this node's control-plane static pods (by
// component), read before the kubelet restarts: from its Pods API where it serves one, else from the
// mirror pods. A component whose UID cannot be read is left out: its old run is then stopped by the
// new kubelet's housekeeping alone.
func staticPodUIDs(ctx context.Context, env *Env) map[string]string {
	var comps []string
	for _, comp := range controlPlaneComponents {
		if env.Host.Files.Exists(host.Manifest(host.ManifestsDir, comp)) {
			comps = append(comps, comp)
		}
	}
	if len(comps) == 0 {
		return nil
	}
	uids := map[string]string{}
	if serves, err := env.Host.KubeletPods.Serves(); err == nil && serves {
		pods, err := env.Host.KubeletPods.Pods(ctx)
		if err != nil {
			env.printf("the static pods before the restart: %v\n", err)
			return nil
		}
		for _, comp := range comps {
			if pod := findPod(pods, comp+"-"+env.NodeName); pod != nil {
				uids[comp] = string(pod.UID)
			}
		}
		return uids
	}
	if env.Client == nil {
		return nil
	}
	for _, comp := range comps {
		pod, err := readMirrorPod(ctx, env, comp)
		if err != nil {
			env.printf("the static pods before the restart: %v\n", err)
			continue
		}
		if pod != nil && pod.Annotations[configHashAnnotation] != "" {
			uids[comp] = pod.Annotations[configHashAnnotation]
		}
	}
	return uids
}

func findPod(pods []corev1.Pod, name string) *corev1.Pod {
	for i := range pods {
		if pods[i].Namespace == "kube-system" && pods[i].Name == name {
			return &pods[i]
		}
	}
	return nil
}

// stopReplacedStaticPods waits, at most replacedPodsWait, until the restarted kubelet lists its pods
// and then stops at once the old processes of every static pod it now runs under a new UID (a new
// minor version of the kubelet names every static pod anew), instead of leaving them to its
// housekeeping: that runs 2 s or more later, and a new etcd or API server that starts before it fails
// on the old one's ports and waits out a 10 s back-off. It never fails the restart: the kubelet
// would stop those pods anyway; it says what it did.
func stopReplacedStaticPods(ctx context.Context, env *Env, before map[string]string, hadPodsAPI bool) string {
	defer env.waiting(v1alpha1.WaitKubeletRestarted)()
	pods, err := restartedKubeletPods(ctx, env, hadPodsAPI)
	if err != nil {
		return fmt.Sprintf("the static pods the new kubelet may replace are left to its housekeeping (%v)", err)
	}
	replaced, n := replacedStaticPods(before, pods, env.NodeName), 0
	if len(replaced) == 0 {
		return "it kept the static pods' UIDs: their containers run on"
	}
	var errs []string
	for _, comp := range replaced {
		stopped, err := env.Host.KubeletPods.StopReplacedPod(ctx, before[comp], replacedPodGrace)
		n += stopped
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", comp, err))
		}
	}
	msg := fmt.Sprintf("it replaced static pods %s under new UIDs: stopped their old containers' %d processes at once, so that the new ones find their ports free", strings.Join(replaced, ", "), n)
	if len(errs) > 0 {
		msg += " (not all: " + strings.Join(errs, "; ") + ")"
	}
	return msg
}

// restartedKubeletPods are the pods of the kubelet that started after the restart, once it lists
// them, asked every kubeletPodsPoll for at most replacedPodsWait. Where the kubelet before had no
// Pods API and the new one has made no socket within newPodsAPIWait, it has none either.
func restartedKubeletPods(ctx context.Context, env *Env, hadPodsAPI bool) ([]corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, replacedPodsWait)
	defer cancel()
	begin := time.Now()
	var last error
	for {
		serves, err := env.Host.KubeletPods.Serves()
		if err == nil && !serves || !hadPodsAPI && !env.Host.KubeletPods.Available() && time.Since(begin) > newPodsAPIWait {
			return nil, host.ErrNoKubeletPodsAPI
		}
		if err == nil {
			var pods []corev1.Pod
			if pods, err = env.Host.KubeletPods.Pods(ctx); err == nil {
				return pods, nil
			}
		}
		last = err
		if serr := clock.Sleep(ctx, kubeletPodsPoll(env)); serr != nil {
			if errors.Is(serr, context.DeadlineExceeded) {
				return nil, fmt.Errorf("no list within %s: %w", replacedPodsWait, last)
			}
			return nil, fmt.Errorf("%w: %w", serr, last)
		}
	}
}

// replacedStaticPods are the components (in before's order of controlPlaneComponents) whose static
// pod the kubelet's pods list under a UID other than before's; a pod it does not list is not called
// replaced.
func replacedStaticPods(before map[string]string, pods []corev1.Pod, node string) []string {
	var replaced []string
	for _, comp := range controlPlaneComponents {
		uid, ok := before[comp]
		if !ok {
			continue
		}
		if pod := findPod(pods, comp+"-"+node); pod != nil && string(pod.UID) != uid {
			replaced = append(replaced, comp)
		}
	}
	return replaced
}
