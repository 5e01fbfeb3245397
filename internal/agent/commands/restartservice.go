package commands

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/version"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/clock"
	"github.com/nodeops/nodeops/internal/host"
)

const (
	// replacedPodGrace is the grace the kubelet's housekeeping gives an orphaned pod's containers.
	replacedPodGrace = time.Second
	// configHashAnnotation is the static pod's UID as the kubelet named it, on its mirror pod.
	configHashAnnotation = "kubernetes.io/config.hash"
	// versionReadTimeout bounds `kubelet --version`.
	versionReadTimeout = 10 * time.Second
	// newKubeletWait bounds the wait for the restarted kubelet to open its Pods API (0.3 s after its
	// start on the real node), the sign that it runs and will start the static pods again.
	newKubeletWait = 3 * time.Second
)

func runRestartService(ctx context.Context, env *Env, s *v1alpha1.RestartServiceCommand) (Result, error) {
	var renaming func() *renamingKubelet
	if s.Name == "kubelet" && !env.DryRun && env.Host.KubeletPods != nil {
		renaming = kubeletRenamingStaticPods(ctx, env)
	}
	if err := env.Host.Services.Restart(ctx, s.Name); err != nil {
		return Result{}, err
	}
	var renamed *renamingKubelet
	if renaming != nil {
		env.printf("%s: %s restarted\n", time.Now().UTC().Format("15:04:05.000"), s.Name)
		renamed = renaming()
	}
	msg := fmt.Sprintf("%s restarted with %s", s.Name, env.Host.Services.Name())
	if renamed != nil {
		msg += "; " + renamed.stopOldRuns(ctx, env)
	}
	return Result{Message: msg}, nil
}

// renamingKubelet is a kubelet restart onto a new minor version on a control plane: the new kubelet
// names every static pod anew (a hash of the pod as its own version decodes the manifest), so it
// starts them all again under new UIDs and stops the old runs only at its housekeeping, 2 s or more
// after it read its pods, often after the new etcd or API server started and failed on the old
// one's ports (a 10 s back-off before it tries again).
type renamingKubelet struct {
	from, to string
	// uids are the static pods' UIDs before the restart, by component.
	uids map[string]string
}

// kubeletRenamingStaticPods reads, before the kubelet restarts, what tells whether the restart
// renames this control plane's static pods (the running kubelet's version and the static pods'
// UIDs), and returns what says so after the restart: whether the binary was replaced by one of
// another minor version. The new binary's `--version` (a tenth to a quarter of a second) runs
// beside the restart, not before it. nil, or a nil answer, when the restart renames nothing or
// when that cannot be told (the kubelet's housekeeping then stops the old runs, as it always did).
func kubeletRenamingStaticPods(ctx context.Context, env *Env) func() *renamingKubelet {
	path, replaced, err := env.Host.KubeletPods.BinaryReplaced()
	if err != nil || !replaced || env.Client == nil {
		return nil
	}
	var comps []string
	for _, comp := range controlPlaneComponents {
		if env.Host.Files.Exists(host.Manifest(host.ManifestsDir, comp)) {
			comps = append(comps, comp)
		}
	}
	if len(comps) == 0 {
		return nil
	}
	type answer struct {
		version string
		err     error
	}
	newVersion := make(chan answer, 1)
	go func() {
		v, err := binaryVersion(ctx, env, path)
		newVersion <- answer{v, err}
	}()
	// The two reads the restart must wait for are independent: read them at once.
	var (
		node    = &corev1.Node{}
		nodeErr error
		uids    map[string]string
		wg      sync.WaitGroup
	)
	wg.Go(func() { nodeErr = env.Client.Get(ctx, client.ObjectKey{Name: env.NodeName}, node) })
	wg.Go(func() { uids = staticPodUIDs(ctx, env, comps) })
	wg.Wait()
	if nodeErr != nil {
		env.printf("the running kubelet's version: %v\n", nodeErr)
		return nil
	}
	if len(uids) == 0 {
		return nil
	}
	from := node.Status.NodeInfo.KubeletVersion
	return func() *renamingKubelet {
		to := <-newVersion
		if to.err != nil {
			env.printf("the new kubelet's version: %v\n", to.err)
			return nil
		}
		if !newMinor(from, to.version) {
			return nil
		}
		return &renamingKubelet{from: from, to: to.version, uids: uids}
	}
}

// newMinor says whether to is another major or minor version than from; false when either does
// not parse.
func newMinor(from, to string) bool {
	f, ferr := version.ParseGeneric(from)
	t, terr := version.ParseGeneric(to)
	return ferr == nil && terr == nil && (f.Major() != t.Major() || f.Minor() != t.Minor())
}

// binaryVersion is the version `path --version` prints ("Kubernetes v1.37.2"), run in the host root.
func binaryVersion(ctx context.Context, env *Env, path string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, versionReadTimeout)
	defer cancel()
	var out bytes.Buffer
	if err := env.Host.Exec.Run(ctx, host.Cmd{Path: path, Args: []string{"--version"}, Output: &out}); err != nil {
		return "", fmt.Errorf("%s --version: %w", path, err)
	}
	fields := strings.Fields(out.String())
	if len(fields) == 0 {
		return "", fmt.Errorf("%s --version printed nothing", path)
	}
	return fields[len(fields)-1], nil
}

// staticPodUIDs are the UIDs the running kubelet gave the components' static pods: from its Pods
// API where it serves one, else from the mirror pods. A component whose UID cannot be read is left
// out: the new kubelet's housekeeping alone stops its old run.
func staticPodUIDs(ctx context.Context, env *Env, comps []string) map[string]string {
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

// findPod is the static pod kube-system/name among the kubelet's pods, or nil.
func findPod(pods []corev1.Pod, name string) *corev1.Pod {
	for i := range pods {
		if pods[i].Namespace == "kube-system" && pods[i].Name == name {
			return &pods[i]
		}
	}
	return nil
}

// stopOldRuns stops, right after the restart and before the new kubelet starts the new pods, the
// processes of the static pods' runs under their old UIDs, as the kubelet's housekeeping would
// seconds later: the new etcd and API server then find their ports free. No kubelet runs those
// pods any more (the old one has stopped; the new one names them anew), so nothing starts them
// again. It stops them only once the new kubelet serves its Pods API: a kubelet that does not come
// up would start nothing again, and the old runs, the control plane kubeadm just upgraded, keep
// serving until a person fixes it. It never fails the restart; it says what it did.
func (r *renamingKubelet) stopOldRuns(ctx context.Context, env *Env) string {
	if err := newKubeletServes(ctx, env); err != nil {
		return fmt.Sprintf("the kubelet went from %s to %s, a new minor version, but %v: the static pods' old runs are left to its housekeeping", r.from, r.to, err)
	}
	graces := map[string]time.Duration{}
	for _, comp := range controlPlaneComponents {
		if uid, ok := r.uids[comp]; ok {
			graces[uid] = replacedPodGrace
		}
	}
	if uid, ok := r.uids["kube-apiserver"]; ok {
		// The old API server, told to stop, drains its open connections against an etcd that is
		// stopping too: it held the new kubelet's first requests (the mirror pods, which the kubelet
		// creates before it starts a static pod's containers) until its SIGKILL, and so delayed the
		// new control plane by most of the grace. It keeps no state of its own: kill it at once.
		graces[uid] = 0
	}
	began := time.Now()
	counts, err := env.Host.KubeletPods.StopReplacedPods(ctx, graces)
	env.printf("%s: the static pods' old runs stopped in %s\n", began.UTC().Format("15:04:05.000"), time.Since(began).Round(time.Millisecond))
	var stopped []string
	n := 0
	for _, comp := range controlPlaneComponents {
		if k := counts[r.uids[comp]]; k > 0 {
			stopped = append(stopped, comp)
			n += k
		}
	}
	how := ""
	if counts[r.uids["kube-apiserver"]] > 0 {
		how = "; the API server's with SIGKILL, the others' with SIGTERM"
	}
	msg := fmt.Sprintf("the kubelet went from %s to %s, a new minor version, which starts every static pod again under a new UID: stopped the old runs of %s at once (%d processes%s), so that the new ones find their ports free",
		r.from, r.to, strings.Join(stopped, ", "), n, how)
	if len(stopped) == 0 {
		msg = fmt.Sprintf("the kubelet went from %s to %s, a new minor version: no process of the static pods' old runs was left to stop", r.from, r.to)
	}
	if err != nil {
		msg += fmt.Sprintf(" (not all: %v)", err)
	}
	return msg
}

// newKubeletServes waits, at most newKubeletWait, until the kubelet running now (started by the
// restart) serves its Pods API; it says why not otherwise.
func newKubeletServes(ctx context.Context, env *Env) error {
	ctx, cancel := context.WithTimeout(ctx, newKubeletWait)
	defer cancel()
	for {
		serves, err := env.Host.KubeletPods.Serves()
		if err == nil && serves {
			return nil
		}
		if err == nil {
			return host.ErrNoKubeletPodsAPI // it has run for a while without one
		}
		if clock.Sleep(ctx, kubeletPodsPoll(env)) != nil {
			return fmt.Errorf("the new kubelet did not serve within %s (%w)", newKubeletWait, err)
		}
	}
}
