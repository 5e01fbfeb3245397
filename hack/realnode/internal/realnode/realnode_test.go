package realnode

import (
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

func TestParseEnvFileAndKubeletArgs(t *testing.T) {
	tests := []struct {
		name, content string
		want          []string
		wantErr       bool
	}{
		{"kubeadm flags", `KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix:///run/x.sock --pod-infra-container-image=registry.k8s.io/pause:3.10.2"` + "\n",
			[]string{"--container-runtime-endpoint=unix:///run/x.sock", "--pod-infra-container-image=registry.k8s.io/pause:3.10.2"}, false},
		{"comments, single quotes, blank lines", "# made by kubeadm\n\nKUBELET_KUBEADM_ARGS='--v=2'\n", []string{"--v=2"}, false},
		{"empty", "", nil, false},
		{"not key=value", "garbage\n", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, err := ParseEnvFile(tt.content)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			got := KubeletArgs("/usr/bin/kubelet", env, map[string]string{})
			want := append([]string{"/usr/bin/kubelet", "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
				"--kubeconfig=/etc/kubernetes/kubelet.conf", "--config=/var/lib/kubelet/config.yaml"}, tt.want...)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("args = %q, want %q", got, want)
			}
		})
	}
	extra := KubeletArgs("k", map[string]string{}, map[string]string{"KUBELET_EXTRA_ARGS": " --v=4  --max-pods=50 "})
	if got := strings.Join(extra[4:], " "); got != "--v=4 --max-pods=50" {
		t.Errorf("extra args = %q", got)
	}
}

func TestImageSpecs(t *testing.T) {
	list := []string{"registry.k8s.io/kube-apiserver:v1.36.3", "registry.k8s.io/kube-proxy:v1.36.3",
		"registry.k8s.io/coredns/coredns:v1.14.2", "registry.k8s.io/pause:3.10.2", "registry.k8s.io/etcd:3.6.8-0", ""}
	got, err := ImageSpecs(list, "/k", "/t")
	if err != nil {
		t.Fatal(err)
	}
	want := []ImageSpec{
		{Ref: "registry.k8s.io/kube-apiserver:v1.36.3", Binary: "/k/kube-apiserver", Path: "/usr/local/bin/kube-apiserver"},
		{Ref: "registry.k8s.io/pause:3.10.2", Binary: "/t/pause", Path: "/pause"},
		{Ref: "registry.k8s.io/etcd:3.6.8-0", Binary: "/k/etcd", Path: "/usr/local/bin/etcd"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("specs = %+v\nwant %+v", got, want)
	}
	if _, err := ImageSpecs([]string{"registry.k8s.io/something-new:v1"}, "/k", "/t"); err == nil {
		t.Error("an unknown image must be an error, not silently skipped")
	}
}

func TestRewriteManifests(t *testing.T) {
	in := `# leading comment
apiVersion: apps/v1
kind: Deployment
metadata: {name: nodeops-manager, namespace: nodeops-system}
spec:
  template:
    spec:
      containers:
      - name: manager
        image: ghcr.io/nodeops/manager:latest
        env:
        - {name: KUBERNETES_SERVICE_HOST, value: old}
        - {name: KEEP, value: "1"}
      - name: sidecar
        image: busybox:1
---
apiVersion: v1
kind: Namespace
metadata: {name: nodeops-system}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: nodeops-agent, namespace: nodeops-system}
spec:
  template:
    spec:
      containers:
      - {name: agent, image: "nodeops/agent"}
`
	out, workloads, err := RewriteManifests([]byte(in), map[string]string{"manager": "local/manager:x", "agent": "local/agent:x"}, "192.0.2.2", "6443")
	if err != nil {
		t.Fatal(err)
	}
	wantW := []Workload{{"Deployment", "nodeops-system", "nodeops-manager"}, {"DaemonSet", "nodeops-system", "nodeops-agent"}}
	if !reflect.DeepEqual(workloads, wantW) {
		t.Errorf("workloads = %v, want %v", workloads, wantW)
	}
	docs := strings.Split(string(out), "---\n")
	if len(docs) != 3 || !strings.Contains(docs[0], "kind: Namespace") {
		t.Fatalf("want the namespace first of 3 docs, got:\n%s", out)
	}
	var dep map[string]any
	if err := yaml.Unmarshal([]byte(docs[1]), &dep); err != nil {
		t.Fatal(err)
	}
	ctrs := dig(dep, "spec", "template", "spec", "containers").([]any)
	mgr := ctrs[0].(map[string]any)
	if mgr["image"] != "local/manager:x" || mgr["imagePullPolicy"] != "Never" {
		t.Errorf("manager container = %v", mgr)
	}
	wantEnv := []any{map[string]any{"name": "KEEP", "value": "1"},
		map[string]any{"name": "KUBERNETES_SERVICE_HOST", "value": "192.0.2.2"},
		map[string]any{"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}}
	if !reflect.DeepEqual(mgr["env"], wantEnv) {
		t.Errorf("env = %v, want %v", mgr["env"], wantEnv)
	}
	if side := ctrs[1].(map[string]any); side["image"] != "busybox:1" || side["env"] != nil {
		t.Errorf("other containers must be left alone: %v", side)
	}
	if _, _, err := RewriteManifests([]byte("kind: Deployment\nmetadata: {name: x}\nspec: {template: {spec: {containers: [{name: c, image: other}]}}}\n"),
		map[string]string{"manager": "m"}, "h", "p"); err == nil {
		t.Error("a workload without a nodeops image must be an error")
	}
}

func TestNodeProcessAndMountMatching(t *testing.T) {
	cgroups := []struct {
		content string
		want    bool
	}{
		{"12:memory:/kubepods/burstable/pod1/abc\n11:cpu:/kubepods/burstable/pod1/abc\n", true},
		{"3:pids:/k8s.io/abc\n", true},
		{"0::/\n12:memory:/user.slice\n", false},
		{"12:memory:/kubepodsx\n", false},
	}
	for _, c := range cgroups {
		if got := InNodeCgroup(c.content); got != c.want {
			t.Errorf("InNodeCgroup(%q) = %v, want %v", c.content, got, c.want)
		}
	}
	mounts := map[string]bool{
		"/var/lib/kubelet/pods/x/volumes/kubernetes.io~projected/kube-api-access":          true,
		"/run/nodeops-realnode/containerd/io.containerd.runtime.v2.task/k8s.io/abc/rootfs": true,
		"/run/netns/cni-1234": true,
		"/var/lib/kubeletx":   false,
		"/run/netns/other":    false,
		"/":                   false,
	}
	for p, want := range mounts {
		if got := NodeMount(p); got != want {
			t.Errorf("NodeMount(%q) = %v, want %v", p, got, want)
		}
	}
}

func TestIsPackageLine(t *testing.T) {
	for line, want := range map[string]bool{
		"k8s.io/kubernetes/pkg/kubelet": true, "github.com/x/y/v2": true, "go: downloading x v1": false,
		"# k8s.io/x": false, "./main.go:3:2: undefined: x": false, "": false,
	} {
		if got := isPackageLine(line); got != want {
			t.Errorf("isPackageLine(%q) = %v, want %v", line, got, want)
		}
	}
}

func TestConfigsNameTheNodesOwnPaths(t *testing.T) {
	c := ContainerdConfig("registry.k8s.io/pause:3.10.2")
	for _, want := range []string{"restrict_oom_score_adj = true", "disable_apparmor = true", ContainerdSock, "sandbox = \"registry.k8s.io/pause:3.10.2\""} {
		if !strings.Contains(c, want) {
			t.Errorf("containerd config lacks %q", want)
		}
	}
	k := KubeadmConfig("v1.36.3", "192.0.2.2")
	for _, want := range []string{"failCgroupV1: false", "cgroupDriver: cgroupfs", "imagePullPolicy: Never", "- addon/kube-proxy", "kubernetesVersion: v1.36.3"} {
		if !strings.Contains(k, want) {
			t.Errorf("kubeadm config lacks %q", want)
		}
	}
}
