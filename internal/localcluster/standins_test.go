package localcluster

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/nodeops/nodeops/internal/controller/agentjob"
)

func TestBinarySource(t *testing.T) {
	bin := t.TempDir()
	content := []byte("a kubeadm binary")
	if err := os.WriteFile(filepath.Join(bin, "kubeadm"), content, 0o755); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(&binarySource{bin: bin, version: "v1.37.2"})
	defer srv.Close()
	sum := sha256.Sum256(content)
	tests := []struct {
		path   string
		status int
		body   string
	}{
		{"/v1.37.2/bin/linux/amd64/kubeadm", http.StatusOK, string(content)},
		{"/v1.37.2/bin/linux/amd64/kubeadm.sha256", http.StatusOK, hex.EncodeToString(sum[:])},
		{"/v1.36.0/bin/linux/amd64/kubeadm", http.StatusNotFound, ""},
		{"/v1.37.2/bin/linux/amd64/etcd", http.StatusNotFound, ""},
		{"/v1.37.2/bin/linux/amd64/../../../../kubeadm", http.StatusNotFound, ""},
		{"/v1.37.2/bin/linux/amd64/kubelet", http.StatusNotFound, ""}, // served, but absent from bin/
	}
	for _, tt := range tests {
		resp, err := http.Get(srv.URL + tt.path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.status || (tt.body != "" && string(body) != tt.body) {
			t.Errorf("GET %s: %d %q, want %d %q", tt.path, resp.StatusCode, body, tt.status, tt.body)
		}
	}
}

func TestMirrorPods(t *testing.T) {
	apiserver := []byte(`apiVersion: v1
kind: Pod
metadata:
  annotations:
    kubeadm.kubernetes.io/kube-apiserver.advertise-address.endpoint: 192.0.2.11:6443
  labels:
    component: kube-apiserver
  name: kube-apiserver
  namespace: kube-system
spec:
  containers:
  - name: kube-apiserver
    image: registry.k8s.io/kube-apiserver:v1.36.4
`)
	changed := append([]byte(nil), apiserver...)
	changed = append(changed[:len(changed)-len("v1.36.4\n")], []byte("v1.37.2\n")...)
	a, err := MirrorPods("cp-1", map[string][]byte{"kube-apiserver.yaml": apiserver}, "https://127.0.0.1:2379")
	if err != nil {
		t.Fatal(err)
	}
	b, err := MirrorPods("cp-1", map[string][]byte{"kube-apiserver.yaml": changed}, "https://127.0.0.1:2379")
	if err != nil {
		t.Fatal(err)
	}
	p := a[0]
	if p.Name != "kube-apiserver-cp-1" || p.Namespace != "kube-system" || p.Spec.NodeName != "cp-1" {
		t.Errorf("mirror pod %s/%s on %q", p.Namespace, p.Name, p.Spec.NodeName)
	}
	if p.Annotations[AnnotationAdvertiseAddress] != "192.0.2.11:6443" || p.Labels["component"] != "kube-apiserver" {
		t.Errorf("manifest metadata not kept: %v %v", p.Annotations, p.Labels)
	}
	if h := p.Annotations[AnnotationConfigHash]; h == "" || p.Annotations[AnnotationConfigMirror] != h {
		t.Errorf("config hash %q, mirror %q", h, p.Annotations[AnnotationConfigMirror])
	}
	if a[0].Annotations[AnnotationConfigHash] == b[0].Annotations[AnnotationConfigHash] {
		t.Errorf("the config hash did not change with the manifest")
	}
	etcd := []byte(`apiVersion: v1
kind: Pod
metadata:
  annotations:
    kubeadm.kubernetes.io/etcd.advertise-client-urls: https://192.0.2.11:2379
  name: etcd
`)
	e, err := MirrorPods("cp-1", map[string][]byte{"etcd.yaml": etcd}, "https://127.0.0.1:2379")
	if err != nil || e[0].Name != "etcd-cp-1" || e[0].Annotations[AnnotationEtcdClientURLs] != "https://127.0.0.1:2379" {
		t.Errorf("etcd mirror pod does not advertise the local etcd: %v %v", err, e)
	}
	if _, err := MirrorPods("cp-1", map[string][]byte{"broken.yaml": []byte("kind: [")}, ""); err == nil {
		t.Errorf("a broken manifest was accepted")
	}
}

// The kubelet-version stand-in counts the root's kubelet restarts and asks the root's kubelet
// binary for its version, as a restarted kubelet reports it.
func TestKubeletStandIn(t *testing.T) {
	root := t.TempDir()
	if n, err := kubeletRestarts(root); n != 0 || err != nil {
		t.Fatalf("a root without a service table: %d restarts, %v", n, err)
	}
	if err := os.MkdirAll(filepath.Join(root, "usr/bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "usr/bin/kubelet"), []byte(placeholderBinary("kubelet", "v1.36.4")), 0o755); err != nil {
		t.Fatal(err)
	}
	if v, err := KubeletVersion(t.Context(), root); v != "v1.36.4" || err != nil {
		t.Fatalf("placeholder kubelet: %q, %v", v, err)
	}
	real, err := os.ReadFile(filepath.Join(os.Getenv("NODEOPS_BIN"), "kubelet"))
	if err != nil {
		t.Fatalf("the built kubelet (NODEOPS_BIN): %v", err)
	}
	if err := os.WriteFile(filepath.Join(root, "usr/bin/kubelet"), real, 0o755); err != nil {
		t.Fatal(err)
	}
	if v, err := KubeletVersion(t.Context(), root); !strings.HasPrefix(v, "v1.") || v == "v1.36.4" || err != nil {
		t.Fatalf("the built kubelet: %q, %v", v, err)
	}
	log := filepath.Join(root, "var/lib/nodeops-local/services.log")
	if err := os.MkdirAll(filepath.Dir(log), 0o755); err != nil {
		t.Fatal(err)
	}
	table := "restart containerd 2026-12-01T00:00:00Z\nrestart kubelet 2026-12-01T00:00:01Z\nrestart static-pod/etcd 2026-12-01T00:00:02Z\nrestart kubelet 2026-12-01T00:00:03Z\n"
	if err := os.WriteFile(log, []byte(table), 0o644); err != nil {
		t.Fatal(err)
	}
	if n, err := kubeletRestarts(root); n != 2 || err != nil {
		t.Fatalf("%d kubelet restarts, %v; want 2", n, err)
	}
}

// TestAgentJobPodStandIn: the process run for an agent Job's pod is bin/agent with the Job's args,
// /host translated into the node's root, the downward API's env resolved from the pod, and the
// pod-bound kubeconfig; its statuses are a kubelet's.
func TestAgentJobPodStandIn(t *testing.T) {
	job := agentjob.BuildJob("worker-1", agentjob.Options{})
	pod := &corev1.Pod{ObjectMeta: *job.Spec.Template.ObjectMeta.DeepCopy(), Spec: *job.Spec.Template.Spec.DeepCopy()}
	pod.Name, pod.Namespace = "nodeops-agent-worker-1-x7k2p", job.Namespace
	pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: "u"}}
	if !agentJobPod(pod) {
		t.Fatal("the Job's pod is not taken for an agent Job's pod")
	}
	if agentJobPod(StandInAgentPod("worker-1")) {
		t.Error("the stand-in agent pod is taken for an agent Job's pod")
	}

	args, env, err := AgentCommand(pod, "/d/nodes/worker-1", "/d/credentials/agent-x.kubeconfig")
	if err != nil {
		t.Fatal(err)
	}
	wantArgs := []string{"--host-root=/d/nodes/worker-1", "--exit-when-idle", "--kubeconfig=/d/credentials/agent-x.kubeconfig", "--service-manager=local"}
	if !slices.Equal(args, wantArgs) {
		t.Errorf("args %v, want %v", args, wantArgs)
	}
	wantEnv := []string{"NODE_NAME=worker-1", "POD_NAME=nodeops-agent-worker-1-x7k2p", "POD_NAMESPACE=nodeops-system"}
	if !slices.Equal(env, wantEnv) {
		t.Errorf("env %v, want %v", env, wantEnv)
	}
	other := pod.DeepCopy()
	other.Spec.Containers[0].Command = []string{"/bin/sh"}
	if _, _, err := AgentCommand(other, "/r", "/k"); err == nil {
		t.Error("a pod running /bin/sh is run as the agent")
	}

	start, end := time.Unix(100, 0), time.Unix(160, 0)
	if s := RunningStatus(pod, start); s.Phase != corev1.PodRunning || !s.ContainerStatuses[0].Ready || s.ContainerStatuses[0].State.Running == nil {
		t.Errorf("running status %+v", s)
	}
	for code, want := range map[int]corev1.PodPhase{0: corev1.PodSucceeded, 1: corev1.PodFailed, 137: corev1.PodFailed} {
		s := FinishedStatus(pod, start, end, code)
		term := s.ContainerStatuses[0].State.Terminated
		if s.Phase != want || term == nil || term.ExitCode != int32(code) || !term.FinishedAt.Time.Equal(end) {
			t.Errorf("exit %d: phase %s, terminated %+v", code, s.Phase, term)
		}
	}
}

// TestKwokStagesLeaveAgentJobPods: each pod stage kwok loads requires agentJobPodKey NotIn [Job];
// node stages are copied unchanged.
func TestKwokStagesLeaveAgentJobPods(t *testing.T) {
	src, dir := t.TempDir(), t.TempDir()
	pod := "apiVersion: kwok.x-k8s.io/v1alpha1\nkind: Stage\nmetadata:\n  name: pod-ready\nspec:\n  resourceRef:\n    apiGroup: v1\n    kind: Pod\n  selector:\n    matchExpressions:\n    - key: .status.phase\n      operator: In\n      values: [Pending]\n"
	node := "apiVersion: kwok.x-k8s.io/v1alpha1\nkind: Stage\nmetadata:\n  name: node-initialize\nspec:\n  resourceRef:\n    apiGroup: v1\n    kind: Node\n"
	for name, data := range map[string]string{"pod.yaml": pod, "node.yaml": node} {
		if err := os.WriteFile(filepath.Join(src, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, err := kwokStages(dir, []string{filepath.Join(src, "pod.yaml"), filepath.Join(src, "node.yaml")})
	if err != nil {
		t.Fatal(err)
	}
	var stage struct {
		Spec struct {
			Selector struct {
				MatchExpressions []struct {
					Key, Operator string
					Values        []string
				} `json:"matchExpressions"`
			} `json:"selector"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal([]byte(readFile(t, out[0])), &stage); err != nil {
		t.Fatal(err)
	}
	exprs := stage.Spec.Selector.MatchExpressions
	if len(exprs) != 2 || exprs[0].Key != ".status.phase" || exprs[1].Key != agentJobPodKey || exprs[1].Operator != "NotIn" || !slices.Equal(exprs[1].Values, []string{"Job"}) {
		t.Errorf("pod stage's expressions %+v", exprs)
	}
	if got := readFile(t, out[1]); got != node {
		t.Errorf("node stage changed:\n%s", got)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// The secret volume stand-in lays files out as the kubelet's atomic writer: the keys in a timestamped
// directory (mode 0400), ..data a relative link to it, a relative link per key; an update swaps ..data,
// removes the old directory and the links of keys that went.
func TestSecretVolumeLayout(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "volume")
	if err := atomicWrite(dir, map[string][]byte{"token": []byte("t1"), "tls.crt": []byte("c")}, 0o400); err != nil {
		t.Fatal(err)
	}
	first, err := os.Readlink(filepath.Join(dir, "..data"))
	if err != nil || !strings.HasPrefix(first, "..") || strings.Contains(first, "/") {
		t.Fatalf("..data -> %q (%v), want a relative link to a ..<timestamp> directory", first, err)
	}
	for _, k := range []string{"token", "tls.crt"} {
		if l, err := os.Readlink(filepath.Join(dir, k)); err != nil || l != filepath.Join("..data", k) {
			t.Errorf("%s -> %q (%v), want ..data/%s", k, l, err, k)
		}
		fi, err := os.Stat(filepath.Join(dir, first, k))
		if err != nil || fi.Mode().Perm() != 0o400 {
			t.Errorf("%s/%s: %v, mode %v, want 0400", first, k, err, fi)
		}
	}
	if err := atomicWrite(dir, map[string][]byte{"token": []byte("t2")}, 0o400); err != nil {
		t.Fatal(err)
	}
	second, _ := os.Readlink(filepath.Join(dir, "..data"))
	if got, err := os.ReadFile(filepath.Join(dir, "token")); err != nil || string(got) != "t2" || second == first {
		t.Errorf("after the update token reads %q (%v), ..data -> %q (was %q)", got, err, second, first)
	}
	for _, gone := range []string{first, "tls.crt"} {
		if _, err := os.Lstat(filepath.Join(dir, gone)); !os.IsNotExist(err) {
			t.Errorf("%s is still there after the update (%v)", gone, err)
		}
	}
}
