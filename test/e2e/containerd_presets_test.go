package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/test/e2e/framework"
)

// testContainerdPresets lays worker-1's root out like each distro in turn and checks that the
// containerdRuntime command, with distro auto, writes that distro's file, leaves the others alone
// and restarts that distro's unit; removal takes the handler out again (docs/design.md, "containerd presets").
func testContainerdPresets(t *testing.T, l *framework.Local) {
	const node = "worker-1"
	root := l.NodeRoot(node)
	mainCfg := filepath.Join(root, "etc/containerd/config.toml")
	orig, err := os.ReadFile(mainCfg)
	if err != nil {
		t.Fatal(err)
	}
	withImports := strings.Replace(string(orig), "\n", "\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n", 1)
	v2 := "version = 2\n\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n"
	wants := "etc/systemd/system/multi-user.target.wants/"
	cases := []struct {
		name    string
		files   map[string]string // host path (relative) -> content, laid out before and removed after
		written string
		kept    []string
		unit    string
		drain   bool
		// cleanup is removed afterwards, so that the next case's root looks like its own distro only.
		cleanup string
	}{
		{name: "containerd-dropin", cleanup: "etc/containerd/conf.d", files: map[string]string{"etc/containerd/config.toml": withImports, "etc/containerd/conf.d/.keep": ""},
			written: "etc/containerd/conf.d/wasmedge.toml", kept: []string{"etc/containerd/config.toml"}, unit: "containerd"},
		{name: "k3s", cleanup: "var/lib/rancher", files: map[string]string{"var/lib/rancher/k3s/agent/etc/containerd/config.toml": v2, wants + "k3s-agent.service": ""},
			written: "var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl", kept: []string{"var/lib/rancher/k3s/agent/etc/containerd/config.toml", "etc/containerd/config.toml"}, unit: "k3s-agent", drain: true},
		{name: "rke2", cleanup: "var/lib/rancher", files: map[string]string{"var/lib/rancher/rke2/agent/etc/containerd/config.toml": v2, wants + "rke2-server.service": ""},
			written: "var/lib/rancher/rke2/agent/etc/containerd/config.toml.tmpl", kept: []string{"var/lib/rancher/rke2/agent/etc/containerd/config.toml", "etc/containerd/config.toml"}, unit: "rke2-server"},
		{name: "k0s", cleanup: "etc/k0s", files: map[string]string{"etc/k0s/containerd.toml": "version = 2\nimports = [\"/run/k0s/containerd-cri.toml\"]\n", wants + "k0sworker.service": ""},
			written: "etc/k0s/containerd.d/wasmedge.toml", kept: []string{"etc/k0s/containerd.toml", "etc/containerd/config.toml"}, unit: "k0sworker"},
		{name: "microk8s", cleanup: "var/snap", files: map[string]string{"var/snap/microk8s/current/args/containerd-template.toml": v2},
			written: "var/snap/microk8s/current/args/containerd-template.toml", kept: []string{"etc/containerd/config.toml"}, unit: "snap.microk8s.daemon-containerd"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for p, content := range tc.files {
				writeHostFile(t, root, p, content)
			}
			t.Cleanup(func() {
				writeHostFile(t, root, "etc/containerd/config.toml", string(orig))
				_ = os.RemoveAll(filepath.Join(root, tc.cleanup))
				for p := range tc.files {
					if strings.HasPrefix(p, wants) {
						_ = os.Remove(filepath.Join(root, p))
					}
				}
			})
			before := map[string]string{}
			for _, p := range tc.kept {
				data, _ := os.ReadFile(filepath.Join(root, p))
				before[p] = string(data)
			}
			restarts := framework.Restarts(t, root, tc.unit)
			add := v1alpha1.ContainerdRuntimeCommand{Name: "wasmedge", RuntimeType: "io.containerd.wasmedge.v1", BinaryPath: "/opt/kwasm/bin/containerd-shim-wasmedge-v1",
				Options: map[string]string{"SystemdCgroup": "true"}, PodAnnotations: []string{"io.wasmedge.*"}}
			if tc.drain {
				add.Restart = &v1alpha1.ContainerdRestart{Drain: true}
			}
			framework.RunOperation(t, l, customOp("ctrd-"+tc.name, onNode(node), v1alpha1.Command{ContainerdRuntime: &add}), v1alpha1.OperationSucceeded)
			got, err := os.ReadFile(filepath.Join(root, tc.written))
			if err != nil || !strings.Contains(string(got), "runtimes.wasmedge]") || !strings.Contains(string(got), "SystemdCgroup = true") || !strings.Contains(string(got), `pod_annotations = ["io.wasmedge.*"]`) {
				t.Errorf("%s (%v) lacks the handler, its options or annotations:\n%s", tc.written, err, got)
			}
			for p, b := range before {
				if data, _ := os.ReadFile(filepath.Join(root, p)); string(data) != b {
					t.Errorf("%s changed:\n%s", p, data)
				}
			}
			if n := framework.Restarts(t, root, tc.unit); n != restarts+1 {
				t.Errorf("%s restarted %d times, want %d:\n%s", tc.unit, n, restarts+1, framework.ServiceLog(t, root))
			}
			if tc.drain {
				task := framework.WaitForTask(t, l, "ctrd-"+tc.name, func(tk *v1alpha1.NodeTask) bool { return tk.Status.Phase == v1alpha1.TaskSucceeded })
				if msg := commandMessages(task); !strings.Contains(msg, "restarted after a drain") {
					t.Errorf("the task does not say it drained: %s", msg)
				}
				n := &corev1.Node{}
				if err := l.Client.Get(context.Background(), client.ObjectKey{Name: node}, n); err != nil || n.Spec.Unschedulable {
					t.Errorf("node %s unschedulable=%t after the drained restart (%v)", node, n.Spec.Unschedulable, err)
				}
			}
			rm := v1alpha1.ContainerdRuntimeCommand{Name: "wasmedge", Remove: true}
			framework.RunOperation(t, l, customOp("ctrd-rm-"+tc.name, onNode(node), v1alpha1.Command{ContainerdRuntime: &rm}), v1alpha1.OperationSucceeded)
			if data, err := os.ReadFile(filepath.Join(root, tc.written)); err == nil && strings.Contains(string(data), "wasmedge") {
				t.Errorf("handler still in %s after removal:\n%s", tc.written, data)
			}
		})
	}
}

func writeHostFile(t *testing.T, root, p, content string) {
	t.Helper()
	real := filepath.Join(root, p)
	if err := os.MkdirAll(filepath.Dir(real), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(real, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func commandMessages(task *v1alpha1.NodeTask) string {
	var msgs []string
	for _, c := range task.Status.Commands {
		msgs = append(msgs, c.Message)
	}
	return strings.Join(msgs, "; ")
}
