package host_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodeops/nodeops/internal/host"
	"github.com/nodeops/nodeops/internal/host/hosttest"
)

// tree is every path under root with its mode and content digest, to compare a root before and after.
func tree(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		b.WriteString(p + " " + fi.Mode().String())
		if d.Type().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(data)
			b.WriteString(" " + hex.EncodeToString(sum[:]))
		}
		b.WriteString("\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestDryRunHostReportsAndChangesNothing(t *testing.T) {
	root := hosttest.NewRoot(t, map[string]string{
		"/etc/a":                              "a",
		"/usr/bin/kubelet":                    "old",
		"/etc/kubernetes/tmp/x/y":             "y",
		"/etc/kubernetes/manifests/etcd.yaml": "etcd",
	})
	before := tree(t, root)
	var out strings.Builder
	h := host.NewLocal(root).DryRun(&out)
	ctx := context.Background()

	if got, err := h.Files.ReadFile("/etc/a"); err != nil || string(got) != "a" {
		t.Errorf("a dry run does not read through: %q, %v", got, err)
	}
	steps := []struct {
		does func() error
		says string
	}{
		{func() error { return h.Files.WriteFileAtomic("/etc/new", []byte("n"), 0o600) }, "would write /etc/new (1 bytes, mode 0600)"},
		{func() error {
			tmp, err := h.Files.CreateTemp("/usr/bin/kubelet")
			if err != nil {
				return err
			}
			if _, err := tmp.Write([]byte("new kubelet")); err != nil {
				return err
			}
			return tmp.Commit(0o755)
		}, "would write /usr/bin/kubelet (11 bytes, mode 0755)"},
		{func() error { return h.Files.KeepPrevious("/usr/bin/kubelet", "/usr/bin/kubelet.prev") }, "would keep /usr/bin/kubelet as /usr/bin/kubelet.prev"},
		{func() error { return h.Files.Chmod("/etc/a", 0o600) }, "would set the mode of /etc/a to 0600"},
		{func() error { return h.Files.Remove("/etc/a") }, "would remove /etc/a"},
		{func() error { return h.Files.RemoveAll("/etc/kubernetes/tmp") }, "would remove /etc/kubernetes/tmp and everything under it"},
		{func() error { return h.Files.Rename("/etc/a", "/etc/b") }, "would move /etc/a to /etc/b"},
		{func() error { return h.Services.Restart(ctx, "kubelet") }, "would restart kubelet with local service table"},
		{func() error { return h.StaticPods.Restart(ctx, &out, host.StaticPod{Component: "etcd"}) }, "would restart static pod etcd"},
		{func() error {
			return h.Exec.Run(ctx, host.Cmd{Path: "/bin/sh", Args: []string{"-c", "touch /ran\necho"}})
		}, "would run /bin/sh -c touch /ran ..."},
	}
	for _, s := range steps {
		if err := s.does(); err != nil {
			t.Errorf("%s: %v", s.says, err)
		}
		if !strings.Contains(out.String(), "dry run: "+s.says+"\n") {
			t.Errorf("output lacks %q:\n%s", s.says, out.String())
		}
	}
	if err := h.Files.WriteFileAtomic("relative", nil, 0o644); err == nil {
		t.Errorf("a dry-run write of a bad path did not fail as the real one would")
	}
	if after := tree(t, root); after != before {
		t.Errorf("a dry run changed the root:\nbefore %s\nafter  %s", before, after)
	}
}

// fakeMirror records what a restart saw of the manifests at each step, in steps it may share with
// the other components' fakeMirrors.
type fakeMirror struct {
	root  string
	comp  string // etcd when empty
	steps *[]string
}

func newFakeMirror(root string) *fakeMirror { return &fakeMirror{root: root, steps: new([]string)} }

// present says, for each component whose manifest the restart handles, whether it is in place.
func (f *fakeMirror) present() string {
	var s []string
	for _, comp := range []string{"etcd", "kube-controller-manager", "kube-scheduler"} {
		if _, err := os.Stat(filepath.Join(f.root, "etc/kubernetes/manifests", comp+".yaml")); err == nil {
			s = append(s, "in")
		} else if _, err := os.Stat(filepath.Join(f.root, "etc/kubernetes/nodeops-moved", comp+".yaml")); err == nil {
			s = append(s, "out")
		}
	}
	return strings.Join(s, "+")
}

func (f *fakeMirror) step(what string) {
	if f.comp != "" {
		what = f.comp + " " + what
	}
	*f.steps = append(*f.steps, what+" "+f.present())
}

func (f *fakeMirror) Identity(context.Context) (string, error) {
	f.step("identity")
	return "run-1", nil
}

func (f *fakeMirror) WaitGone(_ context.Context, before string) error {
	f.step("gone " + before)
	return nil
}

func (f *fakeMirror) WaitBack(_ context.Context, before string) error {
	f.step("back " + before)
	return nil
}

// TestKubeletStaticPodsRestartTogether: the controller-manager and the scheduler restarted together
// are both out before the restart waits for either to go, and both back before it waits for either
// to come back, so the restart takes the slower of the two, not their sum.
func TestKubeletStaticPodsRestartTogether(t *testing.T) {
	root := hosttest.NewRoot(t, map[string]string{
		"/etc/kubernetes/manifests/kube-controller-manager.yaml": "cm",
		"/etc/kubernetes/manifests/kube-scheduler.yaml":          "scheduler",
	})
	steps := new([]string)
	cm := &fakeMirror{root: root, comp: "cm", steps: steps}
	sched := &fakeMirror{root: root, comp: "scheduler", steps: steps}
	var out strings.Builder
	sp := &host.KubeletStaticPods{Files: &host.FS{Root: root}}
	if err := sp.Restart(context.Background(), &out, host.StaticPod{Component: "kube-controller-manager", Mirror: cm},
		host.StaticPod{Component: "kube-scheduler", Mirror: sched}); err != nil {
		t.Fatal(err)
	}
	want := "cm identity in+in, scheduler identity in+in, cm gone run-1 out+out, scheduler gone run-1 out+out, " +
		"cm back run-1 in+in, scheduler back run-1 in+in"
	if got := strings.Join(*steps, ", "); got != want {
		t.Errorf("steps\n%s\nwant\n%s", got, want)
	}
	if got := out.String(); got != "static pod kube-controller-manager restarted\nstatic pod kube-scheduler restarted\n" {
		t.Errorf("output %q", got)
	}
}

func TestKubeletStaticPodsWaitsWhileTheManifestIsOut(t *testing.T) {
	root := hosttest.NewRoot(t, map[string]string{"/etc/kubernetes/nodeops-moved/etcd.yaml": "etcd"})
	mirror := newFakeMirror(root)
	var out strings.Builder
	sp := &host.KubeletStaticPods{Files: &host.FS{Root: root}}
	if err := sp.Restart(context.Background(), &out, host.StaticPod{Component: "etcd", Mirror: mirror}); err != nil {
		t.Fatal(err)
	}
	// The manifest an interrupted run left out is put back first.
	if got, want := strings.Join(*mirror.steps, ", "), "identity in, gone run-1 out, back run-1 in"; got != want {
		t.Errorf("steps %q, want %q", got, want)
	}
	if err := sp.Restart(context.Background(), &out, host.StaticPod{Component: "kube-scheduler", Mirror: mirror}); err == nil || !strings.Contains(err.Error(), "no static pod manifest") {
		t.Errorf("restart without a manifest: %v", err)
	}
}

// unreadableMirror cannot name the pod's current run.
type unreadableMirror struct{ fakeMirror }

func (*unreadableMirror) Identity(context.Context) (string, error) {
	return "", errors.New("the API server does not answer")
}

// TestKubeletStaticPodsMoveNothingWithoutTheRunBefore: a restart that cannot name the run before
// it (to tell the new one from) fails with the manifest left in place.
func TestKubeletStaticPodsMoveNothingWithoutTheRunBefore(t *testing.T) {
	root := hosttest.NewRoot(t, map[string]string{"/etc/kubernetes/manifests/kube-apiserver.yaml": "apiserver"})
	sp := &host.KubeletStaticPods{Files: &host.FS{Root: root}}
	err := sp.Restart(context.Background(), io.Discard, host.StaticPod{Component: "kube-apiserver", Mirror: &unreadableMirror{}})
	if err == nil || !strings.Contains(err.Error(), "static pod kube-apiserver: its current run: the API server does not answer") {
		t.Fatalf("Restart = %v, want the unreadable run named", err)
	}
	if !(&host.FS{Root: root}).Exists("/etc/kubernetes/manifests/kube-apiserver.yaml") {
		t.Error("the manifest was moved out although the restart could not tell the new run from the old")
	}
}
