package localcluster

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// TestKubeletConfigurationIsKubeadms: the kubelet configuration nodeops-local puts in
// kube-system/kubelet-config and in every node root is byte for byte what the real kubeadm (bin/)
// writes from the same kubeadm configuration, so that a fresh cluster shows no drift (the agents
// compare a node's files with `kubeadm upgrade node phase kubelet-config --dry-run`).
func TestKubeletConfigurationIsKubeadms(t *testing.T) {
	bin := os.Getenv("NODEOPS_BIN")
	if bin == "" {
		t.Fatal("NODEOPS_BIN is not set: run `make test-unit`, or `export NODEOPS_BIN=\"$PWD/bin\"` in the repository after `make tools`")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	dry := filepath.Join(dir, "dry")
	params := kubeadmConfigParams{
		NodeName: "cp-1", AdvertiseAddress: "192.0.2.11", ControlPlane: true,
		KubernetesVersion: DefaultKubernetesVersion, Endpoint: "127.0.0.1:40001", CertificatesDir: "/etc/kubernetes/pki",
	}
	cfg := writeConfig(t, dir, "kubeadm-config.yaml", KubeadmConfig(params))
	// upload-config --dry-run needs an admin kubeconfig in the dry-run directory, made from a CA.
	params.CertificatesDir = filepath.Join(dir, "pki")
	pkiCfg := writeConfig(t, dir, "pki-config.yaml", KubeadmConfig(params))
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "kubeadm"), args...)
		cmd.Env = append(os.Environ(), "KUBEADM_INIT_DRYRUN_DIR="+dry)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kubeadm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	if err := os.MkdirAll(dry, 0o755); err != nil {
		t.Fatal(err)
	}
	run("init", "phase", "kubelet-start", "--dry-run", "--config", cfg)
	for file, want := range map[string]string{"config.yaml": NodeKubeletConfig(), "instance-config.yaml": KubeletInstanceConfig} {
		got, err := os.ReadFile(filepath.Join(dry, file))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Errorf("kubeadm init phase kubelet-start writes %s as\n%s\nnodeops-local renders\n%s", file, got, want)
		}
	}

	run("init", "phase", "certs", "ca", "--config", pkiCfg)
	run("init", "phase", "kubeconfig", "admin", "--config", pkiCfg, "--kubeconfig-dir", dry)
	out := run("init", "phase", "upload-config", "kubelet", "--dry-run", "--config", cfg)
	var cm corev1.ConfigMap
	for _, obj := range strings.Split(out, "[dryrun] Attached object:\n")[1:] {
		obj, _, _ = strings.Cut(obj, "\n\n")
		if err := yaml.Unmarshal([]byte(obj), &cm); err == nil && cm.Kind == "ConfigMap" && cm.Name == KubeletConfigMap {
			break
		}
		cm = corev1.ConfigMap{}
	}
	if cm.Name == "" {
		t.Fatalf("kubeadm init phase upload-config kubelet --dry-run shows no ConfigMap %s:\n%s", KubeletConfigMap, out)
	}
	if got, want := cm.Data["kubelet"], KubeletConfiguration(); got != want {
		t.Errorf("kubeadm uploads kubelet-config as\n%s\nnodeops-local uploads\n%s", got, want)
	}
}

func writeConfig(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
