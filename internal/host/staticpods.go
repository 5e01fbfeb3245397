package host

import (
	"context"
	"fmt"
	"io"
)

const (
	// ManifestsDir is where the kubelet reads static pod manifests.
	ManifestsDir = "/etc/kubernetes/manifests"
	// MovedManifestsDir holds a manifest while it is out of ManifestsDir; a re-run after an
	// interruption puts it back from here.
	MovedManifestsDir = "/etc/kubernetes/nodeops-moved"
)

// Manifest is the host path of component's manifest in dir.
func Manifest(dir, component string) string { return dir + "/" + component + ".yaml" }

// StaticPods restarts control-plane static pods by moving their manifests out of ManifestsDir and back.
type StaticPods interface {
	// Restart restarts the pods together, saying what it did to out: every manifest out, every pod
	// gone, every manifest back, every pod back Ready. It returns once all of them serve again.
	Restart(ctx context.Context, out io.Writer, pods ...StaticPod) error
}

// StaticPod is one component to restart and, where a kubelet runs, the watch on its mirror pod.
type StaticPod struct {
	Component string
	Mirror    MirrorPod
}

// MirrorPod watches a static pod's mirror pod, for restarts where a kubelet runs. The host knows no
// cluster: the command running the restart provides it.
type MirrorPod interface {
	// Identity names the pod's current run, "" when it has none. It fails when it cannot tell: a
	// restart compared with a run it could not name would take the old run for the new one.
	Identity(ctx context.Context) (string, error)
	// WaitGone waits, within its own bound, until the run named before is gone.
	WaitGone(ctx context.Context, before string) error
	// WaitBack waits, within its own bound, until a run other than before is Ready.
	WaitBack(ctx context.Context, before string) error
}

// manifestInPlace puts back a manifest an interrupted run left out, and fails when there is none.
func manifestInPlace(files Files, component string) (live, moved string, err error) {
	live, moved = Manifest(ManifestsDir, component), Manifest(MovedManifestsDir, component)
	if files.Exists(moved) && !files.Exists(live) {
		if err := files.Rename(moved, live); err != nil {
			return "", "", err
		}
	}
	if !files.Exists(live) {
		return "", "", fmt.Errorf("no static pod manifest %s", live)
	}
	return live, moved, nil
}

// KubeletStaticPods restarts static pods on a node with a kubelet: it waits for the mirror pod to go
// and to come back Ready.
type KubeletStaticPods struct {
	Files Files
}

// Restart implements StaticPods. Pods restarted together wait out their slowest, not their sum: the
// kubelet stops and starts them at once.
func (k *KubeletStaticPods) Restart(ctx context.Context, out io.Writer, pods ...StaticPod) error {
	type moving struct {
		StaticPod
		live, moved, before string
	}
	ms := make([]moving, 0, len(pods))
	for _, p := range pods {
		live, moved, err := manifestInPlace(k.Files, p.Component)
		if err != nil {
			return err
		}
		before, err := p.Mirror.Identity(ctx)
		if err != nil {
			return fmt.Errorf("static pod %s: its current run: %w", p.Component, err)
		}
		ms = append(ms, moving{StaticPod: p, live: live, moved: moved, before: before})
	}
	for i := range ms {
		if err := k.Files.Rename(ms[i].live, ms[i].moved); err != nil {
			return err
		}
	}
	goneErrs := make([]error, len(ms))
	for i := range ms {
		goneErrs[i] = ms[i].Mirror.WaitGone(ctx, ms[i].before)
	}
	for i := range ms {
		if err := k.Files.Rename(ms[i].moved, ms[i].live); err != nil {
			return err
		}
	}
	for i := range ms {
		if goneErrs[i] != nil {
			_, _ = fmt.Fprintf(out, "static pod %s did not go away: %v\n", ms[i].Component, goneErrs[i])
		}
	}
	for i := range ms {
		if err := ms[i].Mirror.WaitBack(ctx, ms[i].before); err != nil {
			return fmt.Errorf("static pod %s did not come back: %w", ms[i].Component, err)
		}
		_, _ = fmt.Fprintf(out, "static pod %s restarted\n", ms[i].Component)
	}
	return nil
}

// LocalStaticPods is nodeops-local's stand-in, where no kubelet runs: the manifest is moved out and
// back, and `restart static-pod/<component>` is recorded in the local service table.
type LocalStaticPods struct {
	Files Files
	Table *LocalServices
}

// Restart implements StaticPods.
func (l *LocalStaticPods) Restart(_ context.Context, out io.Writer, pods ...StaticPod) error {
	for _, p := range pods {
		live, moved, err := manifestInPlace(l.Files, p.Component)
		if err != nil {
			return err
		}
		if err := l.Files.Rename(live, moved); err != nil {
			return err
		}
		if err := l.Files.Rename(moved, live); err != nil {
			return err
		}
		if err := l.Table.Record("restart static-pod/" + p.Component); err != nil {
			return err
		}
		_, _ = fmt.Fprintf(out, "static pod %s restarted (recorded in the local service table)\n", p.Component)
	}
	return nil
}
