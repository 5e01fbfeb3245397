package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/internal/localcluster"
	"github.com/nodeops/nodeops/internal/testutil"
	"github.com/nodeops/nodeops/test/e2e/framework"
)

// TestLocalStandIns checks what nodeops-local provides in place of parts of a real cluster: the
// binary source upgrades download from, and the control planes' mirror pods (the kubelet's job).
func TestLocalStandIns(t *testing.T) {
	t.Parallel()
	l := framework.StartLocal(t, "--control-planes=2", "--workers=1", "--no-manager", "--no-agents")

	t.Run("the binary source serves kubeadm, kubelet and kubectl with their sha256", func(t *testing.T) {
		base := l.BinarySourceURL(t)
		for _, name := range []string{"kubeadm", "kubelet", "kubectl"} {
			url := fmt.Sprintf("%s/v1.37.2/bin/linux/amd64/%s", base, name)
			got := framework.SHA256(t, framework.HTTPGet(t, url))
			want := framework.FileSHA256(t, filepath.Join(l.BinDir, name))
			published := framework.HTTPGetText(t, url+".sha256")
			if got != want || published != want {
				t.Errorf("%s: downloaded sha256 %s, published %q, bin/%s has %s", url, got, published, name, want)
			}
		}
	})

	t.Run("each control plane has a Running mirror pod per static pod manifest", func(t *testing.T) {
		for _, node := range []string{"cp-1", "cp-2"} {
			for _, component := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
				name := component + "-" + node
				testutil.EventuallyEvery(t, time.Minute, framework.PollInterval, "mirror pod "+name+" Running", func(ctx context.Context) error {
					var p corev1.Pod
					if err := l.Client.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: name}, &p); err != nil {
						return err
					}
					if p.Spec.NodeName != node || p.Annotations[localcluster.AnnotationConfigHash] == "" || p.Annotations[localcluster.AnnotationConfigMirror] == "" {
						return fmt.Errorf("node %q annotations %v", p.Spec.NodeName, p.Annotations)
					}
					if p.Status.Phase != corev1.PodRunning {
						return fmt.Errorf("phase %s", p.Status.Phase)
					}
					return nil
				})
			}
		}
		var p corev1.Pod
		if err := l.Client.Get(context.Background(), client.ObjectKey{Namespace: "kube-system", Name: "kube-apiserver-cp-2"}, &p); err != nil {
			t.Fatal(err)
		}
		if got := p.Annotations[localcluster.AnnotationAdvertiseAddress]; got != "192.0.2.12:6443" {
			t.Errorf("kube-apiserver-cp-2 advertise-address endpoint %q", got)
		}
	})

	// The mirror pods and the TLS etcd are what `kubeadm upgrade apply` needs to finish without a kubelet.
	t.Run("kubeadm upgrades the control planes and the worker for real", func(t *testing.T) {
		out := kubeadmInRoot(t, l.NodeRoot("cp-1"), "upgrade", "apply", "v1.37.2", "--yes")
		if !strings.Contains(out, `SUCCESS! A control plane node of your cluster was upgraded to "v1.37.2"`) {
			t.Fatalf("kubeadm upgrade apply on cp-1:\n%s", out)
		}
		var p corev1.Pod
		if err := l.Client.Get(context.Background(), client.ObjectKey{Namespace: "kube-system", Name: "kube-apiserver-cp-1"}, &p); err != nil {
			t.Fatal(err)
		}
		if img := p.Spec.Containers[0].Image; img != "registry.k8s.io/kube-apiserver:v1.37.2" {
			t.Errorf("kube-apiserver-cp-1 runs %s after the upgrade", img)
		}
		kubeadmInRoot(t, l.NodeRoot("cp-2"), "upgrade", "node")
		// nodeops-local writes the kubelet configuration as kubeadm does: a hand edit tells the rewrite.
		config := filepath.Join(l.NodeRoot("worker-1"), "var/lib/kubelet/config.yaml")
		before, err := os.ReadFile(config)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(config, append(slices.Clone(before), "maxPods: 7\n"...), 0o644); err != nil {
			t.Fatal(err)
		}
		kubeadmInRoot(t, l.NodeRoot("worker-1"), "upgrade", "node")
		after, err := os.ReadFile(config)
		if err != nil || string(after) != string(before) {
			t.Errorf("kubeadm upgrade node did not rewrite worker-1's %s as nodeops-local rendered it (%v):\n%s", config, err, after)
		}
	})

	t.Run("mirror pods follow their manifests", func(t *testing.T) {
		manifests := filepath.Join(l.NodeRoot("cp-1"), "etc/kubernetes/manifests")
		manifest := filepath.Join(manifests, "kube-scheduler.yaml")
		key := client.ObjectKey{Namespace: "kube-system", Name: "kube-scheduler-cp-1"}
		var before corev1.Pod
		if err := l.Client.Get(context.Background(), key, &before); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(manifest)
		if err != nil {
			t.Fatal(err)
		}
		changed := regexp.MustCompile(`(image: \S+/kube-scheduler):\S+`).ReplaceAllString(string(data), "${1}:v1.99.0")
		if changed == string(data) {
			t.Fatalf("no kube-scheduler image in %s:\n%s", manifest, data)
		}
		if err := os.WriteFile(manifest, []byte(changed), 0o600); err != nil {
			t.Fatal(err)
		}
		testutil.EventuallyEvery(t, time.Minute, framework.PollInterval, "kube-scheduler-cp-1 to follow its new manifest", func(ctx context.Context) error {
			var p corev1.Pod
			if err := l.Client.Get(ctx, key, &p); err != nil {
				return err
			}
			if p.Annotations[localcluster.AnnotationConfigHash] == before.Annotations[localcluster.AnnotationConfigHash] ||
				p.Spec.Containers[0].Image != "registry.k8s.io/kube-scheduler:v1.99.0" {
				return fmt.Errorf("image %s, hash %s", p.Spec.Containers[0].Image, p.Annotations[localcluster.AnnotationConfigHash])
			}
			return nil
		})
		// kubeadm restarts a static pod by moving its manifest out and back.
		aside := filepath.Join(l.NodeRoot("cp-1"), "etc/kubernetes/kube-scheduler.yaml")
		if err := os.Rename(manifest, aside); err != nil {
			t.Fatal(err)
		}
		testutil.EventuallyEvery(t, time.Minute, framework.PollInterval, "kube-scheduler-cp-1 to go with its manifest", func(ctx context.Context) error {
			err := l.Client.Get(ctx, key, &corev1.Pod{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			if err != nil {
				return err
			}
			return fmt.Errorf("still there")
		})
		if err := os.Rename(aside, manifest); err != nil {
			t.Fatal(err)
		}
		testutil.EventuallyEvery(t, time.Minute, framework.PollInterval, "kube-scheduler-cp-1 to come back", func(ctx context.Context) error {
			if err := l.Client.Get(ctx, key, &corev1.Pod{}); err != nil {
				return err
			}
			return nil
		})
	})
}

// kubeadmInRoot runs the root's kubeadm chrooted into it, without the preflight checks that cannot
// pass there.
func kubeadmInRoot(t *testing.T, root string, args ...string) string {
	t.Helper()
	args = append(append([]string{root, "/usr/bin/kubeadm"}, args...), "--ignore-preflight-errors="+strings.Join(framework.LocalPreflightIgnores, ","))
	out, err := exec.Command("chroot", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("chroot %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}
