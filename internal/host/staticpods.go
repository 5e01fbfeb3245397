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

// StaticPods restarts a control-plane static pod by moving its manifest out of ManifestsDir and back.
type StaticPods interface {
	// Restart restarts component, saying what it did to out; mirror watches its pod where a kubelet runs.
	Restart(ctx context.Context, out io.Writer, component string, mirror MirrorPod) error
}

// MirrorPod watches a static pod's mirror pod, for restarts where a kubelet runs. The host knows no
// cluster: the command running the restart provides it.
type MirrorPod interface {
	// Identity names the pod's current run, "" when it has none.
	Identity(ctx context.Context) string
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

// Restart implements StaticPods.
func (k *KubeletStaticPods) Restart(ctx context.Context, out io.Writer, component string, mirror MirrorPod) error {
	live, moved, err := manifestInPlace(k.Files, component)
	if err != nil {
		return err
	}
	before := mirror.Identity(ctx)
	if err := k.Files.Rename(live, moved); err != nil {
		return err
	}
	goneErr := mirror.WaitGone(ctx, before)
	if err := k.Files.Rename(moved, live); err != nil {
		return err
	}
	if goneErr != nil {
		_, _ = fmt.Fprintf(out, "mirror pod of %s did not go away: %v\n", component, goneErr)
	}
	if err := mirror.WaitBack(ctx, before); err != nil {
		return fmt.Errorf("static pod %s did not come back: %w", component, err)
	}
	_, _ = fmt.Fprintf(out, "static pod %s restarted\n", component)
	return nil
}

// LocalStaticPods is nodeops-local's stand-in, where no kubelet runs: the manifest is moved out and
// back, and `restart static-pod/<component>` is recorded in the local service table.
type LocalStaticPods struct {
	Files Files
	Table *LocalServices
}

// Restart implements StaticPods.
func (l *LocalStaticPods) Restart(_ context.Context, out io.Writer, component string, _ MirrorPod) error {
	live, moved, err := manifestInPlace(l.Files, component)
	if err != nil {
		return err
	}
	if err := l.Files.Rename(live, moved); err != nil {
		return err
	}
	if err := l.Files.Rename(moved, live); err != nil {
		return err
	}
	if err := l.Table.Record("restart static-pod/" + component); err != nil {
		return err
	}
	_, _ = fmt.Fprintf(out, "static pod %s restarted (recorded in the local service table)\n", component)
	return nil
}
