package commands

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/clock"
	"github.com/nodeops/nodeops/internal/host"
	"github.com/nodeops/nodeops/internal/plan"
)

const defaultNodeReadyTimeout = 5 * time.Minute

// runWaitNodeReady waits until the node is Ready and, with controlPlane, until its control plane
// is healthy again (succeeded means served, rule 13). On timeout it fails naming what was not.
func runWaitNodeReady(ctx context.Context, env *Env, w *v1alpha1.WaitNodeReadyCommand) (Result, error) {
	timeout := defaultNodeReadyTimeout
	if w.Timeout != nil && w.Timeout.Duration > 0 {
		timeout = w.Timeout.Duration
	}
	// Each look runs to its end (bounded by the command's own timeout, rule 12) and the deadline is
	// checked between looks, so a wait that fails always names what its last look found, never a
	// deadline that cut a look short on a slow API server.
	deadline := time.Now().Add(timeout)
	cp := w.ControlPlane
	if cp != nil && cp.Version != "" && env.DryRun {
		// kubeadm's dry run changed no static pod: the old version is what is healthy.
		env.printf("dry run: not waiting for the static pods to run %s\n", cp.Version)
		cp = &v1alpha1.ControlPlaneHealth{}
	}
	what := v1alpha1.WaitNodeReady
	if cp != nil {
		what = v1alpha1.WaitControlPlaneHealthy
	}
	defer env.waiting(what)()
	var last error // the last look's answer
	for {
		err := nodeHealthy(ctx, env, cp)
		if err == nil {
			if cp == nil {
				return Result{Message: fmt.Sprintf("node %s is Ready", env.NodeName)}, nil
			}
			env.printf("%s healthy\n", time.Now().UTC().Format("15:04:05.000"))
			return Result{Message: fmt.Sprintf("node %s is Ready and its control plane healthy%s", env.NodeName, versionText(cp.Version))}, nil
		}
		if ctx.Err() != nil && last != nil {
			// The command itself was stopped during this look: the last complete look says why.
			return Result{}, fmt.Errorf("not healthy when stopped (%w): %w", ctx.Err(), last)
		}
		if last == nil || err.Error() != last.Error() {
			env.printf("%s waiting: %v\n", time.Now().UTC().Format("15:04:05.000"), err)
		}
		last = err
		left := time.Until(deadline)
		if left <= 0 {
			return Result{}, fmt.Errorf("not healthy after %s: %w", timeout, last)
		}
		if serr := clock.Sleep(ctx, min(nodeReadyPoll(env, cp != nil), left)); serr != nil {
			return Result{}, fmt.Errorf("not healthy when stopped (%w): %w", serr, last)
		}
	}
}

// nodeReadyPoll is the time between looks: a tenth of a second for a control plane where the
// kubelet answers for its static pods on the node (a look is then one answer of the kubelet's and
// three small reads of the API server: the node, /readyz, the node again; a control plane's agents
// are few, and the end of this wait is the end of the node's upgrade or renewal).
func nodeReadyPoll(env *Env, controlPlane bool) time.Duration {
	if !controlPlane {
		return env.poll()
	}
	if _, err := env.Host.KubeletPods.Serves(); err != nil || env.Host.KubeletPods.Available() {
		return min(env.poll(), 100*time.Millisecond)
	}
	return env.poll()
}

func versionText(v string) string {
	if v == "" {
		return ""
	}
	return " at " + v
}

// nodeHealthy says why the node (and with cp its control plane) is not healthy, naming the component.
func nodeHealthy(ctx context.Context, env *Env, cp *v1alpha1.ControlPlaneHealth) error {
	node := &corev1.Node{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: env.NodeName}, node); err != nil {
		return fmt.Errorf("node %s: %w", env.NodeName, err)
	}
	if !plan.NodeReady(node) {
		return fmt.Errorf("node %s is not Ready", env.NodeName)
	}
	if cp == nil {
		return nil
	}
	asked := false           // whether the kubelet was asked, once per look, which source to read and its pods
	var kubelet []corev1.Pod // the kubelet's pods, nil where mirror pods are read
	for _, comp := range controlPlaneComponents {
		// The node runs the components whose static pod manifest is on the host.
		if !env.Host.Files.Exists(host.Manifest(host.ManifestsDir, comp)) {
			continue
		}
		if !asked {
			serves, err := env.Host.KubeletPods.Serves()
			if err != nil {
				return fmt.Errorf("%s: %w", comp, err)
			}
			if serves {
				if kubelet, err = env.Host.KubeletPods.Pods(ctx); err != nil {
					return fmt.Errorf("%s: %w", comp, err)
				}
				if kubelet == nil {
					kubelet = []corev1.Pod{}
				}
			}
			asked = true
		}
		if err := staticPodHealthy(ctx, env, comp, cp.Version, kubelet); err != nil {
			return err
		}
	}
	return apiServerHealthy(ctx, env)
}

// staticPodHealthy: the component's static pod is Ready and, for the kube-* components with a
// version asked for, every container's image (in the spec and as run) is tagged with it. Where the
// kubelet serves its Pods API the pod is the kubelet's own, with the status it computed: current
// the moment it changes, and, after the kubelet restarted, only what the new kubelet runs and has
// seen Ready (never the old kubelet's last word, which its mirror pod may still show). Elsewhere it
// is the mirror pod. kubelet holds the kubelet's pods, one answer per look, or is nil where the
// mirror pods are read (as host.KubeletPods.Serves says).
func staticPodHealthy(ctx context.Context, env *Env, comp, version string, kubelet []corev1.Pod) error {
	name := comp + "-" + env.NodeName
	pod := &corev1.Pod{}
	fromKubelet := kubelet != nil
	if fromKubelet {
		if pod = findPod(kubelet, name); pod == nil {
			return fmt.Errorf("%s: the kubelet runs no pod kube-system/%s", comp, name)
		}
	} else if err := env.Client.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: name}, pod); err != nil {
		return fmt.Errorf("%s: mirror pod kube-system/%s: %w", comp, name, err)
	}
	if version != "" && strings.HasPrefix(comp, "kube-") {
		for _, c := range pod.Spec.Containers {
			if tag := imageTag(c.Image); tag != version {
				return fmt.Errorf("%s: kube-system/%s runs image %s, not %s", comp, name, c.Image, version)
			}
		}
		for _, cs := range pod.Status.ContainerStatuses {
			if cs.Image != "" && imageTag(cs.Image) != version {
				return fmt.Errorf("%s: kube-system/%s still runs image %s, not %s", comp, name, cs.Image, version)
			}
		}
	}
	if podReady(pod) {
		return nil
	}
	if fromKubelet {
		// The kubelet runs its startup probe every 10 s: the probes, run now, may already pass.
		err := env.Host.KubeletPods.ServingNow(ctx, pod)
		if err == nil {
			return nil
		}
		if !errors.Is(err, host.ErrNoHTTPProbe) {
			return fmt.Errorf("%s: kube-system/%s is not Ready: %w", comp, name, err)
		}
	}
	return fmt.Errorf("%s: kube-system/%s is not Ready", comp, name)
}

// imageTag is the tag of an image reference ("" when it has none).
func imageTag(ref string) string {
	ref, _, _ = strings.Cut(ref, "@")
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		return ref[i+1:]
	}
	return ""
}

// apiServerHealthy: the API server answers /readyz and then authorizes the agent to read its own
// node. An API server whose authorizer has not synced refuses that read (forbidden); a read, unlike a
// SelfSubjectAccessReview, is no write for the agent's admission policy to refuse (config/admission).
func apiServerHealthy(ctx context.Context, env *Env) error {
	if env.API == nil {
		return errors.New("kube-apiserver: no API connection to check /readyz with")
	}
	body, err := env.API.Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("kube-apiserver: /readyz: %w%s", err, failedChecks(body))
	}
	if strings.TrimSpace(string(body)) != "ok" {
		return fmt.Errorf("kube-apiserver: /readyz answered %q", body)
	}
	if _, err := env.API.Get().AbsPath("/api/v1/nodes/" + env.NodeName).DoRaw(ctx); err != nil {
		return fmt.Errorf("kube-apiserver: does not authorize the agent to get node %s yet: %w", env.NodeName, err)
	}
	return nil
}

// failedChecks are the "[-]name failed: ..." lines of a /readyz answer, which say what is not ready.
func failedChecks(body []byte) string {
	var failed []string
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "[-]") {
			failed = append(failed, strings.TrimSpace(line))
		}
	}
	if len(failed) == 0 {
		return ""
	}
	return " (" + strings.Join(failed, "; ") + ")"
}
