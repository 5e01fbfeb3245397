package kubeadmconfig_test

import (
	"strings"
	"testing"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent/commands"
	"github.com/nodeops/nodeops/internal/kubeadmconfig"
)

const clusterConfiguration = `apiServer:
  certSANs:
  - 127.0.0.1
  extraArgs:
  - name: audit-log-maxage
    value: "7"
  - name: profiling
    value: "false"
apiVersion: kubeadm.k8s.io/v1beta4
controlPlaneEndpoint: 127.0.0.1:6443
kind: ClusterConfiguration
kubernetesVersion: v1.37.2
`

// A patch sets flags by name, removes flags, adds volumes and feature gates; patching twice is
// patching once, and an older kubeadm's configuration is refused rather than rewritten.
func TestPatchClusterConfiguration(t *testing.T) {
	p := &v1alpha1.ClusterConfigurationPatch{
		APIServer: &v1alpha1.APIServerPatch{ControlPlaneComponentPatch: v1alpha1.ControlPlaneComponentPatch{
			ExtraArgs:       []v1alpha1.ExtraArg{{Name: "audit-log-maxage", Value: "30"}, {Name: "audit-log-maxbackup", Value: "3"}},
			RemoveExtraArgs: []string{"profiling"},
			ExtraVolumes:    []v1alpha1.HostPathMount{{Name: "audit", HostPath: "/var/log/audit", MountPath: "/var/log/audit", PathType: "DirectoryOrCreate"}},
		}},
		Scheduler:    &v1alpha1.ControlPlaneComponentPatch{ExtraArgs: []v1alpha1.ExtraArg{{Name: "v", Value: "2"}}},
		FeatureGates: map[string]bool{"ControlPlaneKubeletLocalMode": true},
	}
	got, err := kubeadmconfig.PatchClusterConfiguration(clusterConfiguration, p)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"  - name: audit-log-maxage\n    value: \"30\"\n  - name: audit-log-maxbackup\n    value: \"3\"\n",
		"  extraVolumes:\n  - hostPath: /var/log/audit\n    mountPath: /var/log/audit\n    name: audit\n    pathType: DirectoryOrCreate\n",
		"scheduler:\n  extraArgs:\n  - name: v\n    value: \"2\"\n",
		"featureGates:\n  ControlPlaneKubeletLocalMode: true\n",
		"controlPlaneEndpoint: 127.0.0.1:6443\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("patched configuration lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "profiling") || strings.Count(got, "audit-log-maxage") != 1 {
		t.Errorf("profiling not removed or audit-log-maxage not replaced:\n%s", got)
	}
	again, err := kubeadmconfig.PatchClusterConfiguration(got, p)
	if err != nil || again != got {
		t.Errorf("patching twice changed the text again (%v):\n%s", err, kubeadmconfig.LineDiff(got, again))
	}
	if _, err := kubeadmconfig.PatchClusterConfiguration(strings.Replace(clusterConfiguration, "v1beta4", "v1beta3", 1), p); err == nil || !strings.Contains(err.Error(), "only kubeadm.k8s.io/v1beta4") {
		t.Errorf("a v1beta3 configuration: %v, want it refused naming v1beta4", err)
	}
}

// The kubelet's patch is a JSON merge patch; one that changes nothing leaves the text as it was.
func TestPatchKubeletConfiguration(t *testing.T) {
	const cfg = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 110\nevictionHard:\n  memory.available: 100Mi\n"
	p := "maxPods: 150\nevictionHard:\n  nodefs.available: 5%\n"
	got, err := kubeadmconfig.PatchKubeletConfiguration(cfg, p)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"maxPods: 150\n", "  memory.available: 100Mi\n", "  nodefs.available: 5%\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("patched configuration lacks %q:\n%s", want, got)
		}
	}
	if again, err := kubeadmconfig.PatchKubeletConfiguration(got, p); err != nil || again != got {
		t.Errorf("patching twice changed the text again (%v)", err)
	}
	if diffs := commands.KubeletConfigChanges([]byte(cfg), []byte(got)); strings.Join(diffs, "; ") != "evictionHard.nodefs.available: (none) -> 5%; maxPods: 110 -> 150" {
		t.Errorf("changes %q", diffs)
	}
}

func TestPatchKubeletConfigurationRefusesKubeadmsFields(t *testing.T) {
	if _, err := kubeadmconfig.PatchKubeletConfiguration("kind: KubeletConfiguration\n", `{"kind": "Other"}`); err == nil || !strings.Contains(err.Error(), "kind is kubeadm's") {
		t.Errorf("a patch of kind: %v, want it refused", err)
	}
}

func TestLineDiff(t *testing.T) {
	got := kubeadmconfig.LineDiff("a\nb\nc\n", "a\nc\nd\n")
	if got != "- b\n+ d\n" {
		t.Errorf("diff %q", got)
	}
}

// etcd's flags go to etcd.local; a cluster whose etcd is external is refused naming the field, and
// certSANs are added to those there, never twice.
func TestPatchClusterConfigurationEtcdAndCertSANs(t *testing.T) {
	p := &v1alpha1.ClusterConfigurationPatch{
		APIServer: &v1alpha1.APIServerPatch{CertSANs: []string{"127.0.0.1", "api.example.com"}},
		Etcd:      &v1alpha1.EtcdPatch{ExtraArgs: []v1alpha1.ExtraArg{{Name: "snapshot-count", Value: "5000"}}},
	}
	got, err := kubeadmconfig.PatchClusterConfiguration(clusterConfiguration+"etcd:\n  local:\n    dataDir: /var/lib/etcd\n", p)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"  certSANs:\n  - 127.0.0.1\n  - api.example.com\n",
		"etcd:\n  local:\n    dataDir: /var/lib/etcd\n    extraArgs:\n    - name: snapshot-count\n      value: \"5000\"\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("patched configuration lacks %q:\n%s", want, got)
		}
	}
	external := clusterConfiguration + "etcd:\n  external:\n    endpoints: [https://10.0.0.1:2379]\n"
	if _, err := kubeadmconfig.PatchClusterConfiguration(external, p); err == nil || !strings.Contains(err.Error(), "clusterConfiguration.etcd") || !strings.Contains(err.Error(), "external") {
		t.Errorf("an external etcd: %v, want it refused naming clusterConfiguration.etcd", err)
	}
	if _, err := kubeadmconfig.PatchClusterConfiguration(external, &v1alpha1.ClusterConfigurationPatch{APIServer: p.APIServer}); err != nil {
		t.Errorf("certSANs with an external etcd: %v", err)
	}
}
