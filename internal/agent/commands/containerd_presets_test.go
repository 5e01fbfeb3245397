package commands

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/pelletier/go-toml/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/containerdtoml"
	"github.com/nodeops/nodeops/internal/drain"
	"github.com/nodeops/nodeops/internal/host"
	"github.com/nodeops/nodeops/internal/host/hosttest"
)

const (
	v2Config = "version = 2\n\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"runc\"\n\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n"
	v3Config = "version = 3\n\n[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n"
	// k3s' documented way to extend its generated config: the base template, then additions.
	k3sBaseTemplate = "{{ template \"base\" . }}\n\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.other]\n  runtime_type = \"io.containerd.other.v1\"\n"
)

// wasm is the handler the KWasm operator writes.
var wasm = containerdtoml.RuntimeHandler{Name: "wasmedge", RuntimeType: "io.containerd.wasmedge.v1", BinaryPath: "/opt/kwasm/bin/containerd-shim-wasmedge-v1"}

func parseTOML(t *testing.T, what string, data []byte) map[string]any {
	t.Helper()
	doc := map[string]any{}
	if err := toml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("%s does not parse: %v\n%s", what, err, data)
	}
	return doc
}

// Each preset on a host root laid out like that distro: the file written, the files left alone
// byte for byte, the unit restarted; then removal takes the handler out again.
func TestContainerdPresets(t *testing.T) {
	const (
		k3sDir  = "/var/lib/rancher/k3s/agent/etc/containerd/"
		rke2Dir = "/var/lib/rancher/rke2/agent/etc/containerd/"
		mk8s    = "/var/snap/microk8s/current/args/containerd-template.toml"
		wants   = "/etc/systemd/system/multi-user.target.wants/"
	)
	k0sMain := "# k0s_managed=true\nversion = 2\nimports = [\"/run/k0s/containerd-cri.toml\"]\n"
	mainWithImports := "version = 2\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"registry.k8s.io/pause:3.10\"\n"
	cases := []struct {
		name   string
		distro v1alpha1.ContainerdDistro
		files  map[string]string
		// written is the file the handler goes in; unchanged are files that must keep their bytes.
		written   string
		unchanged []string
		unit      string
		// removeDeletes: removing the handler deletes written, a drop-in that held only it.
		removeDeletes bool
		version       int64
		// keep is text of written that must survive the edit (a template's {{ }} line).
		keep string
	}{
		{name: "containerd v2", files: map[string]string{defaultContainerdConfig: v2Config},
			written: defaultContainerdConfig, unit: "containerd", version: 2},
		{name: "containerd v3", files: map[string]string{defaultContainerdConfig: v3Config},
			written: defaultContainerdConfig, unit: "containerd", version: 3},
		{name: "containerd with imports writes a drop-in", files: map[string]string{defaultContainerdConfig: mainWithImports, "/etc/containerd/conf.d/.keep": ""},
			written: "/etc/containerd/conf.d/wasmedge.toml", unchanged: []string{defaultContainerdConfig}, unit: "containerd", removeDeletes: true, version: 2},
		{name: "containerd with relative imports", files: map[string]string{defaultContainerdConfig: "version = 3\nimports = [\"conf.d/*.toml\"]\n"},
			written: "/etc/containerd/conf.d/wasmedge.toml", unchanged: []string{defaultContainerdConfig}, unit: "containerd", removeDeletes: true, version: 3},
		{name: "k3s server creates the template from the generated config", files: map[string]string{k3sDir + "config.toml": v2Config, "/etc/systemd/system/k3s.service": "", wants + "k3s.service": ""},
			written: k3sDir + "config.toml.tmpl", unchanged: []string{k3sDir + "config.toml"}, unit: "k3s", version: 2},
		{name: "k3s agent keeps its base template line", files: map[string]string{k3sDir + "config.toml": v2Config, k3sDir + "config.toml.tmpl": k3sBaseTemplate, "/etc/systemd/system/k3s-agent.service": "", wants + "k3s-agent.service": ""},
			written: k3sDir + "config.toml.tmpl", unchanged: []string{k3sDir + "config.toml"}, unit: "k3s-agent", version: 2, keep: "{{ template \"base\" . }}\n"},
		{name: "k3s with containerd 2 edits config-v3.toml.tmpl", files: map[string]string{k3sDir + "config.toml": v3Config, k3sDir + "config-v3.toml.tmpl": "{{ template \"base\" . }}\n", k3sDir + "config.toml.tmpl": k3sBaseTemplate},
			written: k3sDir + "config-v3.toml.tmpl", unchanged: []string{k3sDir + "config.toml", k3sDir + "config.toml.tmpl"}, unit: "k3s", version: 3, keep: "{{ template \"base\" . }}\n"},
		{name: "rke2 agent", files: map[string]string{rke2Dir + "config.toml": v2Config, "/usr/local/lib/systemd/system/rke2-server.service": "", "/usr/local/lib/systemd/system/rke2-agent.service": "", wants + "rke2-agent.service": ""},
			written: rke2Dir + "config.toml.tmpl", unchanged: []string{rke2Dir + "config.toml"}, unit: "rke2-agent", version: 2},
		{name: "rke2 server, distro named", distro: v1alpha1.ContainerdDistroRKE2, files: map[string]string{rke2Dir + "config.toml": v3Config, defaultContainerdConfig: v2Config, wants + "rke2-server.service": ""},
			written: rke2Dir + "config.toml.tmpl", unchanged: []string{rke2Dir + "config.toml", defaultContainerdConfig}, unit: "rke2-server", version: 3},
		{name: "k0s worker", files: map[string]string{"/etc/k0s/containerd.toml": k0sMain, "/etc/k0s/containerd.d/.keep": "", "/etc/systemd/system/k0sworker.service": ""},
			written: "/etc/k0s/containerd.d/wasmedge.toml", unchanged: []string{"/etc/k0s/containerd.toml"}, unit: "k0sworker", removeDeletes: true, version: 2},
		{name: "k0s controller", files: map[string]string{"/etc/k0s/containerd.toml": k0sMain, "/etc/systemd/system/k0scontroller.service": "", wants + "k0scontroller.service": ""},
			written: "/etc/k0s/containerd.d/wasmedge.toml", unchanged: []string{"/etc/k0s/containerd.toml"}, unit: "k0scontroller", removeDeletes: true, version: 2},
		{name: "microk8s", files: map[string]string{mk8s: "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"${SNAP_DATA}/pause\"\n"},
			written: mk8s, unit: "snap.microk8s.daemon-containerd", version: 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			env, root, out := localEnv(t, tc.files, false)
			add := &v1alpha1.ContainerdRuntimeCommand{Name: "wasmedge", RuntimeType: wasm.RuntimeType, BinaryPath: wasm.BinaryPath, Distro: tc.distro,
				Options: map[string]string{"BinaryName": "/usr/bin/wasmedge", "SystemdCgroup": "true", "Weight": "3"}, PodAnnotations: []string{"io.wasmedge.*"}}
			if _, err := Run(context.Background(), env, &v1alpha1.Command{ContainerdRuntime: add}); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			got := hosttest.ReadFile(t, root, tc.written)
			doc := parseTOML(t, tc.written, maskTemplate([]byte(got)))
			if v, ok := doc["version"].(int64); ok && v != tc.version {
				t.Errorf("version %d, want %d", v, tc.version)
			}
			base, _ := containerdtoml.RuntimesPath(tc.version)
			entry, _ := containerdtoml.Lookup(doc, append(base, "wasmedge")).(map[string]any)
			opts, _ := entry["options"].(map[string]any)
			if entry["runtime_type"] != wasm.RuntimeType || entry["runtime_path"] != wasm.BinaryPath || opts["SystemdCgroup"] != true ||
				opts["BinaryName"] != "/usr/bin/wasmedge" || opts["Weight"] != int64(3) || len(entry["pod_annotations"].([]any)) != 1 {
				t.Errorf("handler in %s = %v\n%s", tc.written, entry, got)
			}
			if tc.keep != "" && !strings.HasPrefix(got, tc.keep) {
				t.Errorf("%s lost its template line:\n%s", tc.written, got)
			}
			for _, p := range tc.unchanged {
				if hosttest.ReadFile(t, root, p) != tc.files[p] {
					t.Errorf("%s changed:\n%s", p, hosttest.ReadFile(t, root, p))
				}
			}
			if restarts := hosttest.ReadFile(t, root, host.LocalServiceLog); !strings.HasPrefix(restarts, "restart "+tc.unit+" ") || strings.Count(restarts, "\n") != 1 {
				t.Errorf("service table = %q, want one restart of %s", restarts, tc.unit)
			}

			rm := &v1alpha1.ContainerdRuntimeCommand{Name: "wasmedge", Remove: true, Distro: tc.distro}
			if _, err := Run(context.Background(), env, &v1alpha1.Command{ContainerdRuntime: rm}); err != nil {
				t.Fatalf("remove: %v\n%s", err, out)
			}
			real := filepath.Join(root, tc.written)
			if tc.removeDeletes {
				if _, err := os.Stat(real); !os.IsNotExist(err) {
					t.Errorf("drop-in %s still there after removal (%v)", tc.written, err)
				}
			} else if after := hosttest.ReadFile(t, root, tc.written); strings.Contains(after, "wasmedge") {
				t.Errorf("handler still in %s after removal:\n%s", tc.written, after)
			} else if orig, ok := tc.files[tc.written]; ok && after != orig {
				t.Errorf("add then remove did not give back %s byte for byte:\n%s", tc.written, after)
			}
			for _, p := range tc.unchanged {
				if hosttest.ReadFile(t, root, p) != tc.files[p] {
					t.Errorf("%s changed by removal", p)
				}
			}
			if n := strings.Count(hosttest.ReadFile(t, root, host.LocalServiceLog), "restart "+tc.unit+" "); n != 2 {
				t.Errorf("%s restarted %d times, want 2", tc.unit, n)
			}
		})
	}
}

// configPath still overrides the preset's file; the preset still names the unit.
func TestContainerdConfigPathOverridesPreset(t *testing.T) {
	env, root, _ := localEnv(t, map[string]string{"/opt/ctrd/config.toml": v3Config, "/etc/k0s/containerd.toml": "version = 2\n", wants0 + "k0sworker.service": ""}, false)
	c := &v1alpha1.ContainerdRuntimeCommand{Name: "spin", RuntimeType: "io.containerd.spin.v2", ConfigPath: "/opt/ctrd/config.toml"}
	if _, err := Run(context.Background(), env, &v1alpha1.Command{ContainerdRuntime: c}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(hosttest.ReadFile(t, root, "/opt/ctrd/config.toml"), "runtimes.spin]") {
		t.Errorf("configPath not edited")
	}
	if hosttest.ReadFile(t, root, "/etc/k0s/containerd.toml") != "version = 2\n" {
		t.Errorf("the preset's file was edited though configPath was set")
	}
	if log := hosttest.ReadFile(t, root, host.LocalServiceLog); !strings.HasPrefix(log, "restart k0sworker ") {
		t.Errorf("service table = %q", log)
	}
}

const wants0 = "/etc/systemd/system/multi-user.target.wants/"

func TestDropInPath(t *testing.T) {
	for _, tc := range []struct {
		imports []any
		want    string
	}{
		{[]any{"/etc/containerd/conf.d/*.toml"}, "/etc/containerd/conf.d/h.toml"},
		{[]any{"/etc/containerd/extra.toml", "conf.d/*.toml"}, "/etc/containerd/conf.d/h.toml"},
		{[]any{"/etc/containerd/conf.d/*.conf"}, ""},
		{[]any{"/etc/*/x.toml"}, ""},
		{nil, ""},
	} {
		if got := dropInPath(defaultContainerdConfig, tc.imports, "h"); got != tc.want {
			t.Errorf("dropInPath(%v) = %q, want %q", tc.imports, got, tc.want)
		}
	}
}

// observingServices records, at each restart, whether the node was cordoned and which pods were left on it.
type observingServices struct {
	env  *Env
	seen []string
}

func (o *observingServices) Name() string { return "observing" }

func (o *observingServices) Supported() error { return nil }

func (o *observingServices) Restart(ctx context.Context, name string) error {
	n := &corev1.Node{}
	if err := o.env.Client.Get(ctx, client.ObjectKey{Name: o.env.NodeName}, n); err != nil {
		return err
	}
	pods := &corev1.PodList{}
	if err := o.env.Client.List(ctx, pods); err != nil {
		return err
	}
	o.seen = append(o.seen, fmt.Sprintf("restart %s unschedulable=%t pods=%d", name, n.Spec.Unschedulable, len(pods.Items)))
	return nil
}

// clientDrainer drains through c, as the manager does for the agent (internal/controller/nodetask).
type clientDrainer struct {
	c    client.Client
	node string
}

func (d clientDrainer) Drain(ctx context.Context, spec *v1alpha1.DrainCommand, out io.Writer) (string, error) {
	return drain.Run(ctx, drain.Target{Node: d.node, Client: d.c, Reader: d.c, Poll: 10 * time.Millisecond, Out: out}, spec)
}

// restart.drain: the node is cordoned and its pods evicted when containerd restarts, and schedulable again after.
func TestContainerdRestartDrains(t *testing.T) {
	env, _, out := localEnv(t, map[string]string{defaultContainerdConfig: v3Config}, false)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-1", Namespace: "default",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web", UID: "u1", Controller: ptr.To(true)}}},
		Spec: corev1.PodSpec{NodeName: "node-a"}}
	env.Client = fake.NewClientBuilder().WithObjects(node, pod).
		WithIndex(&corev1.Pod{}, "spec.nodeName", func(o client.Object) []string { return []string{o.(*corev1.Pod).Spec.NodeName} }).Build()
	env.Drainer = clientDrainer{c: env.Client, node: env.NodeName}
	obs := &observingServices{env: env}
	env.Host.Services = obs
	c := &v1alpha1.ContainerdRuntimeCommand{Name: "spin", RuntimeType: "io.containerd.spin.v2", Restart: &v1alpha1.ContainerdRestart{Drain: true}}
	res, err := Run(context.Background(), env, &v1alpha1.Command{ContainerdRuntime: c})
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if want := []string{"restart containerd unschedulable=true pods=0"}; !reflect.DeepEqual(obs.seen, want) {
		t.Errorf("at the restart: %v, want %v", obs.seen, want)
	}
	after := &corev1.Node{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: "node-a"}, after); err != nil || after.Spec.Unschedulable || after.Annotations[AnnotationWasUnschedulable] != "" {
		t.Errorf("after: unschedulable=%t annotations=%v (%v)", after.Spec.Unschedulable, after.Annotations, err)
	}
	if !strings.Contains(res.Message, "restarted after a drain") {
		t.Errorf("message %q", res.Message)
	}
}

// A node the task's owner cordoned before the command stays cordoned after the drained restart:
// the task's own uncordon restores it.
func TestContainerdRestartDrainKeepsAnEarlierCordon(t *testing.T) {
	env, _, out := localEnv(t, map[string]string{defaultContainerdConfig: v3Config}, false)
	env.Client = fake.NewClientBuilder().WithObjects(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}).
		WithIndex(&corev1.Pod{}, "spec.nodeName", func(o client.Object) []string { return []string{o.(*corev1.Pod).Spec.NodeName} }).Build()
	env.Drainer = clientDrainer{c: env.Client, node: env.NodeName}
	ctx := context.Background()
	if _, err := Run(ctx, env, &v1alpha1.Command{Cordon: &v1alpha1.CordonCommand{}}); err != nil {
		t.Fatal(err)
	}
	c := &v1alpha1.ContainerdRuntimeCommand{Name: "spin", RuntimeType: "io.containerd.spin.v2", Restart: &v1alpha1.ContainerdRestart{Drain: true}}
	if _, err := Run(ctx, env, &v1alpha1.Command{ContainerdRuntime: c}); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	n := &corev1.Node{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "node-a"}, n); err != nil || !n.Spec.Unschedulable {
		t.Fatalf("the drained restart uncordoned a node cordoned before it (%v)", err)
	}
	if _, err := Run(ctx, env, &v1alpha1.Command{Uncordon: &v1alpha1.UncordonCommand{}}); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "node-a"}, n); err != nil || n.Spec.Unschedulable {
		t.Errorf("the task's uncordon did not restore the node (%v)", err)
	}
}

// A dry run resolves the preset and reports, but creates no drop-in and restarts nothing.
func TestContainerdPresetDryRun(t *testing.T) {
	env, root, out := localEnv(t, map[string]string{"/etc/k0s/containerd.toml": "version = 2\n"}, true)
	c := &v1alpha1.ContainerdRuntimeCommand{Name: "spin", RuntimeType: "io.containerd.spin.v2"}
	if _, err := Run(context.Background(), env, &v1alpha1.Command{ContainerdRuntime: c}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "etc/k0s/containerd.d/spin.toml")); !os.IsNotExist(err) {
		t.Errorf("a dry run created the drop-in (%v)", err)
	}
	if log := hosttest.ReadFile(t, root, host.LocalServiceLog); log != "" {
		t.Errorf("a dry run restarted: %q", log)
	}
	if !strings.Contains(out.String(), "/etc/k0s/containerd.d/spin.toml") || !strings.Contains(out.String(), "k0sworker") {
		t.Errorf("the dry run does not say what it would do:\n%s", out)
	}
}
