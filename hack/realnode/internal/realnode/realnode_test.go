package realnode

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
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

func TestRewriteManifestsSetsTheAPIAddressAndLeavesImages(t *testing.T) {
	in := `# leading comment
apiVersion: apps/v1
kind: Deployment
metadata: {name: nodeops-manager, namespace: nodeops-system}
spec:
  template:
    spec:
      containers:
      - name: manager
        image: ghcr.io/nodeops/manager@sha256:cd65d7be9fadcd70f8ec5b640240a78f515621691b57b5c4753df466916e8687
        imagePullPolicy: Never
        env:
        - {name: KUBERNETES_SERVICE_HOST, value: old}
        - {name: KEEP, value: "1"}
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
      - {name: agent, image: "ghcr.io/nodeops/agent:v1"}
`
	out, workloads, err := RewriteManifests([]byte(in), "192.0.2.2", "6443")
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
	var dep, ds map[string]any
	if err := yaml.Unmarshal([]byte(docs[1]), &dep); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal([]byte(docs[2]), &ds); err != nil {
		t.Fatal(err)
	}
	mgr := dig(dep, "spec", "template", "spec", "containers").([]any)[0].(map[string]any)
	if mgr["image"] != "ghcr.io/nodeops/manager@sha256:cd65d7be9fadcd70f8ec5b640240a78f515621691b57b5c4753df466916e8687" || mgr["imagePullPolicy"] != "Never" {
		t.Errorf("the chart's image and pull policy must be left as rendered: %v", mgr)
	}
	wantEnv := []any{map[string]any{"name": "KEEP", "value": "1"},
		map[string]any{"name": "KUBERNETES_SERVICE_HOST", "value": "192.0.2.2"},
		map[string]any{"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}}
	if !reflect.DeepEqual(mgr["env"], wantEnv) {
		t.Errorf("env = %v, want %v", mgr["env"], wantEnv)
	}
	agent := dig(ds, "spec", "template", "spec", "containers").([]any)[0].(map[string]any)
	if agent["image"] != "ghcr.io/nodeops/agent:v1" || !reflect.DeepEqual(agent["env"], wantEnv[1:]) {
		t.Errorf("agent container = %v", agent)
	}
	if _, _, err := RewriteManifests([]byte("kind: ConfigMap\nmetadata: {name: x}\n"), "h", "p"); err == nil {
		t.Error("a rendered chart without nodeops' workloads must be an error")
	}
}

const (
	managerDigest = "sha256:cd65d7be9fadcd70f8ec5b640240a78f515621691b57b5c4753df466916e8687"
	agentDigest   = "sha256:b2644544b37ec9ac1286b730f3030e56ea7e1b46c4b966eb6fff2f967cc172ac"
)

// digestsEnv is a digests.env as `make images` writes it (hack/images writeOutputs).
const digestsEnv = `# Written by make images (hack/images) for revision 6351d04; digests of OCI image indexes.
NODEOPS_IMAGE_VERSION=6351d04
NODEOPS_MANAGER_IMAGE=ghcr.io/nodeops/manager@` + managerDigest + `
NODEOPS_MANAGER_DIGEST=` + managerDigest + `
NODEOPS_AGENT_IMAGE=registry.example/x/agent@` + agentDigest + `
NODEOPS_AGENT_DIGEST=` + agentDigest + `
`

func TestParseDigests(t *testing.T) {
	got, err := ParseDigests(digestsEnv)
	if err != nil {
		t.Fatal(err)
	}
	want := []NodeopsImage{
		{Name: "manager", Repository: "ghcr.io/nodeops/manager", Digest: managerDigest},
		{Name: "agent", Repository: "registry.example/x/agent", Digest: agentDigest},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("images = %+v\nwant %+v", got, want)
	}
	if got[1].Ref() != "registry.example/x/agent@"+agentDigest {
		t.Errorf("Ref() = %s", got[1].Ref())
	}
	for name, content := range map[string]string{
		"no agent":                  strings.Join(strings.Split(digestsEnv, "\n")[:4], "\n"),
		"image and digest disagree": strings.Replace(digestsEnv, "NODEOPS_AGENT_DIGEST="+agentDigest, "NODEOPS_AGENT_DIGEST="+managerDigest, 1),
		"image by tag":              strings.Replace(digestsEnv, "x/agent@"+agentDigest, "x/agent:v1", 1),
		"not a digest":              strings.ReplaceAll(digestsEnv, agentDigest, "sha256:abc"),
		"not KEY=VALUE":             digestsEnv + "garbage\n",
	} {
		if _, err := ParseDigests(content); err == nil {
			t.Errorf("%s: want an error", name)
		}
	}
}

func TestReadNodeopsImagesChecksEachLayoutHoldsItsDigest(t *testing.T) {
	dir := t.TempDir()
	writeLayout := func(name, digest string) {
		t.Helper()
		if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
		index := `{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.index.v1+json","size":927,"digest":"` + digest + `"}]}`
		for file, content := range map[string]string{"index.json": index, "oci-layout": `{"imageLayoutVersion":"1.0.0"}`, "blobs/sha256/" + strings.TrimPrefix(digest, "sha256:"): "{}"} {
			path := filepath.Join(dir, name, file)
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := ReadNodeopsImages(dir); err == nil || !strings.Contains(err.Error(), "make images") {
		t.Errorf("without digests.env: %v, want an error that says to run make images", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "digests.env"), []byte(digestsEnv), 0o644); err != nil {
		t.Fatal(err)
	}
	writeLayout("manager", managerDigest)
	writeLayout("agent", managerDigest) // an older build's layout
	if _, err := ReadNodeopsImages(dir); err == nil || !strings.Contains(err.Error(), agentDigest) {
		t.Errorf("a layout holding another index: %v, want an error naming %s", err, agentDigest)
	}
	writeLayout("agent", agentDigest)
	imgs, err := ReadNodeopsImages(dir)
	if err != nil || len(imgs) != 2 {
		t.Fatalf("images %v, %v", imgs, err)
	}

	// The oci-archive ctr imports: the layout's files, named relative to it.
	var buf bytes.Buffer
	if err := TarDir(&buf, filepath.Join(dir, "agent")); err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(&buf)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, hdr.Name)
	}
	wantNames := []string{"blobs/", "blobs/sha256/", "blobs/sha256/" + strings.TrimPrefix(agentDigest, "sha256:"), "index.json", "oci-layout"}
	if !reflect.DeepEqual(names, wantNames) {
		t.Errorf("archive entries %q, want %q", names, wantNames)
	}
}

func TestTheChartIsInstalledWithTheValuesMakeImagesWrote(t *testing.T) {
	img := NodeopsImage{Name: "agent", Repository: "ghcr.io/nodeops/agent", Digest: agentDigest}
	wantImport := "--address " + ContainerdSock + " -n k8s.io images import --local --all-platforms --digests --base-name ghcr.io/nodeops/agent -"
	if got := strings.Join(ImportArgs(img), " "); got != wantImport {
		t.Errorf("ctr %s\nwant ctr %s", got, wantImport)
	}
	args := strings.Join(HelmInstallArgs("/repo/charts/nodeops", "/out/images/values.yaml", "/bin/realnode", "192.0.2.2"), " ")
	for _, want := range []string{
		"install nodeops /repo/charts/nodeops ", "-f /out/images/values.yaml",
		"--set image.manager.pullPolicy=Never", "--set image.agent.pullPolicy=Never",
		"--set manager.replicas=1", "--set manager.podDisruptionBudget.enabled=false",
		"--post-renderer /bin/realnode --post-renderer-args post-render --post-renderer-args 192.0.2.2",
	} {
		if !strings.Contains(args, want) {
			t.Errorf("helm %s\nlacks %q", args, want)
		}
	}
	// The images come from the values file alone: no repository, tag or digest is set beside it.
	for _, not := range []string{".repository=", ".tag=", ".digest="} {
		if strings.Contains(args, not) {
			t.Errorf("helm %s\nsets %s", args, not)
		}
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
